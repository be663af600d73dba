package io.flock;

import java.io.IOException;
import java.net.SocketTimeoutException;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * A node's connections of one use, each lent to one caller at a time, so that no caller's round trip waits
 * behind another's (a holder's release behind other threads' acquires). Of those given back, at most
 * {@code keep} stay open, the last used lent first; with a {@code limit}, no more than that are open at all and a
 * caller beyond waits for one to come back, so that any number of threads costs that many connections.
 */
final class Links implements Channel, AutoCloseable {
    private final ConnectionFactory factory;
    private final boolean knowsId;
    private final int keep;
    /** How many may be open at once, lent or idle; 0: no limit (each caller needs one of its own). */
    private final int limit;
    private final ArrayDeque<Link> idle = new ArrayDeque<>();
    private int lent;
    private boolean closed;

    /** {@code knowsId}: each connection asks its CLIENT ID when it opens ({@link Link}). */
    Links(ConnectionFactory factory, boolean knowsId, int keep, int limit) {
        this.factory = factory;
        this.knowsId = knowsId;
        this.keep = keep;
        this.limit = limit;
    }

    /**
     * A connection for the caller alone until it {@link #give}s it back: an idle one, else a new one (opened on
     * its first call), else, at the limit, the next one given back, waited for up to {@code timeoutMs} (0: as
     * long as it takes; an interrupt does not end the wait, and stays set).
     *
     * @throws SocketTimeoutException if none came free in time: the command was not sent
     */
    Link take(int timeoutMs) throws SocketTimeoutException {
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(timeoutMs);
        boolean interrupted = false;
        try {
            synchronized (this) {
                while (limit > 0 && idle.isEmpty() && lent >= limit) {
                    try {
                        if (timeoutMs == 0) {
                            wait();
                        } else if (deadline - System.nanoTime() > 0) {
                            TimeUnit.NANOSECONDS.timedWait(this, deadline - System.nanoTime());
                        } else {
                            throw new SocketTimeoutException("no connection came free within " + timeoutMs + " ms");
                        }
                    } catch (InterruptedException e) {
                        interrupted = true;
                    }
                }
                lent++;
                Link link = idle.poll();
                return link != null ? link : new Link(factory, knowsId);
            }
        } finally {
            if (interrupted) {
                Thread.currentThread().interrupt();
            }
        }
    }

    /** {@code link} back from its caller: kept while there is room (and it is open), else closed. */
    void give(Link link) {
        boolean open = link.isOpen();
        boolean kept;
        synchronized (this) {
            lent--;
            kept = open && !closed && idle.size() < keep;
            if (kept) {
                idle.push(link);
            }
            notify(); // a caller waiting at the limit: this one, or room to open another
        }
        if (!kept) {
            link.close();
        }
    }

    @Override
    public Object call(byte[][] args, boolean asking) throws IOException {
        return lend(0, link -> link.call(args, asking));
    }

    /** The wait for a free connection counts in {@code timeoutMs}. */
    @Override
    public Object call(byte[][] args, boolean asking, int timeoutMs) throws IOException {
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(timeoutMs);
        return lend(timeoutMs, link -> link.call(args, asking, Protocol.msUntil(deadline)));
    }

    @Override
    public List<Object> pipeline(boolean asking, byte[][]... commands) throws IOException {
        return lend(0, link -> link.pipeline(asking, commands));
    }

    private interface OnLink<T> {
        T call(Link link) throws IOException;
    }

    /**
     * {@code call} on a connection taken for it. After an I/O error the idle connections are closed too: opened
     * before that one broke, they most likely broke with it (a server that restarted or failed over), and a
     * resend should open a new connection, not find the next dead one.
     */
    private <T> T lend(int timeoutMs, OnLink<T> call) throws IOException {
        Link link = take(timeoutMs);
        try {
            return call.call(link);
        } catch (IOException e) {
            closeIdle();
            throw e;
        } finally {
            give(link);
        }
    }

    private void closeIdle() {
        List<Link> stale;
        synchronized (this) {
            stale = new ArrayList<>(idle);
            idle.clear();
        }
        stale.forEach(Link::close);
    }

    /** Closes the idle connections, and each lent one once it is given back. */
    @Override
    public void close() {
        synchronized (this) {
            closed = true;
        }
        closeIdle();
    }
}
