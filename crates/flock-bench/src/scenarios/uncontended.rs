//! `uncontended`: every client locks and unlocks a key of its own.

use std::time::Duration;

use redis::RedisResult;

use crate::client::{now_ns, Client};
use crate::methods::{Kind, Method};
use crate::results::Metric;
use crate::runner::{run_method, Run};
use crate::server::{measure_busy, Server};
use crate::stats::latency_us;
use crate::stop::Stop;

pub const PAIRS: Metric = Metric::median("pairs/s");
pub const ACQUIRE_P50: Metric = Metric::median("acquire p50 us");
pub const ACQUIRE_P99: Metric = Metric::median("acquire p99 us");
pub const REQUESTS: Metric = Metric::worst("req/pair");
pub const SERVER: Metric = Metric::median("server us/pair");

const LEASE_MS: u64 = 30_000;

/// What one client saw: latencies in ns and the requests it sent.
#[derive(Default)]
pub struct Pairs {
    pub acquire: Vec<u64>,
    pub pair: Vec<u64>,
    pub requests: u64,
}

/// Acquire+release pairs, one after another, each client on its own key.
pub fn pairs(server: &Server, kind: Kind, clients: usize, duration: Duration) -> RedisResult<Run<Pairs>> {
    run_method(server, kind, clients, duration, lock_own_key)
}

fn lock_own_key(i: usize, c: &mut Client, method: &mut dyn Method, stop: &Stop) -> RedisResult<Pairs> {
    let (key, owner) = (format!("own:{i}"), format!("c{i}"));
    let mut pairs = Pairs::default();
    while !stop.is_set() {
        c.mark();
        let start = now_ns();
        if !method.acquire(c, &key, &owner, LEASE_MS, stop)? {
            break;
        }
        let acquired = now_ns();
        method.release(c, &key, &owner)?;
        pairs.pair.push(now_ns() - start);
        pairs.acquire.push(acquired - start);
        pairs.requests += c.sent().requests;
    }
    Ok(pairs)
}

pub fn run(server: &Server, kind: Kind, clients: usize, duration: Duration) -> RedisResult<Vec<(Metric, f64)>> {
    let (run, busy) = measure_busy(server, || pairs(server, kind, clients, duration))?;
    let seconds = run.seconds();
    let (mut acquire, mut requests) = (Vec::new(), 0);
    for p in run.results {
        acquire.extend(p.acquire);
        requests += p.requests;
    }
    let count = acquire.len() as f64;
    let [p50, p99, _] = latency_us(acquire);
    Ok(vec![
        (PAIRS, count / seconds),
        (ACQUIRE_P50, p50),
        (ACQUIRE_P99, p99),
        (REQUESTS, requests as f64 / count),
        (SERVER, busy / count),
    ])
}
