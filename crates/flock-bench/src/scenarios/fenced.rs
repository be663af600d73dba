//! `fenced`: a write through `FLOCK.FENCED` against the same write sent
//! plain. Each client holds a lock of its own (its token fixed for the
//! run) and sets a key of its own, one command per round trip, as a holder
//! writes its data: `set` sends `SET key value`, `fenced` sends
//! `FLOCK.FENCED lock token SET key value`.

use std::time::Duration;

use redis::RedisResult;

use crate::client::now_ns;
use crate::results::Metric;
use crate::runner::run_clients;
use crate::server::Server;
use crate::stats::latency_us;

pub const OPS: Metric = Metric::median("ops/s");
pub const P50: Metric = Metric::median("p50 us");

/// The two ways a write is sent.
pub const WAYS: [&str; 2] = ["set", "fenced"];

pub fn run(server: &Server, way: &str, clients: usize, duration: Duration) -> RedisResult<Vec<(Metric, f64)>> {
    let fenced = way == "fenced";
    let run = run_clients(
        server,
        clients,
        duration,
        |i| {
            let (lock, key) = (format!("fenced:lock:{i}"), format!("fenced:key:{i}"));
            let mut write = redis::cmd("SET");
            if fenced {
                let token: i64 = redis::cmd("FLOCK.ACQUIRE")
                    .arg(&lock)
                    .arg("holder")
                    .arg(3_600_000)
                    .query(&mut server.connect()?)?;
                write = redis::cmd("FLOCK.FENCED");
                write.arg(&lock).arg(token).arg("SET");
            }
            write.arg(&key).arg("value");
            Ok(write)
        },
        |_, c, write, stop| {
            let mut latencies = Vec::new();
            while !stop.is_set() {
                let start = now_ns();
                c.request(write)?;
                latencies.push(now_ns() - start);
            }
            Ok(latencies)
        },
    )?;
    let latencies = run.results.concat();
    let ops = latencies.len() as f64 / run.seconds();
    let [p50, _, _] = latency_us(latencies);
    Ok(vec![(OPS, ops), (P50, p50)])
}
