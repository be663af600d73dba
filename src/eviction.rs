//! Eviction safety. Lock keys have no TTL, so `volatile-*` maxmemory
//! policies never evict them and `noeviction` refuses the ACQUIRE (it is
//! `deny-oom`) instead; but an `allkeys-*` policy evicts a held lock like any
//! cache entry: its waiters get LOCKDELETED and the next ACQUIRE is granted
//! while the holder still believes it holds the lock. No module API up to
//! Redis 8 exempts a key from eviction (`RM_SetLRU`/`RM_SetLFU` only bias
//! the sampling, and not under `allkeys-random`), so while such a policy is
//! in force ACQUIRE grants nothing unless `flock.allow-eviction` is on.
//!
//! The policy is read at load and after every CONFIG SET, and cached: the
//! check in ACQUIRE reads one field.

use std::sync::atomic::Ordering;

use redis_module::{Context, RedisError};

use crate::config;
use crate::errors;
use crate::ffi;
use crate::state::{Risk, State};
use crate::value::LIVE_LOCKS;

/// Reads the memory settings again (at load and after every CONFIG SET)
/// and logs when the risk changed.
pub fn refresh(ctx: &Context, s: &mut State) {
    // INFO memory rather than CONFIG GET: it bypasses the command table, so
    // a renamed or disabled CONFIG command cannot hide the policy.
    let (maxmemory, policy) = ffi::memory_settings(ctx);
    let risk = Risk {
        policy: (maxmemory > 0 && policy.starts_with("allkeys-")).then_some(policy),
        allowed: config::allow_eviction(),
    };
    let (before, waiters) = (std::mem::replace(&mut s.eviction, risk.clone()), s.waiters.len());
    if before == risk || (before.policy.is_none() && risk.policy.is_none()) {
        return;
    }
    let locks = LIVE_LOCKS.load(Ordering::Relaxed);
    let message = match &risk.policy {
        None => "maxmemory settings no longer evict lock keys: FLOCK.ACQUIRE grants locks again".to_string(),
        Some(policy) if risk.allowed => format!(
            "maxmemory-policy {policy} with maxmemory {maxmemory} can evict lock keys and flock.allow-eviction is yes: \
             FLOCK keeps granting, so a held lock may be evicted and granted to another owner while its holder still believes it holds it"
        ),
        Some(policy) => format!(
            "maxmemory-policy {policy} with maxmemory {maxmemory} can evict lock keys: FLOCK.ACQUIRE is refused (EVICTION) \
             until the policy is volatile-* or noeviction, or flock.allow-eviction is yes; the locks held now ({locks}) and the waiters \
             queued now ({waiters}) carry on (release, renew, hand-off) but can be evicted"
        ),
    };
    // RM_Log takes a format string; the policy is one of Redis's names, but
    // keep any `%` literal anyway.
    let message = message.replace('%', "%%");
    if risk.policy.is_some() {
        ctx.log_warning(&message);
    } else {
        ctx.log_notice(&message);
    }
}

/// Refuses an ACQUIRE while the policy can evict the lock it would grant.
pub fn check_acquire(s: &mut State) -> Result<(), RedisError> {
    if config::allow_eviction() {
        return Ok(());
    }
    let Some(policy) = &s.eviction.policy else { return Ok(()) };
    s.eviction_refused += 1;
    Err(errors::eviction(policy))
}
