//! `philosophers`: N clients over N keys, each again and again taking two
//! keys picked at random (in the order picked), holding both for 100 us
//! (busy) and letting go. Three ways to take two locks:
//! - `flock-acquireall`: one `FLOCK.ACQUIREALL 2 a b ... WAIT`, all or
//!   none, one place in both queues (`FLOCK.RELEASEALL` after);
//! - `flock-key-order`: two `FLOCK.ACQUIRE ... WAIT` in key order, the
//!   classic way to never deadlock (the caller must know every key first);
//! - `redisson-multilock`: a port of Redisson's `RedissonMultiLock.lock()`:
//!   the locks one by one in the order given, each waiting at most the time
//!   left of the round; a lock that does not come in time releases the ones
//!   taken and the round starts again (a retry); a round whose time ran out
//!   (3 s for two locks, `lockInterruptibly`'s base) is a timeout, and
//!   `lock()` tries another. Each lock is a FLOCK lock under an owner of
//!   its own (Redisson's lock does not follow owners from lock to lock, so
//!   FLOCK's deadlock detection stays out of the port).

use std::time::Duration;

use rand::seq::index::sample;
use rand::SeedableRng;
use redis::{RedisResult, Value};

use crate::client::{now_ns, Client};
use crate::methods::flock;
use crate::results::Metric;
use crate::runner::run_clients;
use crate::server::Server;
use crate::stats::latency_us;
use crate::stop::Stop;

pub const GRANTS: Metric = Metric::median("grants/s");
pub const WAIT_P50: Metric = Metric::median("wait p50 us");
pub const WAIT_P99: Metric = Metric::median("wait p99 us");
pub const TIMEOUTS: Metric = Metric::worst("timeouts");
pub const RETRIES: Metric = Metric::worst("retries");

/// The client counts the issue names; the keys are as many.
pub const CLIENTS: [usize; 2] = [8, 32];
pub const HOLD_NS: u64 = 100_000;
const LEASE_MS: u64 = 30_000;
/// A FLOCK wait's limit: far beyond a run, so that a timeout means a lost wait.
const WAIT_MS: u64 = 60_000;
/// `RedissonMultiLock.lockInterruptibly`: 1500 ms per lock for each round.
pub const MULTILOCK_ROUND_MS: u64 = 2 * 1500;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Way {
    AcquireAll,
    KeyOrder,
    MultiLock,
}

impl Way {
    pub const ALL: [Way; 3] = [Way::AcquireAll, Way::KeyOrder, Way::MultiLock];

    /// The method column of the results.
    pub fn name(self) -> &'static str {
        match self {
            Way::AcquireAll => "flock-acquireall",
            Way::KeyOrder => "flock-key-order",
            Way::MultiLock => "redisson-multilock",
        }
    }
}

/// What one client saw.
#[derive(Default)]
struct Tally {
    /// From the first request of a take to holding both keys.
    waits: Vec<u64>,
    timeouts: u64,
    retries: u64,
}

pub fn run(server: &Server, way: Way, clients: usize, duration: Duration) -> RedisResult<Vec<(Metric, f64)>> {
    let run = run_clients(
        server,
        clients,
        duration,
        |i| Ok(rand::rngs::StdRng::seed_from_u64(i as u64)),
        |i, c, rng, stop| {
            let owner = format!("p{i}");
            let mut tally = Tally::default();
            while !stop.is_set() {
                let picked = sample(rng, clients, 2);
                let keys = [format!("fork:{}", picked.index(0)), format!("fork:{}", picked.index(1))];
                let started = now_ns();
                let held = match way {
                    Way::AcquireAll => acquire_all(c, &keys, &owner, &mut tally, stop)?,
                    Way::KeyOrder => key_order(c, &keys, &owner, &mut tally, stop)?,
                    Way::MultiLock => multilock(c, &keys, &owner, &mut tally, stop)?,
                };
                let Some(release) = held else { continue };
                tally.waits.push(now_ns() - started);
                let granted = now_ns();
                while now_ns() - granted < HOLD_NS {
                    std::hint::spin_loop();
                }
                for cmd in release {
                    c.request(&cmd)?;
                }
            }
            Ok(tally)
        },
    )?;
    let seconds = run.seconds();
    let waits: Vec<u64> = run.results.iter().flat_map(|t| t.waits.iter().copied()).collect();
    let grants = waits.len() as f64;
    let [p50, p99, _] = latency_us(waits);
    Ok(vec![
        (GRANTS, grants / seconds),
        (WAIT_P50, p50),
        (WAIT_P99, p99),
        (TIMEOUTS, run.results.iter().map(|t| t.timeouts).sum::<u64>() as f64),
        (RETRIES, run.results.iter().map(|t| t.retries).sum::<u64>() as f64),
    ])
}

/// The commands that let go of what a take holds, if it holds both keys.
type Held = Option<Vec<redis::Cmd>>;

fn acquire(key: &str, owner: &str, wait_ms: u64) -> redis::Cmd {
    let mut cmd = flock::acquire_cmd(key, owner, LEASE_MS);
    cmd.arg("WAIT").arg(wait_ms);
    cmd
}

fn release(key: &str, owner: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("FLOCK.RELEASE");
    cmd.arg(key).arg(owner);
    cmd
}

/// A wait that ended with nil: a timeout, unless the run's end unblocked it.
fn timed_out(tally: &mut Tally, stop: &Stop) {
    if !stop.is_set() {
        tally.timeouts += 1;
    }
}

fn acquire_all(c: &mut Client, keys: &[String; 2], owner: &str, tally: &mut Tally, stop: &Stop) -> RedisResult<Held> {
    let mut cmd = redis::cmd("FLOCK.ACQUIREALL");
    cmd.arg(2).arg(keys).arg(owner).arg(LEASE_MS).arg("WAIT").arg(WAIT_MS);
    if c.request(&cmd)? == Value::Nil {
        timed_out(tally, stop);
        return Ok(None);
    }
    let mut release = redis::cmd("FLOCK.RELEASEALL");
    release.arg(2).arg(keys).arg(owner);
    Ok(Some(vec![release]))
}

fn key_order(c: &mut Client, keys: &[String; 2], owner: &str, tally: &mut Tally, stop: &Stop) -> RedisResult<Held> {
    let mut ordered = keys.clone();
    ordered.sort();
    let mut taken = Vec::new();
    for key in &ordered {
        if c.request(&acquire(key, owner, WAIT_MS))? == Value::Nil {
            timed_out(tally, stop);
            for cmd in taken {
                c.request(&cmd)?;
            }
            return Ok(None);
        }
        taken.push(release(key, owner));
    }
    Ok(Some(taken))
}

/// One `RedissonMultiLock.lock()`: rounds of `tryLock(round, lease)` until
/// one takes every lock (or the run ends). Within a round, a lock that does
/// not come in the time left releases the ones taken and the round starts
/// over from the first lock (a retry); a round out of time returns false
/// (a timeout) and `lock()` tries another.
fn multilock(c: &mut Client, keys: &[String; 2], owner: &str, tally: &mut Tally, stop: &Stop) -> RedisResult<Held> {
    // Redisson's lock is reentrant per thread, but follows no owner from
    // one lock to another: an owner per lock keeps FLOCK's deadlock
    // detection out of the port.
    let owners = keys.clone().map(|key| format!("{owner}/{key}"));
    while !stop.is_set() {
        let round_ends = now_ns() + MULTILOCK_ROUND_MS * 1_000_000;
        loop {
            let mut taken = Vec::new();
            for (key, lock_owner) in keys.iter().zip(&owners) {
                let left_ms = round_ends.saturating_sub(now_ns()) / 1_000_000;
                if left_ms == 0 || c.request(&acquire(key, lock_owner, left_ms))? == Value::Nil {
                    break;
                }
                taken.push(release(key, lock_owner));
            }
            if taken.len() == keys.len() {
                return Ok(Some(taken));
            }
            for cmd in taken {
                c.request(&cmd)?;
            }
            if stop.is_set() {
                return Ok(None);
            }
            if now_ns() >= round_ends {
                tally.timeouts += 1;
                break;
            }
            tally.retries += 1;
        }
    }
    Ok(None)
}
