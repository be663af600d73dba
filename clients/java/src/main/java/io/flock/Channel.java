package io.flock;

import java.io.IOException;
import java.util.List;

/**
 * Where a node's commands of one use go: one connection of their own ({@link Link}), or whichever connection of a
 * pool is free ({@link Links}). Each call is on one connection, with nothing else in between.
 */
interface Channel {
    /**
     * Sends once; an I/O error closes the connection it was sent on and is rethrown. {@code asking}: ASKING first
     * (a Cluster node answered ASK: the key's slot is being imported there, and only the next command may use it).
     */
    Object call(byte[][] args, boolean asking) throws IOException;

    /**
     * {@link #call(byte[][], boolean)} within {@code timeoutMs} ({@link Timed}): a command the client sends for
     * itself, given the time until the deadline it serves.
     */
    Object call(byte[][] args, boolean asking, int timeoutMs) throws IOException;

    /**
     * Sends {@code commands} one after the other on one connection and returns their replies in order, an error
     * reply as the RuntimeException in its place; {@code asking}: ASKING first. An I/O error closes the
     * connection and is rethrown.
     */
    List<Object> pipeline(boolean asking, byte[][]... commands) throws IOException;
}
