package io.flock;

import java.util.concurrent.TimeUnit;

/**
 * The rules every FLOCK client shares (docs/client-protocol.md, "The rules every client shares"; the same values
 * as the {@code protocol} block of clients/scenarios.json, which a test checks): how often a session is heard
 * from, how much a deadline is taken in by, and how long a cancelled wait waits for its answer.
 */
final class Protocol {
    /** A session's heartbeat: each FLOCK.INBOX read waits at most this fraction of the session timeout. */
    static final int HEARTBEAT_FRACTION = 4;
    /** The drift margin: this many milliseconds ... */
    static final long DRIFT_MARGIN_MS = 10;
    /** ... plus this percent of the lease or timeout it applies to. */
    static final long DRIFT_MARGIN_PERCENT = 1;
    /** A watchdog grant's lease is renewed every this fraction of it. */
    static final int WATCHDOG_RENEW_FRACTION = 3;
    /** A wait whose FLOCK.CANCEL got no answer nor event within this closes its session's connection. */
    static final long CANCEL_GRACE_MS = 2_000;
    /** The session timeout when neither the user nor a server has named one yet (the server's default). */
    static final long DEFAULT_SESSION_TIMEOUT_MS = 10_000;

    private Protocol() {
    }

    /** The drift margin of a lease or timeout of {@code spanMs}, in nanoseconds: 10 ms + 1% of it. */
    static long marginNanos(long spanMs) {
        return TimeUnit.MILLISECONDS.toNanos(DRIFT_MARGIN_MS + spanMs * DRIFT_MARGIN_PERCENT / 100);
    }

    /**
     * The local deadline of a lease or session timeout of {@code spanMs} that began on the server no earlier than
     * {@code sentNanos} (the send time of the command it answered, on System.nanoTime()): taken in by the margin.
     */
    static long deadline(long sentNanos, long spanMs) {
        return sentNanos + TimeUnit.MILLISECONDS.toNanos(spanMs) - marginNanos(spanMs);
    }

    /** How long a command the client sends for itself may take when no deadline bounds it: a quarter of T. */
    static long heartbeatMs(long sessionTimeoutMs) {
        return Math.max(1, sessionTimeoutMs / HEARTBEAT_FRACTION);
    }

    /**
     * Milliseconds from now until {@code deadlineNanos}, rounded up (a command given this much ends at the deadline
     * or after, never before it), at least 1 (a socket timeout of 0 would mean none).
     */
    static int msUntil(long deadlineNanos) {
        long ms = TimeUnit.NANOSECONDS.toMillis(deadlineNanos - System.nanoTime() + 999_999);
        return (int) Math.max(1, Math.min(Integer.MAX_VALUE, ms));
    }
}
