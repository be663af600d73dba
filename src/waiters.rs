//! The registry of waiters: clients blocked in `FLOCK.ACQUIRE ... WAIT`,
//! and the waits sessions sent (`... INBOX session-id`). A lock's queue
//! names each by its `WaitId`; the registry answers each exactly once, by
//! unblocking the client or by an event in its session's inbox.
//!
//! Every way out of the queue (grant, WAIT timeout, deletion of the lock,
//! disconnect, CLIENT UNBLOCK, FLOCK.CANCEL, demotion to replica, a resend
//! taking the place) ends in `Waiters::answer`.
//! Redis itself never times a waiter out (see `ffi::block`): its own timeout
//! races with a hand-off in the same event-loop turn and can lose the reply.

use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::HashMap;
use std::time::Instant;

use crate::clock;
use crate::ffi::{BlockedClient, BlockedId};
use crate::observed::Observed;
use crate::place::Place;
use crate::sessions::{Event, Kind, Sessions};
use crate::timers::{self, Timer};
use flock_core::distributions::WaitEnd;
use flock_core::effects::Leave;
use flock_core::holders::Want;
use flock_core::lock::Lock;
use flock_core::queue::WaiterId;

/// Where a new wait queued, and what it brings.
pub struct Queued {
    /// Its (first) place and its entry in that lock's queue.
    pub at: (Place, WaiterId),
    /// Its WAIT timeout, if it has one.
    pub timer: Option<Timer>,
    pub group: Option<Box<Group>>,
}

/// What a wait's end touches beside the registry.
pub struct Ends<'a> {
    pub sessions: &'a mut Sessions,
    pub observed: &'a mut Observed,
}

/// Which waiter: a blocked client, or a session's wait by its number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WaitId {
    Blocked(BlockedId),
    Session(u64),
}

pub enum Reply {
    Granted {
        token: u64,
        place: Place,
        /// The lease's end (unix ms), for a session's `granted` event;
        /// `None` for a grant that lives with its session.
        until_ms: Option<u64>,
        delivered: bool,
        at: Instant,
    },
    /// A wait for several keys (`FLOCK.ACQUIREALL`): each key's token, in
    /// the order the command named them.
    GrantedAll {
        grants: Vec<(Place, u64)>,
        delivered: bool,
        at: Instant,
    },
    Nil,
    /// FLOCK.CANCEL: nil to a blocked client, `cancelled` to a session.
    Cancelled,
    Error(Leave),
    /// The client is gone or was already answered.
    Silent,
}

/// What a blocked client is unblocked with.
pub struct Answer {
    pub client: u64,
    pub reply: Reply,
}

/// Who is answered, and how.
pub enum Via {
    /// A client blocked on its own connection (`client` is its id).
    Blocked { bc: BlockedClient<Answer>, client: u64 },
    /// Wait `number` of the session of connection `client`.
    Session { client: u64, number: u64 },
}

/// A waiter and where it waits.
pub struct Waiter {
    via: Via,
    pub owner: Box<[u8]>,
    /// Its first place in a lock's queue (of a wait for several keys: the
    /// first it queued in), and its entry there.
    pub place: Place,
    pub id: WaiterId,
    /// Its WAIT timeout, if it has one.
    timer: Option<Timer>,
    /// A wait for several keys: all of them.
    pub group: Option<Box<Group>>,
    /// When it queued (monotonic microseconds).
    pub since_us: u64,
}

impl Waiter {
    /// Every place it waits at: its own, or its group's keys it queued at.
    pub fn places(&self) -> impl Iterator<Item = &Place> + '_ {
        match &self.group {
            Some(group) => Box::new(group.keys.iter().filter(|(_, id)| id.is_some()).map(|(p, _)| p))
                as Box<dyn Iterator<Item = &Place>>,
            None => Box::new(std::iter::once(&self.place)),
        }
    }
}

/// A wait for several keys (`FLOCK.ACQUIREALL ... WAIT`): one waiter with
/// a place in the queue of each key it does not hold, granted every key at
/// once when each is its to take.
pub struct Group {
    /// Each key in the order the command named them, with the waiter's
    /// entry in its queue; `None` for a key the owner held when it asked,
    /// which it reenters at the grant.
    pub keys: Vec<(Place, Option<WaiterId>)>,
    pub lease_ms: u64,
    pub session: Option<u64>,
    pub want: Want,
    pub lock_delay_ms: u32,
    /// The request ID and how long what it did is remembered.
    pub request: Option<(Box<[u8]>, u64)>,
}

#[derive(Default)]
pub struct Waiters {
    waiting: FxHashMap<WaitId, Waiter>,
    /// Where each owner waits (an owner may wait on several locks, from
    /// several connections): for deadlock detection.
    by_owner: HashMap<Box<[u8]>, Vec<WaitId>>,
    /// Owners with more than one wait, and waits for several keys: while
    /// there are none, a waiter waits at one lock only (`spread`).
    spread: usize,
    /// Client ids unblocked by the module whose reply is not written yet.
    answered: FxHashSet<u64>,
    /// Queue entries of waits for several keys that ended without a grant:
    /// each still holds a place in its lock's queue until it is taken out.
    pub stale: Vec<(Place, WaiterId)>,
    /// The last number given to a session's wait.
    numbered: u64,
}

impl Waiters {
    pub fn insert(&mut self, wait: WaitId, via: Via, owner: &[u8], queued: Queued, observed: &mut Observed) {
        let Queued { at: (place, id), timer, group } = queued;
        let waits = self.by_owner.entry(owner.into()).or_default();
        waits.push(wait);
        self.spread += usize::from(waits.len() == 2) + usize::from(group.is_some());
        let waiter = Waiter { via, owner: owner.into(), place, id, timer, group, since_us: clock::monotonic_us() };
        waiter.places().for_each(|p| observed.queued(p, waiter.since_us));
        self.waiting.insert(wait, waiter);
    }

    /// Whether some waiter waits at more than one lock (several waits of
    /// one owner, or a wait for several keys). While none does, a cycle
    /// through a new wait can only run through the holders of each lock
    /// (`deadlocks::cycle`).
    pub fn spread(&self) -> bool {
        self.spread > 0
    }

    /// The locks `owner` waits for.
    pub fn places_of(&self, owner: &[u8]) -> impl Iterator<Item = &Place> + '_ {
        self.waits_of(owner).flat_map(Waiter::places)
    }

    /// The waits of `owner`.
    pub fn waits_of(&self, owner: &[u8]) -> impl Iterator<Item = &Waiter> + '_ {
        let waits = self.by_owner.get(owner).map_or(&[][..], Vec::as_slice);
        waits.iter().filter_map(|w| self.waiting.get(w))
    }

    /// When the first waiter of `lock`'s queue that is still registered
    /// queued (monotonic microseconds): entries of waits for several keys
    /// that ended stay queued until taken out, and are skipped.
    pub fn first_queued_us(&self, lock: &Lock<WaitId>) -> Option<u64> {
        lock.waiters().find_map(|w| self.waiting.get(&w.payload)).map(|w| w.since_us)
    }

    /// Whether `id` is a wait for several keys (its grants are answered
    /// together, not one by one).
    pub fn is_group(&self, id: WaitId) -> bool {
        self.waiting.get(&id).is_some_and(|w| w.group.is_some())
    }

    /// A number for a session's wait, never given before.
    pub fn number(&mut self) -> u64 {
        self.numbered += 1;
        self.numbered
    }

    pub fn get(&self, id: WaitId) -> Option<&Waiter> {
        self.waiting.get(&id)
    }

    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    /// Every waiter whose lock is in a database identity `matches` accepts.
    pub fn in_dbs(&self, matches: impl Fn(u32) -> bool) -> Vec<WaitId> {
        self.waiting.iter().filter(|(_, w)| matches(w.place.ident())).map(|(&id, _)| id).collect()
    }

    /// Ends the wait of a registered waiter with `reply`, which ended
    /// `how`; false if it is no longer registered (already answered). The
    /// one place that answers: it unblocks a blocked client, or files an
    /// event in a session's inbox (whose grant the session then watches).
    pub fn answer(&mut self, ends: Ends, id: WaitId, reply: Reply, how: WaitEnd) -> bool {
        let Ends { sessions, observed } = ends;
        let Some(waiter) = self.waiting.remove(&id) else { return false };
        let waited_us = clock::monotonic_us().saturating_sub(waiter.since_us);
        waiter.places().for_each(|p| observed.left(p, waited_us));
        observed.wait_ended(waiter.place.key(), &waiter.owner, waited_us, how);
        if let Some(waits) = self.by_owner.get_mut(&waiter.owner) {
            waits.retain(|&w| w != id);
            self.spread -= usize::from(waits.len() == 1) + usize::from(waiter.group.is_some());
            if waits.is_empty() {
                self.by_owner.remove(&waiter.owner);
            }
        }
        if let Some(timer) = waiter.timer {
            timers::stop_timer(timer);
        }
        if let Some(group) = waiter.group.filter(|_| !matches!(reply, Reply::GrantedAll { .. })) {
            let entries = group.keys.into_iter().filter_map(|(place, id)| Some((place, id?)));
            self.stale.extend(entries);
        }
        match waiter.via {
            via @ Via::Blocked { .. } => self.unblock(via, reply),
            Via::Session { client, number } => {
                let (kind, token, until_ms) = match reply {
                    Reply::Granted { token, until_ms, .. } => (Kind::Granted, token, until_ms),
                    // Waits for several keys block their client.
                    Reply::GrantedAll { .. } => return true,
                    Reply::Nil => (Kind::TimedOut, 0, None),
                    Reply::Cancelled => (Kind::Cancelled, 0, None),
                    // A resend took its place: its outcome is the one the
                    // session hears.
                    Reply::Error(Leave::Resent) | Reply::Silent => {
                        sessions.drop_wait(client, number);
                        return true;
                    }
                    Reply::Error(why) => (Kind::Error(why), 0, None),
                };
                if kind == Kind::Granted {
                    sessions.watch(client, token, &waiter.place, &waiter.owner, false);
                }
                let event = Event { kind, place: waiter.place, owner: waiter.owner, token, until_ms };
                sessions.push(client, Some(number), event);
            }
        }
        true
    }

    /// Answers a blocked client that is not registered (a wait that could
    /// not be queued after all); a session's wait is not answered here.
    pub fn unblock(&mut self, via: Via, reply: Reply) {
        if let Via::Blocked { bc, client } = via {
            if !matches!(reply, Reply::Silent) {
                self.answered.insert(client);
            }
            bc.unblock(Answer { client, reply });
        }
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
