//! Server and keyspace events that change where locks live or who holds
//! them: FLUSHDB/FLUSHALL, SWAPDB, RENAME/MOVE, closed connections
//! (SESSION locks), and demotion to replica (waiters).

use std::ffi::c_void;

use redis_module::{raw, Context, NotifyEvent};

use crate::blocking::Outcome;
use crate::engine::{self, RELEASED};
use crate::ffi::{self, RawCtx};
use crate::keytype::lock_value;
use crate::state;

pub fn subscribe(ctx: RawCtx) {
    ffi::subscribe(ctx, raw::REDISMODULE_EVENT_FLUSHDB, on_flush);
    ffi::subscribe(ctx, raw::REDISMODULE_EVENT_SWAPDB, on_swapdb);
    ffi::subscribe(ctx, raw::REDISMODULE_EVENT_CLIENT_CHANGE, on_client_change);
    ffi::subscribe(ctx, raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED, on_role_changed);
}

/// REPLICAOF or a failover made this master a replica: grants can only come
/// from the new master, so no waiter may stay blocked here.
unsafe extern "C" fn on_role_changed(ctx: RawCtx, _: raw::RedisModuleEvent, subevent: u64, _: *mut c_void) {
    if subevent == raw::REDISMODULE_EVENT_REPLROLECHANGED_NOW_REPLICA {
        crate::blocking::demote_all(&Context::new(ctx));
    }
}

/// FLUSHDB and FLUSHALL (also ASYNC, which frees values on another thread)
/// skip the type's unlink callback: answer the flushed waiters and drop the
/// flushed leases here, before any value is freed.
unsafe extern "C" fn on_flush(_: RawCtx, _: raw::RedisModuleEvent, subevent: u64, data: *mut c_void) {
    if subevent != raw::REDISMODULE_SUBEVENT_FLUSHDB_START {
        return;
    }
    let dbnum = unsafe { &*data.cast::<raw::RedisModuleFlushInfo>() }.dbnum;
    state::with(|s| {
        let dbs = &s.dbs;
        let flushed = |ident: u32| dbnum == -1 || dbs.db(ident) == dbnum;
        let gone: Vec<_> = s.waiters.iter().filter(|(_, e)| flushed(e.place.ident())).map(|(bc, _)| *bc).collect();
        // Their leases would only wake the timer for locks that are gone.
        s.deadlines.retain(|lease| !flushed(lease.place.ident()));
        for places in s.sessions.values_mut() {
            places.retain(|p| !flushed(p.ident()));
        }
        s.sessions.retain(|_, places| !places.is_empty());
        for bc in gone {
            if crate::blocking::answer(s, bc, Outcome::Deleted) {
                s.stats.waiters_deleted += 1;
            }
        }
    });
}

unsafe extern "C" fn on_swapdb(_: RawCtx, _: raw::RedisModuleEvent, _: u64, data: *mut c_void) {
    let info = unsafe { &*data.cast::<raw::RedisModuleSwapDbInfo>() };
    state::with(|s| s.dbs.swap(info.dbnum_first, info.dbnum_second));
}

/// A closed connection releases the SESSION locks it holds.
unsafe extern "C" fn on_client_change(ctx: RawCtx, _: raw::RedisModuleEvent, subevent: u64, data: *mut c_void) {
    if subevent != raw::REDISMODULE_SUBEVENT_CLIENT_CHANGE_DISCONNECTED {
        return;
    }
    let client = unsafe { &*data.cast::<raw::RedisModuleClientInfo>() }.id;
    let Some(places) = state::with(|s| s.sessions.remove(&client)) else { return };
    let ctx = Context::new(ctx);
    for place in places {
        engine::open_lock_at(&ctx, &place, |key, name, value| {
            engine::update(&ctx, key, name, &place, value, |s, value, changes| {
                // Checked after `update` ended a due lease: the lock may have
                // passed on, or the binding may be stale (FLUSH, re-creation).
                if value.lock.session() == Some(client) {
                    s.stats.session_releases += 1;
                    changes.event(RELEASED);
                    changes.grant(value.lock.vacate(changes.now, &mut s.tokens).1);
                }
            });
        });
    }
}

/// RENAME and MOVE fire the type's unlink callback on the source, which
/// stops the lease timer; re-arm it where the lock arrived.
pub fn on_keyspace_event(ctx: &Context, _: NotifyEvent, event: &str, key: &[u8]) {
    if event != "rename_to" && event != "move_to" {
        return;
    }
    let name = ffi::key_name(ctx, key);
    let handle = ctx.open_key_writable(&name);
    if let Ok(Some(value)) = lock_value(&handle) {
        engine::attach(value, ffi::selected_db(ctx.ctx), key);
    }
}
