package io.flock;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
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
 * <p>Events carry no request ID, so a wait stays registered until the server can have nothing more for it
 * (see {@link FlockLock}): a thread's next wait of the same lock never takes its last one's event. When the
 * session connection breaks (or an ACQUIRE answers {@code NOSESSION}) the session is forgotten, and its reader,
 * once it has handed out every event it read, tells each of its waits ({@link Event#BROKEN}); the waiting
 * thread then registers again, which opens a new session, and resends its ACQUIRE there with its same request
 * ID.
 */
final class Session implements AutoCloseable {
    /**
     * How long one FLOCK.INBOX blocks on the server before the reader asks again: also how long a fence may wait
     * for a read to end, and a forgotten session's reader for its next reply.
     */
    static final long INBOX_TIMEOUT_MS = 1_000;
    private static final byte[][] SESSION = {FlockClient.bytes("FLOCK.SESSION")};
    private static final byte[][] INBOX = {FlockClient.bytes("FLOCK.INBOX"),
        FlockClient.bytes(Long.toString(INBOX_TIMEOUT_MS))};
    /** A read for a fence: it need not wait for an event, only bring those already there. */
    private static final byte[][] INBOX_NOW = {FlockClient.bytes("FLOCK.INBOX"), FlockClient.bytes("1")};

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
        /** The client's: the session the wait was sent to ended, and every event it had was handed out. */
        static final String BROKEN = "broken";
        /** The client's: the FlockClient was closed. */
        static final String CLOSED = "closed";
        /** The client's: every event the session had for the wait when it asked ({@link Wait#fence}) is out. */
        static final String FENCED = "fenced";
    }

    /** One thread's wait: registered before its ACQUIRE is sent (the event can beat the WAITING reply). */
    static final class Wait {
        final WaitKey id;
        final byte[] key;
        final byte[] owner;
        final BlockingQueue<Event> events = new LinkedBlockingQueue<>();
        /** The session its ACQUIRE went to last (on a Cluster, of the node it was sent to), its reader and ID. */
        volatile Session session;
        volatile Reader reader;
        volatile String sessionId;
        /** The reader's INBOX calls sent when the wait asked for a fence; guarded by that reader. */
        long fencedAfter;

        Wait(byte[] key, byte[] owner) {
            this.key = key;
            this.owner = owner;
            this.id = WaitKey.of(key, owner);
        }

        /** The wait ended: the server has nothing more for it in the session it was sent to last. */
        void unregister() {
            Session last = session;
            if (last != null) {
                last.pending.remove(id, this);
            }
        }

        /**
         * Asks for {@link Event#FENCED} once the reader of the session it was sent to last has handed out every
         * event the server had for it by now: after a reply that shows the server holds nothing more of the wait
         * (a CANCEL's, a grant's), an event not come by then never comes. A session that ends first tells
         * {@link Event#BROKEN} instead.
         */
        void fence() {
            reader.fence(this);
        }

        /** Closes the connection of the session it was sent to last, which says nothing: its end comes at once. */
        void closeSession() {
            Reader r = reader;
            r.session().forget(r.sid);
            closeQuietly(r.conn);
        }
    }

    private final FlockClient client;
    private final ConnectionFactory factory;
    private final Object state = new Object();
    private final Map<WaitKey, Wait> pending = new ConcurrentHashMap<>();
    /** The open session's reader, null while none is open. */
    private Reader current;
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
            return openIfNeeded().sid;
        }
    }

    /**
     * Registers {@code wait} under the open session (opening one if needed) and returns that session's ID; null
     * while the session it was sent to last is ending here (its {@link Event#BROKEN} comes once its reader has
     * handed out every event it read, which may be this wait's). A wait sent to another node before (a Cluster
     * slot moved) leaves that node's session.
     */
    String register(Wait wait) throws IOException {
        synchronized (state) {
            Reader last = wait.reader;
            if (last != null && last.session() == this && last != current && !last.ended()) {
                return null;
            }
            Reader r = openIfNeeded();
            Session before = wait.session;
            if (before != null && before != this) {
                before.pending.remove(wait.id, wait);
            }
            wait.session = this;
            wait.reader = r;
            wait.sessionId = r.sid;
            pending.put(wait.id, wait);
            return r.sid;
        }
    }

    /** The reader thread of the last session opened, or null (tests). */
    Thread reader() {
        synchronized (state) {
            return current == null ? null : current.thread;
        }
    }

    /** How many sessions were opened (tests). */
    int opened() {
        synchronized (state) {
            return opened;
        }
    }

    private Reader openIfNeeded() throws IOException {
        if (closed) {
            throw new IllegalStateException("the FlockClient is closed");
        }
        if (current != null) {
            return current;
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
        current = new Reader(sid, conn);
        opened++;
        current.thread.start();
        return current;
    }

    /**
     * Session {@code sid} is over (the server answered NOSESSION, or its reader ended): the next wait opens
     * another, and the grants it watched move there. Its reader goes on to hand out what the server sent it
     * before (a grant among them), and then ends it.
     */
    void forget(String sid) {
        synchronized (state) {
            if (current == null || !current.sid.equals(sid)) {
                return;
            }
            current = null;
        }
        client.rewatchLater(0);
    }

    /** Closes the session connection (the reader ends) and tells every pending wait. */
    @Override
    public void close() {
        Reader r;
        synchronized (state) {
            closed = true;
            r = current;
            current = null;
        }
        if (r != null) {
            closeQuietly(r.conn);
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

    private boolean isCurrent(Reader r) {
        synchronized (state) {
            return current == r;
        }
    }

    /** One session: its connection and the daemon thread that loops FLOCK.INBOX on it, in the server's order. */
    final class Reader {
        final String sid;
        final FlockConnection conn;
        final Thread thread;
        /** INBOX calls sent so far; guarded by this reader, as are the next two. */
        private long calls;
        private final List<Wait> fenced = new ArrayList<>();
        private boolean ended;

        Reader(String sid, FlockConnection conn) {
            this.sid = sid;
            this.conn = conn;
            this.thread = new Thread(this::read, "flock-session-reader");
            thread.setDaemon(true);
        }

        Session session() {
            return Session.this;
        }

        synchronized boolean ended() {
            return ended;
        }

        /**
         * The next INBOX call sent is answered after now on the server, with every event it had: once its reply
         * is handed out, so is every event of the wait's.
         */
        synchronized void fence(Wait wait) {
            if (!ended) {
                wait.fencedAfter = calls;
                fenced.add(wait);
            }
        }

        /** FLOCK.INBOX until the connection breaks, the session is forgotten or the client closes. */
        private void read() {
            while (true) {
                long call;
                byte[][] inbox;
                synchronized (this) {
                    call = ++calls;
                    inbox = fenced.isEmpty() ? INBOX : INBOX_NOW;
                }
                Object reply;
                try {
                    reply = conn.call(inbox);
                } catch (IOException | UncheckedIOException e) {
                    end();
                    return;
                } catch (RuntimeException e) {
                    if (!isClosed() && "UNBLOCKED".equals(RedisError.codeOf(e))) {
                        // The server was demoted (Redis answers a blocked module command itself); the events
                        // stay in the inbox for the next read.
                        pause(100);
                        continue;
                    }
                    end(); // NOSESSION, or anything else: this session is not usable
                    return;
                }
                if (reply instanceof List) {
                    for (Object event : (List<?>) reply) {
                        dispatch((List<?>) event, sid);
                    }
                }
                synchronized (this) {
                    fenced.removeIf(wait -> {
                        if (wait.fencedAfter >= call) {
                            return false;
                        }
                        wait.events.add(new Event(Event.FENCED, 0, "", sid));
                        return true;
                    });
                }
                if (!isCurrent(this)) {
                    end();
                    return;
                }
            }
        }

        /** After the last event read: the session is over, and each of its waits is told to send itself again. */
        private void end() {
            synchronized (this) {
                ended = true;
                fenced.clear();
            }
            forget(sid);
            closeQuietly(conn);
            if (isClosed()) {
                return;
            }
            for (Wait wait : pending.values()) {
                if (sid.equals(wait.sessionId)) {
                    wait.events.add(new Event(Event.BROKEN, 0, "", sid));
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
        if (wait != null) {
            wait.events.add(new Event(kind, token, detail, sid));
        }
        // else: a wait that went on to another node's session, which the resend of its same request ID answers
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
