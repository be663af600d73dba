package io.flock;

/**
 * {@code UPGRADE}: the thread holds the lock shared (a read lock) and asked for it exclusively (the write lock).
 * It would wait for itself, so the server refuses and changes nothing: unlock every read hold first.
 */
public class UpgradeException extends RedisError {
    private static final long serialVersionUID = 1L;

    UpgradeException(Throwable cause) {
        super(cause);
    }
}
