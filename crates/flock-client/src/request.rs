//! One acquire request: how its grant is to hold the key ([`Mode`]), and
//! what it takes to send it, again on a new session if need be
//! ([`Acquire`]).

use std::time::Instant;

use redis::Cmd;

/// How a grant holds its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// [`Lock`](crate::Lock), or the write side of an [`RwLock`](crate::RwLock): the only holder.
    Exclusive,
    /// The read side of an [`RwLock`](crate::RwLock) (`SHARED`): with any other readers.
    Shared,
    /// `permits` of the `limit` of a [`Semaphore`](crate::Semaphore) (`PERMITS n LIMIT m`).
    Permits { permits: u32, limit: u32 },
}

/// What it takes to send a wait again on a new session.
#[derive(Clone)]
pub(crate) struct Acquire {
    pub key: String,
    pub owner: String,
    /// The lease asked for: 0 for a session grant.
    pub lease_ms: u64,
    /// The lease a renewal gives (`FLOCK.RENEW`): the lock's.
    pub renew_ms: u64,
    pub mode: Mode,
    pub rid: String,
    /// `WAIT` ms (0: no limit); `None` for a try.
    pub wait_ms: Option<u64>,
    /// `LOCKDELAY` ms; `None`: the server's `flock.lock-delay-ms`.
    pub lock_delay_ms: Option<u64>,
    pub started: Instant,
}

impl Acquire {
    /// The command, on session `sid` if given; a wait resent later asks
    /// for what is left of its time.
    pub(crate) fn cmd(&self, sid: Option<&str>) -> Cmd {
        let mut cmd = redis::cmd("FLOCK.ACQUIRE");
        cmd.arg(&self.key).arg(&self.owner).arg(self.lease_ms);
        if self.wait_ms.is_some() {
            cmd.arg("WAIT").arg(self.left_ms().unwrap_or(1));
        }
        if let Some(sid) = sid {
            cmd.arg("INBOX").arg(sid);
        }
        cmd.arg("ID").arg(&self.rid);
        if let Some(ms) = self.lock_delay_ms {
            cmd.arg("LOCKDELAY").arg(ms);
        }
        match self.mode {
            Mode::Exclusive => {}
            Mode::Shared => {
                cmd.arg("SHARED");
            }
            Mode::Permits { permits, limit } => {
                cmd.arg("PERMITS").arg(permits).arg("LIMIT").arg(limit);
            }
        }
        cmd
    }

    /// What is left of a bounded wait (`Some(0)`: no limit; `None`: over).
    pub(crate) fn left_ms(&self) -> Option<u64> {
        match self.wait_ms {
            None | Some(0) => Some(0),
            Some(ms) => {
                let spent = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
                ms.checked_sub(spent).filter(|left| *left > 0)
            }
        }
    }
}
