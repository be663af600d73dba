package io.flock;

import java.io.IOException;

/**
 * Opens a new connection. {@link FlockClient} calls it for its command connection, its watchdog connection
 * and for each blocking wait (a blocked {@code FLOCK.ACQUIRE ... WAIT} holds its connection, as BLPOP does,
 * so it must never be a shared or pooled one that other threads write to).
 */
@FunctionalInterface
public interface ConnectionFactory {
    FlockConnection connect() throws IOException;
}
