package io.flock;

import java.util.concurrent.locks.ReadWriteLock;

/**
 * Redisson's {@code RReadWriteLock} on one FLOCK key: {@link #readLock()} takes it {@code SHARED}, {@link
 * #writeLock()} exclusively; both are {@link FlockLock}s (session grants, tokens, request IDs as for any lock).
 * One FIFO queue serves both: readers behind a waiting writer wait too (no writer starvation). A writer may also
 * take the read lock (one more hold on its write grant); a reader asking for the write lock gets {@link UpgradeException}.
 */
public final class FlockReadWriteLock implements ReadWriteLock {
    private final String name;
    private final FlockLock read;
    private final FlockLock write;

    FlockReadWriteLock(FlockClient client, String name) {
        this.name = name;
        this.read = new FlockLock(client, name, FlockClient.bytes("SHARED"));
        this.write = new FlockLock(client, name);
    }

    /**
     * The lock's name.
     *
     * @return the Redis key of both views
     */
    public String getName() {
        return name;
    }

    @Override
    public FlockLock readLock() {
        return read;
    }

    @Override
    public FlockLock writeLock() {
        return write;
    }
}
