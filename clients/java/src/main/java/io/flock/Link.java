package io.flock;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.List;

/**
 * One connection, opened on first use and again after it broke. Its server-side client id (CLIENT ID, asked
 * when it opens) lets another connection CLIENT UNBLOCK a wait on it; it is volatile because the thread that
 * cancels a wait reads it while the waiting thread holds this link's monitor.
 */
final class Link implements AutoCloseable {
    private static final byte[][] CLIENT_ID = {FlockClient.bytes("CLIENT"), FlockClient.bytes("ID")};
    private static final byte[][] ASKING = {FlockClient.bytes("ASKING")};

    private final ConnectionFactory factory;
    private final boolean knowsId;
    private FlockConnection conn;
    private volatile long clientId;

    Link(ConnectionFactory factory, boolean knowsId) {
        this.factory = factory;
        this.knowsId = knowsId;
    }

    long clientId() {
        return clientId;
    }

    synchronized boolean isOpen() {
        return conn != null;
    }

    /** Sends once; an I/O error closes the connection (the next call opens a new one) and is rethrown. */
    Object call(byte[][] args) throws IOException {
        return call(args, false);
    }

    /**
     * {@code asking}: ASKING first, on the same connection with nothing in between (a Cluster node answered
     * ASK: the key's slot is being imported here, and only the next command may use it).
     */
    synchronized Object call(byte[][] args, boolean asking) throws IOException {
        try {
            open();
            if (asking) {
                conn.call(ASKING);
            }
            return conn.call(args);
        } catch (IOException | UncheckedIOException e) {
            close();
            throw e instanceof IOException ? (IOException) e : ((UncheckedIOException) e).getCause();
        }
    }

    /**
     * {@link #call(byte[][], boolean)} within {@code timeoutMs} ({@link Timed}): a command the client sends for
     * itself, given the time until the deadline it serves.
     */
    synchronized Object call(byte[][] args, boolean asking, int timeoutMs) throws IOException {
        try {
            open();
            if (asking) {
                Timed.call(conn, timeoutMs, ASKING);
            }
            return Timed.call(conn, timeoutMs, args);
        } catch (IOException | UncheckedIOException e) {
            close();
            throw e instanceof IOException ? (IOException) e : ((UncheckedIOException) e).getCause();
        }
    }

    /**
     * Sends {@code commands} one after the other on this connection and returns their replies in order, an
     * error reply as the RuntimeException in its place: in one round trip when the connection can pipeline
     * ({@link Pipelined}: the built-in one, directly or through Sentinel), else one call after the other (an
     * adapter's connection), still on the same connection with nothing in between. {@code asking}: ASKING
     * first, as {@link #call(byte[][], boolean)}. An I/O error closes the connection and is rethrown.
     */
    synchronized List<Object> pipeline(boolean asking, byte[][]... commands) throws IOException {
        try {
            open();
            if (asking) {
                conn.call(ASKING);
            }
            if (conn instanceof Pipelined) {
                return ((Pipelined) conn).pipeline(commands);
            }
            List<Object> replies = new ArrayList<>();
            for (byte[][] command : commands) {
                try {
                    replies.add(conn.call(command));
                } catch (UncheckedIOException e) {
                    throw e;
                } catch (RuntimeException e) {
                    replies.add(e);
                }
            }
            return replies;
        } catch (IOException | UncheckedIOException e) {
            close();
            throw e instanceof IOException ? (IOException) e : ((UncheckedIOException) e).getCause();
        }
    }

    private void open() throws IOException {
        if (conn == null) {
            conn = factory.connect();
            if (knowsId) {
                clientId = (Long) conn.call(CLIENT_ID);
            }
        }
    }

    @Override
    public synchronized void close() {
        clientId = 0;
        if (conn != null) {
            try {
                conn.close();
            } catch (IOException ignored) {
                // closing a broken connection: nothing left to tell anyone
            }
            conn = null;
        }
    }
}
