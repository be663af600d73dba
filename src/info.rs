//! The `INFO flock` section.

use std::sync::atomic::Ordering;

use redis_module::{InfoContext, RedisResult};
use redis_module_macros::info_command_handler;

use crate::clock;
use crate::ffi;
use crate::state::{self, State};
use crate::value::LIVE_LOCKS;
use flock_core::distributions::{Distribution, Distributions};
use flock_core::effects::Counter;

#[info_command_handler]
fn flock_info(ctx: &InfoContext, _for_crash_report: bool) -> RedisResult<()> {
    // The crash report may call this while FLOCK's own code holds the state:
    // it then shows the live locks alone (counted outside the state) rather
    // than panic in the handler.
    let (numbers, texts) = state::try_with(|s| (numbers(s), distributions(&s.observed.distributions)))
        .unwrap_or_else(|| (vec![("locks", LIVE_LOCKS.load(Ordering::Relaxed))], Vec::new()));
    ffi::info_section(ctx, &numbers, &texts);
    Ok(())
}

fn numbers(s: &State) -> Vec<(&'static str, u64)> {
    let handoffs = &s.observed.distributions.handoffs;
    let mut fields = vec![
        ("locks", LIVE_LOCKS.load(Ordering::Relaxed)),
        ("waiters", s.waiters.len() as u64),
        ("leases", s.leases.len() as u64),
    ];
    fields.extend(Counter::ALL.iter().map(|&c| (c.name(), s.counters.get(c))));
    fields.extend([
        ("handoff_latency_mean_us", handoffs.mean()),
        ("handoff_latency_max_us", handoffs.max()),
        ("eviction_unsafe", u64::from(s.eviction.policy.is_some())),
        ("eviction_refused_acquires", s.eviction_refused),
        ("sessions", s.sessions.len() as u64),
        ("remembered_free_locks", s.remembered.len() as u64),
        ("clock_steps", clock::steps()),
        ("contended_locks", s.observed.contended.len() as u64),
        ("longlog_len", s.observed.longlog.len() as u64),
    ]);
    fields
}

/// Each distribution as `INFO latencystats` shows one: all waits, holds
/// and hand-offs, then each way a wait or hold ended that was seen.
fn distributions(d: &Distributions) -> Vec<(String, String)> {
    let line = |name: String, d: &Distribution| (name, d.summary());
    let mut texts = vec![
        line("wait_percentiles_usec".into(), &Distributions::all(d.waits())),
        line("hold_percentiles_usec".into(), &Distributions::all(d.holds())),
        line("handoff_percentiles_usec".into(), &d.handoffs),
    ];
    for (kind, each) in [("wait", d.waits().collect::<Vec<_>>()), ("hold", d.holds().collect())] {
        let seen = each.into_iter().filter(|(_, d)| !d.is_empty());
        texts.extend(seen.map(|(ended, d)| line(format!("{kind}_percentiles_usec_{ended}"), d)));
    }
    texts
}
