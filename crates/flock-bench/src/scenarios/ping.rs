//! `ping`: PING round trips, the ceiling for one command per round trip.

use std::time::Duration;

use redis::RedisResult;

use crate::client::now_ns;
use crate::results::Metric;
use crate::runner::run_clients;
use crate::server::Server;
use crate::stats::latency_us;

pub const OPS: Metric = Metric::median("ops/s");
pub const P50: Metric = Metric::median("p50 us");
pub const P99: Metric = Metric::median("p99 us");

pub fn run(server: &Server, clients: usize, duration: Duration) -> RedisResult<Vec<(Metric, f64)>> {
    let run = run_clients(
        server,
        clients,
        duration,
        |_| Ok(()),
        |_, c, _, stop| {
            let ping = redis::cmd("PING");
            let mut latencies = Vec::new();
            while !stop.is_set() {
                let start = now_ns();
                c.request(&ping)?;
                latencies.push(now_ns() - start);
            }
            Ok(latencies)
        },
    )?;
    let latencies = run.results.concat();
    let ops = latencies.len() as f64 / run.seconds();
    let [p50, p99, _] = latency_us(latencies);
    Ok(vec![(OPS, ops), (P50, p50), (P99, p99)])
}
