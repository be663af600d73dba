//! The `INFO flock` section.

use std::sync::atomic::Ordering;

use redis_module::{InfoContext, RedisResult};
use redis_module_macros::info_command_handler;

use crate::ffi;
use crate::state;
use crate::value::LIVE_LOCKS;

#[info_command_handler]
fn flock_info(ctx: &InfoContext, _for_crash_report: bool) -> RedisResult<()> {
    // The crash report may call this while FLOCK's own code holds the state:
    // it then shows the counters as zero rather than panic in the handler.
    let (stats, waiters, leases, unsafe_policy) =
        state::try_with(|s| (s.stats, s.waiters.len(), s.deadlines.len(), s.eviction.policy.is_some()))
            .unwrap_or_default();
    let fields: [(&str, u64); 22] = [
        ("locks", LIVE_LOCKS.load(Ordering::Relaxed)),
        ("waiters", waiters as u64),
        ("leases", leases as u64),
        ("grants", stats.grants),
        ("immediate_grants", stats.immediate_grants),
        ("handoffs", stats.handoffs),
        ("reentrant_acquires", stats.reentrant),
        ("releases", stats.releases),
        ("lease_expiries", stats.expiries),
        ("force_releases", stats.force_releases),
        ("session_releases", stats.session_releases),
        ("deletions", stats.deletions),
        ("undelivered_grants", stats.undelivered),
        ("wait_timeouts", stats.wait_timeouts),
        ("wait_disconnects", stats.wait_disconnects),
        ("waiters_deleted", stats.waiters_deleted),
        ("waiters_demoted", stats.waiters_demoted),
        ("waiters_resent", stats.waiters_resent),
        ("handoff_latency_mean_us", stats.handoff_us_mean()),
        ("handoff_latency_max_us", stats.handoff_us_max),
        ("eviction_unsafe", u64::from(unsafe_policy)),
        ("eviction_refused_acquires", stats.eviction_refused),
    ];
    ffi::info_section(ctx, &fields);
    Ok(())
}
