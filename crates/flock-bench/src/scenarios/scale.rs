//! `scale`: memory per idle held lock, per waiter and (FLOCK) per
//! remembered request ID, and whether the
//! server's cost of an acquire+release pair stays flat with many other
//! locks held or many waiters queued.
//!
//! Fresh servers: one holds the locks, one the waiters, one stays empty;
//! the cost probes alternate between the empty one and a loaded one, so
//! that whatever else the machine does weighs on both alike.

use std::error::Error;
use std::path::Path;
use std::time::{Duration, Instant};

use redis::{Connection, RedisResult};

use crate::client::Client;
use crate::methods::{self, Kind, Method};
use crate::results::Metric;
use crate::scenarios::uncontended;
use crate::server::{info_number, measure_busy, open_files_limit, Server};
use crate::stats::{latency_us, median};
use crate::stop::Stop;

pub const LOCK_BYTES: Metric = Metric::median("bytes/lock");
pub const KEY_BYTES: Metric = Metric::median("key bytes");
pub const WAITERS: Metric = Metric::median("waiters");
pub const WAITER_BYTES: Metric = Metric::median("bytes/waiter");
pub const ID_BYTES: Metric = Metric::median("bytes/request ID");
pub const PAIR: Metric = Metric::median("pair p50 us");
pub const SERVER: Metric = Metric::median("server us/pair");
pub const WITH_LOCKS: Metric = Metric::worst("server x with locks");
pub const WITH_WAITERS: Metric = Metric::worst("server x with waiters");

/// Long enough that nothing expires while measuring.
const LEASE_MS: u64 = 3_600_000;
const BATCH: usize = 1000;
const CROWDED: &str = "crowded";
/// Files kept for everything but the waiters (runner, INFO, probes).
const SPARE_FILES: usize = 256;
/// Request IDs remembered on one lock for their cost, each a UUID's 36
/// bytes, as the clients send them.
const REQUEST_IDS: usize = 100_000;
/// Probes alternate between the servers this many times each.
pub const PROBE_ROUNDS: u32 = 9;

/// How much to load.
#[derive(Clone, Copy, Debug)]
pub struct Size {
    pub locks: usize,
    pub waiters: usize,
    /// How long the probes run on each server, all rounds together.
    pub probe: Duration,
}

fn idle_key(i: usize) -> String {
    format!("idle:{i:07}")
}

/// A fresh server, ready for every method.
fn fresh(module: &Path) -> Result<Server, Box<dyn Error>> {
    let server = Server::start(module)?;
    methods::load_scripts(&mut Client::open(&server)?)?;
    Ok(server)
}

pub fn run(module: &Path, kind: Kind, size: Size) -> Result<Vec<(Metric, f64)>, Box<dyn Error>> {
    let [empty, locks, crowd] = [fresh(module)?, fresh(module)?, fresh(module)?];
    // Memory holds still only once new connections have been idle a while:
    // open the waiters' first, and spend that while on the locks.
    let opened = Instant::now();
    let mut waiters = open_waiters(&crowd, kind, size.waiters)?;
    let mut holder = Client::open(&crowd)?;
    kind.client(&crowd)?.acquire(&mut holder, CROWDED, "holder", LEASE_MS, &Stop::default())?;

    let mut info = locks.connect()?;
    let before = used_memory(&mut info)?;
    hold_idle_locks(&locks, kind, size.locks)?;
    let lock_bytes = (used_memory(&mut info)? - before) / size.locks as f64;
    let with_locks = compare(&empty, &locks, kind, size.probe)?;
    let id_bytes = if kind == Kind::Flock { request_id_bytes(&locks)? } else { f64::NAN };

    let mut info = crowd.connect()?;
    let before = settled_memory(&mut info, opened)?;
    let parked = Instant::now();
    for (i, (client, method)) in waiters.iter_mut().enumerate() {
        method.park(client, CROWDED, &format!("w{i:05}"), LEASE_MS)?;
    }
    let waiter_bytes = (settled_memory(&mut info, parked)? - before) / waiters.len() as f64;
    let with_waiters = compare(&empty, &crowd, kind, size.probe)?;

    Ok(vec![
        (LOCK_BYTES, lock_bytes),
        (KEY_BYTES, idle_key(0).len() as f64),
        (WAITERS, waiters.len() as f64),
        (WAITER_BYTES, waiter_bytes),
        (ID_BYTES, id_bytes),
        (PAIR, with_locks.empty.p50_us),
        (SERVER, with_locks.empty.server_us),
        (WITH_LOCKS, with_locks.ratio),
        (WITH_WAITERS, with_waiters.ratio),
    ])
}

/// A lone client's acquire+release pairs on a key of its own.
#[derive(Clone, Copy)]
struct Probe {
    /// The median pair as the client saw it.
    p50_us: f64,
    /// The server's time in commands per pair: what a load could change.
    server_us: f64,
}

fn probe(server: &Server, kind: Kind, duration: Duration) -> RedisResult<Probe> {
    let (run, busy) = measure_busy(server, || uncontended::pairs(server, kind, 1, duration))?;
    let pairs: Vec<u64> = run.results.into_iter().flat_map(|p| p.pair).collect();
    let count = pairs.len() as f64;
    let [p50_us, _, _] = latency_us(pairs);
    Ok(Probe { p50_us, server_us: busy / count })
}

struct Comparison {
    /// Medians over the rounds on the empty server.
    empty: Probe,
    /// Server cost on the loaded server over that on the empty one: the
    /// median of the rounds' ratios.
    ratio: f64,
}

fn compare(empty: &Server, loaded: &Server, kind: Kind, duration: Duration) -> RedisResult<Comparison> {
    let part = duration / PROBE_ROUNDS;
    let mut rounds = Vec::new();
    for _ in 0..PROBE_ROUNDS {
        rounds.push((probe(empty, kind, part)?, probe(loaded, kind, part)?));
    }
    let of_empty = |cost: fn(&Probe) -> f64| median(&rounds.iter().map(|(e, _)| cost(e)).collect::<Vec<_>>());
    let ratios: Vec<f64> = rounds.iter().map(|(e, l)| l.server_us / e.server_us).collect();
    Ok(Comparison {
        empty: Probe { p50_us: of_empty(|p| p.p50_us), server_us: of_empty(|p| p.server_us) },
        ratio: median(&ratios),
    })
}

/// Takes `count` locks that nobody releases, in pipelined batches.
fn hold_idle_locks(server: &Server, kind: Kind, count: usize) -> RedisResult<()> {
    let mut client = Client::open(server)?;
    let method = kind.client(server)?;
    for start in (0..count).step_by(BATCH) {
        let mut pipe = redis::pipe();
        for i in start..count.min(start + BATCH) {
            method.take_free(&mut pipe, &idle_key(i), &format!("o{i:07}"), LEASE_MS);
        }
        client.pipeline(&pipe)?;
    }
    Ok(())
}

/// used_memory per request ID that a held lock remembers (`FLOCK.RENEW
/// ... ID <uuid>`, pipelined).
fn request_id_bytes(server: &Server) -> RedisResult<f64> {
    let mut client = Client::open(server)?;
    let mut info = server.connect()?;
    client.request(redis::cmd("FLOCK.ACQUIRE").arg("ids").arg("o").arg(LEASE_MS))?;
    let before = used_memory(&mut info)?;
    for _ in (0..REQUEST_IDS).step_by(BATCH) {
        let mut pipe = redis::pipe();
        for _ in 0..BATCH {
            let id = uuid::Uuid::new_v4().to_string();
            pipe.cmd("FLOCK.RENEW").arg("ids").arg("o").arg(LEASE_MS).arg("ID").arg(id).ignore();
        }
        client.pipeline(&pipe)?;
    }
    Ok((used_memory(&mut info)? - before) / REQUEST_IDS as f64)
}

/// Clients for as many of `count` waiters as open files allow.
fn open_waiters(server: &Server, kind: Kind, count: usize) -> RedisResult<Vec<(Client, Box<dyn Method>)>> {
    let count = count.min(open_files_limit().saturating_sub(SPARE_FILES) / kind.connections());
    (0..count).map(|_| Ok((Client::open(server)?, kind.client(server)?))).collect()
}

fn used_memory(info: &mut Connection) -> RedisResult<f64> {
    Ok(info_number(info, "memory", "used_memory")? as f64)
}

/// used_memory once it stops moving. Connections that sent something at
/// `last_activity` hold bigger buffers until clientsCron shrinks them: when
/// they have been idle for over 2 s by its clock in whole seconds, at its
/// next visit (every client at least once a second).
pub fn settled_memory(info: &mut Connection, last_activity: Instant) -> RedisResult<f64> {
    std::thread::sleep((last_activity + Duration::from_secs(4)).saturating_duration_since(Instant::now()));
    let mut last = used_memory(info)?;
    for _ in 0..30 {
        std::thread::sleep(Duration::from_millis(500));
        let now = used_memory(info)?;
        if (now - last).abs() <= now * 1e-3 {
            return Ok(now);
        }
        last = now;
    }
    Ok(last)
}
