package io.flock;

/**
 * A grant that fewer replicas than {@link FlockConfig#setDurableReplicas} asked for acknowledged within
 * {@link FlockConfig#setDurableTimeout} (or that was gone before they could: {@code RENEW} answered
 * {@code NOTOWNER}). The client gave the hold back ({@code FLOCK.RELEASE}; a multi-lock's, every key's with
 * {@code FLOCK.RELEASEALL}) before it threw this: the acquire did not take the lock (a reentry's earlier holds
 * stay). Its code is {@code NOTDURABLE}; the message names the key, the count reached and the count asked.
 *
 * <p>Unchecked, as every error of this client: {@code lock()}, {@code tryLock(...)} and the semaphore's
 * {@code acquire}/{@code tryAcquire} throw it only when durable grants are on.
 */
public class LockNotDurableException extends RedisError {
    private static final long serialVersionUID = 1L;

    /** The lock's key. */
    private final String key;
    /** How many replicas acknowledged the grant. */
    private final long reached;
    /** How many were asked for. */
    private final int requested;

    LockNotDurableException(String key, long reached, int requested, String why, Throwable cause) {
        super("NOTDURABLE lock '" + key + "': " + reached + " of " + requested
                + " replicas acknowledged the grant; " + why + "; the hold was given back");
        this.key = key;
        this.reached = reached;
        this.requested = requested;
        if (cause != null) {
            initCause(cause);
        }
    }

    /**
     * The lock's key.
     *
     * @return the key (the lock's or semaphore's name; a multi-lock's keys, comma-separated)
     */
    public String getKey() {
        return key;
    }

    /**
     * How many replicas acknowledged the grant ({@code WAIT}'s answer); 0 when no answer came.
     *
     * @return the count reached
     */
    public long getReplicasReached() {
        return reached;
    }

    /**
     * How many were asked for ({@link FlockConfig#setDurableReplicas}).
     *
     * @return the count asked
     */
    public int getReplicasRequested() {
        return requested;
    }
}
