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
    void onLeaseLost(String lockName, long threadId, long token, String reason);
}
