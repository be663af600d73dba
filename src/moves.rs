//! A lock's key moving: deleted, overwritten, expired, renamed or moved
//! away (`detach`), arrived under a new name or database (`attach`), or put
//! under a key by Redis with nothing to hold (`remove_arrived_if_free`).
//! Its leases, session bindings and request IDs follow it or go.

use redis_module::Context;

use crate::clock;
use crate::engine::{self, open_lock_at, paused, put_off, update};
use crate::place::Place;
use crate::state::{self, State};
use crate::timers;
use crate::value::LockValue;
use flock_core::effects::{Counter, End, Leave, Outcome};
use flock_core::holders::{Holder, Terms};
use flock_core::lock::Lock;

/// The lock leaves its key (deleted, overwritten, expired, renamed or moved
/// away): its waiters get LOCKDELETED, its leases and session bindings go,
/// its holders end for `why` (`attach` takes a deletion back if the lock
/// arrives elsewhere here). Redis may call this from inside FLOCK's own
/// calls, so the work waits for the state if it is borrowed.
pub fn detach(value: &mut LockValue, db: i32, key: &[u8], why: End) {
    let requests = value.lock.take_requests();
    let mut out = Vec::new();
    value.lock.drain_waiters(Leave::Deleted, &mut out);
    let ended: Vec<(Holder, Terms)> = value.lock.holders().iter().map(|(h, t)| (h.clone(), t)).collect();
    for holder in value.lock.holders_mut() {
        holder.deadline_id = None;
    }
    out.extend(ended.into_iter().map(|(holder, terms)| Outcome::Ended { holder, terms, why }));
    if out.is_empty() && requests.is_none() {
        return;
    }
    let key = key.to_vec();
    state::now_or_after(move |s| {
        let place = s.place(db, &key);
        engine::follow_quietly(s, &place, &mut Lock::default(), out);
        engine::remember(s, &place, requests);
    });
}

/// The lock arrived under a new name or database (RENAME, MOVE) from
/// `from`: its leases, session bindings and request IDs follow it, and its
/// holders are not deleted after all. One that holds nothing goes
/// (`remove_arrived_if_free`).
pub fn attach(ctx: &Context, s: &mut State, value: &mut LockValue, db: i32, key: &[u8], from: Option<Place>) {
    if let Some(from) = from {
        engine::reclaim_requests(s, &from, value);
    }
    let place = s.place(db, key);
    let now = clock::now_ms();
    let tokens: Vec<u64> = value.lock.holders().iter().map(|(h, _)| h.token).collect();
    s.counters.unbump(Counter::Deletions, tokens.len() as u64);
    for token in tokens {
        engine::file(s, &place, &mut value.lock, token, None, now);
    }
    if value.lock.is_idle() {
        remove_arrived_if_free(Some(ctx), place);
    }
}

/// A lock that Redis itself put under a key (RENAME, MOVE, RESTORE, a
/// load) may hold nothing: a key whose only use is a queue (a wait for
/// several keys queues at a free key too) keeps its lock, and that lock
/// leaves its waiters behind when it moves (`detach`) and has none saved.
/// No command would delete it: the key goes once the command that brought
/// it is done (Redis 7.2 and later: right after it; 7.0: from a timer due
/// at once), through `update`, which replicates the DEL. That DEL matters
/// beyond the key: the master replicates holders, not waiters, so its
/// replicas never had such a key; their RENAME of it failed and left the
/// lock that the master's RENAME overwrote, until this DEL of its name.
pub fn remove_arrived_if_free(ctx: Option<&Context>, place: Place) {
    if let Some(ctx) = ctx {
        let job_place = place.clone();
        let queued = ctx.add_post_notification_job(move |ctx| {
            if state::try_with(|s| remove_free_lock_at(ctx, s, &job_place)).is_none() {
                timers::create_timer(0, on_arrived, job_place);
            }
        });
        if matches!(queued, Ok(redis_module::Status::Ok)) {
            return;
        }
    }
    timers::create_timer(0, on_arrived, place);
}

fn on_arrived(ctx: &Context, place: Place) {
    state::with(|s| remove_free_lock_at(ctx, s, &place));
}

/// Deletes the lock under `place` if it holds nothing and nobody waits
/// (a lock made or given a grant since is left as it is); while writes are
/// paused, once the pause is over.
fn remove_free_lock_at(ctx: &Context, s: &mut State, place: &Place) {
    if paused(s) {
        let place = place.clone();
        put_off(s, move |ctx, s| remove_free_lock_at(ctx, s, &place));
        return;
    }
    open_lock_at(ctx, s, place, |s, k, value| {
        if value.lock.is_idle() {
            update(s, k, value, None, |_, _, _, _| {});
        }
    });
}
