//! The ways to lock that are measured, behind one interface so that every
//! scenario drives them through the same client code: FLOCK (a blocked
//! connection per waiter, or one session for the whole process), and the
//! recipes used with plain Redis today, as Lua scripts run by EVALSHA.

pub(crate) mod flock;
mod flock_session;
mod listpoll;
mod pubsub;
mod redisson;
mod redisson_rw;
mod redisson_semaphore;
mod setnx;

pub use flock::supports_shared;

use std::sync::OnceLock;
use std::time::Duration;

use redis::{Cmd, Pipeline, RedisResult, Script};

use crate::client::Client;
use crate::server::Server;
use crate::stop::Stop;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Flock,
    /// FLOCK through one session per server for every client thread.
    FlockSession,
    SetNx,
    ListPoll,
    Redisson,
}

impl Kind {
    pub const ALL: [Kind; 5] = [Kind::Flock, Kind::FlockSession, Kind::SetNx, Kind::ListPoll, Kind::Redisson];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Flock => "flock",
            Kind::FlockSession => "flock-session",
            Kind::SetNx => "setnx",
            Kind::ListPoll => "listpoll",
            Kind::Redisson => "redisson",
        }
    }

    pub fn parse(name: &str) -> Result<Kind, String> {
        Kind::ALL.into_iter().find(|k| k.name() == name).ok_or_else(|| format!("unknown method {name:?}"))
    }

    /// Connections one client holds: redisson waits on a second, pub/sub one.
    pub fn connections(self) -> usize {
        match self {
            Kind::Redisson => 2,
            _ => 1,
        }
    }

    /// The state of one client of this method (its extra connections).
    pub fn client(self, server: &Server) -> RedisResult<Box<dyn Method>> {
        Ok(match self {
            Kind::Flock => Box::new(flock::Flock),
            Kind::FlockSession => Box::new(flock_session::FlockSession::new(server)?),
            Kind::SetNx => Box::new(setnx::SetNx),
            Kind::ListPoll => Box::new(listpoll::ListPoll),
            Kind::Redisson => Box::new(redisson::Redisson::new(server)?),
        })
    }
}

/// A lock as a client uses it. Every acquire blocks until granted.
pub trait Method: Send {
    /// Waits until `owner` holds `key`; false if the run ended first.
    fn acquire(&mut self, c: &mut Client, key: &str, owner: &str, lease_ms: u64, stop: &Stop) -> RedisResult<bool>;

    fn release(&mut self, c: &mut Client, key: &str, owner: &str) -> RedisResult<()>;

    /// Adds to `pipe` what takes `key` at once when it is free (bulk loading).
    fn take_free(&self, pipe: &mut Pipeline, key: &str, owner: &str, lease_ms: u64);

    /// Joins the queue of the held `key` and returns without waiting: what
    /// one waiter leaves on the server.
    fn park(&mut self, c: &mut Client, key: &str, owner: &str, lease_ms: u64) -> RedisResult<()>;
}

/// What a client of the rwlock and semaphore scenarios asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    Read,
    Write,
    /// One permit of `limit`.
    Permit {
        limit: u32,
    },
}

/// A read-write lock or a semaphore as a client uses it. Every acquire
/// blocks until granted.
pub trait Shared: Send {
    /// Once per client before its first acquire.
    fn prepare(&mut self, _c: &mut Client, _key: &str, _want: Want) -> RedisResult<()> {
        Ok(())
    }

    /// Waits until `owner` holds `key` as `want` says; false if the run ended first.
    fn acquire(
        &mut self,
        c: &mut Client,
        key: &str,
        owner: &str,
        want: Want,
        lease_ms: u64,
        stop: &Stop,
    ) -> RedisResult<bool>;

    /// The fencing token of the last grant, for a method that has them: the
    /// order in which the server granted.
    fn last_token(&self) -> Option<u64> {
        None
    }

    /// Gives back what the last acquire with `want` got.
    fn release(&mut self, c: &mut Client, key: &str, owner: &str, want: Want) -> RedisResult<()>;
}

/// One way to take a read-write lock or a semaphore, by the name it is
/// reported under.
#[derive(Clone, Copy)]
pub struct SharedKind {
    pub name: &'static str,
    make: fn(&Server) -> RedisResult<Box<dyn Shared>>,
}

impl SharedKind {
    /// The state of one client of this method (its extra connections).
    pub fn client(&self, server: &Server) -> RedisResult<Box<dyn Shared>> {
        (self.make)(server)
    }

    /// The methods measured for `Kind`s in the rwlock scenario (`semaphore`:
    /// in the semaphore one); `flock` only with a module that has `SHARED`.
    pub fn of(kinds: &[Kind], semaphore: bool, flock_shared: bool) -> Vec<SharedKind> {
        let flock = SharedKind { name: "flock", make: |_| Ok(Box::<flock::FlockShared>::default()) };
        let rw = SharedKind { name: "redisson", make: |s| Ok(Box::new(redisson_rw::RedissonRw::new(s)?)) };
        let semaphore_kinds = [
            SharedKind { name: "redisson", make: |s| Ok(Box::new(redisson_semaphore::RedissonSemaphore::new(s)?)) },
            SharedKind {
                name: "redisson-expirable",
                make: |s| Ok(Box::new(redisson_semaphore::RedissonExpirable::new(s)?)),
            },
        ];
        let mut out = Vec::new();
        for &kind in kinds {
            match kind {
                Kind::Flock if flock_shared => out.push(flock),
                Kind::Redisson if semaphore => out.extend(semaphore_kinds),
                Kind::Redisson => out.push(rw),
                _ => {}
            }
        }
        out
    }
}

/// A Lua script run with EVALSHA; `load_scripts` puts it in the server.
pub struct Lua {
    source: &'static str,
    hash: OnceLock<String>,
}

impl Lua {
    const fn new(source: &'static str) -> Lua {
        Lua { source, hash: OnceLock::new() }
    }

    /// EVALSHA on `keys`; the caller adds the arguments.
    fn call(&self, keys: &[&str]) -> Cmd {
        let hash = self.hash.get_or_init(|| Script::new(self.source).get_hash().to_string());
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(hash).arg(keys.len()).arg(keys);
        cmd
    }
}

static SCRIPTS: [&Lua; 14] = [
    &setnx::RELEASE,
    &listpoll::POLL,
    &listpoll::RELEASE,
    &redisson::ACQUIRE,
    &redisson::RELEASE,
    &redisson_rw::READ_LOCK,
    &redisson_rw::READ_UNLOCK,
    &redisson_rw::WRITE_LOCK,
    &redisson_rw::WRITE_UNLOCK,
    &redisson_semaphore::SET_PERMITS,
    &redisson_semaphore::ACQUIRE,
    &redisson_semaphore::RELEASE,
    &redisson_semaphore::EXPIRABLE_ACQUIRE,
    &redisson_semaphore::EXPIRABLE_RELEASE,
];

/// Loads every baseline's scripts (once per server: FLUSHALL keeps them).
pub fn load_scripts(c: &mut Client) -> RedisResult<()> {
    for script in SCRIPTS {
        c.request(redis::cmd("SCRIPT").arg("LOAD").arg(script.source))?;
    }
    Ok(())
}

/// How a polling waiter waits: `attempt` every `interval` until it takes
/// the lock (true) or the run ends (false).
fn poll(stop: &Stop, interval: Duration, mut attempt: impl FnMut() -> RedisResult<bool>) -> RedisResult<bool> {
    loop {
        if attempt()? {
            return Ok(true);
        }
        if stop.is_set() {
            return Ok(false);
        }
        std::thread::sleep(interval);
    }
}
