//! `vanished`: a process that holds a lock and waits for another vanishes
//! the way a partition, a dead host or a frozen VM makes it vanish: its
//! connections stay open (no FIN, no RST) and nothing more comes. Its
//! session (`FLOCK.SESSION TIMEOUT`) expires after its timeout; the lock it
//! held through it (`lease-ms` 0) passes to the next waiter, and its own
//! wait leaves the queue. Measured: from the last command on its session's
//! connection to the next waiter's grant, beyond the timeout.

use std::time::{Duration, Instant};

use redis::{RedisResult, Value};

use crate::results::Metric;
use crate::server::Server;
use crate::stats::latency_us;

pub const LATE_P50: Metric = Metric::median("freed late p50 ms");
pub const LATE_MAX: Metric = Metric::worst("freed late max ms");
pub const WAITS_LEFT: Metric = Metric::worst("waits left");

pub const TIMEOUT_MS: u64 = 1000;
pub const TRIALS: usize = 5;

pub fn run(server: &Server) -> RedisResult<Vec<(Metric, f64)>> {
    let mut control = server.connect()?;
    let mut late = Vec::with_capacity(TRIALS);
    let mut waits_left = 0;
    for trial in 0..TRIALS {
        let (held, busy) = (format!("vanished:{trial}"), format!("vanished-busy:{trial}"));
        let mut session = server.connect()?;
        let id: String = redis::cmd("FLOCK.SESSION").arg("TIMEOUT").arg(TIMEOUT_MS).query(&mut session)?;
        let heard = Instant::now();
        let _: i64 =
            redis::cmd("FLOCK.ACQUIRE").arg(&held).arg("gone").arg(0).arg("INBOX").arg(&id).query(&mut control)?;
        let _: i64 = redis::cmd("FLOCK.ACQUIRE").arg(&busy).arg("other").arg(60_000).query(&mut control)?;
        let _: Value = redis::cmd("FLOCK.ACQUIRE")
            .arg(&busy)
            .arg("gone")
            .arg(60_000)
            .arg("WAIT")
            .arg(0)
            .arg("INBOX")
            .arg(&id)
            .query(&mut control)?;
        let mut next = server.connect()?;
        let _: i64 =
            redis::cmd("FLOCK.ACQUIRE").arg(&held).arg("next").arg(60_000).arg("WAIT").arg(0).query(&mut next)?;
        late.push(heard.elapsed().saturating_sub(Duration::from_millis(TIMEOUT_MS)).as_nanos() as u64);
        let info: Vec<Value> = redis::cmd("FLOCK.INFO").arg(&busy).query(&mut control)?;
        let waiters = info.chunks(2).find(|f| matches!(&f[0], Value::BulkString(b) if b == b"waiters"));
        if let Some([_, Value::Int(n)]) = waiters {
            waits_left += (*n == 0) as usize;
        }
        drop(session);
    }
    let [p50, _, max] = latency_us(late);
    Ok(vec![(LATE_P50, p50 / 1e3), (LATE_MAX, max / 1e3), (WAITS_LEFT, waits_left as f64)])
}
