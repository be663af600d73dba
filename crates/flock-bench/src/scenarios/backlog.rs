//! `backlog`: many leases fall due while the event loop is busy (a slow
//! command, a fork, a load; here DEBUG SLEEP). How long until all have
//! ended, and how long a client waits meanwhile: FLOCK's lease timer against
//! Redis's own active expiry of SET NX PX keys (the setnx recipe's locks).

use std::error::Error;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::RedisResult;

use crate::methods::Kind;
use crate::results::Metric;
use crate::server::Server;
use crate::stats::quantile;

pub const ENDED: Metric = Metric::median("all ended ms");
pub const PING_P99: Metric = Metric::median("ping p99 ms");
pub const PING_MAX: Metric = Metric::worst("ping max ms");
pub const OVERRUN: Metric = Metric::worst("overrun ms");
pub const PINGS: Metric = Metric::median("pings");

/// Shorter than the sleep: every lease is due when it ends.
pub const LEASE_MS: u64 = 50;
pub const SLEEP_MS: u64 = 100;
/// Locks taken per script, well within Redis's busy-script limit (5 s).
const CHUNK: usize = 50_000;
/// How often the end is looked for.
const POLL: Duration = Duration::from_millis(1);

/// The name under which a backlog of `leases` is reported.
pub fn label(leases: usize) -> String {
    format!("backlog {leases} leases")
}

/// Scripts that take the locks `due:first` to `due:last-1` (ARGV: first,
/// last, lease).
const FLOCK_FILL: &str = "for i = ARGV[1], ARGV[2] - 1 do redis.call('FLOCK.ACQUIRE', 'due:' .. i, 'o', ARGV[3]) end";
const SETNX_FILL: &str = "for i = ARGV[1], ARGV[2] - 1 do redis.call('SET', 'due:' .. i, 'o', 'NX', 'PX', ARGV[3]) end";

fn fill_script(kind: Kind) -> Option<&'static str> {
    match kind {
        Kind::Flock => Some(FLOCK_FILL),
        Kind::SetNx => Some(SETNX_FILL),
        // A session changes nothing about leases.
        Kind::FlockSession | Kind::ListPoll | Kind::Redisson => None,
    }
}

/// The methods measured: FLOCK and plain keys with a TTL.
pub fn covers(kind: Kind) -> bool {
    fill_script(kind).is_some()
}

fn unix_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// In one pipeline, which Redis reads at once and runs without serving
/// anything else: takes `leases` locks, sleeps past their leases, and reads
/// the server's clock, the moment the catch-up starts (same machine, same
/// clock as `unix_us`). Not a transaction: EXEC would free what it
/// propagated for all the scripts at once, a stall of its own. Meanwhile a
/// pinger sends PING after PING, and DBSIZE is polled until it is 0.
pub fn run(server: &Server, kind: Kind, leases: usize) -> Result<Vec<(Metric, f64)>, Box<dyn Error>> {
    let fill = fill_script(kind).ok_or("backlog measures flock and setnx only")?;
    let (mut control, mut pinger) = (server.connect()?, server.connect()?);
    let stop = AtomicBool::new(false);
    let (pings, started, ended) = std::thread::scope(|scope| {
        let pings = scope.spawn(|| -> RedisResult<Vec<(u64, u64)>> {
            let mut pings = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let sent = unix_us();
                redis::cmd("PING").query::<String>(&mut pinger)?;
                pings.push((sent, unix_us()));
            }
            Ok(pings)
        });
        let catch_up = (|| -> RedisResult<(u64, u64)> {
            let mut pipe = redis::pipe();
            for first in (0..leases).step_by(CHUNK) {
                pipe.cmd("EVAL").arg(fill).arg(0).arg(first).arg(leases.min(first + CHUNK)).arg(LEASE_MS).ignore();
            }
            pipe.cmd("DEBUG").arg("SLEEP").arg(SLEEP_MS as f64 / 1000.0).ignore();
            pipe.cmd("TIME");
            let ((secs, micros),): ((u64, u64),) = pipe.query(&mut control)?;
            while redis::cmd("DBSIZE").query::<u64>(&mut control)? > 0 {
                std::thread::sleep(POLL);
            }
            Ok((secs * 1_000_000 + micros, unix_us()))
        })();
        stop.store(true, Ordering::Relaxed);
        let pings = pings.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        catch_up.and_then(|(started, ended)| Ok((pings?, started, ended)))
    })?;
    // A PING sent before the catch-up started waits from its start.
    let during: Vec<(u64, u64)> =
        pings.into_iter().filter(|&(_, replied)| replied >= started).map(|(sent, r)| (sent.max(started), r)).collect();
    let mut waits: Vec<u64> = during.iter().map(|&(sent, replied)| replied.saturating_sub(sent)).collect();
    waits.sort_unstable();
    let replies = std::iter::once(started).chain(during.iter().map(|&(_, replied)| replied));
    let overrun = replies.clone().zip(replies.skip(1)).map(|(a, b)| b.saturating_sub(a)).max().unwrap_or(0);
    let ms = |t: u64| t as f64 / 1e3;
    Ok(vec![
        (ENDED, ms(ended.saturating_sub(started))),
        (PING_P99, quantile(&waits, 0.99) / 1e3),
        (PING_MAX, ms(waits.last().copied().unwrap_or(0))),
        (OVERRUN, ms(overrun)),
        (PINGS, during.len() as f64),
    ])
}
