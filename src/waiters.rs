//! The registry of clients blocked in `FLOCK.ACQUIRE ... WAIT`: it owns
//! each blocked client (a lock's queue names it by `BlockedId`) and unblocks
//! it exactly once, with the reply it is answered.
//!
//! Every way out of the queue (grant, WAIT timeout, deletion of the lock,
//! disconnect, CLIENT UNBLOCK, demotion to replica, a resend taking the
//! place) ends in `Waiters::answer`.
//! Redis itself never times a waiter out (see `ffi::block`): its own timeout
//! races with a hand-off in the same event-loop turn and can lose the reply.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use crate::ffi::{self, BlockedClient, BlockedId, Timer};
use crate::place::Place;
use flock_core::effects::Leave;
use flock_core::queue::WaiterId;

pub enum Reply {
    Granted {
        token: u64,
        place: Place,
        delivered: bool,
        at: Instant,
    },
    Nil,
    Error(Leave),
    /// The client is gone or was already answered.
    Silent,
}

/// What a blocked client is unblocked with.
pub struct Answer {
    pub client: u64,
    pub reply: Reply,
}

/// A blocked client and where it waits.
pub struct Waiter {
    bc: BlockedClient<Answer>,
    pub place: Place,
    /// Its entry in the lock's queue.
    pub id: WaiterId,
    /// Its WAIT timeout, if it has one.
    timer: Option<Timer<BlockedId>>,
    /// The waiting connection's client id.
    client: u64,
}

#[derive(Default)]
pub struct Waiters {
    blocked: HashMap<BlockedId, Waiter>,
    /// Client ids unblocked by the module whose reply is not written yet.
    answered: HashSet<u64>,
}

impl Waiters {
    pub fn insert(
        &mut self,
        bc: BlockedClient<Answer>,
        place: Place,
        id: WaiterId,
        timer: Option<Timer<BlockedId>>,
        client: u64,
    ) {
        self.blocked.insert(bc.id(), Waiter { bc, place, id, timer, client });
    }

    pub fn get(&self, id: BlockedId) -> Option<&Waiter> {
        self.blocked.get(&id)
    }

    pub fn len(&self) -> usize {
        self.blocked.len()
    }

    /// Every waiter whose lock is in a database identity `matches` accepts.
    pub fn in_dbs(&self, matches: impl Fn(u32) -> bool) -> Vec<BlockedId> {
        self.blocked.iter().filter(|(_, w)| matches(w.place.ident())).map(|(&id, _)| id).collect()
    }

    /// Ends the wait of a registered waiter with `reply`; false if it is
    /// no longer registered (already answered). The one place that unblocks.
    pub fn answer(&mut self, id: BlockedId, reply: Reply) -> bool {
        let Some(waiter) = self.blocked.remove(&id) else { return false };
        if let Some(timer) = waiter.timer {
            ffi::stop_timer(timer);
        }
        if !matches!(reply, Reply::Silent) {
            self.answered.insert(waiter.client);
        }
        waiter.bc.unblock(Answer { client: waiter.client, reply });
        true
    }

    /// True while `client` was answered and its reply is not written yet.
    pub fn is_answered(&self, client: u64) -> bool {
        self.answered.contains(&client)
    }

    /// The answer to `client` is done with (written, or the client is gone).
    pub fn answer_done(&mut self, client: u64) {
        self.answered.remove(&client);
    }
}
