package io.flock;

import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

/**
 * A semaphore of {@code limit} permits on one FLOCK key ({@code PERMITS n LIMIT m}), with Redisson's
 * {@code RSemaphore} / {@code RPermitExpirableSemaphore} shapes. Permits are held by an owner, as a lock is:
 * {@code <client UUID>:<thread id>}, with a lease (or none: they live with the client's session) and a fencing token. A
 * thread holds one grant of n permits at a time: acquiring again with the same n adds a hold (each needs a
 * {@link #release()}), another n is an error. Requests are served in FIFO order, and a request that does not
 * fit stops the queue: a big request at the head is not overtaken by smaller ones, nor by a try. With durable
 * grants ({@link FlockConfig#setDurableReplicas}) an acquire of permits waits for the replicas as a lock's does
 * ({@link LockNotDurableException}, the permits given back).
 */
public final class FlockSemaphore {
    private final FlockClient client;
    private final String name;
    private final int limit;
    /** RELEASE and INFO carry no mode, so any view of the key serves them. */
    private final FlockLock anyView;

    FlockSemaphore(FlockClient client, String name, int limit) {
        this.client = client;
        this.name = name;
        this.limit = limit;
        this.anyView = permits(1);
    }

    /**
     * The semaphore's name.
     *
     * @return the Redis key
     */
    public String getName() {
        return name;
    }

    /**
     * The m of {@code PERMITS n LIMIT m}: fixed when the key is created (Redisson's trySetPermits).
     *
     * @return the number of permits in all
     */
    public int getLimit() {
        return limit;
    }

    /**
     * This semaphore as a {@link FlockLock} that takes {@code n} permits: the whole lock interface (lease times,
     * tokens, interruptible waits) for a request of n.
     *
     * @param n the permits each grant takes, 1 to the limit
     * @return the lock view
     */
    public FlockLock permits(int n) {
        return new FlockLock(client, name, FlockClient.bytes("PERMITS"), FlockClient.bytes(Integer.toString(n)),
                FlockClient.bytes("LIMIT"), FlockClient.bytes(Integer.toString(limit)));
    }

    /**
     * Waits in the queue for one permit; no lease time (they live with the client's session).
     *
     * @throws InterruptedException if interrupted while waiting (the waiter leaves the queue)
     */
    public void acquire() throws InterruptedException {
        acquire(1);
    }

    /**
     * Waits in the queue for {@code permits} permits, taken as one grant; no lease time.
     *
     * @param permits how many, 1 to the limit
     * @throws InterruptedException if interrupted while waiting (the waiter leaves the queue)
     */
    public void acquire(int permits) throws InterruptedException {
        permits(permits).lockInterruptibly();
    }

    /**
     * RPermitExpirableSemaphore's lease: the permits come back by themselves after {@code leaseTime}.
     *
     * @param permits how many, 1 to the limit
     * @param leaseTime how long the grant lasts (no watchdog)
     * @param unit the unit of {@code leaseTime}
     * @throws InterruptedException if interrupted while waiting (the waiter leaves the queue)
     */
    public void acquire(int permits, long leaseTime, TimeUnit unit) throws InterruptedException {
        permits(permits).lockInterruptibly(leaseTime, unit);
    }

    /**
     * One permit if it is free and nobody queues (a try never overtakes the queue).
     *
     * @return true if granted
     */
    public boolean tryAcquire() {
        return tryAcquire(1);
    }

    /**
     * {@code permits} permits if they are free and nobody queues.
     *
     * @param permits how many, 1 to the limit
     * @return true if granted
     */
    public boolean tryAcquire(int permits) {
        return permits(permits).tryLock();
    }

    /**
     * Waits up to {@code waitTime} for one permit; no lease time.
     *
     * @param waitTime how long to wait in the queue
     * @param unit the unit of {@code waitTime}
     * @return true if granted
     * @throws InterruptedException if interrupted while waiting (the waiter leaves the queue)
     */
    public boolean tryAcquire(long waitTime, TimeUnit unit) throws InterruptedException {
        return tryAcquire(1, waitTime, unit);
    }

    /**
     * Waits up to {@code waitTime} for {@code permits} permits; no lease time.
     *
     * @param permits how many, 1 to the limit
     * @param waitTime how long to wait in the queue
     * @param unit the unit of {@code waitTime}
     * @return true if granted
     * @throws InterruptedException if interrupted while waiting (the waiter leaves the queue)
     */
    public boolean tryAcquire(int permits, long waitTime, TimeUnit unit) throws InterruptedException {
        return tryAcquire(permits, waitTime, -1, unit);
    }

    /**
     * Waits up to {@code waitTime}; {@code leaseTime} &le; 0 means none (they live with the client's session).
     *
     * @param permits how many, 1 to the limit
     * @param waitTime how long to wait in the queue
     * @param leaseTime how long the grant lasts; &le; 0: none, they live with the client's session (the
     *     watchdog's lease, renewed until release, without one)
     * @param unit the unit of both times
     * @return true if granted
     * @throws InterruptedException if interrupted while waiting (the waiter leaves the queue)
     */
    public boolean tryAcquire(int permits, long waitTime, long leaseTime, TimeUnit unit) throws InterruptedException {
        return permits(permits).tryLock(waitTime, leaseTime, unit);
    }

    /**
     * Releases one hold of the current thread's grant; its permits return once the holds reach 0.
     * {@link IllegalMonitorStateException} if the thread holds none.
     */
    public void release() {
        anyView.unlock();
    }

    /**
     * The permits no holder has now (waiters may already be owed them).
     *
     * @return the limit minus the permits held
     */
    public int availablePermits() {
        Map<String, Object> info = anyView.info();
        if (info == null) {
            return limit;
        }
        long held = 0;
        for (Object holder : (List<?>) info.get("holders")) {
            held += (Long) ((Map<?, ?>) holder).get("permits");
        }
        return (int) (limit - held);
    }

    /**
     * The fencing token of the current thread's grant.
     *
     * @return the token
     * @throws IllegalMonitorStateException if the current thread holds no permits
     */
    public long getToken() {
        return anyView.getToken();
    }

    /**
     * Runs {@code command} only while the current thread's permits are still held, in one step on the server
     * ({@code FLOCK.FENCED} with the grant's token), as {@link FlockLock#fenced}: so that a holder whose permits
     * ran out while it was paused cannot write over the work of the one they went to next.
     *
     * @param command the command and its arguments ({@code String}, {@code byte[]} or number each)
     * @return the command's reply
     * @throws StaleTokenException if the grant has ended (nothing ran; it is lost from then on) or is known lost
     *     here (nothing sent)
     * @throws IllegalMonitorStateException if the current thread holds no permits (nothing sent)
     */
    public Object fenced(Object... command) {
        return anyView.fenced(command);
    }

    /**
     * True once the current thread's grant is known gone, as {@link FlockLock#isLeaseLost()}.
     *
     * @return whether the current thread's grant was lost
     */
    public boolean isLeaseLost() {
        return anyView.isLeaseLost();
    }

    /**
     * Takes every permit back from every holder (FLOCK.FORCERELEASE).
     *
     * @return true if anyone held some
     */
    public boolean forceRelease() {
        return anyView.forceUnlock();
    }

    /**
     * FLOCK.INFO, as {@link FlockLock#info()}.
     *
     * @return the semaphore's fields, or null when nobody holds permits
     */
    public Map<String, Object> info() {
        return anyView.info();
    }
}
