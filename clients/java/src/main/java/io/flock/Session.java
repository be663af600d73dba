package io.flock;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

/**
 * The client's FLOCK session on its server: one connection of its own, opened on first use, that called
 * {@code FLOCK.SESSION} and then loops {@code FLOCK.INBOX} on a daemon reader thread. Every thread's wait is
 * one {@code FLOCK.ACQUIRE ... WAIT t INBOX <id>} on a command connection; the server answers
 * {@code WAITING} and the outcome comes through here, matched to the waiting thread by (key, owner). Losses
 * of watched grants ({@code lost}) are handed to the client at once, in the server's order.
 *
 * <p>Events carry no request ID, so a wait stays registered until the server can have nothing more for it
 * (see {@link FlockLock}): a thread's next wait of the same lock never takes its last one's event. When the
 * session connection breaks (or an ACQUIRE answers {@code NOSESSION}) the session is forgotten, and its reader,
 * once it has handed out every event it read, tells each of its waits ({@link Event#BROKEN}); the waiting
 * thread then registers again, which opens a new session, and resends its ACQUIRE there with its same request
 * ID.
 *
 * <p>The session's timeout T is the one its {@code FLOCK.SESSION [TIMEOUT ms] WITHTIMEOUT} answered. Each
 * {@code FLOCK.INBOX} read waits at most T/3 on the server (whose nil reply is the heartbeat), and the session's
 * local deadline is the send time of the last read (or of FLOCK.SESSION) whose reply came, plus T, less the drift
 * margin ({@link Protocol}). A read may take until that deadline; when it passes unconfirmed a timer reports every
 * grant that lives with the session lost ({@link LossReason#UNCONFIRMED}) and closes the connection, so that the
 * server ends them too if it had not yet. A session that ends otherwise (its connection closed, NOSESSION) ends
 * those grants on the server: they are reported lost ({@link LossReason#SESSIONENDED}), never taken again.
 */
final class Session implements AutoCloseable {
    private static final byte[][] INBOX_NOW = {FlockClient.bytes("FLOCK.INBOX"), FlockClient.bytes("1")};

    /** A wait's identity on the server: key and owner, as raw bytes (ISO-8859-1 keeps them exact). */
    record WaitKey(String key, String owner) {
        static WaitKey of(byte[] key, byte[] owner) {
            return new WaitKey(new String(key, StandardCharsets.ISO_8859_1),
                    new String(owner, StandardCharsets.ISO_8859_1));
        }
    }

    /**
     * An outcome pushed to a wait: the server's (granted, timeout, cancelled, error) or the client's own; the
     * session that read it ({@code reader}, null for {@link #CLOSED}) and when it sent the read that brought it.
     */
    record Event(String kind, long token, String detail, Reader reader, long readSentNanos) {
        /** The ID of the session that read it ("" for none). */
        String sessionId() {
            return reader == null ? "" : reader.sid;
        }

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
    /** The last session opened (current, or ended or ending). */
    private Reader previous;
    private boolean closed;
    /** Sessions opened so far (tests: a broken session was replaced). */
    private int opened;
    /** The last timeout a server answered (or, before, the one asked for, else the server default). */
    private volatile long timeoutMs;

    Session(FlockClient client, ConnectionFactory factory) {
        this.client = client;
        this.factory = factory;
        this.timeoutMs = client.sessionTimeoutMs > 0 ? client.sessionTimeoutMs : Protocol.DEFAULT_SESSION_TIMEOUT_MS;
    }

    /** The open session's ID, opening one first if there is none. */
    String id() throws IOException {
        return current().sid;
    }

    /** The open session, opening one first if there is none. */
    Reader current() throws IOException {
        awaitLastEnded();
        synchronized (state) {
            return openIfNeeded();
        }
    }

    /**
     * Before a new session is opened: the last one's reader has handed out every event it read and reported
     * the grants that lived with it lost, so that no thread of this process is granted through the new session
     * before a loss of the old one is known. (It ends at once once its connection closed, by its deadline at the
     * latest.)
     */
    private void awaitLastEnded() {
        Reader last;
        synchronized (state) {
            last = current == null ? previous : null;
        }
        if (last != null) {
            last.awaitEnd();
        }
    }

    /** The session timeout T of the last session opened (before any: the one asked for, else 10 s). */
    long timeoutMs() {
        return timeoutMs;
    }

    /**
     * Registers {@code wait} under the open session (opening one if needed) and returns that session's ID; null
     * while the session it was sent to last is ending here (its {@link Event#BROKEN} comes once its reader has
     * handed out every event it read, which may be this wait's). A wait sent to another node before (a Cluster
     * slot moved) leaves that node's session.
     */
    String register(Wait wait) throws IOException {
        awaitLastEnded();
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
        long timeout;
        long sent = System.nanoTime();
        try {
            List<?> reply = (List<?>) Timed.call(conn, (int) Protocol.heartbeatMs(timeoutMs), sessionArgs());
            sid = FlockLock.text(reply.get(0));
            timeout = (Long) reply.get(1);
        } catch (IOException | RuntimeException e) {
            closeQuietly(conn);
            if (e instanceof UncheckedIOException) {
                throw ((UncheckedIOException) e).getCause();
            }
            throw e;
        }
        timeoutMs = timeout;
        current = new Reader(sid, conn, timeout, Protocol.deadline(sent, timeout));
        previous = current;
        opened++;
        current.thread.start();
        current.watchDeadline();
        return current;
    }

    /** FLOCK.SESSION [TIMEOUT ms] WITHTIMEOUT: the reply names the timeout the session keeps. */
    private byte[][] sessionArgs() {
        if (client.sessionTimeoutMs > 0) {
            return new byte[][] {FlockClient.bytes("FLOCK.SESSION"), FlockClient.bytes("TIMEOUT"),
                FlockClient.bytes(Long.toString(client.sessionTimeoutMs)), FlockClient.bytes("WITHTIMEOUT")};
        }
        return new byte[][] {FlockClient.bytes("FLOCK.SESSION"), FlockClient.bytes("WITHTIMEOUT")};
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
            wait.events.add(new Event(Event.CLOSED, 0, "", null, 0));
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

    /**
     * One session: its connection, its timeout and deadline, the grants that live with it, and the daemon thread
     * that loops FLOCK.INBOX on it, handing out the events in the server's order.
     */
    final class Reader {
        final String sid;
        final FlockConnection conn;
        final Thread thread;
        /** T: the timeout the server answered for this session. */
        final long timeoutMs;
        /** The local deadline (nanoTime): moved on by each read's reply, by the reader thread alone. */
        private volatile long deadline;
        /** The grants that live with this session (lease-ms 0): they end with it. */
        private final Set<Grant> grants = ConcurrentHashMap.newKeySet();
        /** INBOX calls sent so far; guarded by this reader, as is the next one. */
        private long calls;
        private final List<Wait> fenced = new ArrayList<>();
        private volatile boolean ended;
        /** Its deadline passed unconfirmed: it was ended here. */
        private volatile boolean expired;
        /** Its last read got no reply by the deadline. */
        private volatile boolean unconfirmed;

        Reader(String sid, FlockConnection conn, long timeoutMs, long deadline) {
            this.sid = sid;
            this.conn = conn;
            this.timeoutMs = timeoutMs;
            this.deadline = deadline;
            this.thread = new Thread(this::read, "flock-session-reader");
            thread.setDaemon(true);
        }

        Session session() {
            return Session.this;
        }

        boolean ended() {
            return ended;
        }

        /** Ended, or found past its deadline: the grants that lived with it are gone. */
        boolean gone() {
            return ended || expired;
        }

        /** Ended, or no longer the session its node sends waits to. */
        boolean over() {
            return ended || !isCurrent(this);
        }

        /**
         * Waits for the reader to have handed out its last events and ended (the server said NOSESSION: its
         * connection is closed or closing), at the latest until its deadline, when it ends by itself.
         */
        void awaitEnd() {
            if (Thread.currentThread() == thread) {
                return;
            }
            try {
                thread.join(Math.max(1, TimeUnit.NANOSECONDS.toMillis(deadline - System.nanoTime()) + 1));
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }

        /** When the grants that live with it are lost unless a read's reply confirms it first (nanoTime). */
        long deadline() {
            return deadline;
        }

        /**
         * {@code grant} lives with this session from now on (ends with it); null, or why it is lost already: the
         * session ended before (the server ended the grant with it) or its deadline passed.
         */
        LossReason bind(Grant grant) {
            grants.add(grant);
            if (ended || expired || System.nanoTime() - deadline >= 0) {
                grants.remove(grant);
                return lossNow();
            }
            return null;
        }

        void unbind(Grant grant) {
            grants.remove(grant);
        }

        /** Why a grant that lived with this session is lost, the session being over. */
        private LossReason lossNow() {
            return expired || unconfirmed || System.nanoTime() - deadline >= 0 ? LossReason.UNCONFIRMED
                    : LossReason.SESSIONENDED;
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

        /** On the client's timer at the deadline: moved on meanwhile, or the session is over here. */
        void watchDeadline() {
            if (ended) {
                return;
            }
            long left = deadline - System.nanoTime();
            if (left > 0) {
                client.schedule(this::watchDeadline, left);
                return;
            }
            expire();
        }

        /**
         * The deadline passed unconfirmed (seen by the timer, or by a check of the clock): every grant that lives
         * with the session is lost, and the session is over here.
         */
        void expire() {
            synchronized (this) {
                if (expired) {
                    return;
                }
                expired = true;
            }
            for (Grant grant : grants) {
                client.leaseLost(grant, LossReason.UNCONFIRMED, "no heartbeat of the session confirmed it for its "
                        + "timeout (" + timeoutMs + " ms): the server may have ended it");
            }
            // The server ends the session's grants when it sees the connection close, if it has not already; the
            // reader's read fails at once and its waits are sent again on a new session.
            forget(sid);
            closeQuietly(conn);
        }

        /**
         * A read sent at {@code sent} waits T/4, or half the time left to the deadline when that is less (a pause or a
         * slow reply held up its send), so that its answer comes back well before the deadline.
         */
        private byte[][] inbox(long sent) {
            long waitMs = Math.max(1, Math.min(Protocol.heartbeatMs(timeoutMs), (deadline - sent) / 2_000_000));
            return new byte[][] {FlockClient.bytes("FLOCK.INBOX"), FlockClient.bytes(Long.toString(waitMs))};
        }

        /** FLOCK.INBOX until the connection breaks, the session is forgotten or the client closes. */
        private void read() {
            while (true) {
                long call;
                byte[][] args;
                long sent = System.nanoTime();
                if (deadline - sent <= 0 || expired) {
                    end();
                    return;
                }
                synchronized (this) {
                    call = ++calls;
                    args = fenced.isEmpty() ? inbox(sent) : INBOX_NOW;
                }
                Object reply;
                try {
                    // At the deadline the client's timer tells the session's losses and then closes this
                    // connection, which ends the read: its own limit is a backstop a heartbeat later, so that the
                    // connection never closes (and the server passes the grants on) before the losses are told.
                    reply = Timed.call(conn, (int) (Protocol.msUntil(deadline) + Protocol.heartbeatMs(timeoutMs)),
                            args);
                } catch (IOException | UncheckedIOException e) {
                    // no reply by the deadline: the session is unconfirmed, whatever the clock says now
                    unconfirmed = e instanceof java.net.SocketTimeoutException;
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
                long confirmed = Protocol.deadline(sent, timeoutMs);
                if (System.nanoTime() - deadline >= 0) {
                    // Answered after the deadline: its losses stand (a check of the clock may have seen them),
                    // and the session is over here; the reply's events are still handed out.
                    expire();
                } else if (confirmed - deadline > 0) {
                    deadline = confirmed;
                }
                if (reply instanceof List) {
                    for (Object event : (List<?>) reply) {
                        dispatch((List<?>) event, this, sent);
                    }
                }
                synchronized (this) {
                    fenced.removeIf(wait -> {
                        if (wait.fencedAfter >= call) {
                            return false;
                        }
                        wait.events.add(new Event(Event.FENCED, 0, "", this, sent));
                        return true;
                    });
                }
                if (!isCurrent(this)) {
                    end();
                    return;
                }
            }
        }

        /**
         * After the last event read: the session is over. The grants that lived with it are lost (the server
         * ended them with it), and each of its waits is told to send itself again.
         */
        private void end() {
            synchronized (this) {
                ended = true;
                fenced.clear();
            }
            LossReason why = lossNow();
            for (Grant grant : grants) {
                client.leaseLost(grant, why, why == LossReason.UNCONFIRMED
                        ? "no heartbeat of the session confirmed it for its timeout (" + timeoutMs + " ms)"
                        : "the session it lived with ended (its connection closed): the server ended the grant");
            }
            grants.clear();
            forget(sid);
            closeQuietly(conn);
            if (isClosed()) {
                return;
            }
            for (Wait wait : pending.values()) {
                if (sid.equals(wait.sessionId)) {
                    wait.events.add(new Event(Event.BROKEN, 0, "", this, 0));
                }
            }
        }
    }

    /** One event, in the server's order: a loss to the client at once, an outcome to its wait. */
    private void dispatch(List<?> event, Reader reader, long readSent) {
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
            client.movedAway(new String(key, StandardCharsets.UTF_8), new String(owner, StandardCharsets.UTF_8), token,
                    reader);
            return;
        }
        Wait wait = pending.get(WaitKey.of(key, owner));
        if (wait != null) {
            wait.events.add(new Event(kind, token, detail, reader, readSent));
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
