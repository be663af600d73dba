//! Module-wide state that is connection state, not data: waiters,
//! sessions, SESSION bindings, recent losses, lease deadlines, counters, the token source, and where
//! each database went after SWAPDB; and the one datum that is data, the
//! request IDs of free locks (saved as the module's aux data). Only the Redis main thread touches it.
//!
//! The rule: every callback Redis makes into FLOCK borrows the state once,
//! with `with` at its entry, and passes `&mut State` down; nothing below an
//! entry borrows it again, so a second borrow cannot be written. The one
//! callback Redis makes from inside FLOCK's own calls is a key type's
//! `unlink` (a key FLOCK deletes, or one whose TTL ends as FLOCK opens it):
//! it hands its work to `now_or_after`, which runs it once the entry that
//! holds the borrow has done its own, before that entry returns.

use rustc_hash::FxHashMap;
use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::RandomState;

use redis_module::Context;

use crate::ffi;
use crate::observed::Observed;
use crate::place::{DbMap, Place};
use crate::sessions::Sessions;
use crate::timers::Timer;
use crate::value::{read_lock_value, LockValue};
use crate::waiters::{Ends, WaitId, Waiters};
use flock_core::effects::{Counters, Event};
use flock_core::lock::{Lock, Outcomes};
use flock_core::losses::Losses;
use flock_core::requests::Remembered;
use flock_core::tokens::TokenSource;
use flock_core::wheel::LeaseWheel;

/// A lease filed in the deadline wheel: the token tells a stale entry (the
/// lock changed hands, moved or was deleted since) from a live one. Token
/// `DELAY_ENDS` (no grant has it) is the end of the lock's lock-delay.
pub struct Lease {
    pub token: u64,
    pub place: Place,
}

/// `Lease::token` of a lock-delay's end.
pub const DELAY_ENDS: u64 = 0;

/// The lock FLOCK's waiters queue on while a lock of another client holds
/// the key (`legacy`), and when the timer set for that lock's TTL fires.
pub struct Shadow {
    pub value: LockValue,
    pub watching: Option<u64>,
}

/// Work that would change locks outside a command, put off while writes
/// are paused (`engine::put_off`).
pub type Job = Box<dyn FnOnce(&Context, &mut State)>;

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

/// What replicas and the AOF must hear after an operation.
pub enum Send {
    /// The holder with this token as it is now, if it still holds.
    Holder(u64),
    /// This owner holds nothing any more.
    Gone(Box<[u8]>),
}

/// What an operation reported, and the effects of it that wait for the end
/// of the operation. Kept between commands so that one allocates nothing.
#[derive(Default)]
pub struct Scratch {
    pub outcomes: Outcomes<WaitId>,
    pub sends: Vec<Send>,
    pub events: Vec<Event>,
}

#[derive(Default)]
pub struct State {
    pub tokens: TokenSource,
    pub dbs: DbMap,
    pub waiters: Waiters,
    pub sessions: Sessions,
    /// The request IDs of free locks, which have no key.
    pub remembered: Remembered<Place>,
    /// The waiters of keys that locks of other clients hold.
    pub shadows: HashMap<Place, Shadow>,
    /// The source of the RENAME or MOVE Redis is notifying.
    pub moving_from: Option<Place>,
    /// Why recent grants ended, by lock and owner, for NOTOWNER.
    pub losses: Losses<(Place, Box<[u8]>)>,
    /// client id -> the holders bound to that connection (SESSION), each as
    /// its lock's place and its token (a token names one holder). A
    /// connection's set stays when it empties (a small one), until the
    /// connection ends.
    pub bindings: FxHashMap<u64, Bound>,
    /// Every holder's lease deadline and every lock-delay's end (the wheel
    /// says when to wake), and the one timer that wakes up for the next.
    pub leases: LeaseWheel<Lease>,
    pub tick: Option<Timer>,
    pub counters: Counters,
    /// The contended locks, the distributions and the record of long holds
    /// and waits.
    pub observed: Observed,
    /// ACQUIREs refused because the maxmemory policy can evict locks.
    pub eviction_refused: u64,
    pub eviction: Risk,
    pub scratch: Scratch,
    /// Waits for several keys whose turn came at one of their keys: each
    /// is granted if every key is its to take (`grants::drain`).
    pub ready: Vec<WaitId>,
    /// The wait for several keys being queued now: not yet registered, but
    /// no stale entry.
    pub forming: Option<WaitId>,
    /// `grants::drain` runs (it grants through `update`, which finds more).
    pub draining: bool,
    /// The timer that drains what a callback other than a command left.
    pub drain_timer: Option<Timer>,
    /// Work put off while writes are paused, in the order it came, and the
    /// timer that looks for the end of the pause (`engine::paused`).
    pub put_off: Vec<Job>,
    pub resume: Option<Timer>,
}

impl State {
    pub fn place(&mut self, db: i32, key: &[u8]) -> Place {
        Place::new(self.dbs.ident(db), key)
    }

    /// What a wait's end touches beside the registry (`Waiters::answer`).
    pub fn ends(&mut self) -> (&mut Waiters, Ends<'_>) {
        (&mut self.waiters, Ends { sessions: &mut self.sessions, observed: &mut self.observed })
    }

    pub fn bind_session(&mut self, client: u64, place: &Place, token: u64) {
        self.bindings.entry(client).or_default().insert((place.clone(), token));
    }

    pub fn unbind_session(&mut self, client: u64, place: &Place, token: u64) {
        if let Some(places) = self.bindings.get_mut(&client) {
            places.remove(&Binding(place, token));
            // A set made anew cost each grant of a session that holds one
            // lock at a time an allocation; one a burst left large goes.
            if places.is_empty() && places.capacity() > KEPT_BINDINGS {
                *places = Bound::default();
            }
        }
    }
}

/// The most bindings an emptied set keeps room for.
const KEPT_BINDINGS: usize = 16;

/// The holders bound to one connection: keyed (SipHash) by their places,
/// which clients name.
pub type Bound = hashbrown::HashSet<(Place, u64), RandomState>;

/// A binding as `Bound` hashes it, looked up without a copy of its place.
#[derive(Hash)]
struct Binding<'a>(&'a Place, u64);

impl hashbrown::Equivalent<(Place, u64)> for Binding<'_> {
    fn equivalent(&self, bound: &(Place, u64)) -> bool {
        *self.0 == bound.0 && self.1 == bound.1
    }
}

/// Runs `f` on the lock at `place`, read only: its key's, or the shadow its
/// waiters queue on while a lock of another client holds the key; `None`
/// if there is neither.
pub fn read_lock<R>(ctx: &Context, s: &State, place: &Place, f: impl FnOnce(&Lock<WaitId>) -> R) -> Option<R> {
    if let Some(shadow) = s.shadows.get(place) {
        return Some(f(&shadow.value.lock));
    }
    ffi::with_db(ctx, s.dbs.db(place.ident()), || {
        let key = ctx.open_key(&ffi::key_name(ctx, place.key()));
        read_lock_value(&key).ok().flatten().map(|value| f(&value.lock))
    })
}

/// Work handed over while the state was borrowed.
type After = Box<dyn FnOnce(&mut State)>;

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::default());
    static AFTER: RefCell<Vec<After>> = const { RefCell::new(Vec::new()) };
}

/// Borrows the state for one callback. Only callback entries call this.
pub fn with<R>(f: impl FnOnce(&mut State) -> R) -> R {
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        let result = f(&mut s);
        while let Some(work) = AFTER.with(|a| a.borrow_mut().pop()) {
            work(&mut s);
        }
        result
    })
}

/// As `with`, or `None` if the state is borrowed already: a command that
/// another module called from a keyspace event FLOCK sent, or Redis's
/// crash report, which can run in the middle of any module code.
pub fn try_with<R>(f: impl FnOnce(&mut State) -> R) -> Option<R> {
    is_free().then(|| with(f))
}

/// Runs `work` now, or, if the state is borrowed (Redis called back from
/// inside a FLOCK call), when that borrow ends.
pub fn now_or_after(work: impl FnOnce(&mut State) + 'static) {
    if is_free() {
        with(work);
    } else {
        AFTER.with(|a| a.borrow_mut().push(Box::new(work)));
    }
}

/// Nothing borrows the state now.
fn is_free() -> bool {
    STATE.with(|s| s.try_borrow_mut().is_ok())
}
