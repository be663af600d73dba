//! `ping`: PING round trips, the ceiling for one command per round trip.

use std::time::Duration;

use redis::{Cmd, RedisResult};

use crate::client::now_ns;
use crate::results::Metric;
use crate::runner::run_clients;
use crate::server::Server;
use crate::stats::latency_us;

pub const OPS: Metric = Metric::median("ops/s");
pub const P50: Metric = Metric::median("p50 us");
pub const P99: Metric = Metric::median("p99 us");

pub fn run(server: &Server, clients: usize, duration: Duration) -> RedisResult<Vec<(Metric, f64)>> {
    let [ops, p50, p99] = round_trips(server, clients, duration, |_| Ok(redis::cmd("PING")))?;
    Ok(vec![(OPS, ops), (P50, p50), (P99, p99)])
}

/// Client `i` sends `command(i)` (made before the run starts) one round
/// trip after another: ops/s, p50 and p99 µs.
pub fn round_trips(
    server: &Server,
    clients: usize,
    duration: Duration,
    command: impl Fn(usize) -> RedisResult<Cmd> + Sync,
) -> RedisResult<[f64; 3]> {
    let run = run_clients(server, clients, duration, command, |_, c, command, stop| {
        let mut latencies = Vec::new();
        while !stop.is_set() {
            let start = now_ns();
            c.request(command)?;
            latencies.push(now_ns() - start);
        }
        Ok(latencies)
    })?;
    let latencies = run.results.concat();
    let ops = latencies.len() as f64 / run.seconds();
    let [p50, p99, _] = latency_us(latencies);
    Ok([ops, p50, p99])
}
