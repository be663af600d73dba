package io.flock;

import java.io.IOException;

/**
 * Opens a new connection. {@link FlockClient} calls it for its command connection, its watchdog connection,
 * its session connection (blocked in {@code FLOCK.INBOX}) and, without sessions, for each blocking wait (a
 * blocked {@code FLOCK.ACQUIRE ... WAIT} holds its connection, as BLPOP does). So it must never give a shared
 * or pooled connection that other threads write to.
 */
@FunctionalInterface
public interface ConnectionFactory {
    /**
     * Opens a connection of its own.
     *
     * @return the new connection
     * @throws IOException if the server cannot be reached
     */
    FlockConnection connect() throws IOException;
}
