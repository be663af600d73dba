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
final class Link implements Channel, AutoCloseable {
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

    @Override
    public synchronized Object call(byte[][] args, boolean asking) throws IOException {
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

    @Override
    public synchronized Object call(byte[][] args, boolean asking, int timeoutMs) throws IOException {
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
     * In one round trip when the connection can pipeline ({@link Pipelined}: the built-in one, directly or
     * through Sentinel), else one call after the other (an adapter's connection).
     */
    @Override
    public synchronized List<Object> pipeline(boolean asking, byte[][]... commands) throws IOException {
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
