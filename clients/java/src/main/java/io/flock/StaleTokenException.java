package io.flock;

/**
 * {@code STALE}: {@link FlockLock#fenced} sent a command with the fencing token of this thread's grant after that
 * grant had ended on the server (its lease ran out while the thread was paused, it was force-released, the key was
 * deleted), so the server ran nothing; or the grant was already known lost here, so nothing was sent. It is an
 * {@link IllegalMonitorStateException}, the exception of a lock that is not held, because that is what it
 * means: code that already catches a lost lock at {@code unlock()} or {@code getToken()} catches this too. The
 * grant is lost from then on ({@link FlockLock#isLeaseLost()}; {@link LossReason#NOTOWNER} when the server's
 * refusal is how this client learnt of it) and the next {@code unlock()} throws. The message is the server's
 * {@code STALE} text when it refused, which says what holds the lock now; its cause is the reply's exception
 * (a {@link RedisError}, or the adapter's).
 */
public class StaleTokenException extends IllegalMonitorStateException {
    private static final long serialVersionUID = 1L;

    StaleTokenException(String message, Throwable cause) {
        super(message);
        if (cause != null) {
            initCause(cause);
        }
    }
}
