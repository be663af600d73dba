//! Durations as the server takes them (whole milliseconds, a wait as its
//! `WAIT` argument says it), and the protocol's shared constants
//! (docs/client-protocol.md, "The rules every client shares"): the
//! heartbeat, the drift margin, the watchdog's lease and the cancel grace.

use std::time::Duration;

use flock_core::limits::MAX_MS;

/// As `wait`: queue without a time limit (`WAIT 0` on the server).
pub const FOREVER: Duration = Duration::MAX;

/// The cancel grace: how long past its own time a session wait waits for
/// the server's `timeout` before it sends `FLOCK.CANCEL`, and then for the
/// wait's last event before it gives up.
pub const WAIT_MARGIN: Duration = Duration::from_secs(2);

/// The same 2 s under the protocol's name for it.
pub const CANCEL_GRACE: Duration = WAIT_MARGIN;

/// The session reader's `FLOCK.INBOX` waits at most the session timeout
/// divided by this (the server answers nil by then: the heartbeat).
pub const HEARTBEAT_FRACTION: u32 = 4;

/// The fixed part of the drift margin, in ms: a deadline is taken in by
/// this plus [`DRIFT_MARGIN_PERCENT`] of the lease or timeout it counts.
pub const DRIFT_MARGIN_MS: u64 = 10;

/// The proportional part of the drift margin, in percent.
pub const DRIFT_MARGIN_PERCENT: u32 = 1;

/// The lease the protocol gives a grant that a watchdog renews (a grant
/// taken without a session): pass it to [`Lock::new`](crate::Lock::new)
/// for a lock without a session whose guard's
/// [`watchdog`](crate::Guard::watchdog) keeps it.
pub const WATCHDOG_LEASE: Duration = Duration::from_secs(30);

/// A watchdog renews its grant every lease divided by this.
pub const WATCHDOG_RENEW_FRACTION: u32 = 3;

/// The session timeout the server has by default
/// (`flock.session-timeout-ms`); the client uses the one the server answers.
pub(crate) const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// The drift margin of a lease or timeout `d`: 10 ms + 1% of it.
pub(crate) fn margin(d: Duration) -> Duration {
    Duration::from_millis(DRIFT_MARGIN_MS) + d * DRIFT_MARGIN_PERCENT / 100
}

/// A wait as `WAIT timeout-ms` says it: `None` (or zero) tries once,
/// [`FOREVER`] or more than 2^40 ms is `0` (no limit).
pub(crate) fn wait_ms(wait: Option<Duration>) -> Option<u64> {
    wait.filter(|w| !w.is_zero()).map(|w| Some(millis(w)).filter(|&ms| ms <= MAX_MS).unwrap_or(0))
}

/// Whole milliseconds, rounded up, at least 1.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_margin_is_ten_ms_and_one_percent() {
        assert_eq!(margin(Duration::from_secs(10)), Duration::from_millis(110));
        assert_eq!(margin(Duration::from_millis(400)), Duration::from_millis(14));
        assert_eq!(margin(Duration::ZERO), Duration::from_millis(10));
    }
}
