//! `redisson`: the Redisson fair lock. A hash holds owner -> holds, a list
//! is the queue and a sorted set the waiters' timeouts. Release publishes
//! on the channel of the waiter now at the head, so only the next waiter
//! wakes; a waiter waits for that message or for the ttl the acquire
//! script returned, whichever comes first, then tries again. Lease expiry
//! publishes nothing: waiters find out when their timed wait ends.

use std::time::{SystemTime, UNIX_EPOCH};

use redis::{Cmd, ErrorKind, Pipeline, RedisResult, Value};

use super::pubsub::{acquire_as_redisson, Subscriber, Try};
use super::{Lua, Method};
use crate::client::Client;
use crate::server::Server;
use crate::stop::Stop;

pub static ACQUIRE: Lua =
    Lua::new(concat!(include_str!("redisson_drop_stale.lua"), include_str!("redisson_acquire.lua")));
pub static RELEASE: Lua =
    Lua::new(concat!(include_str!("redisson_drop_stale.lua"), include_str!("redisson_release.lua")));

/// Redisson's default thread wait time: how long a queued waiter may stay
/// silent before the waiters behind it drop it.
const WAIT_TIME_MS: u64 = 5000;
/// Redisson's default lease (`lockWatchdogTimeout`), used to re-arm the
/// lease of a reentrant hold on release.
const LEASE_MS: u64 = 30_000;

pub struct Redisson {
    wakeups: Subscriber,
}

impl Redisson {
    pub fn new(server: &Server) -> RedisResult<Redisson> {
        Ok(Redisson { wakeups: Subscriber::connect(server.port)? })
    }
}

pub fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The lock's queue, timeouts and channel prefix, named as Redisson does.
fn names(key: &str) -> [String; 3] {
    ["redisson_lock_queue", "redisson_lock_timeout", "redisson_lock__channel"]
        .map(|prefix| format!("{prefix}:{{{key}}}"))
}

fn channel(key: &str, owner: &str) -> String {
    let [_, _, prefix] = names(key);
    format!("{prefix}:{owner}")
}

fn acquire_cmd(key: &str, owner: &str, lease_ms: u64) -> Cmd {
    let [queue, timeouts, _] = names(key);
    let mut cmd = ACQUIRE.call(&[key, &queue, &timeouts]);
    cmd.arg(lease_ms).arg(owner).arg(WAIT_TIME_MS).arg(unix_ms());
    cmd
}

/// One try: `None` when `owner` holds the lock, else the ms to wait at most.
fn try_acquire(c: &mut Client, key: &str, owner: &str, lease_ms: u64) -> RedisResult<Option<u64>> {
    match c.request(&acquire_cmd(key, owner, lease_ms))? {
        Value::Nil => Ok(None),
        Value::Int(ttl) => Ok(Some(ttl.max(0) as u64)),
        other => Err((ErrorKind::TypeError, "unexpected redisson acquire reply", format!("{other:?}")).into()),
    }
}

impl Method for Redisson {
    fn acquire(&mut self, c: &mut Client, key: &str, owner: &str, lease_ms: u64, stop: &Stop) -> RedisResult<bool> {
        acquire_as_redisson(&mut self.wakeups, c, &channel(key, owner), stop, |c| {
            Ok(match try_acquire(c, key, owner, lease_ms)? {
                None => Try::Granted,
                Some(ttl) => Try::Wait(Some(ttl)),
            })
        })
    }

    fn release(&mut self, c: &mut Client, key: &str, owner: &str) -> RedisResult<()> {
        let [queue, timeouts, prefix] = names(key);
        let mut cmd = RELEASE.call(&[key, &queue, &timeouts, &prefix]);
        cmd.arg(LEASE_MS).arg(owner).arg(0).arg(unix_ms());
        c.request(&cmd).map(drop)
    }

    fn take_free(&self, pipe: &mut Pipeline, key: &str, owner: &str, lease_ms: u64) {
        pipe.add_command(acquire_cmd(key, owner, lease_ms));
    }

    fn park(&mut self, c: &mut Client, key: &str, owner: &str, lease_ms: u64) -> RedisResult<()> {
        try_acquire(c, key, owner, lease_ms)?;
        self.wakeups.subscribe(&channel(key, owner))
    }
}
