package io.flock;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.net.SocketTimeoutException;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;

/**
 * A connection that takes a time limit per command: the built-in {@link RespConnection} (directly or through
 * Sentinel). The commands the client sends for itself (heartbeats, renewals, re-watches, its own releases and
 * cancels) are each given the time until the deadline they serve, not the config's command timeout.
 */
interface Timed {
    /**
     * Sends one command and reads its reply within {@code timeoutMs}, however long the command may block on the
     * server. A reply that does not come in time is lost: the connection is then closed.
     *
     * @param timeoutMs milliseconds, at least 1
     * @param args the command and its arguments
     * @return the reply
     * @throws IOException if the reply was lost (the connection is then closed)
     */
    Object call(int timeoutMs, byte[]... args) throws IOException;

    /**
     * {@code args} on {@code conn} within {@code timeoutMs}: the connection's own limit when it is {@link Timed};
     * otherwise (an adapter's) the connection is closed when the time is up, which ends the call with an I/O
     * error as a socket timeout would.
     */
    static Object call(FlockConnection conn, int timeoutMs, byte[][] args) throws IOException {
        if (conn instanceof Timed) {
            return ((Timed) conn).call(timeoutMs, args);
        }
        boolean[] closed = {false};
        ScheduledFuture<?> guard = Guard.TIMER.schedule(() -> {
            synchronized (closed) {
                closed[0] = true;
            }
            try {
                conn.close();
            } catch (IOException | RuntimeException ignored) {
                // closing is what ends the call
            }
        }, timeoutMs, TimeUnit.MILLISECONDS);
        try {
            return conn.call(args);
        } catch (IOException | UncheckedIOException e) {
            synchronized (closed) {
                if (closed[0]) {
                    SocketTimeoutException late = new SocketTimeoutException("no reply within " + timeoutMs + " ms");
                    late.initCause(e);
                    throw late;
                }
            }
            throw e;
        } finally {
            guard.cancel(false);
        }
    }

    /** The timer of the closing guards (connections of adapters only). */
    final class Guard {
        static final ScheduledThreadPoolExecutor TIMER = new ScheduledThreadPoolExecutor(1, r -> {
            Thread t = new Thread(r, "flock-timeout");
            t.setDaemon(true);
            return t;
        });

        static {
            TIMER.setRemoveOnCancelPolicy(true);
        }

        private Guard() {
        }
    }
}
