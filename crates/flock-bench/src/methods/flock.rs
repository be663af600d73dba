//! FLOCK: one command to wait in the server's queue, one to release.

use redis::{Cmd, Pipeline, RedisResult, Value};

use super::{Method, Shared, Want};
use crate::client::Client;
use crate::stop::Stop;

pub struct Flock;

pub(crate) fn acquire_cmd(key: &str, owner: &str, lease_ms: u64) -> Cmd {
    let mut cmd = redis::cmd("FLOCK.ACQUIRE");
    cmd.arg(key).arg(owner).arg(lease_ms);
    cmd
}

pub(super) fn wait_cmd(key: &str, owner: &str, lease_ms: u64) -> Cmd {
    let mut cmd = acquire_cmd(key, owner, lease_ms);
    cmd.arg("WAIT").arg(0);
    cmd
}

impl Method for Flock {
    /// Blocks in the server until the grant; the runner ends a wait at the
    /// end of a run with CLIENT UNBLOCK, which answers nil.
    fn acquire(&mut self, c: &mut Client, key: &str, owner: &str, lease_ms: u64, _stop: &Stop) -> RedisResult<bool> {
        Ok(c.request(&wait_cmd(key, owner, lease_ms))? != Value::Nil)
    }

    fn release(&mut self, c: &mut Client, key: &str, owner: &str) -> RedisResult<()> {
        c.request(redis::cmd("FLOCK.RELEASE").arg(key).arg(owner)).map(drop)
    }

    fn take_free(&self, pipe: &mut Pipeline, key: &str, owner: &str, lease_ms: u64) {
        pipe.add_command(acquire_cmd(key, owner, lease_ms));
    }

    fn park(&mut self, c: &mut Client, key: &str, owner: &str, lease_ms: u64) -> RedisResult<()> {
        c.send(&wait_cmd(key, owner, lease_ms))
    }
}

/// FLOCK in the rwlock and semaphore scenarios: the same two commands,
/// `SHARED` for a reader and `PERMITS 1 LIMIT m` for a permit.
#[derive(Default)]
pub struct FlockShared {
    token: Option<u64>,
}

impl Shared for FlockShared {
    fn acquire(
        &mut self,
        c: &mut Client,
        key: &str,
        owner: &str,
        want: Want,
        lease_ms: u64,
        _: &Stop,
    ) -> RedisResult<bool> {
        let mut cmd = wait_cmd(key, owner, lease_ms);
        match want {
            Want::Read => cmd.arg("SHARED"),
            Want::Write => &mut cmd,
            Want::Permit { limit } => cmd.arg("PERMITS").arg(1).arg("LIMIT").arg(limit),
        };
        self.token = redis::from_owned_redis_value(c.request(&cmd)?)?;
        Ok(self.token.is_some())
    }

    fn last_token(&self) -> Option<u64> {
        self.token
    }

    fn release(&mut self, c: &mut Client, key: &str, owner: &str, _: Want) -> RedisResult<()> {
        Flock.release(c, key, owner)
    }
}

/// Whether the module knows `SHARED` (`--module` may name one from before).
pub fn supports_shared(c: &mut Client) -> RedisResult<bool> {
    let key = "flock-bench:probe";
    match c.request(acquire_cmd(key, "probe", 1000).arg("SHARED")) {
        Ok(_) => c.request(redis::cmd("FLOCK.FORCERELEASE").arg(key)).map(|_| true),
        Err(e) if e.kind() == redis::ErrorKind::ResponseError || e.code().is_some() => Ok(false),
        Err(e) => Err(e),
    }
}
