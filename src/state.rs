//! Module-wide state that is connection state, not data: blocked waiters,
//! session bindings, counters, the token source, and where each database
//! went after SWAPDB. Only the Redis main thread touches it.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

use crate::deadlines::Deadlines;
use crate::ffi::{BlockedClient, TimerId};
use crate::lock::TokenSource;
use crate::queue::WaiterId;

/// Where a lock lives: a database *identity* (stable across SWAPDB) and the
/// key name. Timers and waiters remember a `Place`, never a raw db index.
/// One allocation (the identity's 4 bytes, then the name): every held lock
/// has one in the deadline wheel.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Place(Box<[u8]>);

impl Place {
    fn new(ident: u32, key: &[u8]) -> Self {
        Place([&ident.to_le_bytes()[..], key].concat().into_boxed_slice())
    }

    pub fn ident(&self) -> u32 {
        u32::from_le_bytes([self.0[0], self.0[1], self.0[2], self.0[3]])
    }

    pub fn key(&self) -> &[u8] {
        &self.0[4..]
    }
}

/// A lease filed in the deadline wheel: the token tells a stale entry (the
/// lock changed hands, moved or was deleted since) from a live one.
pub struct Lease {
    pub token: u64,
    pub place: Place,
}

/// SWAPDB exchanges two databases' contents; remembered places follow the
/// contents, so each identity maps to the db index it is at now.
#[derive(Default)]
pub struct DbMap {
    ident_to_db: Vec<i32>,
    db_to_ident: Vec<u32>,
}

impl DbMap {
    fn grow(&mut self, n: usize) {
        while self.db_to_ident.len() < n {
            let i = self.db_to_ident.len();
            self.db_to_ident.push(i as u32);
            self.ident_to_db.push(i as i32);
        }
    }

    pub fn ident(&mut self, db: i32) -> u32 {
        let db = db.max(0) as usize;
        self.grow(db + 1);
        self.db_to_ident[db]
    }

    pub fn db(&self, ident: u32) -> i32 {
        self.ident_to_db.get(ident as usize).copied().unwrap_or(ident as i32)
    }

    pub fn swap(&mut self, a: i32, b: i32) {
        let (ia, ib) = (self.ident(a), self.ident(b));
        self.db_to_ident.swap(a as usize, b as usize);
        self.ident_to_db[ia as usize] = b;
        self.ident_to_db[ib as usize] = a;
    }
}

pub struct WaiterEntry {
    pub place: Place,
    pub id: WaiterId,
    pub timer: Option<TimerId>,
    /// The waiting connection's client id.
    pub client: u64,
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
    pub waiters: HashMap<BlockedClient, WaiterEntry>,
    /// Client ids unblocked by the module whose reply is not written yet.
    pub answered: HashSet<u64>,
    /// client id -> places whose holder is bound to that connection.
    pub sessions: HashMap<u64, HashSet<Place>>,
    /// Every holder's lease deadline, and the one Redis timer (with the time
    /// it is set for) that wakes up for the next.
    pub deadlines: Deadlines<Lease>,
    pub tick: Option<(TimerId, u64)>,
    pub stats: Stats,
    pub eviction: crate::eviction::Risk,
}

impl State {
    pub fn place(&mut self, db: i32, key: &[u8]) -> Place {
        Place::new(self.dbs.ident(db), key)
    }

    pub fn bind_session(&mut self, client: u64, place: &Place) {
        self.sessions.entry(client).or_default().insert(place.clone());
    }

    pub fn unbind_session(&mut self, client: u64, place: &Place) {
        if let Some(places) = self.sessions.get_mut(&client) {
            places.remove(place);
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
