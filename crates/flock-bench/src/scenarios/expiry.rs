//! `expiry`: holders that never release. Every client takes the lock with
//! a 200 ms lease and abandons it, then queues again under a new owner
//! name, so every grant after the first comes from a lease running out.

use std::time::Duration;

use redis::RedisResult;

use crate::client::{now_ns, Client};
use crate::methods::{Kind, Method};
use crate::results::Metric;
use crate::runner::run_method;
use crate::server::Server;
use crate::stats::latency_us;
use crate::stop::Stop;

pub const HANDOFFS: Metric = Metric::median("hand-offs");
pub const DELAY_P50: Metric = Metric::median("delay p50 ms");
pub const DELAY_MAX: Metric = Metric::worst("delay max ms");
pub const WAITING_REQUESTS: Metric = Metric::worst("max req waiting");

const KEY: &str = "expiry";
pub const LEASE_MS: u64 = 200;

pub fn run(server: &Server, kind: Kind, clients: usize, duration: Duration) -> RedisResult<Vec<(Metric, f64)>> {
    let run = run_method(server, kind, clients, duration, abandon_locks)?;
    let mut grants: Vec<(u64, u64)> = run.results.concat().into_iter().filter(|&(at, _)| at <= run.end).collect();
    grants.sort_unstable();
    // The deadline is the previous grant as its client saw it plus the
    // lease: late by one reply's trip through loopback, tens of µs.
    let lease_ns = LEASE_MS * 1_000_000;
    let mut delays: Vec<u64> = grants.windows(2).map(|w| w[1].0.saturating_sub(w[0].0 + lease_ns)).collect();
    // A lease that ended with no grant before the end of the run (someone
    // always waits) counts with the time it has waited so far.
    if let Some(&(last, _)) = grants.last() {
        delays.extend(run.end.checked_sub(last + lease_ns));
    }
    // Every acquire sends one request to join; the rest were sent waiting.
    let waiting = grants.iter().skip(1).map(|&(_, requests)| requests - 1).max().map_or(f64::NAN, |r| r as f64);
    let [p50, _, max] = latency_us(delays);
    Ok(vec![
        (HANDOFFS, grants.len().saturating_sub(1) as f64),
        (DELAY_P50, p50 / 1e3),
        (DELAY_MAX, max / 1e3),
        (WAITING_REQUESTS, waiting),
    ])
}

/// Client `i`: take the lock under a new name each time and never release
/// it. When each grant was seen, and the requests its acquire sent.
fn abandon_locks(i: usize, c: &mut Client, method: &mut dyn Method, stop: &Stop) -> RedisResult<Vec<(u64, u64)>> {
    let mut grants = Vec::new();
    for n in 0.. {
        c.mark();
        if stop.is_set() || !method.acquire(c, KEY, &format!("c{i}-{n}"), LEASE_MS, stop)? {
            break;
        }
        grants.push((now_ns(), c.sent().requests));
    }
    Ok(grants)
}
