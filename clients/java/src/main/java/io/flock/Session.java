package io.flock;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.LinkedBlockingQueue;

/**
 * The client's FLOCK session on its server: one connection of its own, opened on first use, that called
 * {@code FLOCK.SESSION} and then loops {@code FLOCK.INBOX} on a daemon reader thread. Every thread's wait is
 * one {@code FLOCK.ACQUIRE ... WAIT t INBOX <id>} on the shared command connection; the server answers
 * {@code WAITING} and the outcome comes through here, matched to the waiting thread by (key, owner). Losses
 * of watched grants ({@code lost}) are handed to the client at once, in the server's order.
 *
 * <p>When the session connection breaks (or an ACQUIRE answers {@code NOSESSION}) the session is forgotten
 * and each of its pending waits is told ({@link Event#BROKEN}); the waiting thread then registers again,
 * which opens a new session, and resends its ACQUIRE there with its same request ID.
 */
final class Session implements AutoCloseable {
    /** How long one FLOCK.INBOX blocks on the server before the reader asks again. */
    static final long INBOX_TIMEOUT_MS = 10_000;
    private static final byte[][] SESSION = {FlockClient.bytes("FLOCK.SESSION")};
    private static final byte[][] INBOX = {FlockClient.bytes("FLOCK.INBOX"),
        FlockClient.bytes(Long.toString(INBOX_TIMEOUT_MS))};

    /** A wait's identity on the server: key and owner, as raw bytes (ISO-8859-1 keeps them exact). */
    record WaitKey(String key, String owner) {
        static WaitKey of(byte[] key, byte[] owner) {
            return new WaitKey(new String(key, StandardCharsets.ISO_8859_1),
                    new String(owner, StandardCharsets.ISO_8859_1));
        }
    }

    /** An outcome pushed to a wait: the server's (granted, timeout, cancelled, error) or the client's own. */
    record Event(String kind, long token, String detail, String sessionId) {
        static final String GRANTED = "granted";
        static final String TIMEOUT = "timeout";
        static final String CANCELLED = "cancelled";
        static final String ERROR = "error";
        /** The client's: the session the wait was sent to ended; send it again. */
        static final String BROKEN = "broken";
        /** The client's: the FlockClient was closed. */
        static final String CLOSED = "closed";
    }

    /** One thread's wait: registered before its ACQUIRE is sent (the event can beat the WAITING reply). */
    static final class Wait {
        final WaitKey id;
        final byte[] key;
        final byte[] owner;
        final BlockingQueue<Event> events = new LinkedBlockingQueue<>();
        /** The session its ACQUIRE went to last (on a Cluster, of the node it was sent to) and that session's ID. */
        volatile Session session;
        volatile String sessionId;
        /** Given up by its thread without a final event: a grant that still comes is released. */
        volatile boolean abandoned;

        Wait(byte[] key, byte[] owner) {
            this.key = key;
            this.owner = owner;
            this.id = WaitKey.of(key, owner);
        }

        /** The wait ended (its final event read, or its ACQUIRE answered at once). */
        void unregister() {
            Session last = session;
            if (last != null && !abandoned) {
                last.pending.remove(id, this);
            }
        }

        /** The wait ended without its final event: the reader releases a grant that still comes for it. */
        void abandon() {
            abandoned = true;
        }
    }

    private final FlockClient client;
    private final ConnectionFactory factory;
    private final Object state = new Object();
    private final Map<WaitKey, Wait> pending = new ConcurrentHashMap<>();
    private FlockConnection connection;
    private String id;
    private Thread reader;
    private boolean closed;
    /** Sessions opened so far (tests: a broken session was replaced). */
    private int opened;

    Session(FlockClient client, ConnectionFactory factory) {
        this.client = client;
        this.factory = factory;
    }

    /** The open session's ID, opening one first if there is none. */
    String id() throws IOException {
        synchronized (state) {
            return openIfNeeded();
        }
    }

    /**
     * Registers {@code wait} under the open session (opening one if needed) and returns that session's ID. A
     * wait sent to another node before (a Cluster slot moved) leaves that node's session.
     */
    String register(Wait wait) throws IOException {
        synchronized (state) {
            String sid = openIfNeeded();
            Session before = wait.session;
            if (before != null && before != this) {
                before.pending.remove(wait.id, wait);
            }
            wait.session = this;
            wait.sessionId = sid;
            wait.abandoned = false;
            pending.put(wait.id, wait);
            return sid;
        }
    }

    /** The reader thread of the last session opened, or null (tests). */
    Thread reader() {
        synchronized (state) {
            return reader;
        }
    }

    /** How many sessions were opened (tests). */
    int opened() {
        synchronized (state) {
            return opened;
        }
    }

    private String openIfNeeded() throws IOException {
        if (closed) {
            throw new IllegalStateException("the FlockClient is closed");
        }
        if (id != null) {
            return id;
        }
        FlockConnection conn = factory.connect();
        String sid;
        try {
            sid = FlockLock.text(conn.call(SESSION));
        } catch (IOException | RuntimeException e) {
            closeQuietly(conn);
            if (e instanceof UncheckedIOException) {
                throw ((UncheckedIOException) e).getCause();
            }
            throw e;
        }
        connection = conn;
        id = sid;
        opened++;
        reader = new Thread(() -> read(conn, sid), "flock-session-reader");
        reader.setDaemon(true);
        reader.start();
        return sid;
    }

    /**
     * Session {@code sid} is over (its connection broke, or the server answered NOSESSION): forget it if it
     * is still the open one, and tell its pending waits to send themselves again.
     */
    void broken(String sid) {
        FlockConnection conn = null;
        synchronized (state) {
            if (sid.equals(id)) {
                conn = connection;
                connection = null;
                id = null;
            }
        }
        if (conn != null) {
            closeQuietly(conn);
            client.rewatchLater(0); // the grants it watched: to the next session
        }
        for (Wait wait : pending.values()) {
            if (sid.equals(wait.sessionId)) {
                if (wait.abandoned) {
                    pending.remove(wait.id, wait); // the server dropped it with the session
                } else {
                    wait.events.add(new Event(Event.BROKEN, 0, "", sid));
                }
            }
        }
    }

    /** Closes the session connection (the reader ends) and tells every pending wait. */
    @Override
    public void close() {
        FlockConnection conn;
        synchronized (state) {
            closed = true;
            conn = connection;
            connection = null;
            id = null;
        }
        if (conn != null) {
            closeQuietly(conn);
        }
        for (Wait wait : pending.values()) {
            wait.events.add(new Event(Event.CLOSED, 0, "", ""));
        }
        pending.clear();
    }

    private boolean isClosed() {
        synchronized (state) {
            return closed;
        }
    }

    /** The reader thread of session {@code sid}: FLOCK.INBOX until the connection breaks or the client closes. */
    private void read(FlockConnection conn, String sid) {
        while (true) {
            Object reply;
            try {
                reply = conn.call(INBOX);
            } catch (IOException | UncheckedIOException e) {
                if (!isClosed()) {
                    broken(sid);
                }
                return;
            } catch (RuntimeException e) {
                if (isClosed()) {
                    return;
                }
                if ("UNBLOCKED".equals(RedisError.codeOf(e))) {
                    // The server was demoted (Redis answers a blocked module command itself); the events
                    // stay in the inbox for the next read.
                    pause(100);
                    continue;
                }
                broken(sid); // NOSESSION, or anything else: this session is not usable
                return;
            }
            if (reply instanceof List) {
                for (Object event : (List<?>) reply) {
                    dispatch((List<?>) event, sid);
                }
            }
        }
    }

    /** One event, in the server's order: a loss to the client at once, an outcome to its wait. */
    private void dispatch(List<?> event, String sid) {
        String kind = FlockLock.text(event.get(0));
        byte[] key = raw(event.get(1));
        byte[] owner = raw(event.get(2));
        long token = event.get(3) instanceof Long ? (Long) event.get(3) : 0;
        String detail = FlockLock.text(event.get(4));
        if ("lost".equals(kind)) {
            client.pushedLoss(new String(key, StandardCharsets.UTF_8), new String(owner, StandardCharsets.UTF_8),
                    token, detail);
            return;
        }
        if ("moved".equals(kind)) {
            client.movedAway(new String(key, StandardCharsets.UTF_8), new String(owner, StandardCharsets.UTF_8), token);
            return;
        }
        Wait wait = pending.get(WaitKey.of(key, owner));
        if (wait == null) {
            return; // its thread took the grant from a resend's reply, or never waited here
        }
        if (wait.abandoned) {
            pending.remove(wait.id, wait);
            if (Event.GRANTED.equals(kind)) {
                client.releaseLater(key, owner);
            }
            return;
        }
        wait.events.add(new Event(kind, token, detail, sid));
    }

    private static byte[] raw(Object reply) {
        return reply instanceof byte[] ? (byte[]) reply : FlockClient.bytes(String.valueOf(reply));
    }

    private static void closeQuietly(FlockConnection conn) {
        try {
            conn.close();
        } catch (IOException | RuntimeException ignored) {
            // closing a broken or closed connection: nothing to tell
        }
    }

    private static void pause(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
