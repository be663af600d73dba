package io.flock;

/**
 * Told once per grant found lost. At once when the server pushes the loss through the client's session
 * (reason {@code expired}: the lease ran out; {@code forcereleased}; {@code deleted}: the key was deleted;
 * {@code demoted}: the server stopped being a master), on the session's reader thread; or when a watchdog
 * renewal finds the grant gone ({@code NOTOWNER}) or no renewal got through for a whole lease
 * ({@code UNCONFIRMED}), on the watchdog thread. Keep it short: the reader hands out the next events after it.
 */
@FunctionalInterface
public interface LeaseLostListener {
    /**
     * A grant of this client was found lost.
     *
     * @param lockName the lock's key
     * @param threadId the id of the thread that held it
     * @param token the lost grant's fencing token
     * @param reason {@code expired}, {@code forcereleased}, {@code deleted}, {@code demoted}, {@code NOTOWNER}
     *     or {@code UNCONFIRMED}
     */
    void onLeaseLost(String lockName, long threadId, long token, String reason);
}
