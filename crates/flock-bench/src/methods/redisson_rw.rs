//! `redisson` in the rwlock scenario: Redisson's `RReadWriteLock`
//! (RedissonReadLock.java, RedissonWriteLock.java), its Lua as Redisson sends
//! it. One hash holds the mode and each holder's hold count; every read hold
//! also has a key of its own that times out (the hash lives as long as the
//! longest). Unlocks publish on the lock's one channel, which every waiting
//! client subscribes to: each wakes, tries again, and waits for the next
//! message or the lock's ttl. Nothing is queued: a reader is granted while
//! the lock is in read mode, so a writer waits until no reader holds it.

use redis::{Cmd, ErrorKind, RedisResult, Value};

use super::pubsub::{acquire_as_redisson, Subscriber, Try};
use super::{Lua, Shared, Want};
use crate::client::Client;
use crate::server::Server;
use crate::stop::Stop;

pub static READ_LOCK: Lua = Lua::new(include_str!("redisson_read_lock.lua"));
pub static READ_UNLOCK: Lua = Lua::new(include_str!("redisson_read_unlock.lua"));
pub static WRITE_LOCK: Lua = Lua::new(include_str!("redisson_write_lock.lua"));
pub static WRITE_UNLOCK: Lua = Lua::new(include_str!("redisson_write_unlock.lua"));

/// LockPubSub.UNLOCK_MESSAGE and READ_UNLOCK_MESSAGE: a client with one
/// waiting thread wakes on either.
const UNLOCK_MESSAGE: u64 = 0;
const READ_UNLOCK_MESSAGE: u64 = 1;
/// How long an unlock's latch lives: (timeout 3000 ms + retry delay up to
/// 2000 ms) x 4 retry attempts with Redisson's defaults
/// (RedissonBaseLock.unlockInnerAsync).
const LATCH_MS: u64 = 20_000;
/// Redisson's `lockWatchdogTimeout`, the lease a write unlock re-arms when
/// holds remain.
const INTERNAL_LEASE_MS: u64 = 30_000;

pub struct RedissonRw {
    wakeups: Subscriber,
    unlocks: u64,
}

impl RedissonRw {
    pub fn new(server: &Server) -> RedisResult<RedissonRw> {
        Ok(RedissonRw { wakeups: Subscriber::connect(server.port)?, unlocks: 0 })
    }
}

/// RedissonReadLock.getChannelName: `redisson_rwlock:{key}`.
fn channel(key: &str) -> String {
    format!("redisson_rwlock:{{{key}}}")
}

/// getReadWriteTimeoutNamePrefix: `{key}:<lock name>:rwlock_timeout`.
fn timeout_prefix(key: &str, owner: &str) -> String {
    format!("{{{key}}}:{owner}:rwlock_timeout")
}

/// The write side's lock name (getWriteLockName).
fn write_name(owner: &str) -> String {
    format!("{owner}:write")
}

fn lock_cmd(key: &str, owner: &str, want: Want, lease_ms: u64) -> Cmd {
    match want {
        Want::Read => {
            let mut cmd = READ_LOCK.call(&[key, &timeout_prefix(key, owner)]);
            cmd.arg(lease_ms).arg(owner).arg(write_name(owner));
            cmd
        }
        _ => {
            let mut cmd = WRITE_LOCK.call(&[key]);
            cmd.arg(lease_ms).arg(write_name(owner));
            cmd
        }
    }
}

impl Shared for RedissonRw {
    fn acquire(
        &mut self,
        c: &mut Client,
        key: &str,
        owner: &str,
        want: Want,
        lease_ms: u64,
        stop: &Stop,
    ) -> RedisResult<bool> {
        let cmd = lock_cmd(key, owner, want, lease_ms);
        acquire_as_redisson(&mut self.wakeups, c, &channel(key), stop, |c| match c.request(&cmd)? {
            Value::Nil => Ok(Try::Granted),
            // A negative ttl: wait for a message only.
            Value::Int(ttl) => Ok(Try::Wait(u64::try_from(ttl).ok())),
            other => Err((ErrorKind::TypeError, "unexpected redisson rwlock reply", format!("{other:?}")).into()),
        })
    }

    /// The unlock script, then, without waiting for its reply, DEL of the
    /// unlock's latch, as RedissonBaseLock.unlockInnerAsync does.
    fn release(&mut self, c: &mut Client, key: &str, owner: &str, want: Want) -> RedisResult<()> {
        self.unlocks += 1;
        let latch = format!("redisson_unlock_latch:{{{key}}}:{owner}:{}", self.unlocks);
        let cmd = match want {
            Want::Read => {
                let mut cmd =
                    READ_UNLOCK.call(&[key, &channel(key), &timeout_prefix(key, owner), &format!("{{{key}}}"), &latch]);
                cmd.arg(UNLOCK_MESSAGE).arg(owner).arg("publish").arg(LATCH_MS);
                cmd
            }
            _ => {
                let mut cmd = WRITE_UNLOCK.call(&[key, &channel(key), &latch]);
                cmd.arg(READ_UNLOCK_MESSAGE).arg(INTERNAL_LEASE_MS).arg(write_name(owner)).arg("publish").arg(LATCH_MS);
                cmd
            }
        };
        if c.request(&cmd)? == Value::Nil {
            return Err((ErrorKind::ClientError, "redisson rwlock: unlock of a lock not held").into());
        }
        c.request_later(redis::cmd("DEL").arg(latch))
    }
}
