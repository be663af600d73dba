package io.flock;

/**
 * Told once when a watchdog finds that a grant it renews is gone: {@code NOTOWNER} (the lease ran out or
 * someone called FORCERELEASE) or {@code UNCONFIRMED} (no renewal got through for a whole lease). Runs on
 * the watchdog thread: keep it short.
 */
@FunctionalInterface
public interface LeaseLostListener {
    void onLeaseLost(String lockName, long threadId, long token, String reason);
}
