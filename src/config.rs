//! Module settings: `loadmodule ... max-waiters N max-lease-ms N`, and
//! `CONFIG GET/SET flock.*` at run time.

use std::sync::atomic::{AtomicI64, Ordering};

use crate::args::MAX_MS;

pub const DEFAULT_MAX_WAITERS: i64 = 100_000;

/// Waiters one lock may queue: bounds the memory a client can pin.
pub static MAX_WAITERS: AtomicI64 = AtomicI64::new(DEFAULT_MAX_WAITERS);

/// The longest lease (and WAIT timeout) a command may ask for.
pub static MAX_LEASE_MS: AtomicI64 = AtomicI64::new(MAX_MS as i64);

pub fn max_waiters() -> usize {
    usize::try_from(MAX_WAITERS.load(Ordering::Relaxed)).unwrap_or(usize::MAX)
}

pub fn max_lease_ms() -> u64 {
    u64::try_from(MAX_LEASE_MS.load(Ordering::Relaxed)).unwrap_or(MAX_MS)
}
