package io.flock;

import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.Lock;

/**
 * The {@link Lock} interface and Redisson's {@code RLock} shapes of {@link FlockLock} and {@link FlockMultiLock},
 * once, over the one acquire each implements: every {@code lock}, {@code lockInterruptibly} and {@code tryLock}
 * is an {@link #acquire} with a wait and a lease. {@code T} is what a grant answers: a fencing token, or one per
 * key. The public methods here are documented on both classes (as their own), so their comments say where the
 * two differ ("a {@link FlockMultiLock}: ...").
 *
 * <p>The two classes declare {@code implements Lock}, not this one: were these methods overrides of
 * {@link Lock}'s, Javadoc would point the classes' {@code {@link #lock()}} at {@code java.util}'s page instead
 * of their own.
 *
 * @param <T> a grant's fencing token ({@code Long}), or tokens ({@code List<Long>})
 */
abstract class AbstractFlockLock<T> {
    /** {@link #acquire}'s {@code waitMs} of a wait without limit. */
    static final long FOREVER = -1;
    /** {@link #acquire}'s {@code leaseMs} of the watchdog's lease, renewed until the unlock. */
    static final long WATCHDOG = -1;

    /**
     * waitMs: 0 tries only, {@link #FOREVER} queues without limit; leaseMs: {@link #WATCHDOG} (other values
     * &le; 0: the watchdog's timeout, without the watchdog), or the lease. Returns the grant's token(s), or null
     * if not granted (a try, or a wait that ran out). Not interruptible: an interrupt keeps the wait going and
     * the thread's flag stays set (as ReentrantLock); interruptible: it ends the wait (a grant that raced it is
     * given back) and throws.
     */
    abstract T acquire(long waitMs, long leaseMs, boolean interruptible) throws InterruptedException;

    /**
     * The {@code leaseMs} of {@code lock(leaseTime, unit)} and {@code lockInterruptibly(leaseTime, unit)}: as
     * {@link #leaseMs} ({@code leaseTime} &le; 0 is the watchdog's lease) unless the class says otherwise.
     */
    long lockLeaseMs(long leaseTime, TimeUnit unit) {
        return leaseMs(leaseTime, unit);
    }

    /** A lease time as {@link #acquire}'s {@code leaseMs}: &le; 0 is the watchdog's lease, else at least 1 ms. */
    static long leaseMs(long leaseTime, TimeUnit unit) {
        return leaseTime > 0 ? Math.max(1, unit.toMillis(leaseTime)) : WATCHDOG;
    }

    /** {@link #acquire} without limit, not interruptibly. */
    final T lockUninterruptibly(long leaseMs) {
        try {
            return acquire(FOREVER, leaseMs, false);
        } catch (InterruptedException impossible) {
            throw new AssertionError("an uninterruptible wait was interrupted", impossible);
        }
    }

    /** One try with the watchdog's lease: the token(s), or null when busy. */
    final T tryOnce() {
        try {
            return acquire(0, WATCHDOG, false);
        } catch (InterruptedException impossible) {
            throw new AssertionError("a try never waits", impossible);
        }
    }

    /** Redisson's {@code tryLock(waitTime, leaseTime, unit)}: waitTime &le; 0 tries once; leaseTime as leaseMs. */
    final T tryAcquire(long waitTime, long leaseTime, TimeUnit unit) throws InterruptedException {
        return acquire(waitTime > 0 ? Math.max(1, unit.toMillis(waitTime)) : 0, leaseMs(leaseTime, unit), true);
    }

    // --- java.util.concurrent.locks.Lock (but unlock(), each class's own) ---

    /**
     * Waits in the queue (a {@link FlockMultiLock}: in every key's queue at once), without limit, not answering
     * interrupts (as ReentrantLock); no lease time: a {@link FlockLock}'s grant lives with the client's session, a
     * {@link FlockMultiLock}'s has the watchdog's lease.
     */
    public void lock() {
        lockUninterruptibly(WATCHDOG);
    }

    /**
     * Waits in the queue (a {@link FlockMultiLock}: in every key's queue); an interrupt ends the wait on the
     * server and throws, after giving back a grant that won the race. A {@link FlockLock}'s wait is taken off the
     * server's queue ({@code FLOCK.CANCEL}); a {@link FlockMultiLock}'s is unblocked ({@code CLIENT UNBLOCK}:
     * it leaves every queue).
     *
     * @throws InterruptedException if interrupted while waiting (a grant that raced it is given back)
     */
    public void lockInterruptibly() throws InterruptedException {
        acquire(FOREVER, WATCHDOG, true);
    }

    /**
     * Takes the lock if it is free and nobody queues for it (a try never overtakes the queue). A
     * {@link FlockMultiLock} takes every key if each is free and nobody queues for it, or held by this thread;
     * else none.
     *
     * @return true if granted
     */
    public boolean tryLock() {
        return tryOnce() != null;
    }

    /**
     * Waits up to {@code time} (&le; 0: tries once) without a lease time: {@code tryLock(time, -1, unit)}.
     *
     * @param time how long to wait in the queue (a {@link FlockMultiLock}: in every key's queue)
     * @param unit the unit of {@code time}
     * @return true if granted (a {@link FlockMultiLock}: if every key was granted; none is taken otherwise)
     * @throws InterruptedException if interrupted while waiting (a grant that raced it is given back)
     */
    public boolean tryLock(long time, TimeUnit unit) throws InterruptedException {
        return tryLock(time, WATCHDOG, unit);
    }

    /**
     * Not supported: FLOCK has no condition variables (Redisson's {@code RLock} and multi-lock do not have them
     * either).
     *
     * @return never: throws {@link UnsupportedOperationException}
     */
    public Condition newCondition() {
        throw new UnsupportedOperationException("FLOCK locks have no conditions");
    }

    // --- Redisson's RLock shapes ---

    /**
     * Waits without limit (not interruptibly); the grant (a {@link FlockMultiLock}: every key's) ends after
     * {@code leaseTime} unless unlocked first.
     *
     * @param leaseTime how long the grant (a {@link FlockMultiLock}: each key's) lasts (no watchdog); a
     *     {@link FlockMultiLock} takes &le; 0 as the watchdog's lease, renewed until unlock
     * @param unit the unit of {@code leaseTime}
     */
    public void lock(long leaseTime, TimeUnit unit) {
        lockUninterruptibly(lockLeaseMs(leaseTime, unit));
    }

    /**
     * {@code lock(leaseTime, unit)} that an interrupt ends: the wait leaves the server's queue (a
     * {@link FlockMultiLock}'s: every key's queue).
     *
     * @param leaseTime how long the grant (a {@link FlockMultiLock}: each key's) lasts (no watchdog); a
     *     {@link FlockMultiLock} takes &le; 0 as the watchdog's lease, renewed until unlock
     * @param unit the unit of {@code leaseTime}
     * @throws InterruptedException if interrupted while waiting (a grant that raced it is given back)
     */
    public void lockInterruptibly(long leaseTime, TimeUnit unit) throws InterruptedException {
        acquire(FOREVER, lockLeaseMs(leaseTime, unit), true);
    }

    /**
     * Waits up to {@code waitTime} (&le; 0: tries once; a {@link FlockMultiLock}: for every key);
     * {@code leaseTime} &le; 0 means none of its own.
     *
     * @param waitTime how long to wait in the queue (a {@link FlockMultiLock}: in every key's queue)
     * @param leaseTime how long the grant (a {@link FlockMultiLock}: each key's) lasts; &le; 0: a {@link FlockLock}'s
     *     lives with the client's session, a {@link FlockMultiLock}'s gets the watchdog's lease, renewed until
     *     unlock
     * @param unit the unit of both times
     * @return true if granted (a {@link FlockMultiLock}: if every key was granted; none is taken otherwise)
     * @throws InterruptedException if interrupted while waiting (a grant that raced it is given back)
     */
    public boolean tryLock(long waitTime, long leaseTime, TimeUnit unit) throws InterruptedException {
        return tryAcquire(waitTime, leaseTime, unit) != null;
    }
}
