//! `listpoll`: a list per lock is its queue. A waiter RPUSHes itself and
//! polls every 100 ms; it holds the lock once it is at the head and
//! `SET lock owner NX PX lease` succeeds. Release deletes the lock and pops
//! the head. Fair, but a hand-off waits for the next poll, and nothing
//! removes a holder that died from the head of the queue.

use std::time::Duration;

use redis::{Cmd, Pipeline, RedisResult, Value};

use super::{poll, Lua, Method};
use crate::client::Client;
use crate::stop::Stop;

pub static POLL: Lua = Lua::new(include_str!("listpoll_poll.lua"));
pub static RELEASE: Lua = Lua::new(include_str!("listpoll_release.lua"));

const INTERVAL: Duration = Duration::from_millis(100);

pub struct ListPoll;

fn queue(key: &str) -> String {
    format!("{key}:queue")
}

fn join(key: &str, owner: &str) -> Cmd {
    let mut cmd = redis::cmd("RPUSH");
    cmd.arg(queue(key)).arg(owner);
    cmd
}

fn poll_cmd(key: &str, owner: &str, lease_ms: u64) -> Cmd {
    let mut cmd = POLL.call(&[key, &queue(key)]);
    cmd.arg(owner).arg(lease_ms);
    cmd
}

impl Method for ListPoll {
    fn acquire(&mut self, c: &mut Client, key: &str, owner: &str, lease_ms: u64, stop: &Stop) -> RedisResult<bool> {
        c.request(&join(key, owner))?;
        poll(stop, INTERVAL, || Ok(c.request(&poll_cmd(key, owner, lease_ms))? == Value::Int(1)))
    }

    fn release(&mut self, c: &mut Client, key: &str, owner: &str) -> RedisResult<()> {
        c.request(RELEASE.call(&[key, &queue(key)]).arg(owner)).map(drop)
    }

    fn take_free(&self, pipe: &mut Pipeline, key: &str, owner: &str, lease_ms: u64) {
        pipe.add_command(join(key, owner)).add_command(poll_cmd(key, owner, lease_ms));
    }

    fn park(&mut self, c: &mut Client, key: &str, owner: &str, _lease_ms: u64) -> RedisResult<()> {
        c.request(&join(key, owner)).map(drop)
    }
}
