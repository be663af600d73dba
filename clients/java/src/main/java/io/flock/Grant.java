package io.flock;

import java.util.ArrayList;
import java.util.List;
import java.util.Objects;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.atomic.AtomicBoolean;

/** What this client knows of one thread's grant of one lock: its token, its watchdog and whether it was lost. */
final class Grant {
    final Key key;
    final byte[] lockKey;
    final byte[] owner;
    final long token;
    /** The mode options of the ACQUIRE that took it (SHARED, PERMITS n LIMIT m), for a reentry. */
    final List<byte[]> acquireOptions;
    /** Held by unlock() and by a re-watch (a hold added and released): they never interleave. */
    final Object holdsLock = new Object();
    /**
     * The holds the thread took of this grant and has not released: when its last is released and the server
     * still counts some, those are holds the thread does not know of (a failover lost the reply of one of its
     * acquires, or of a give-back), and unlock() releases them too.
     */
    int holds;
    /** The session it lives with (lease-ms 0, and a reentry of such a grant): it ends with it. Null if none. */
    volatile Session.Reader session;
    /** The session that watches it (pushes its loss), to watch it from a new one when this one ends; or null. */
    volatile Session.Reader watcher;
    /** Its own lease in ms: 0 for none (it lives with its session); fixed, or renewed by the watchdog. */
    volatile long leaseMs;
    volatile boolean renewed;
    /**
     * With a lease of its own: its local deadline (nanoTime), the send time of the command that started or last
     * renewed the lease (whose reply came) + the lease - the drift margin.
     */
    volatile long leaseDeadline;
    /** The watchdog's renewals and the timer at the lease deadline; guarded by this grant. */
    ScheduledFuture<?> watchdog;
    ScheduledFuture<?> deadlineCheck;
    /** A renewal is under way (the watchdog starts none meanwhile). */
    final AtomicBoolean renewing = new AtomicBoolean();
    /**
     * Null while the grant is believed held; else why it is gone: the server's pushed reason (expired,
     * forcereleased, deleted, demoted), its deadline's (expired, unconfirmed), its session's end
     * (sessionended) or a renewal's answer (notowner).
     */
    volatile LossReason lostReason;
    /** The loss in words, for the exception of a later unlock. */
    volatile String lostMessage;

    Grant(Key key, byte[] lockKey, byte[] owner, long token, List<byte[]> acquireOptions) {
        this.key = key;
        this.lockKey = lockKey;
        this.owner = owner;
        this.token = token;
        this.acquireOptions = acquireOptions;
    }

    /** A reentry (one more hold, the lease reset) that moves the grant's watch to session {@code sessionId}. */
    byte[][] rewatchArgs(long leaseMs, String sessionId) {
        List<byte[]> args = new ArrayList<>(List.of(FlockClient.bytes("FLOCK.ACQUIRE"), lockKey, owner,
                FlockClient.bytes(Long.toString(leaseMs))));
        args.addAll(acquireOptions);
        args.addAll(List.of(FlockClient.bytes("INBOX"), FlockClient.bytes(sessionId), FlockClient.bytes("ID"),
                FlockClient.requestId()));
        return args.toArray(new byte[0][]);
    }

    byte[][] releaseArgs() {
        return new byte[][] {FlockClient.bytes("FLOCK.RELEASE"), lockKey, owner, FlockClient.bytes("ID"),
            FlockClient.requestId()};
    }

    byte[][] renewArgs(long leaseMs) {
        return new byte[][] {
            FlockClient.bytes("FLOCK.RENEW"), lockKey, owner, FlockClient.bytes(Long.toString(leaseMs)),
            FlockClient.bytes("ID"), FlockClient.requestId()
        };
    }

    /**
     * Why the grant is lost by {@code now} on its deadlines, or null: its own lease's (a fixed lease: expired; the
     * watchdog's: unconfirmed) or its session's (unconfirmed).
     */
    LossReason due(long now) {
        if (leaseMs > 0 && now - leaseDeadline >= 0) {
            return renewed ? LossReason.UNCONFIRMED : LossReason.EXPIRED;
        }
        Session.Reader s = session;
        return s != null && now - s.deadline() >= 0 ? LossReason.UNCONFIRMED : null;
    }

    /** A renewal sent at {@code sentNanos} was answered: the lease runs from then at least. */
    synchronized void confirmed(long sentNanos, long lease) {
        long deadline = Protocol.deadline(sentNanos, lease);
        if (leaseMs > 0 && deadline - leaseDeadline > 0) {
            leaseDeadline = deadline;
        }
    }

    synchronized void stopWatchdog() {
        if (watchdog != null) {
            watchdog.cancel(false);
            watchdog = null;
        }
    }

    synchronized void cancelDeadline() {
        if (deadlineCheck != null) {
            deadlineCheck.cancel(false);
            deadlineCheck = null;
        }
    }

    /** No more renewals nor lease deadline (it lives with its session now). */
    synchronized void cancelTimers() {
        stopWatchdog();
        cancelDeadline();
    }

    /** Released or lost: no timer, and its session no longer ends it. */
    void stop() {
        cancelTimers();
        Session.Reader s = session;
        if (s != null) {
            s.unbind(this);
        }
    }

    /** A lock name and a thread: grants are per thread, like the owners. */
    static final class Key {
        final String name;
        final long threadId;

        Key(String name, long threadId) {
            this.name = name;
            this.threadId = threadId;
        }

        @Override
        public boolean equals(Object o) {
            return o instanceof Key && ((Key) o).name.equals(name) && ((Key) o).threadId == threadId;
        }

        @Override
        public int hashCode() {
            return Objects.hash(name, threadId);
        }
    }
}
