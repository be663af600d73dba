//! `fenced`: a write through `FLOCK.FENCED` against the same write sent
//! plain. Each client holds a lock of its own (its token fixed for the
//! run) and sets a key of its own, one command per round trip, as a holder
//! writes its data: `set` sends `SET key value`, `fenced` sends
//! `FLOCK.FENCED lock token SET key value`.

use std::time::Duration;

use redis::RedisResult;

use crate::results::Metric;
use crate::scenarios::ping::round_trips;
use crate::server::Server;

pub const OPS: Metric = Metric::median("ops/s");
pub const P50: Metric = Metric::median("p50 us");

/// The two ways a write is sent.
pub const WAYS: [&str; 2] = ["set", "fenced"];

pub fn run(server: &Server, way: &str, clients: usize, duration: Duration) -> RedisResult<Vec<(Metric, f64)>> {
    let fenced = way == "fenced";
    let [ops, p50, _] = round_trips(server, clients, duration, |i| {
        let (lock, key) = (format!("fenced:lock:{i}"), format!("fenced:key:{i}"));
        let mut write = redis::cmd("SET");
        if fenced {
            let token: i64 =
                redis::cmd("FLOCK.ACQUIRE").arg(&lock).arg("holder").arg(3_600_000).query(&mut server.connect()?)?;
            write = redis::cmd("FLOCK.FENCED");
            write.arg(&lock).arg(token).arg("SET");
        }
        write.arg(&key).arg("value");
        Ok(write)
    })?;
    Ok(vec![(OPS, ops), (P50, p50)])
}
