package io.flock;

/**
 * {@code DEADLOCK}: the wait would never end, because its owner (this thread) would wait, through the holders and
 * waiters of the lock and what they wait for in turn, for itself; the message names the owners of the cycle. The
 * server queued nothing and changed nothing: unlock what this thread holds and try again.
 */
public class DeadlockException extends RedisError {
    private static final long serialVersionUID = 1L;

    DeadlockException(Throwable cause) {
        super(cause);
    }
}
