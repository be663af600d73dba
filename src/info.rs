//! The `INFO flock` section.

use std::sync::atomic::Ordering;

use redis_module::{InfoContext, RedisResult};
use redis_module_macros::info_command_handler;

use crate::clock;
use crate::ffi;
use crate::state;
use crate::value::LIVE_LOCKS;
use flock_core::effects::Counter;

#[info_command_handler]
fn flock_info(ctx: &InfoContext, _for_crash_report: bool) -> RedisResult<()> {
    // The crash report may call this while FLOCK's own code holds the state:
    // it then shows the counters as zero rather than panic in the handler.
    let (counters, waiters, leases, latency, unsafe_policy, refused, sessions, remembered) = state::try_with(|s| {
        (
            s.counters,
            s.waiters.len(),
            s.leases.len(),
            s.handoff_latency,
            s.eviction.policy.is_some(),
            s.eviction_refused,
            s.sessions.len(),
            s.remembered.len(),
        )
    })
    .unwrap_or_default();
    let mut fields =
        vec![("locks", LIVE_LOCKS.load(Ordering::Relaxed)), ("waiters", waiters as u64), ("leases", leases as u64)];
    fields.extend(Counter::ALL.iter().map(|&c| (c.name(), counters.get(c))));
    fields.extend([
        ("handoff_latency_mean_us", latency.mean_us()),
        ("handoff_latency_max_us", latency.max_us),
        ("eviction_unsafe", u64::from(unsafe_policy)),
        ("eviction_refused_acquires", refused),
        ("sessions", sessions as u64),
        ("remembered_free_locks", remembered as u64),
        ("clock_steps", clock::steps()),
    ]);
    ffi::info_section(ctx, &fields);
    Ok(())
}
