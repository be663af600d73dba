//! `redisson`: the Redisson fair lock. A hash holds owner -> holds, a list
//! is the queue and a sorted set the waiters' timeouts. Release publishes
//! on the channel of the waiter now at the head, so only the next waiter
//! wakes; a waiter waits for that message or for the ttl the acquire
//! script returned, whichever comes first, then tries again. Lease expiry
//! publishes nothing: waiters find out when their timed wait ends.

use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::{Cmd, ErrorKind, Parser, Pipeline, RedisResult, Value};

use super::{Lua, Method};
use crate::client::Client;
use crate::runner::Stop;
use crate::server::Server;

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

fn unix_ms() -> u64 {
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
        if try_acquire(c, key, owner, lease_ms)?.is_none() {
            return Ok(true);
        }
        // As Redisson: subscribe, then try again before every wait, so that
        // a wake-up published before the subscription is not missed.
        let channel = channel(key, owner);
        self.wakeups.subscribe(&channel)?;
        let held = loop {
            let Some(ttl) = try_acquire(c, key, owner, lease_ms)? else { break true };
            if stop.is_set() {
                break false;
            }
            let wait = Duration::from_millis(ttl).min(stop.remaining()).max(Duration::from_millis(1));
            self.wakeups.wait(wait)?;
        };
        // Redisson does not wait for the unsubscription either.
        self.wakeups.unsubscribe(&channel)?;
        c.count_elsewhere(2);
        Ok(held)
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

/// The pub/sub connection on which a redisson waiter hears its wake-up.
/// A plain socket read with the `redis` parser, so that a wait that times
/// out leaves the connection usable.
struct Subscriber {
    reader: BufReader<TcpStream>,
    parser: Parser,
}

impl Subscriber {
    fn connect(port: u16) -> RedisResult<Subscriber> {
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_nodelay(true)?;
        Ok(Subscriber { reader: BufReader::new(stream), parser: Parser::new() })
    }

    fn write(&mut self, cmd: &mut Cmd, channel: &str) -> RedisResult<()> {
        Ok(self.reader.get_mut().write_all(&cmd.arg(channel).get_packed_command())?)
    }

    /// Subscribes to `channel` and waits for the confirmation, skipping what
    /// earlier waits left unread (late wake-ups, unsubscribe replies).
    fn subscribe(&mut self, channel: &str) -> RedisResult<()> {
        self.reader.get_ref().set_read_timeout(None)?;
        self.write(&mut redis::cmd("SUBSCRIBE"), channel)?;
        while !is_subscribed(&self.parser.parse_value(&mut self.reader)?, channel) {}
        Ok(())
    }

    fn unsubscribe(&mut self, channel: &str) -> RedisResult<()> {
        self.write(&mut redis::cmd("UNSUBSCRIBE"), channel)
    }

    /// Waits for a wake-up or `timeout`, whichever comes first.
    fn wait(&mut self, timeout: Duration) -> RedisResult<()> {
        self.reader.get_ref().set_read_timeout(Some(timeout))?;
        match self.parser.parse_value(&mut self.reader) {
            Err(e) if e.is_timeout() => Ok(()),
            other => other.map(drop),
        }
    }
}

/// The reply `subscribe <channel> <count>`.
fn is_subscribed(reply: &Value, channel: &str) -> bool {
    let Value::Array(items) = reply else { return false };
    matches!(items.as_slice(), [Value::BulkString(kind), Value::BulkString(name), _]
        if kind == b"subscribe" && name == channel.as_bytes())
}
