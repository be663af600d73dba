//! Clients blocked in `FLOCK.ACQUIRE ... WAIT`: how they wait, leave and are
//! answered.
//!
//! Every way out of the queue (grant, WAIT timeout, deletion of the lock,
//! disconnect, CLIENT UNBLOCK, demotion to replica) ends in exactly one `unblock` with an
//! `Outcome`, and the reply callback answers from that outcome alone. Redis
//! itself never times a waiter out (see `ffi::block`): its own timeout races
//! with a hand-off in the same event-loop turn and can lose the reply.

use std::ffi::c_void;
use std::os::raw::c_int;
use std::time::Instant;

use redis_module::{raw, Context, RedisValue};

use crate::engine::{self, RELEASED};
use crate::ffi::{self, BlockedClient, RawCtx};
use crate::keytype::LockValue;
use crate::lock::{LockError, Request};
use crate::state::{self, Place, State, WaiterEntry};

pub const LOCKDELETED: &str = "LOCKDELETED the lock was deleted while waiting for it";
/// `UNBLOCKED` is the code Redis itself answers blocked clients with when a
/// master becomes a replica, so clients already treat it as "retry".
pub const DEMOTED: &str = "UNBLOCKED this node is no longer a master: retry on the new master";

pub enum Outcome {
    Granted { token: u64, place: Place, delivered: bool, at: Instant },
    TimedOut,
    Deleted,
    /// This node became a replica.
    Demoted,
    /// The client is gone or was already answered.
    Silent,
}

/// What a blocked client is unblocked with.
struct Answer {
    client: u64,
    outcome: Outcome,
}

/// Queues the calling client on `value` and blocks it; false (nothing
/// queued) if the server would not block it.
pub fn wait(
    ctx: &Context,
    s: &mut State,
    value: &mut LockValue,
    place: &Place,
    req: &Request,
    timeout_ms: u64,
) -> Result<bool, LockError> {
    let client = ffi::client_id(ctx.ctx);
    let mut blocked = None;
    let id = value.lock.enqueue_with(req, || {
        blocked = ffi::block(ctx.ctx, on_reply, on_unblock_command, on_free, on_disconnect);
        blocked
    })?;
    let (Some(id), Some(bc)) = (id, blocked) else { return Ok(false) };
    let timer = (timeout_ms > 0).then(|| ffi::create_timer(timeout_ms, on_wait_timeout, bc));
    s.waiters.insert(bc, WaiterEntry { place: place.clone(), id, timer, client });
    Ok(true)
}

/// Ends the wait of a registered waiter with `outcome`; false if it is no
/// longer registered (already answered). The one place that unblocks.
pub fn answer(s: &mut State, bc: BlockedClient, outcome: Outcome) -> bool {
    let Some(entry) = s.waiters.remove(&bc) else { return false };
    if let Some(id) = entry.timer {
        ffi::stop_timer::<BlockedClient>(id);
    }
    if !matches!(outcome, Outcome::Silent) {
        s.answered.insert(entry.client);
    }
    bc.unblock(Answer { client: entry.client, outcome });
    true
}

/// Takes `bc` out of its lock's queue and answers it; false if it was no
/// longer waiting.
fn leave(ctx: &Context, bc: BlockedClient, outcome: Outcome) -> bool {
    let Some((place, id)) = state::with(|s| s.waiters.get(&bc).map(|e| (e.place.clone(), e.id))) else {
        return false;
    };
    // Waiter ids are never reused, so one of a deleted lock matches nothing
    // in a lock made later under the same name.
    engine::open_lock_at(ctx, &place, |_, _, value| {
        value.lock.remove_waiter(id);
    });
    // Opening the key may have expired it (a TTL on the lock key), which
    // already answered this waiter LOCKDELETED: then `answer` is a no-op.
    state::with(|s| answer(s, bc, outcome))
}

/// This node stopped being a master: every waiter leaves its queue and is
/// told to retry elsewhere. Redis 7.0 and 8.2 have already answered them
/// (their disconnect callback made them leave); Valkey leaves those of a
/// CLUSTER FAILOVER blocked, and a stale queue entry would outlive a later
/// promotion.
pub fn demote_all(ctx: &Context) {
    let waiting: Vec<BlockedClient> = state::with(|s| s.waiters.keys().copied().collect());
    for bc in waiting {
        if leave(ctx, bc, Outcome::Demoted) {
            state::with(|s| s.stats.waiters_demoted += 1);
        }
    }
}

fn on_wait_timeout(ctx: &Context, bc: BlockedClient) {
    if leave(ctx, bc, Outcome::TimedOut) {
        state::with(|s| s.stats.wait_timeouts += 1);
    }
}

unsafe extern "C" fn on_disconnect(ctx: RawCtx, bc: *mut raw::RedisModuleBlockedClient) {
    // Also called for a client closed after it was answered: `leave` ignores
    // it, as a second unblock of the same handle would corrupt memory.
    let Some(bc) = BlockedClient::from_raw(bc) else { return };
    if leave(&Context::new(ctx), bc, Outcome::Silent) {
        state::with(|s| s.stats.wait_disconnects += 1);
    }
}

/// Redis calls this only for CLIENT UNBLOCK (its own timeout is never set);
/// it counts as the WAIT timeout.
unsafe extern "C" fn on_unblock_command(ctx: RawCtx, _: *mut *mut raw::RedisModuleString, _: c_int) -> c_int {
    let context = Context::new(ctx);
    if let Some(bc) = BlockedClient::of_ctx(ctx) {
        if leave(&context, bc, Outcome::Silent) {
            state::with(|s| s.stats.wait_timeouts += 1);
        }
    }
    context.reply(Ok(RedisValue::Null));
    raw::REDISMODULE_OK as c_int
}

/// Redis 7.0 loses the reply of a client that is unblocked by the module and
/// then, in the same event-loop turn, by CLIENT UNBLOCK. Such a client is no
/// longer waiting, so CLIENT UNBLOCK is pointed at no client (id 0) and
/// answers 0, as for any client that is not blocked.
pub unsafe extern "C" fn unblock_filter(fctx: *mut raw::RedisModuleCommandFilterCtx) {
    let args = ffi::FilterArgs(fctx);
    if args.len() < 3 || !args.get(0).eq_ignore_ascii_case(b"client") || !args.get(1).eq_ignore_ascii_case(b"unblock") {
        return;
    }
    let Some(id) = std::str::from_utf8(args.get(2)).ok().and_then(|a| a.parse::<u64>().ok()) else { return };
    if state::with(|s| s.answered.contains(&id)) {
        args.replace(2, b"0");
    }
}

unsafe extern "C" fn on_reply(ctx: RawCtx, _: *mut *mut raw::RedisModuleString, _: c_int) -> c_int {
    let context = Context::new(ctx);
    let reply = match unsafe { ffi::blocked_privdata::<Answer>(ctx) }.map(|a| &mut a.outcome) {
        Some(Outcome::Granted { token, delivered, at, .. }) => {
            *delivered = true;
            let micros = u64::try_from(at.elapsed().as_micros()).unwrap_or(u64::MAX);
            state::with(|s| s.stats.record_handoff(micros));
            Ok(RedisValue::Integer(*token as i64))
        }
        Some(Outcome::Deleted) => Err(redis_module::RedisError::Str(LOCKDELETED)),
        Some(Outcome::Demoted) => Err(redis_module::RedisError::Str(DEMOTED)),
        _ => Ok(RedisValue::Null),
    };
    context.reply(reply);
    raw::REDISMODULE_OK as c_int
}

/// Runs once per unblock, after the reply callback if the client was still
/// there. A grant whose reply never reached its client (it closed in
/// between) is passed on at once, from a timer: this callback has no client.
unsafe extern "C" fn on_free(_: RawCtx, data: *mut c_void) {
    let Some(answer) = (unsafe { ffi::take_privdata::<Answer>(data) }) else { return };
    state::with(|s| s.answered.remove(&answer.client));
    if let Outcome::Granted { token, place, delivered: false, .. } = answer.outcome {
        ffi::create_timer(0, pass_on, (place, token));
    }
}

/// Tokens are unique, so the holder still has this grant's token only if it
/// is the same grant.
fn pass_on(ctx: &Context, (place, token): (Place, u64)) {
    engine::open_lock_at(ctx, &place, |key, name, value| {
        if value.lock.holder().is_some_and(|h| h.token == token) {
            engine::update(ctx, key, name, &place, value, |s, value, changes| {
                s.stats.undelivered += 1;
                changes.event(RELEASED);
                changes.grant(value.lock.vacate(changes.now, &mut s.tokens).1);
            });
        }
    });
}
