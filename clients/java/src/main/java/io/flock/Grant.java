package io.flock;

import java.util.ArrayList;
import java.util.List;
import java.util.Objects;
import java.util.concurrent.ScheduledFuture;

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
    volatile ScheduledFuture<?> watchdog;
    /** Without a watchdog: when the lease ends at the latest (nanoTime); 0 while a watchdog renews it. */
    volatile long leaseEndNanos;
    volatile long confirmedNanos = System.nanoTime();
    /**
     * Null while the lease is believed held; else why it is gone: the server's pushed reason (expired,
     * forcereleased, deleted, demoted) or the watchdog's (NOTOWNER, UNCONFIRMED).
     */
    volatile String lostReason;
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

    void stopWatchdog() {
        ScheduledFuture<?> running = watchdog;
        if (running != null) {
            running.cancel(false);
            watchdog = null;
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
