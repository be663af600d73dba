package io.flock;

/**
 * Told once per grant found lost, with the reason's word ({@link LossReason#reason()}). When the server pushes
 * the loss through the client's session ({@code expired}: the lease ran out; {@code forcereleased};
 * {@code deleted}: the key was deleted; {@code demoted}: the server stopped being a master), on the session's
 * reader thread. When a deadline passes ({@code expired}: a fixed lease's; {@code unconfirmed}: no heartbeat
 * confirmed the session a grant lives with, or no watchdog renewal confirmed its lease, in time), on the client's
 * timer thread, or on the thread whose {@code isLeaseLost()} or {@code unlock()} saw the deadline passed first.
 * When the session a grant lived with ended ({@code sessionended}: its connection closed, or the server no
 * longer knew it), on the session's reader thread. When a renewal or re-watch was refused ({@code notowner}), on
 * an I/O thread of the client; when {@link FlockLock#fenced} was refused {@code STALE} ({@code notowner}), on the
 * thread that called it, before it throws. Keep it short: the reader hands out the next events after it, and the timer
 * runs the next deadlines after it.
 */
@FunctionalInterface
public interface LeaseLostListener {
    /**
     * A grant of this client was found lost.
     *
     * @param lockName the lock's key
     * @param threadId the id of the thread that held it
     * @param token the lost grant's fencing token
     * @param reason why, as {@link LossReason#reason()} words it: {@code expired}, {@code unconfirmed},
     *     {@code sessionended}, {@code forcereleased}, {@code deleted}, {@code demoted} or {@code notowner}
     */
    void onLeaseLost(String lockName, long threadId, long token, String reason);
}
