package io.flock;

import java.io.IOException;
import java.io.UncheckedIOException;

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
            if (conn == null) {
                conn = factory.connect();
                if (knowsId) {
                    clientId = (Long) conn.call(CLIENT_ID);
                }
            }
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
