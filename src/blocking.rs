//! Clients blocked in `FLOCK.ACQUIRE ... WAIT`: how they wait, leave and are
//! answered.
//!
//! Every way out of the queue (grant, WAIT timeout, deletion of the lock,
//! disconnect, CLIENT UNBLOCK) ends in exactly one `unblock` with an
//! `Outcome`, and the reply callback answers from that outcome alone. Redis
//! itself never times a waiter out (see `ffi::block`): its own timeout races
//! with a hand-off in the same event-loop turn and can lose the reply.

use std::ffi::c_void;
use std::os::raw::c_int;

use redis_module::{raw, Context, RedisValue};

use crate::engine::{self, RELEASED};
use crate::ffi::{self, BlockedClient, RawCtx, TimerId};
use crate::keytype::LockValue;
use crate::lock::{Request, LockError};
use crate::state::{self, Place, State, WaiterEntry};

pub const LOCKDELETED: &str = "LOCKDELETED the lock was deleted while waiting for it";

pub enum Outcome {
    Granted { token: u64, place: Place, serial: u64, delivered: bool },
    TimedOut,
    Deleted,
    /// The client is gone or was already answered.
    Silent,
}

/// Queues the calling client on `value` and blocks it.
pub fn wait(
    ctx: &Context,
    s: &mut State,
    value: &mut LockValue,
    place: &Place,
    req: &Request,
    timeout_ms: u64,
) -> Result<(), LockError> {
    let bc = ffi::block(ctx.ctx, on_reply, on_unblock_command, on_free, on_disconnect);
    let id = match value.lock.enqueue(req, bc) {
        Ok(id) => id,
        Err(e) => {
            bc.unblock(Outcome::Silent);
            return Err(e);
        }
    };
    let timer = (timeout_ms > 0).then(|| ffi::create_timer(timeout_ms, on_wait_timeout, bc));
    s.waiters.insert(bc, WaiterEntry { place: place.clone(), serial: value.serial, id, timer });
    Ok(())
}

pub fn stop_wait_timer(timer: Option<TimerId>) {
    if let Some(id) = timer {
        ffi::stop_timer::<BlockedClient>(id);
    }
}

/// Takes `bc` out of its lock's queue; false if it was no longer waiting.
fn leave(ctx: &Context, bc: BlockedClient) -> bool {
    let Some(entry) = state::with(|s| s.waiters.remove(&bc)) else { return false };
    stop_wait_timer(entry.timer);
    engine::with_lock_at(ctx, &entry.place, entry.serial, |_, _, value| {
        value.lock.remove_waiter(entry.id);
    });
    true
}

fn on_wait_timeout(ctx: &Context, bc: BlockedClient) {
    if leave(ctx, bc) {
        state::with(|s| s.stats.wait_timeouts += 1);
        bc.unblock(Outcome::TimedOut);
    }
}

unsafe extern "C" fn on_disconnect(ctx: RawCtx, bc: *mut raw::RedisModuleBlockedClient) {
    // Also called for a client closed after its grant: `leave` ignores it,
    // as a second unblock of the same handle would corrupt Redis's memory.
    let Some(bc) = BlockedClient::from_raw(bc) else { return };
    if leave(&Context::new(ctx), bc) {
        state::with(|s| s.stats.wait_disconnects += 1);
        bc.unblock(Outcome::Silent);
    }
}

/// Redis calls this only for CLIENT UNBLOCK (its own timeout is never set);
/// it counts as the WAIT timeout.
unsafe extern "C" fn on_unblock_command(ctx: RawCtx, _: *mut *mut raw::RedisModuleString, _: c_int) -> c_int {
    let context = Context::new(ctx);
    if let Some(bc) = BlockedClient::of_ctx(ctx) {
        if leave(&context, bc) {
            state::with(|s| s.stats.wait_timeouts += 1);
            bc.unblock(Outcome::Silent);
        }
    }
    context.reply(Ok(RedisValue::Null));
    raw::REDISMODULE_OK as c_int
}

unsafe extern "C" fn on_reply(ctx: RawCtx, _: *mut *mut raw::RedisModuleString, _: c_int) -> c_int {
    let context = Context::new(ctx);
    let reply = match unsafe { ffi::blocked_privdata::<Outcome>(ctx) } {
        Some(Outcome::Granted { token, delivered, .. }) => {
            *delivered = true;
            Ok(RedisValue::Integer(*token as i64))
        }
        Some(Outcome::Deleted) => Err(redis_module::RedisError::Str(LOCKDELETED)),
        _ => Ok(RedisValue::Null),
    };
    context.reply(reply);
    raw::REDISMODULE_OK as c_int
}

/// A grant whose reply never reached its client (it closed in between) is
/// passed on at once, from a timer: this callback has no client to work with.
unsafe extern "C" fn on_free(_: RawCtx, data: *mut c_void) {
    if let Some(outcome) = unsafe { ffi::take_privdata::<Outcome>(data) } {
        if let Outcome::Granted { token, place, serial, delivered: false } = *outcome {
            ffi::create_timer(0, pass_on, (place, serial, token));
        }
    }
}

fn pass_on(ctx: &Context, (place, serial, token): (Place, u64, u64)) {
    engine::with_lock_at(ctx, &place, serial, |key, name, value| {
        if value.lock.holder().is_some_and(|h| h.token == token) {
            engine::update(ctx, key, name, &place, value, |s, value, changes| {
                s.stats.undelivered += 1;
                changes.event(RELEASED);
                changes.grant(value.lock.vacate(changes.now, &mut s.tokens).1);
            });
        }
    });
}
