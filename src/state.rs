//! Module-wide state that is connection state, not data: blocked waiters,
//! session bindings, lease deadlines, counters, the token source, and where
//! each database went after SWAPDB. Only the Redis main thread touches it.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

use crate::deadlines::Deadlines;
use crate::ffi::Timer;
use crate::lock::TokenSource;
use crate::place::{DbMap, Place};
use crate::waiters::Waiters;

/// A lease filed in the deadline wheel: the token tells a stale entry (the
/// lock changed hands, moved or was deleted since) from a live one.
pub struct Lease {
    pub token: u64,
    pub place: Place,
}

/// What the server's memory settings mean for lock keys, as last read
/// (see `eviction`).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Risk {
    /// The maxmemory policy, if it can evict keys without a TTL.
    pub policy: Option<String>,
    /// `flock.allow-eviction` as it was then (for the log only: ACQUIRE
    /// reads the setting itself).
    pub allowed: bool,
}

#[derive(Default, Debug, Clone, Copy)]
pub struct Stats {
    pub grants: u64,
    pub immediate_grants: u64,
    pub handoffs: u64,
    pub reentrant: u64,
    pub releases: u64,
    pub expiries: u64,
    pub force_releases: u64,
    pub session_releases: u64,
    pub deletions: u64,
    pub undelivered: u64,
    pub wait_timeouts: u64,
    pub wait_disconnects: u64,
    pub waiters_deleted: u64,
    /// ACQUIREs refused because the maxmemory policy can evict locks.
    pub eviction_refused: u64,
    pub waiters_demoted: u64,
    pub waiters_resent: u64,
    /// From a hand-off to its reply being written, in microseconds.
    pub handoff_us_total: u64,
    pub handoff_us_max: u64,
    pub handoffs_replied: u64,
}

impl Stats {
    pub fn record_handoff(&mut self, micros: u64) {
        self.handoff_us_total = self.handoff_us_total.saturating_add(micros);
        self.handoff_us_max = self.handoff_us_max.max(micros);
        self.handoffs_replied += 1;
    }

    pub fn handoff_us_mean(&self) -> u64 {
        self.handoff_us_total.checked_div(self.handoffs_replied).unwrap_or(0)
    }
}

#[derive(Default)]
pub struct State {
    pub tokens: TokenSource,
    pub dbs: DbMap,
    pub waiters: Waiters,
    /// client id -> the holders bound to that connection, each as its
    /// lock's place and its token (a token names one holder).
    pub sessions: HashMap<u64, HashSet<(Place, u64)>>,
    /// Every holder's lease deadline, and the one Redis timer (with the time
    /// it is set for) that wakes up for the next.
    pub deadlines: Deadlines<Lease>,
    pub tick: Option<(Timer<()>, u64)>,
    pub stats: Stats,
    pub eviction: Risk,
}

impl State {
    pub fn place(&mut self, db: i32, key: &[u8]) -> Place {
        Place::new(self.dbs.ident(db), key)
    }

    pub fn bind_session(&mut self, client: u64, place: &Place, token: u64) {
        self.sessions.entry(client).or_default().insert((place.clone(), token));
    }

    pub fn unbind_session(&mut self, client: u64, place: &Place, token: u64) {
        if let Some(places) = self.sessions.get_mut(&client) {
            places.remove(&(place.clone(), token));
            if places.is_empty() {
                self.sessions.remove(&client);
            }
        }
    }
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::default());
}

/// Borrows the state; `f` must not call back into Redis APIs that can run
/// module callbacks synchronously (deleting a key runs `unlink2`).
pub fn with<R>(f: impl FnOnce(&mut State) -> R) -> R {
    STATE.with(|s| f(&mut s.borrow_mut()))
}

/// As `with`, or `None` if the state is borrowed already: for Redis's crash
/// report, which can run in the middle of any module code.
pub fn try_with<R>(f: impl FnOnce(&mut State) -> R) -> Option<R> {
    STATE.with(|s| s.try_borrow_mut().ok().map(|mut s| f(&mut s)))
}
