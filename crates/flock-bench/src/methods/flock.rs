//! FLOCK: one command to wait in the server's queue, one to release.

use redis::{Cmd, Pipeline, RedisResult, Value};

use super::Method;
use crate::client::Client;
use crate::runner::Stop;

pub struct Flock;

fn acquire_cmd(key: &str, owner: &str, lease_ms: u64) -> Cmd {
    let mut cmd = redis::cmd("FLOCK.ACQUIRE");
    cmd.arg(key).arg(owner).arg(lease_ms);
    cmd
}

fn wait_cmd(key: &str, owner: &str, lease_ms: u64) -> Cmd {
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
