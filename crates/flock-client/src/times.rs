//! Durations as the server takes them: whole milliseconds, a wait as its
//! `WAIT` argument says it, and how long past its time a wait is waited for.

use std::time::Duration;

use flock_core::limits::MAX_MS;

/// As `wait`: queue without a time limit (`WAIT 0` on the server).
pub const FOREVER: Duration = Duration::MAX;

/// How long past its own time a session wait waits for the server's
/// `timeout` before it sends `FLOCK.CANCEL`, and then for the wait's last
/// event before it gives up.
pub const WAIT_MARGIN: Duration = Duration::from_secs(2);

/// A wait as `WAIT timeout-ms` says it: `None` (or zero) tries once,
/// [`FOREVER`] or more than 2^40 ms is `0` (no limit).
pub(crate) fn wait_ms(wait: Option<Duration>) -> Option<u64> {
    wait.filter(|w| !w.is_zero()).map(|w| Some(millis(w)).filter(|&ms| ms <= MAX_MS).unwrap_or(0))
}

/// Whole milliseconds, rounded up, at least 1.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX).max(1)
}
