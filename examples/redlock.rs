//! Redlock over FLOCK: one lock taken on a majority of N independent Redis
//! masters (no replication between them), each running the FLOCK module.
//!
//! ```text
//! cargo run --release --example redlock -- 127.0.0.1:7001 127.0.0.1:7002 127.0.0.1:7003
//! ```
//!
//! The algorithm (see docs/redlock.md, "Several independent masters (Redlock)",
//! for what it does and does not guarantee):
//! 1. Note the time, then try `FLOCK.ACQUIRE key owner lease-ms` (a
//!    non-blocking try, no `WAIT`) on every server in turn, each with a short
//!    connect/reply timeout so that a dead server costs little time.
//! 2. The lock is taken if a majority (N/2 + 1) granted it and time is left:
//!    `validity = lease - elapsed - drift`, with `drift = 1% of lease + 2 ms`
//!    for clock-rate differences between the servers and this client.
//!    The lock may be relied on until `acquired_at + validity`, no longer.
//! 3. Otherwise it releases (`FLOCK.RELEASE`) wherever it may have been
//!    granted (every server that did not clearly refuse) and fails; `lock`
//!    retries after a random delay.
//! 4. When done, `unlock` releases on every server.
//!
//! Every server grants its own fencing token; `Lock::tokens` returns them per
//! server. Use a unique `owner` per holder (e.g. a UUID plus thread id).
//!
//! This file is also compiled into `tests/integration/redlock.rs` (`#[path]` include),
//! so the library part is tested against real servers.
#![allow(dead_code)]

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, Instant};

use redis::{Client, Connection, RedisError, RedisResult};

/// Clock drift allowance, proportional part: 1% of the lease.
pub const DRIFT_FACTOR: f64 = 0.01;
/// Clock drift allowance, fixed part (timer granularity of the servers).
pub const DRIFT_FIXED: Duration = Duration::from_millis(2);

/// One independent server.
struct Instance {
    addr: String,
    client: Client,
    conn: Option<Connection>,
}

/// A client for a Redlock over N independent FLOCK servers.
pub struct Redlock {
    servers: Vec<Instance>,
    /// Connect and reply timeout per server. Keep it small next to the lease:
    /// a server that hangs costs up to this much of the validity time.
    pub io_timeout: Duration,
    /// Further attempts of `lock` after the first one fails.
    pub retry_count: u32,
    /// `lock` waits a random time in `[retry_delay / 2, retry_delay)` between attempts.
    pub retry_delay: Duration,
}

/// A Redlock held on a majority of the servers.
#[derive(Debug, Clone)]
pub struct Lock {
    pub key: String,
    pub owner: String,
    /// When the first try was sent.
    pub acquired_at: Instant,
    /// How long after `acquired_at` the lock may be relied on.
    pub validity: Duration,
    /// The fencing token each server granted (index as in `Redlock::new`),
    /// `None` where it was not granted.
    pub tokens: Vec<Option<i64>>,
}

impl Lock {
    /// The moment after which the holder must assume it lost the lock.
    pub fn valid_until(&self) -> Instant {
        self.acquired_at + self.validity
    }

    /// Whether the validity time has not run out yet.
    pub fn is_valid(&self) -> bool {
        Instant::now() < self.valid_until()
    }

    /// Servers that granted it.
    pub fn granted(&self) -> usize {
        self.tokens.iter().flatten().count()
    }
}

/// What one server answered to a try.
#[derive(Debug)]
pub enum Reply {
    /// Granted, with this server's fencing token.
    Granted(i64),
    /// Held by someone else (or others wait for it): nil.
    Refused,
    /// An error reply from the server (e.g. WRONGTYPE): not granted.
    Error(RedisError),
    /// No answer (down, timeout, connection lost): may or may not be granted.
    Unreachable(RedisError),
}

/// Why an attempt failed.
#[derive(Debug)]
pub struct LockError {
    pub key: String,
    /// How many servers granted it, and how many were needed.
    pub granted: usize,
    pub quorum: usize,
    /// The time the attempt took, and the lease it asked for.
    pub elapsed: Duration,
    pub lease: Duration,
    /// Every server's answer, index as in `Redlock::new`.
    pub replies: Vec<Reply>,
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "redlock {}: granted by {} of {} servers (quorum {}) in {:?} for a {:?} lease",
            self.key,
            self.granted,
            self.replies.len(),
            self.quorum,
            self.elapsed,
            self.lease
        )
    }
}

impl std::error::Error for LockError {}

/// A random duration in `[lo, hi)`.
fn jitter(lo: Duration, hi: Duration) -> Duration {
    let span = hi.saturating_sub(lo).as_micros().max(1) as u64;
    lo + Duration::from_micros(RandomState::new().build_hasher().finish() % span)
}

fn drift(lease: Duration) -> Duration {
    lease.mul_f64(DRIFT_FACTOR) + DRIFT_FIXED
}

impl Redlock {
    /// A client for the given servers: `redis://host:port/` URLs or
    /// `host:port`. Connects lazily (and again after a failure).
    pub fn new<S: AsRef<str>>(servers: &[S]) -> RedisResult<Redlock> {
        let servers = servers
            .iter()
            .map(|s| {
                let s = s.as_ref();
                let url = if s.contains("://") { s.to_string() } else { format!("redis://{s}/") };
                Ok(Instance { addr: s.to_string(), client: Client::open(url)?, conn: None })
            })
            .collect::<RedisResult<Vec<_>>>()?;
        Ok(Redlock {
            servers,
            io_timeout: Duration::from_millis(100),
            retry_count: 3,
            retry_delay: Duration::from_millis(200),
        })
    }

    /// How many servers must grant: a majority.
    pub fn quorum(&self) -> usize {
        self.servers.len() / 2 + 1
    }

    pub fn addresses(&self) -> Vec<&str> {
        self.servers.iter().map(|s| s.addr.as_str()).collect()
    }

    /// Runs `cmd` on server `i`, connecting first if needed; a connection
    /// that failed is dropped so that the next call reconnects.
    fn run<T: redis::FromRedisValue>(&mut self, i: usize, cmd: &redis::Cmd) -> RedisResult<T> {
        let timeout = self.io_timeout;
        let server = &mut self.servers[i];
        if server.conn.is_none() {
            let conn = server.client.get_connection_with_timeout(timeout)?;
            conn.set_read_timeout(Some(timeout))?;
            conn.set_write_timeout(Some(timeout))?;
            server.conn = Some(conn);
        }
        let result = cmd.query(server.conn.as_mut().expect("connected"));
        if let Err(e) = &result {
            if e.is_io_error() || e.is_unrecoverable_error() {
                server.conn = None;
            }
        }
        result
    }

    /// One attempt: a non-blocking try on every server. `Ok` if a majority
    /// granted within the validity time; otherwise releases what it may have
    /// taken and returns why it failed.
    pub fn try_lock(&mut self, key: &str, owner: &str, lease: Duration) -> Result<Lock, LockError> {
        let lease_ms = lease.as_millis().max(1) as u64;
        let start = Instant::now();
        let mut replies = Vec::with_capacity(self.servers.len());
        for i in 0..self.servers.len() {
            let cmd = redis::cmd("FLOCK.ACQUIRE").arg(key).arg(owner).arg(lease_ms).clone();
            replies.push(match self.run::<Option<i64>>(i, &cmd) {
                Ok(Some(token)) => Reply::Granted(token),
                Ok(None) => Reply::Refused,
                Err(e) if e.is_io_error() || e.is_unrecoverable_error() => Reply::Unreachable(e),
                Err(e) => Reply::Error(e),
            });
        }
        let elapsed = start.elapsed();
        let tokens: Vec<Option<i64>> =
            replies.iter().map(|r| if let Reply::Granted(t) = r { Some(*t) } else { None }).collect();
        let granted = tokens.iter().flatten().count();
        let validity = lease.checked_sub(elapsed + drift(lease));
        match validity {
            Some(validity) if granted >= self.quorum() && !validity.is_zero() => {
                Ok(Lock { key: key.to_string(), owner: owner.to_string(), acquired_at: start, validity, tokens })
            }
            _ => {
                // Release wherever it may be held: granted, or no answer (the
                // grant may have happened and only the reply was lost).
                for (i, reply) in replies.iter().enumerate() {
                    if matches!(reply, Reply::Granted(_) | Reply::Unreachable(_)) {
                        let _ = self.run::<i64>(i, redis::cmd("FLOCK.RELEASE").arg(key).arg(owner));
                    }
                }
                Err(LockError { key: key.to_string(), granted, quorum: self.quorum(), elapsed, lease, replies })
            }
        }
    }

    /// `try_lock`, retried up to `retry_count` more times after a random
    /// delay (so that competing clients do not keep splitting the votes).
    pub fn lock(&mut self, key: &str, owner: &str, lease: Duration) -> Result<Lock, LockError> {
        let mut attempt = 0;
        loop {
            match self.try_lock(key, owner, lease) {
                Ok(lock) => return Ok(lock),
                Err(e) if attempt >= self.retry_count => return Err(e),
                Err(_) => {
                    attempt += 1;
                    std::thread::sleep(jitter(self.retry_delay / 2, self.retry_delay));
                }
            }
        }
    }

    /// Resets the lease to `lease` from now on every server that granted
    /// the lock (`FLOCK.RENEW`). Succeeds, updating `lock`, if a majority
    /// renewed it in time; otherwise the lock must be taken as lost (and it
    /// is best released).
    pub fn extend(&mut self, lock: &mut Lock, lease: Duration) -> bool {
        if !lock.is_valid() {
            return false;
        }
        let lease_ms = lease.as_millis().max(1) as u64;
        let start = Instant::now();
        let mut renewed = 0;
        for i in 0..self.servers.len() {
            if lock.tokens[i].is_none() {
                continue;
            }
            let cmd = redis::cmd("FLOCK.RENEW").arg(&lock.key).arg(&lock.owner).arg(lease_ms).clone();
            match self.run::<i64>(i, &cmd) {
                Ok(_) => renewed += 1,
                Err(_) => lock.tokens[i] = None, // NOTOWNER (lost) or unreachable
            }
        }
        match lease.checked_sub(start.elapsed() + drift(lease)) {
            Some(validity) if renewed >= self.quorum() && !validity.is_zero() => {
                lock.acquired_at = start;
                lock.validity = validity;
                true
            }
            _ => false,
        }
    }

    /// Releases one hold on every server (also those that did not grant it:
    /// a lost reply may hide a grant; there it answers NOTOWNER, ignored).
    /// Returns how many servers released it.
    pub fn unlock(&mut self, lock: &Lock) -> usize {
        (0..self.servers.len())
            .filter(|&i| self.run::<i64>(i, redis::cmd("FLOCK.RELEASE").arg(&lock.key).arg(&lock.owner)).is_ok())
            .count()
    }
}

/// Demo: takes a Redlock on the servers given as arguments, shows its
/// tokens, shows that a second client cannot take it, extends and releases.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let servers: Vec<String> = std::env::args().skip(1).collect();
    if servers.is_empty() {
        eprintln!("usage: redlock HOST:PORT|redis://HOST:PORT/ ...   (N independent servers with the FLOCK module)");
        std::process::exit(2);
    }
    let mut redlock = Redlock::new(&servers)?;
    let key = "redlock:demo";
    let owner = format!("demo-{}-{:x}", std::process::id(), RandomState::new().build_hasher().finish());
    let lease = Duration::from_secs(10);

    println!("servers: {:?} (quorum {})", redlock.addresses(), redlock.quorum());
    let mut lock = redlock.lock(key, &owner, lease)?;
    println!("locked {key} as {owner}: valid for {:?}", lock.validity);
    for (addr, token) in redlock.addresses().iter().zip(&lock.tokens) {
        match token {
            Some(t) => println!("  {addr}: fencing token {t}"),
            None => println!("  {addr}: not granted"),
        }
    }

    let mut other = Redlock::new(&servers)?;
    other.retry_count = 0;
    match other.lock(key, "demo-other-client", lease) {
        Ok(_) => println!("BUG: a second client also got the lock"),
        Err(e) => println!("second client: {e}"),
    }

    // ... work on the resource, passing it the tokens ...
    if redlock.extend(&mut lock, lease) {
        println!("extended: valid for {:?} more", lock.validity);
    } else {
        println!("could not extend: the lock is lost");
    }
    let released = redlock.unlock(&lock);
    println!("released on {released} of {} servers", servers.len());
    Ok(())
}
