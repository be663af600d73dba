//! `setnx`: SET NX PX takes the lock, a Lua compare-and-delete releases it,
//! and a waiter retries every millisecond. Not fair: whoever retries at the
//! right moment wins.

use std::time::Duration;

use redis::{Cmd, Pipeline, RedisResult, Value};

use super::{poll, Lua, Method};
use crate::client::Client;
use crate::stop::Stop;

pub static RELEASE: Lua = Lua::new(include_str!("setnx_release.lua"));

const RETRY: Duration = Duration::from_millis(1);

pub struct SetNx;

fn set_nx(key: &str, owner: &str, lease_ms: u64) -> Cmd {
    let mut cmd = redis::cmd("SET");
    cmd.arg(key).arg(owner).arg("NX").arg("PX").arg(lease_ms);
    cmd
}

impl Method for SetNx {
    fn acquire(&mut self, c: &mut Client, key: &str, owner: &str, lease_ms: u64, stop: &Stop) -> RedisResult<bool> {
        poll(stop, RETRY, || Ok(c.request(&set_nx(key, owner, lease_ms))? != Value::Nil))
    }

    fn release(&mut self, c: &mut Client, key: &str, owner: &str) -> RedisResult<()> {
        c.request(RELEASE.call(&[key]).arg(owner)).map(drop)
    }

    fn take_free(&self, pipe: &mut Pipeline, key: &str, owner: &str, lease_ms: u64) {
        pipe.add_command(set_nx(key, owner, lease_ms));
    }

    /// A setnx waiter leaves nothing on the server: it only retries.
    fn park(&mut self, _c: &mut Client, _key: &str, _owner: &str, _lease_ms: u64) -> RedisResult<()> {
        Ok(())
    }
}
