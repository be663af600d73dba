//! Locks held outside FLOCK on the same names, so that a fleet can move to
//! FLOCK one process at a time. A key holding a string, as `SET key token NX
//! PX` leaves it (redis-py's `Lock`, Spring's and Jedis code, node-redlock),
//! is held by a foreign owner when `flock.legacy-locks` counts it: a try
//! finds it busy, and a `WAIT` queues on a shadow lock kept in the state.
//! When the string goes (deleted, expired, evicted, renamed away) the shadow
//! becomes the key's lock and grants its head. Every way FLOCK opens a lock
//! for a client (`with_lock`) goes through here, so the queue is found
//! wherever it is.

use redis_module::{Context, RedisError, RedisString};

use crate::clock;
use crate::config::{self, LegacyLocks};
use crate::engine::{self, Key};
use crate::ffi::{self, StringKey};
use crate::place::Place;
use crate::state::{self, Shadow, State};
use crate::timers;
use crate::value::{lock_value, put_lock, LockValue};
use crate::waiters::WaitId;
use flock_core::effects::{Leave, Outcome};
use flock_core::lock::Lock;

/// What the key `name` holds, if it counts as a lock held outside FLOCK.
pub fn foreign_holder(ctx: &Context, name: &RedisString) -> Option<StringKey> {
    let held = ffi::string_key(ctx, name)?;
    match config::legacy_locks() {
        LegacyLocks::no => None,
        LegacyLocks::all => Some(held),
        LegacyLocks::ttl => held.ttl_ms.is_some().then_some(held),
    }
}

/// Runs `f` on the lock under `name` (at `place`): the key's own; with the
/// key gone and waiters queued on its shadow, the shadow made the key's lock
/// first (their turn has come); under a key that a foreign lock holds, the
/// shadow, made if `create`. `create` also makes a free lock under an empty
/// key. `Ok(None)`: no lock to run `f` on. `WRONGTYPE` for any other value.
pub fn with_lock<R>(
    ctx: &Context,
    s: &mut State,
    name: &RedisString,
    place: &Place,
    create: bool,
    f: impl FnOnce(&mut State, &Key, &mut LockValue) -> R,
) -> Result<Option<R>, RedisError> {
    let key = ctx.open_key_writable(name);
    let k = Key { ctx, key: &key, name, place };
    let value = match lock_value(&key) {
        Ok(Some(value)) => value,
        Ok(None) => match adopt(s, &k)? {
            Some(value) => value,
            None if create => {
                let value = put_lock(&key, LockValue::new(Lock::default()))?;
                engine::reclaim_requests(s, place, value);
                value
            }
            None => return Ok(None),
        },
        Err(e) => return with_shadow(s, &k, create, f).unwrap_or(Err(e)),
    };
    Ok(Some(f(s, &k, value)))
}

/// `with_lock` on the shadow of a key that is no lock of FLOCK's: the
/// shadow there, or a new one if `create` and a foreign lock holds the key.
/// `None`: the key holds no lock of any kind (WRONGTYPE). A shadow nobody
/// waits on is dropped.
fn with_shadow<R>(
    s: &mut State,
    k: &Key,
    create: bool,
    f: impl FnOnce(&mut State, &Key, &mut LockValue) -> R,
) -> Option<Result<Option<R>, RedisError>> {
    let shadow = match s.shadows.remove(k.place) {
        Some(shadow) => shadow,
        None => {
            let held = foreign_holder(k.ctx, k.name)?;
            if !create {
                return Some(Ok(None));
            }
            let mut value = LockValue::new(Lock::default());
            value.lock.set_foreign();
            let mut shadow = Shadow { value, watching: None };
            watch(k.ctx, &mut shadow, k.place, held.ttl_ms);
            shadow
        }
    };
    Some(Ok(Some(engine::on_shadow(s, k, shadow, f))))
}

/// The key is empty and its shadow's waiters are due: the shadow becomes
/// the key's lock, and its head is granted in this command. `None` if there
/// is no shadow (or nobody was left to grant).
fn adopt<'a>(s: &mut State, k: &Key) -> Result<Option<&'a mut LockValue>, RedisError> {
    let Some(shadow) = s.shadows.remove(k.place) else { return Ok(None) };
    let value = put_lock(k.key, shadow.value)?;
    engine::reclaim_requests(s, k.place, value);
    engine::update(s, k, value, None, |s, lock, out, now| lock.clear_foreign(now, &mut s.tokens, out));
    // Left free if every waiter had gone: then the key went too.
    lock_value(k.key)
}

/// Arms a timer for the foreign lock's TTL, unless one fires by then: Redis
/// deletes an expired key lazily or in its expire cycle, and the waiters'
/// turn comes when the TTL ends.
fn watch(ctx: &Context, shadow: &mut Shadow, place: &Place, ttl_ms: Option<u64>) {
    let Some(ttl) = ttl_ms else { return };
    let at = clock::now_ms().saturating_add(ttl);
    if shadow.watching.is_some_and(|armed| armed <= at) {
        return;
    }
    shadow.watching = Some(at);
    let db = ffi::selected_db(ctx);
    timers::create_timer(ttl, on_ttl_due, (db, place.key().to_vec()));
}

fn on_ttl_due(ctx: &Context, (db, key): (i32, Vec<u8>)) {
    state::with(|s| look_again(ctx, s, db, &key, true));
}

/// A key that a shadow waits on may have gone (a keyspace event for it):
/// looks again after the command that sent the event (Redis 7.2 and later),
/// or in the next event-loop turn (7.0, or inside FLOCK's own command).
pub fn key_event(ctx: &Context, key: &[u8]) {
    let db = ffi::selected_db(ctx);
    // Every deletion and expiry of the server comes here: most find no shadow.
    let waited_on = state::try_with(|s| {
        if s.shadows.is_empty() {
            return false;
        }
        let place = s.place(db, key);
        s.shadows.contains_key(&place)
    });
    if waited_on == Some(false) {
        return;
    }
    let job_key = key.to_vec();
    let queued = ctx.add_post_notification_job(move |ctx| {
        if state::try_with(|s| look_again(ctx, s, db, &job_key, false)).is_none() {
            timers::create_timer(0, on_ttl_due, (db, job_key));
        }
    });
    if !matches!(queued, Ok(redis_module::Status::Ok)) {
        timers::create_timer(0, on_ttl_due, (db, key.to_vec()));
    }
}

/// The waiters on the shadow of `key` of database `db`: granted if the key
/// has gone, still waiting (its TTL watched) while a string holds it, told
/// `LOCKDELETED` if something else took the name; while writes are paused,
/// once the pause is over. `timer`: called from the TTL timer (which is
/// spent).
fn look_again(ctx: &Context, s: &mut State, db: i32, key: &[u8], timer: bool) {
    let place = s.place(db, key);
    if timer {
        if let Some(shadow) = s.shadows.get_mut(&place) {
            shadow.watching = None;
        }
    }
    if ffi::is_replica() || !s.shadows.contains_key(&place) {
        return;
    }
    // Making the shadow the key's lock writes the key: once the pause is over.
    if engine::paused(s) {
        let key = key.to_vec();
        engine::put_off(s, move |ctx, s| look_again(ctx, s, db, &key, false));
        return;
    }
    ffi::with_db(ctx, db, || {
        let name = ffi::key_name(ctx, key);
        // The string first: opening a key may expire it (its TTL ends in
        // this very millisecond), and the lock's handle must see that.
        let held = ffi::string_key(ctx, &name);
        let handle = ctx.open_key_writable(&name);
        let k = Key { ctx, key: &handle, name: &name, place: &place };
        match (lock_value(&handle), held) {
            (Ok(None), _) => {
                let _ = adopt(s, &k);
            }
            (Err(_), Some(held)) => {
                if let Some(shadow) = s.shadows.get_mut(&place) {
                    watch(ctx, shadow, &place, held.ttl_ms);
                }
            }
            _ => drop_shadow(s, &place),
        }
    });
}

/// The name went to a value that is no lock held outside FLOCK: its
/// waiters leave as for a deleted lock.
fn drop_shadow(s: &mut State, place: &Place) {
    let Some(mut shadow) = s.shadows.remove(place) else { return };
    let mut out = Vec::new();
    shadow.value.lock.drain_waiters(Leave::Deleted, &mut out);
    for outcome in out {
        if let Outcome::Left { waiter, why } = outcome {
            engine::answer_left(s, waiter, why);
        }
    }
}

/// The shadow lock FLOCK's waiters queue on under `place`, if any.
pub fn shadow<'a>(s: &'a State, place: &Place) -> Option<&'a Lock<WaitId>> {
    s.shadows.get(place).map(|shadow| &shadow.value.lock)
}
