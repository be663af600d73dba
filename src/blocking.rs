//! The Redis side of `FLOCK.ACQUIRE ... WAIT`: blocking a client, and the
//! callbacks that end its wait (WAIT timeout, disconnect, CLIENT UNBLOCK,
//! demotion) and reply from its `Outcome`. The registry of waiters and the
//! one unblock are in `waiters`.

use redis_module::{Context, RedisError, RedisResult, RedisValue};

use crate::engine::{self, RELEASED};
use crate::ffi::{self, BlockHandlers, BlockedId, CommandFilter, FilterArgs};
use crate::lock::{LockError, Request};
use crate::place::Place;
use crate::state::{self, State};
use crate::value::LockValue;
use crate::waiters::{Answer, Outcome};

pub const LOCKDELETED: &str = "LOCKDELETED the lock was deleted while waiting for it";
/// `UNBLOCKED` is the code Redis itself answers blocked clients with when a
/// master becomes a replica, so clients already treat it as "retry".
pub const DEMOTED: &str = "UNBLOCKED this node is no longer a master: retry on the new master";
pub const RESENT: &str = "RESENT this request was sent again on another connection, which now waits in its place";

/// Queues the calling client on `value` and blocks it; false (nothing
/// queued) if the server would not block it. A resend of a queued request
/// takes over its place, and the client that waited there is answered.
pub fn wait(
    ctx: &Context,
    s: &mut State,
    value: &mut LockValue,
    place: &Place,
    req: &Request,
    timeout_ms: u64,
) -> Result<bool, LockError> {
    let client = ffi::client_id(ctx);
    let mut blocked = None;
    let id = value.lock.enqueue_with(req, || {
        blocked = ffi::block::<Waiting>(ctx);
        blocked.as_ref().map(ffi::BlockedClient::id)
    })?;
    let (Some((id, first)), Some(bc)) = (id, blocked) else { return Ok(false) };
    if let Some(first) = first {
        s.stats.waiters_resent += 1;
        s.waiters.answer(first, Outcome::Resent);
    }
    let timer = (timeout_ms > 0).then(|| ffi::create_timer(timeout_ms, on_wait_timeout, bc.id()));
    s.waiters.insert(bc, place.clone(), id, timer, client);
    Ok(true)
}

/// Takes waiter `bc` out of its lock's queue and answers it; false if it was
/// no longer waiting.
fn leave(ctx: &Context, bc: BlockedId, outcome: Outcome) -> bool {
    let Some((place, id)) = state::with(|s| s.waiters.get(bc).map(|w| (w.place.clone(), w.id))) else {
        return false;
    };
    // Waiter ids are never reused, so one of a deleted lock matches nothing
    // in a lock made later under the same name. The waiters behind one that
    // held them up are granted from a timer: this may run in a callback that
    // cannot replicate (a disconnect).
    engine::open_lock_at(ctx, &place, |_, _, value| {
        if value.lock.remove_waiter(id).is_some() && value.lock.head_fits() {
            ffi::create_timer(0, grant_waiters, place.clone());
        }
    });
    // Opening the key may have expired it (a TTL on the lock key), which
    // already answered this waiter LOCKDELETED: then `answer` is a no-op.
    state::with(|s| s.waiters.answer(bc, outcome))
}

/// This node stopped being a master: every waiter leaves its queue and is
/// told to retry elsewhere. Redis 7.0 and 8.2 have already answered them
/// (their disconnect callback made them leave); Valkey leaves those of a
/// CLUSTER FAILOVER blocked, and a stale queue entry would outlive a later
/// promotion.
pub fn demote_all(ctx: &Context) {
    let waiting = state::with(|s| s.waiters.in_dbs(|_| true));
    for bc in waiting {
        if leave(ctx, bc, Outcome::Demoted) {
            state::with(|s| s.stats.waiters_demoted += 1);
        }
    }
}

fn on_wait_timeout(ctx: &Context, bc: BlockedId) {
    if leave(ctx, bc, Outcome::TimedOut) {
        state::with(|s| s.stats.wait_timeouts += 1);
    }
}

/// The callbacks of a client blocked in WAIT.
struct Waiting;

impl BlockHandlers for Waiting {
    type Answer = Answer;

    fn reply(_: &Context, answer: Option<&mut Answer>) -> RedisResult {
        match answer.map(|a| &mut a.outcome) {
            Some(Outcome::Granted { token, delivered, at, .. }) => {
                *delivered = true;
                let micros = u64::try_from(at.elapsed().as_micros()).unwrap_or(u64::MAX);
                state::with(|s| s.stats.record_handoff(micros));
                Ok(RedisValue::Integer(*token as i64))
            }
            Some(Outcome::Deleted) => Err(RedisError::Str(LOCKDELETED)),
            Some(Outcome::Demoted) => Err(RedisError::Str(DEMOTED)),
            Some(Outcome::Resent) => Err(RedisError::Str(RESENT)),
            _ => Ok(RedisValue::Null),
        }
    }

    /// A grant whose reply never reached its client (it closed in between)
    /// is passed on at once, from a timer: this callback has no client.
    fn free(answer: Answer) {
        state::with(|s| s.waiters.answer_done(answer.client));
        if let Outcome::Granted { token, place, delivered: false, .. } = answer.outcome {
            ffi::create_timer(0, pass_on, (place, token));
        }
    }

    /// Also called for a client closed after it was answered: `leave`
    /// ignores it, as a second unblock of the same handle would corrupt memory.
    fn disconnect(ctx: &Context, bc: BlockedId) {
        if leave(ctx, bc, Outcome::Silent) {
            state::with(|s| s.stats.wait_disconnects += 1);
        }
    }

    /// Redis calls this only for CLIENT UNBLOCK (its own timeout is never
    /// set); it counts as the WAIT timeout.
    fn unblock_command(ctx: &Context, bc: Option<BlockedId>) -> RedisResult {
        if bc.is_some_and(|bc| leave(ctx, bc, Outcome::Silent)) {
            state::with(|s| s.stats.wait_timeouts += 1);
        }
        Ok(RedisValue::Null)
    }
}

/// Redis 7.0 loses the reply of a client that is unblocked by the module and
/// then, in the same event-loop turn, by CLIENT UNBLOCK. Such a client is no
/// longer waiting, so CLIENT UNBLOCK is pointed at no client (id 0) and
/// answers 0, as for any client that is not blocked.
pub struct UnblockFilter;

impl CommandFilter for UnblockFilter {
    fn filter(args: &mut FilterArgs) {
        if args.len() < 3
            || !args.get(0).eq_ignore_ascii_case(b"client")
            || !args.get(1).eq_ignore_ascii_case(b"unblock")
        {
            return;
        }
        let Some(id) = std::str::from_utf8(args.get(2)).ok().and_then(|a| a.parse::<u64>().ok()) else { return };
        if state::with(|s| s.waiters.is_answered(id)) {
            args.replace(2, b"0");
        }
    }
}

/// Tokens are unique, so a holder still has this grant's token only if it
/// is the same grant: it ends (an undelivered shared grant frees its share).
fn pass_on(ctx: &Context, (place, token): (Place, u64)) {
    engine::open_lock_at(ctx, &place, |key, name, value| {
        if value.lock.holds_token(token) {
            engine::update(ctx, key, name, &place, value, |s, value, changes| {
                s.stats.undelivered += 1;
                changes.event(RELEASED);
                changes.grant(value.lock.end_holder(token, changes.now, &mut s.tokens).unwrap_or_default());
            });
        }
    });
}

/// Grants the waiters that a waiter leaving from the head held up.
fn grant_waiters(ctx: &Context, place: Place) {
    engine::open_lock_at(ctx, &place, |key, name, value| {
        engine::update(ctx, key, name, &place, value, |s, value, changes| {
            changes.grant(value.lock.grant_waiters(changes.now, &mut s.tokens));
        });
    });
}
