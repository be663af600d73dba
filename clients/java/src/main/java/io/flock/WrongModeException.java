package io.flock;

/**
 * {@code WRONGMODE}: the key is a lock and was asked for as a semaphore, or it is a semaphore and was asked for
 * as a lock or with another limit. Nothing changed.
 */
public class WrongModeException extends RedisError {
    private static final long serialVersionUID = 1L;

    WrongModeException(Throwable cause) {
        super(cause);
    }
}
