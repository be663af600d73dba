package io.flock;

import java.util.Objects;
import java.util.concurrent.ScheduledFuture;

/** What this client knows of one thread's grant of one lock: its token, its watchdog and whether it was lost. */
final class Grant {
    final Key key;
    final byte[] lockKey;
    final byte[] owner;
    final long token;
    volatile ScheduledFuture<?> watchdog;
    volatile long confirmedNanos = System.nanoTime();
    /**
     * Null while the lease is believed held; else why it is gone: the server's pushed reason (expired,
     * forcereleased, deleted, demoted) or the watchdog's (NOTOWNER, UNCONFIRMED).
     */
    volatile String lostReason;
    /** The loss in words, for the exception of a later unlock. */
    volatile String lostMessage;

    Grant(Key key, byte[] lockKey, byte[] owner, long token) {
        this.key = key;
        this.lockKey = lockKey;
        this.owner = owner;
        this.token = token;
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
