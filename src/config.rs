//! Module settings: `loadmodule ... name value ...` (docs/configuration.md),
//! and `CONFIG GET/SET flock.*` at run time.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Mutex;

use redis_module::enum_configuration;

use flock_core::args::SESSION_TIMEOUTS;
use flock_core::limits::{MAX_LOCK_DELAY_MS, MAX_MS};
use flock_core::longlog::Limits;

pub const DEFAULT_MAX_WAITERS: i64 = 100_000;

/// Waiters one lock may queue: bounds the memory a client can pin.
pub static MAX_WAITERS: AtomicI64 = AtomicI64::new(DEFAULT_MAX_WAITERS);

/// The longest lease (and WAIT timeout) a command may ask for.
pub static MAX_LEASE_MS: AtomicI64 = AtomicI64::new(MAX_MS as i64);

pub const DEFAULT_RETRY_WINDOW_MS: i64 = 60_000;

/// How long a command sent with `ID request-id` is remembered, so that a
/// resend is answered the same and applied once.
pub static RETRY_WINDOW_MS: AtomicI64 = AtomicI64::new(DEFAULT_RETRY_WINDOW_MS);

pub fn retry_window_ms() -> u64 {
    u64::try_from(RETRY_WINDOW_MS.load(Ordering::Relaxed)).unwrap_or(DEFAULT_RETRY_WINDOW_MS as u64)
}

/// How long a lock stays closed after a grant ends without its holder
/// releasing it (lease end, session end), for a grant whose ACQUIRE gave no
/// `LOCKDELAY`; read when the grant is made. 0: none.
pub static LOCK_DELAY_MS: AtomicI64 = AtomicI64::new(0);

pub fn lock_delay_ms(asked: Option<u32>) -> u32 {
    asked.unwrap_or_else(|| u32::try_from(LOCK_DELAY_MS.load(Ordering::Relaxed)).unwrap_or(0))
}

pub const DEFAULT_SESSION_TIMEOUT_MS: i64 = 10_000;

/// How long a session lives without being heard from, unless it asked for
/// its own (`FLOCK.SESSION TIMEOUT ms`); read at each renewal.
pub static SESSION_TIMEOUT_MS: AtomicI64 = AtomicI64::new(DEFAULT_SESSION_TIMEOUT_MS);

pub fn session_timeout_ms() -> u64 {
    u64::try_from(SESSION_TIMEOUT_MS.load(Ordering::Relaxed)).unwrap_or(DEFAULT_SESSION_TIMEOUT_MS as u64)
}

/// The operator accepts that an `allkeys-*` maxmemory policy may evict held
/// locks (see `eviction`): ACQUIRE grants under it anyway.
pub static ALLOW_EVICTION: AtomicBool = AtomicBool::new(false);

enum_configuration! {
    /// Which keys of other types FLOCK waits for as locks held outside it
    /// (`legacy`): the option's values are the names.
    #[allow(non_camel_case_types)]
    #[derive(PartialEq, Eq, Debug)]
    pub enum LegacyLocks {
        /// String keys with a TTL, as every `SET key value NX PX` lock is.
        ttl = 0,
        /// Any string key (locks set without an expiry too).
        all = 1,
        /// None: `WRONGTYPE`, as before.
        no = 2,
    }
}

pub static LEGACY_LOCKS: Mutex<LegacyLocks> = Mutex::new(LegacyLocks::ttl);

pub fn legacy_locks() -> LegacyLocks {
    LEGACY_LOCKS.lock().map_or(LegacyLocks::ttl, |l| l.clone())
}

pub fn max_waiters() -> usize {
    usize::try_from(MAX_WAITERS.load(Ordering::Relaxed)).unwrap_or(usize::MAX)
}

pub fn max_lease_ms() -> u64 {
    u64::try_from(MAX_LEASE_MS.load(Ordering::Relaxed)).unwrap_or(MAX_MS)
}

pub fn allow_eviction() -> bool {
    ALLOW_EVICTION.load(Ordering::Relaxed)
}

/// `flock.longlog-hold-ms`, `flock.longlog-wait-ms` (0: off) and
/// `flock.longlog-max-len`: what `FLOCK.LONGLOG` keeps.
pub const DEFAULT_LONGLOG_HOLD_MS: i64 = 60_000;
pub static LONGLOG_HOLD_MS: AtomicI64 = AtomicI64::new(DEFAULT_LONGLOG_HOLD_MS);
pub const DEFAULT_LONGLOG_WAIT_MS: i64 = 10_000;
pub static LONGLOG_WAIT_MS: AtomicI64 = AtomicI64::new(DEFAULT_LONGLOG_WAIT_MS);
pub const DEFAULT_LONGLOG_MAX_LEN: i64 = 128;
pub const MAX_LONGLOG_LEN: i64 = 100_000;
pub static LONGLOG_MAX_LEN: AtomicI64 = AtomicI64::new(DEFAULT_LONGLOG_MAX_LEN);

pub fn longlog_limits() -> Limits {
    let read = |v: &AtomicI64| u64::try_from(v.load(Ordering::Relaxed)).unwrap_or(0);
    Limits {
        hold_ms: read(&LONGLOG_HOLD_MS),
        wait_ms: read(&LONGLOG_WAIT_MS),
        max_len: usize::try_from(read(&LONGLOG_MAX_LEN)).unwrap_or(0),
    }
}

/// Checks `loadmodule` arguments, which the crate applies without the checks
/// that CONFIG SET makes (it reads any bool other than `yes` as `no`): name
/// value pairs of known options, numbers in range, bools `yes` or `no`.
pub fn check_load_args(args: &[&[u8]]) -> Result<(), String> {
    const USAGE: &str = "max-waiters N max-lease-ms N retry-window-ms N session-timeout-ms N lock-delay-ms N \
                         longlog-hold-ms N longlog-wait-ms N longlog-max-len N allow-eviction yes|no legacy-locks ttl|all|no";
    if !args.len().is_multiple_of(2) {
        return Err(format!("module arguments are name value pairs: {USAGE}"));
    }
    for pair in args.chunks(2) {
        let name = String::from_utf8_lossy(pair[0]);
        let (min, max) = match &*name {
            "max-waiters" => (1, i64::MAX),
            "max-lease-ms" | "retry-window-ms" => (1, MAX_MS as i64),
            "session-timeout-ms" => (*SESSION_TIMEOUTS.start() as i64, *SESSION_TIMEOUTS.end() as i64),
            "lock-delay-ms" => (0, MAX_LOCK_DELAY_MS as i64),
            "longlog-hold-ms" | "longlog-wait-ms" => (0, MAX_MS as i64),
            "longlog-max-len" => (0, MAX_LONGLOG_LEN),
            "allow-eviction" if matches!(pair[1], b"yes" | b"no") => continue,
            "allow-eviction" => return Err("module argument allow-eviction must be yes or no".into()),
            "legacy-locks" if matches!(pair[1], b"ttl" | b"all" | b"no") => continue,
            "legacy-locks" => return Err("module argument legacy-locks must be ttl, all or no".into()),
            _ => return Err(format!("unknown module argument '{name}': known are {USAGE}")),
        };
        // Plain digits, as commands take numbers (Rust's parse takes a sign).
        let digits = !pair[1].is_empty() && pair[1].iter().all(u8::is_ascii_digit);
        let value = std::str::from_utf8(pair[1]).ok().filter(|_| digits).and_then(|v| v.parse::<i64>().ok());
        if !value.is_some_and(|v| (min..=max).contains(&v)) {
            return Err(format!("module argument {name} must be an integer from {min} to {max}"));
        }
    }
    Ok(())
}
