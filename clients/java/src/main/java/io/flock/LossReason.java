package io.flock;

import java.util.Locale;

/**
 * Why a grant was lost (docs/client-protocol.md, "Losses"): {@link #reason()} and {@link #toString()} give the
 * lowercase word every FLOCK client uses, which is also what a {@link LeaseLostListener} is told.
 */
public enum LossReason {
    /** A fixed lease reached its deadline, or the server pushed {@code lost ... expired}. */
    EXPIRED,
    /**
     * A session grant's or watchdog grant's deadline passed without a heartbeat or renewal reply confirming it (a
     * silent or unreachable server, or this process paused past it).
     */
    UNCONFIRMED,
    /** The session that held it closed or expired: its grants ended with it, and are never taken again quietly. */
    SESSIONENDED,
    /** {@code FLOCK.FORCERELEASE} (pushed by the server). */
    FORCERELEASED,
    /** The key was deleted, overwritten or evicted (pushed by the server). */
    DELETED,
    /** The server stopped being a master (pushed by the server). */
    DEMOTED,
    /**
     * A renewal or check answered {@code NOTOWNER}, or {@link FlockLock#fenced} was refused {@code STALE}: the
     * server no longer counts the grant, and this client learnt it by asking.
     */
    NOTOWNER;

    /**
     * The lowercase word, as every FLOCK client names the loss: {@code expired}, {@code unconfirmed},
     * {@code sessionended}, {@code forcereleased}, {@code deleted}, {@code demoted} or {@code notowner}.
     *
     * @return the word
     */
    public String reason() {
        return name().toLowerCase(Locale.ROOT);
    }

    /**
     * The lowercase word ({@link #reason()}).
     *
     * @return the word
     */
    @Override
    public String toString() {
        return reason();
    }

    /**
     * The reason named by {@code word} (any case), as a {@code lost} event of the server says it.
     *
     * @param word a loss reason's word
     * @return the reason, or null for a word that names none
     */
    public static LossReason of(String word) {
        for (LossReason r : values()) {
            if (r.reason().equalsIgnoreCase(word)) {
                return r;
            }
        }
        return null;
    }
}
