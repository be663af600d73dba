package io.flock;

import java.util.Objects;
import java.util.concurrent.ScheduledFuture;

/** What this client knows of one thread's grant of one lock: its token, and its watchdog and whether it lost it. */
final class Grant {
    final Key key;
    final byte[] lockKey;
    final byte[] owner;
    final long token;
    volatile ScheduledFuture<?> watchdog;
    volatile long confirmedNanos = System.nanoTime();
    /** Null while the lease is believed held; else why the watchdog found it gone. */
    volatile String lostReason;

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
