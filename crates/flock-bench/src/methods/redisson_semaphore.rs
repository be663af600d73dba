//! `redisson` and `redisson-expirable` in the semaphore scenario: Redisson's
//! `RSemaphore` (RedissonSemaphore.java) and `RPermitExpirableSemaphore`
//! (RedissonPermitExpirableSemaphore.java), their Lua as Redisson sends it.
//! A counter holds the free permits; the expirable one also keeps a sorted
//! set permit id -> expiry, whose due permits the next acquire returns.
//! Releases publish the free count on the semaphore's one channel, which
//! every waiting client subscribes to: each wakes and tries again. Nothing is
//! queued. `RSemaphore` has no lease: a permit of a client that dies is lost.

use redis::{Cmd, ErrorKind, RedisResult, Value};

use super::pubsub::{acquire_as_redisson, Subscriber, Try};
use super::redisson::unix_ms;
use super::{Lua, Shared, Want};
use crate::client::Client;
use crate::server::Server;
use crate::stop::Stop;

pub static SET_PERMITS: Lua = Lua::new(include_str!("redisson_semaphore_set.lua"));
pub static ACQUIRE: Lua = Lua::new(include_str!("redisson_semaphore_acquire.lua"));
pub static RELEASE: Lua = Lua::new(include_str!("redisson_semaphore_release.lua"));
pub static EXPIRABLE_ACQUIRE: Lua = Lua::new(include_str!("redisson_expirable_acquire.lua"));
pub static EXPIRABLE_RELEASE: Lua = Lua::new(include_str!("redisson_expirable_release.lua"));

/// RedissonPermitExpirableSemaphore.nonExpirableTimeout: the score of a
/// permit without lease.
const NON_EXPIRABLE: u64 = 922_337_203_685_477;

/// RedissonSemaphore.getChannelName: `redisson_sc:{key}`.
fn channel(key: &str) -> String {
    format!("redisson_sc:{{{key}}}")
}

/// The expirable semaphore's sorted set: `{key}:timeout`.
fn timeouts(key: &str) -> String {
    format!("{{{key}}}:timeout")
}

fn reply_error(what: &'static str, reply: &Value) -> redis::RedisError {
    (ErrorKind::TypeError, what, format!("{reply:?}")).into()
}

/// trySetPermits: the first client to start sets the limit.
fn set_permits(c: &mut Client, key: &str, want: Want) -> RedisResult<()> {
    let Want::Permit { limit } = want else { return Ok(()) };
    c.request(SET_PERMITS.call(&[key, &channel(key)]).arg(limit).arg("publish")).map(drop)
}

pub struct RedissonSemaphore {
    wakeups: Subscriber,
}

impl RedissonSemaphore {
    pub fn new(server: &Server) -> RedisResult<RedissonSemaphore> {
        Ok(RedissonSemaphore { wakeups: Subscriber::connect(server.port)? })
    }
}

impl Shared for RedissonSemaphore {
    fn prepare(&mut self, c: &mut Client, key: &str, want: Want) -> RedisResult<()> {
        set_permits(c, key, want)
    }

    /// RedissonSemaphore.acquire(1): a refused waiter waits for a message only.
    fn acquire(&mut self, c: &mut Client, key: &str, _: &str, _: Want, _: u64, stop: &Stop) -> RedisResult<bool> {
        let mut cmd = ACQUIRE.call(&[key]);
        cmd.arg(1);
        acquire_as_redisson(&mut self.wakeups, c, &channel(key), stop, |c| match c.request(&cmd)? {
            Value::Int(1) => Ok(Try::Granted),
            Value::Int(0) => Ok(Try::Wait(None)),
            other => Err(reply_error("unexpected redisson semaphore reply", &other)),
        })
    }

    fn release(&mut self, c: &mut Client, key: &str, _: &str, _: Want) -> RedisResult<()> {
        c.request(RELEASE.call(&[key, &channel(key)]).arg(1).arg("publish")).map(drop)
    }
}

pub struct RedissonExpirable {
    wakeups: Subscriber,
    /// The permit this client holds.
    permit: Option<String>,
    permits: u64,
}

impl RedissonExpirable {
    pub fn new(server: &Server) -> RedisResult<RedissonExpirable> {
        Ok(RedissonExpirable { wakeups: Subscriber::connect(server.port)?, permit: None, permits: 0 })
    }
}

fn expirable_acquire(key: &str, id: &str, lease_ms: u64) -> Cmd {
    let mut cmd = EXPIRABLE_ACQUIRE.call(&[key, &timeouts(key), &channel(key)]);
    let now = unix_ms();
    cmd.arg(1).arg(now + lease_ms).arg(now).arg(NON_EXPIRABLE).arg("publish").arg(id);
    cmd
}

impl Shared for RedissonExpirable {
    fn prepare(&mut self, c: &mut Client, key: &str, want: Want) -> RedisResult<()> {
        set_permits(c, key, want)
    }

    /// RedissonPermitExpirableSemaphore.acquire(leaseTime): a refused waiter
    /// waits for a message or until the nearest permit expires.
    fn acquire(
        &mut self,
        c: &mut Client,
        key: &str,
        owner: &str,
        _: Want,
        lease_ms: u64,
        stop: &Stop,
    ) -> RedisResult<bool> {
        // Redisson makes a random 16-byte id per permit; any unique id does.
        self.permits += 1;
        let id = format!("{owner}:{}", self.permits);
        let held = acquire_as_redisson(&mut self.wakeups, c, &channel(key), stop, |c| {
            // Each try sends the time it is sent.
            match c.request(&expirable_acquire(key, &id, lease_ms))? {
                Value::Nil => Ok(Try::Wait(None)),
                Value::BulkString(s) if s == b"OK" => Ok(Try::Granted),
                Value::BulkString(s) => {
                    let nearest = std::str::from_utf8(&s).ok().and_then(|s| s.strip_prefix(':')?.parse::<f64>().ok());
                    match nearest {
                        Some(at) => Ok(Try::Wait(Some((at as u64).saturating_sub(unix_ms())))),
                        None => Err(reply_error("unexpected redisson expirable reply", &Value::BulkString(s))),
                    }
                }
                other => Err(reply_error("unexpected redisson expirable reply", &other)),
            }
        })?;
        if held {
            self.permit = Some(id);
        }
        Ok(held)
    }

    /// RedissonPermitExpirableSemaphore.release(permitId).
    fn release(&mut self, c: &mut Client, key: &str, _: &str, _: Want) -> RedisResult<()> {
        let Some(id) = self.permit.take() else {
            return Err((ErrorKind::ClientError, "redisson expirable: release without a permit").into());
        };
        let mut cmd = EXPIRABLE_RELEASE.call(&[key, &channel(key), &timeouts(key)]);
        cmd.arg(id).arg(1).arg(unix_ms()).arg("publish");
        match c.request(&cmd)? {
            Value::Int(1) => Ok(()),
            other => Err(reply_error("redisson expirable: permit already released or expired", &other)),
        }
    }
}
