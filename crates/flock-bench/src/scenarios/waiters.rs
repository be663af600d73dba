//! `waiters`: what one process with many waiting threads costs the server,
//! in connections and in memory per waiter, three ways: FLOCK's blocking
//! `WAIT` (a connection per waiter), FLOCK through a session (one
//! connection sends every wait, one reads the inbox), and the Redisson port
//! with one shared pub/sub connection, as Redisson waits. FLOCK's waiters
//! are then granted one by one: how long from a RELEASE being sent to the
//! grant being read (from the inbox, or as the blocked ACQUIRE's reply),
//! in the order they queued, beside a PING just before each on the same
//! connection. Through the session, what queueing a wait costs the server
//! is timed at the first thousand and at the last: a wait must cost the
//! same behind 10,000 as behind none.

use std::error::Error;
use std::path::Path;
use std::time::Instant;

use redis::{Connection, RedisResult};

use crate::client::Client;
use crate::methods::{self, Kind, Method};
use crate::results::Metric;
use crate::scenarios::scale::settled_memory;
use crate::server::{busy_us, info_number, open_files_limit, Server};
use crate::stats::latency_us;
use crate::stop::Stop;

pub const WAITERS: Metric = Metric::median("waiters");
pub const CONNECTIONS: Metric = Metric::median("connections added");
pub const WAITER_BYTES: Metric = Metric::median("bytes/waiter");
pub const OUT_OF_ORDER: Metric = Metric::worst("grants out of order");
pub const HANDOFF: Metric = Metric::median("hand-off p50 us");
pub const PING: Metric = Metric::median("ping p50 us");
pub const QUEUE_FIRST: Metric = Metric::median("first waits: server us each");
pub const QUEUE_LAST: Metric = Metric::median("last waits: server us each");

const KEY: &str = "crowded";
/// Long enough that nothing expires while measuring.
const LEASE_MS: u64 = 3_600_000;
/// Waits sent in one pipeline (and timed together).
pub const BATCH: usize = 1000;
/// Files kept for everything but the blocking waiters.
const SPARE_FILES: usize = 256;
/// Grants timed one by one through the session.
pub const HANDOFFS: usize = 1000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Way {
    Blocking,
    Session,
    RedissonShared,
}

impl Way {
    pub const ALL: [Way; 3] = [Way::Blocking, Way::Session, Way::RedissonShared];

    /// The method column of the results.
    pub fn name(self) -> &'static str {
        match self {
            Way::Blocking => "flock-blocking",
            Way::Session => "flock-session",
            Way::RedissonShared => "redisson-shared",
        }
    }
}

pub fn run(module: &Path, way: Way, count: usize) -> Result<Vec<(Metric, f64)>, Box<dyn Error>> {
    let server = Server::start(module)?;
    methods::load_scripts(&mut Client::open(&server)?)?;
    let mut info = server.connect()?;
    let kind = if way == Way::RedissonShared { Kind::Redisson } else { Kind::Flock };
    let mut holder = Client::open(&server)?;
    kind.client(&server)?.acquire(&mut holder, KEY, "holder", LEASE_MS, &Stop::default())?;
    let clients_before = info_number(&mut info, "clients", "connected_clients")?;
    let memory_before = settled_memory(&mut info, Instant::now())?;
    let parked = Instant::now();
    let mut metrics = match way {
        Way::Blocking => blocking(&server, count)?,
        Way::Session => session(&server, count)?,
        Way::RedissonShared => redisson_shared(&server, count)?,
    };
    let waiters = metrics.waiters as f64;
    let connections = info_number(&mut info, "clients", "connected_clients")? - clients_before;
    let bytes = (settled_memory(&mut info, parked)? - memory_before) / waiters;
    let mut out = vec![(WAITERS, waiters), (CONNECTIONS, connections as f64), (WAITER_BYTES, bytes)];
    // The Redisson port's hand-off is `contended`'s.
    let n = metrics.waiters.min(HANDOFFS);
    let grants = match (way, metrics.inbox.as_mut()) {
        (Way::Session, Some(inbox)) => Some(Grants::Inbox { inbox, info: &mut info }),
        (Way::Blocking, _) => Some(Grants::Replies(&mut metrics.open)),
        _ => None,
    };
    let timed = grants.map(|g| hand_off(&mut holder, n, g)).transpose()?;
    let timed = timed.unwrap_or([f64::NAN; 3]);
    out.extend([OUT_OF_ORDER, HANDOFF, PING].into_iter().zip(timed));
    out.extend([QUEUE_FIRST, QUEUE_LAST].into_iter().zip(metrics.queue_us.unwrap_or([f64::NAN; 2])));
    Ok(out)
}

/// What parking left open: the connections that must stay, and the
/// session's inbox connection.
struct Parked {
    waiters: usize,
    open: Vec<Client>,
    _subscriber: Option<Box<dyn Method>>,
    inbox: Option<Connection>,
    /// The server's µs per wait queued in the first batch and in the last.
    queue_us: Option<[f64; 2]>,
}

fn owner(i: usize) -> String {
    format!("w{i:05}")
}

fn wait_cmd(i: usize) -> redis::Cmd {
    let mut cmd = redis::cmd("FLOCK.ACQUIRE");
    cmd.arg(KEY).arg(owner(i)).arg(LEASE_MS).arg("WAIT").arg(0);
    cmd
}

/// A connection per waiter, each blocked in its own WAIT.
fn blocking(server: &Server, count: usize) -> RedisResult<Parked> {
    let count = count.min(open_files_limit().saturating_sub(SPARE_FILES));
    let mut kept = Vec::with_capacity(count);
    for i in 0..count {
        let mut c = Client::open(server)?;
        c.send(&wait_cmd(i))?;
        kept.push(c);
    }
    Ok(Parked { waiters: count, open: kept, _subscriber: None, inbox: None, queue_us: None })
}

/// One connection sends every wait (`INBOX session-id`), pipelined in
/// batches; one holds the session.
fn session(server: &Server, count: usize) -> RedisResult<Parked> {
    let mut inbox = server.connect()?;
    let sid: String = redis::cmd("FLOCK.SESSION").query(&mut inbox)?;
    let mut sender = Client::open(server)?;
    let mut stats = server.connect()?;
    let mut per_wait = Vec::new();
    for start in (0..count).step_by(BATCH) {
        let mut pipe = redis::pipe();
        let end = count.min(start + BATCH);
        for i in start..end {
            pipe.add_command(wait_cmd(i).arg("INBOX").arg(&sid).clone()).ignore();
        }
        let before = busy_us(&mut stats, |c| c == "flock.acquire")?;
        sender.pipeline(&pipe)?;
        per_wait.push((busy_us(&mut stats, |c| c == "flock.acquire")? - before) / (end - start) as f64);
    }
    let queue_us = per_wait.first().zip(per_wait.last()).map(|(&first, &last)| [first, last]);
    Ok(Parked { waiters: count, open: vec![sender], _subscriber: None, inbox: Some(inbox), queue_us })
}

/// One command connection tries for every waiter and one pub/sub
/// connection subscribes to every waiter's channel, as Redisson's
/// connection manager does.
fn redisson_shared(server: &Server, count: usize) -> RedisResult<Parked> {
    let mut method = Kind::Redisson.client(server)?;
    let mut sender = Client::open(server)?;
    for i in 0..count {
        method.park(&mut sender, KEY, &owner(i), LEASE_MS)?;
    }
    Ok(Parked { waiters: count, open: vec![sender], _subscriber: Some(method), inbox: None, queue_us: None })
}

/// Where the waiters' grants are read.
enum Grants<'a> {
    /// The session's inbox (and a connection to see its read block).
    Inbox { inbox: &'a mut Connection, info: &'a mut Connection },
    /// The reply of each blocked ACQUIRE, waiter `i` on connection `i`.
    Replies(&'a mut [Client]),
}

impl Grants<'_> {
    /// Before the RELEASE goes out: the inbox read must block first.
    fn ready(&mut self) -> RedisResult<()> {
        if let Grants::Inbox { inbox, info } = self {
            inbox.send_packed_command(&redis::cmd("FLOCK.INBOX").arg(0).get_packed_command())?;
            while info_number(info, "clients", "blocked_clients")? == 0 {}
        }
        Ok(())
    }

    /// The owner of the next grant.
    fn read(&mut self, i: usize) -> RedisResult<String> {
        match self {
            Grants::Inbox { inbox, .. } => {
                let events: Vec<(String, String, String, i64, String)> =
                    redis::from_redis_value(&inbox.recv_response()?)?;
                Ok(events.into_iter().find(|e| e.0 == "granted").map(|e| e.2).unwrap_or_default())
            }
            Grants::Replies(open) => open[i].reply().map(|_| owner(i)),
        }
    }
}

/// Releases `n` times, each time timing from the RELEASE being sent to the
/// next grant being read, and a PING on the same connection just before (so
/// that both see the same load); the grants out of queue order, and both
/// p50s in µs.
fn hand_off(holder: &mut Client, n: usize, mut grants: Grants) -> RedisResult<[f64; 3]> {
    let mut out_of_order = 0;
    let (mut times, mut pings) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let mut previous = "holder".to_string();
    for i in 0..n {
        let started = Instant::now();
        holder.request(&redis::cmd("PING"))?;
        pings.push(started.elapsed().as_nanos() as u64);
        grants.ready()?;
        let started = Instant::now();
        holder.request(redis::cmd("FLOCK.RELEASE").arg(KEY).arg(&previous))?;
        let granted = grants.read(i)?;
        times.push(started.elapsed().as_nanos() as u64);
        if granted != owner(i) {
            out_of_order += 1;
        }
        previous = granted;
    }
    Ok([out_of_order as f64, latency_us(times)[0], latency_us(pings)[0]])
}
