//! Turns a change of one lock's core state into its effects in Redis: grants
//! delivered to blocked clients, the lease timer moved, session bindings
//! kept in step, keyspace events sent, and the key removed once idle.

use std::time::Instant;

use redis_module::key::RedisKeyWritable;
use redis_module::{Context, NotifyEvent};

use crate::blocking::{self, Outcome};
use crate::ffi::{self, BlockedClient};
use crate::keytype::{self, lock_value, LockValue};
use crate::lock::{Grant, Holder};
use crate::state::{self, Place, State};

pub const ACQUIRED: &str = "flock.acquired";
pub const RELEASED: &str = "flock.released";
pub const EXPIRED: &str = "flock.expired";

/// What one operation did to a lock, gathered while the state is borrowed
/// and applied when it is done.
pub struct Changes {
    before: Option<Snapshot>,
    grants: Vec<Grant<BlockedClient>>,
    events: Vec<&'static str>,
    pub now: u64,
}

impl Changes {
    pub fn grant(&mut self, grant: Option<Grant<BlockedClient>>) {
        if let Some(grant) = grant {
            self.grants.push(grant);
            self.events.push(ACQUIRED);
        }
    }

    pub fn event(&mut self, event: &'static str) {
        self.events.push(event);
    }
}

/// A holder as far as a change to it matters, without copying its owner: a
/// new owner always comes with a new token.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Snapshot {
    token: u64,
    holds: u64,
    deadline_ms: u64,
    session: Option<u64>,
}

impl Snapshot {
    fn of(value: &LockValue) -> Option<Self> {
        value.lock.holder().map(|h| Snapshot { token: h.token, holds: h.holds, deadline_ms: h.deadline_ms, session: h.session })
    }

    /// What replicas and the AOF see: the session flag, not the connection.
    fn replicated(this: Option<Self>) -> Option<(u64, u64, u64, bool)> {
        this.map(|h| (h.token, h.holds, h.deadline_ms, h.session.is_some()))
    }
}

/// Runs `op` on `value`, the lock stored in `key` at `place`, after ending
/// a lease that has run out, then applies every effect. The key is deleted
/// when the lock is left idle.
pub fn update<R>(
    ctx: &Context,
    key: &RedisKeyWritable,
    key_name: &redis_module::RedisString,
    place: &Place,
    value: &mut LockValue,
    op: impl FnOnce(&mut State, &mut LockValue, &mut Changes) -> R,
) -> R {
    let now = ffi::now_ms();
    // A replica follows its master's FLOCK.STATE and never ends a lease itself.
    let replica = ffi::is_replica();
    let (result, events, idle, state) = state::with(|s| {
        let mut changes = Changes { before: Snapshot::of(value), grants: Vec::new(), events: Vec::new(), now };
        if !replica {
            if let Some((_, grant)) = value.lock.expire_due(now, &mut s.tokens) {
                s.stats.expiries += 1;
                changes.event(EXPIRED);
                changes.grant(grant);
            }
        }
        let result = op(s, value, &mut changes);
        let idle = apply(s, place, value, &mut changes);
        let changed = Snapshot::replicated(changes.before) != Snapshot::replicated(Snapshot::of(value));
        (result, changes.events, idle, changed)
    });
    if state {
        propagate(ctx, key_name, value.lock.holder());
    }
    if idle {
        // The value is already detached from timers and sessions, so the
        // unlink callback this triggers has nothing left to do.
        let _ = key.delete();
    }
    for event in events {
        ctx.notify_keyspace_event(NotifyEvent::MODULE, event, key_name);
    }
    result
}

/// Applies gathered effects; true if the lock is now idle.
fn apply(s: &mut State, place: &Place, value: &mut LockValue, changes: &mut Changes) -> bool {
    for grant in changes.grants.drain(..) {
        deliver(s, place, value.serial, grant);
    }
    let (before, after) = (changes.before, Snapshot::of(value));
    let binding = |h: Option<Snapshot>| h.map(|h| (h.token, h.session));
    if binding(before) != binding(after) {
        if let Some(client) = before.and_then(|h| h.session) {
            s.unbind_session(client, place);
        }
        if let Some(client) = after.and_then(|h| h.session) {
            s.bind_session(client, place);
        }
    }
    let lease = |h: Option<Snapshot>| h.map(|h| (h.token, h.deadline_ms));
    if lease(before) != lease(after) || (after.is_some() && value.lease_timer.is_none()) {
        arm_lease(value, place, changes.now);
    }
    value.lock.is_idle()
}

/// Sends the lock's new state to replicas and the AOF as one deterministic
/// command with absolute times (never the blocking ACQUIRE itself).
fn propagate(ctx: &Context, key_name: &redis_module::RedisString, holder: Option<&Holder>) {
    let key = key_name.as_slice();
    match holder {
        None => ctx.replicate(keytype::STATE_COMMAND, &[key]),
        Some(holder) => {
            let numbers = keytype::state_numbers(holder).map(|n| n.to_string());
            let mut args: Vec<&[u8]> = vec![key, &holder.owner];
            args.extend(numbers.iter().map(String::as_bytes));
            ctx.replicate(keytype::STATE_COMMAND, args.as_slice())
        }
    };
}

fn deliver(s: &mut State, place: &Place, serial: u64, grant: Grant<BlockedClient>) {
    s.stats.grants += 1;
    s.stats.handoffs += 1;
    let outcome =
        Outcome::Granted { token: grant.token, place: place.clone(), serial, delivered: false, at: Instant::now() };
    blocking::answer(s, grant.payload, outcome);
}

const REPLICA_RECHECK_MS: u64 = 50;

#[derive(Clone)]
struct LeaseTimer {
    place: Place,
    serial: u64,
    generation: u64,
}

/// Heap bytes of one lease timer's data for a key of `key_len` bytes.
pub fn lease_timer_size(key_len: usize) -> usize {
    ffi::timer_data_size::<LeaseTimer>() + key_len
}

/// (Re)arms the lease timer for the current holder's deadline, or stops it
/// when nobody holds the lock.
pub fn arm_lease(value: &mut LockValue, place: &Place, now: u64) {
    if let Some(id) = value.lease_timer.take() {
        ffi::stop_timer::<LeaseTimer>(id);
    }
    let Some(holder) = value.lock.holder() else { return };
    value.lease_gen += 1;
    let data = LeaseTimer { place: place.clone(), serial: value.serial, generation: value.lease_gen };
    let mut delay = holder.deadline_ms.saturating_sub(now);
    if delay == 0 && ffi::is_replica() {
        // The master's expiry is on its way; look again in case this replica
        // is promoted before it arrives.
        delay = REPLICA_RECHECK_MS;
    }
    value.lease_timer = Some(ffi::create_timer(delay, on_lease_timer, data));
}

fn on_lease_timer(ctx: &Context, timer: LeaseTimer) {
    with_lock_at(ctx, &timer.place, timer.serial, |key, name, value| {
        if value.lease_gen != timer.generation {
            return;
        }
        value.lease_timer = None;
        // `update` ends the lease if it is due, or re-arms the timer.
        update(ctx, key, name, &timer.place, value, |_, _, _| ());
    });
}

/// Opens the lock at `place` in its current database, if there is one, and
/// runs `f` on it.
pub fn open_lock_at(
    ctx: &Context,
    place: &Place,
    f: impl FnOnce(&RedisKeyWritable, &redis_module::RedisString, &mut LockValue),
) {
    let db = state::with(|s| s.dbs.db(place.ident));
    ffi::with_db(ctx.ctx, db, || {
        let name = ctx.create_string(&*place.key);
        let key = ctx.open_key_writable(&name);
        if let Ok(Some(value)) = lock_value(&key) {
            f(&key, &name, value);
        }
    });
}

/// Like `open_lock_at`, but only if it is still the same lock object
/// (`serial`): a timer or waiter may outlive the lock it was made for.
pub fn with_lock_at(
    ctx: &Context,
    place: &Place,
    serial: u64,
    f: impl FnOnce(&RedisKeyWritable, &redis_module::RedisString, &mut LockValue),
) {
    open_lock_at(ctx, place, |key, name, value| {
        if value.serial == serial {
            f(key, name, value);
        }
    });
}

/// The lock leaves its key (deleted, overwritten, expired, renamed or moved
/// away): its waiters get LOCKDELETED, its timer and session binding go.
pub fn detach(value: &mut LockValue, db: i32, key: &[u8]) {
    let bound = value.lock.holder().and_then(|h| h.session);
    if value.lock.waiter_count() == 0 && value.lease_timer.is_none() && bound.is_none() {
        return;
    }
    if let Some(id) = value.lease_timer.take() {
        ffi::stop_timer::<LeaseTimer>(id);
    }
    let waiters = value.lock.drain_waiters();
    state::with(|s| {
        let place = s.place(db, key);
        if let Some(client) = bound {
            s.unbind_session(client, &place);
        }
        if value.lock.holder().is_some() {
            s.stats.deletions += 1;
        }
        for waiter in waiters {
            // A waiter missing from the registry is leaving right now (its
            // removal opened the key, which expired it): its leaver answers it.
            if blocking::answer(s, waiter.payload, Outcome::Deleted) {
                s.stats.waiters_deleted += 1;
            }
        }
    });
}

/// The lock arrived under a new name or database (RENAME, MOVE): its lease
/// timer and session binding follow it.
pub fn attach(value: &mut LockValue, db: i32, key: &[u8]) {
    let place = state::with(|s| {
        let place = s.place(db, key);
        if let Some(client) = value.lock.holder().and_then(|h| h.session) {
            s.bind_session(client, &place);
        }
        if value.lock.holder().is_some() {
            s.stats.deletions = s.stats.deletions.saturating_sub(1);
        }
        place
    });
    arm_lease(value, &place, ffi::now_ms());
}
