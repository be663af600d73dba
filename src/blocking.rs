//! The Redis side of `FLOCK.ACQUIRE ... WAIT`: queueing a waiter (a client
//! blocked on its own connection, or a session's wait), and the callbacks
//! that end its wait (WAIT timeout, disconnect, CLIENT UNBLOCK, demotion)
//! and reply from its answer. The registry of waiters and the one answer
//! are in `waiters`.

use std::time::Instant;

use redis_module::{Context, RedisResult, RedisValue};

use crate::engine;
use crate::errors;
use crate::ffi::{self, BlockHandlers, BlockedId};
use crate::grants;
use crate::place::Place;
use crate::state::{self, State};
use crate::timers;
use crate::waiters::{Answer, Group, Queued, Reply, Via, WaitId};
use flock_core::effects::{End, Leave};
use flock_core::lock::{Lock, LockError, Outcomes, Request};
use flock_core::queue::WaiterId;

/// Queues a waiter on `lock`: the calling client, blocked (`session`
/// `None`), or a wait of the session of connection `session`. False
/// (nothing queued) if the server would not block the client. A resend of
/// a queued request takes over its place, and the waiter there leaves
/// (`out`).
#[allow(clippy::too_many_arguments)]
pub fn wait(
    ctx: &Context,
    s: &mut State,
    lock: &mut Lock<WaitId>,
    place: &Place,
    req: &Request,
    timeout_ms: u64,
    session: Option<u64>,
    out: &mut Outcomes<WaitId>,
) -> Result<bool, LockError> {
    let mut via = None;
    let id = lock.enqueue_with(
        req,
        || {
            let (wait, v) = match session {
                Some(client) => {
                    let number = s.waiters.number();
                    (WaitId::Session(number), Via::Session { client, number })
                }
                None => block_client(ctx)?,
            };
            via = Some((wait, v));
            Some(wait)
        },
        out,
    )?;
    let (Some(id), Some((wait, via))) = (id, via) else { return Ok(false) };
    if let (Some(client), WaitId::Session(number)) = (session, wait) {
        s.sessions.add_wait(client, number);
    }
    register(s, wait, via, req.owner, (place.clone(), id), timeout_ms, None);
    Ok(true)
}

/// Blocks the calling client: its wait's id, and how it is answered.
/// `None` if the server would not block it.
pub fn block_client(ctx: &Context) -> Option<(WaitId, Via)> {
    let bc = ffi::block::<Waiting>(ctx)?;
    Some((WaitId::Blocked(bc.id()), Via::Blocked { bc, client: ffi::client_id(ctx) }))
}

/// Registers a queued wait at its (first) place in a queue, with a timer
/// for its WAIT timeout (0: none).
pub fn register(
    s: &mut State,
    wait: WaitId,
    via: Via,
    owner: &[u8],
    at: (Place, WaiterId),
    timeout_ms: u64,
    group: Option<Box<Group>>,
) {
    let timer = (timeout_ms > 0).then(|| timers::create_timer(timeout_ms, on_wait_timeout, wait));
    s.waiters.insert(wait, via, owner, Queued { at, timer, group }, &mut s.observed);
}

/// Takes a waiter out of its lock's queue and answers it, if it is still
/// waiting (neither is sent to replicas, so this works while writes are
/// paused too). The waiters behind one that held them up are granted from a
/// timer: this may run in a callback that cannot replicate (a disconnect).
pub fn leave(ctx: &Context, s: &mut State, wait: WaitId, why: Leave) {
    let Some((place, id)) = s.waiters.get(wait).map(|w| (w.place.clone(), w.id)) else { return };
    // Waiter ids are never reused, so one of a deleted lock matches nothing
    // in a lock made later under the same name.
    engine::open_lock_at(ctx, s, &place, |_, _, value| {
        // Its `Left` outcome is answered below, whether or not the lock still
        // had it (the key may be gone).
        let removed = value.lock.remove_waiter(id, why, &mut Vec::new());
        if removed && (value.lock.head_fits() || value.lock.gated_head().is_some()) {
            timers::create_timer(0, grant_waiters, place.clone());
        }
    });
    engine::answer_left(s, wait, why);
    // A wait for several keys leaves its other queues now, not a timer later.
    grants::drain(ctx, s);
}

/// This node stopped being a master: every waiter leaves its queue and is
/// told to retry elsewhere. Redis 7.0 and 8.2 have already answered them
/// (their disconnect callback made them leave); Valkey leaves those of a
/// CLUSTER FAILOVER blocked, and a stale queue entry would outlive a later
/// promotion.
pub fn demote_all(ctx: &Context, s: &mut State) {
    for wait in s.waiters.in_dbs(|_| true) {
        leave(ctx, s, wait, Leave::Demoted);
    }
}

fn on_wait_timeout(ctx: &Context, wait: WaitId) {
    state::with(|s| leave(ctx, s, wait, Leave::TimedOut));
}

/// A grant's reply is being written: it reached its client, this long
/// after the hand-off.
fn mark_delivered(delivered: &mut bool, at: &Instant) {
    *delivered = true;
    let micros = u64::try_from(at.elapsed().as_micros()).unwrap_or(u64::MAX);
    state::with(|s| s.observed.distributions.handoffs.record(micros));
}

/// The callbacks of a client blocked in WAIT.
struct Waiting;

impl BlockHandlers for Waiting {
    type Answer = Answer;

    fn reply(_: &Context, answer: Option<&mut Answer>) -> RedisResult {
        match answer.map(|a| &mut a.reply) {
            Some(Reply::Granted { token, delivered, at, .. }) => {
                mark_delivered(delivered, at);
                Ok(RedisValue::Integer(*token as i64))
            }
            Some(Reply::GrantedAll { grants, delivered, at }) => {
                mark_delivered(delivered, at);
                Ok(RedisValue::Array(grants.iter().map(|&(_, token)| RedisValue::Integer(token as i64)).collect()))
            }
            Some(Reply::Error(why)) => Err(errors::left(*why)),
            Some(Reply::Nil | Reply::Cancelled | Reply::Silent) | None => Ok(RedisValue::Null),
        }
    }

    /// A grant whose reply never reached its client (it closed in between)
    /// is passed on at once, from a timer: this callback has no client.
    fn free(answer: Answer) {
        state::with(|s| s.waiters.answer_done(answer.client));
        match answer.reply {
            Reply::Granted { token, place, delivered: false, .. } => {
                timers::create_timer(0, pass_on, (place, token));
            }
            Reply::GrantedAll { grants, delivered: false, .. } => {
                for grant in grants {
                    timers::create_timer(0, pass_on, grant);
                }
            }
            _ => {}
        }
    }

    /// Also called for a client closed after it was answered: `leave`
    /// ignores it, as a second unblock of the same handle would corrupt memory.
    fn disconnect(ctx: &Context, bc: BlockedId) {
        state::with(|s| leave(ctx, s, WaitId::Blocked(bc), Leave::Disconnected));
    }

    /// Redis calls this only for CLIENT UNBLOCK (its own timeout is never
    /// set); it counts as the WAIT timeout.
    fn unblock_command(ctx: &Context, bc: Option<BlockedId>) -> RedisResult {
        if let Some(bc) = bc {
            state::with(|s| leave(ctx, s, WaitId::Blocked(bc), Leave::Unblocked));
        }
        Ok(RedisValue::Null)
    }
}

/// From a timer: the free callback that finds a grant undelivered has no
/// client to open the key with.
pub fn pass_on(ctx: &Context, (place, token): (Place, u64)) {
    state::with(|s| pass_on_now(ctx, s, &place, token));
}

/// Tokens are unique, so a holder still has this grant's token only if it
/// is the same grant: it ends (an undelivered shared grant frees its share).
/// While writes are paused, once the pause is over.
pub fn pass_on_now(ctx: &Context, s: &mut State, place: &Place, token: u64) {
    if engine::paused(s) {
        let place = place.clone();
        engine::put_off(s, move |ctx, s| pass_on_now(ctx, s, &place, token));
        return;
    }
    engine::open_lock_at(ctx, s, place, |s, k, value| {
        if value.lock.holders().get(token).is_some() {
            engine::update(s, k, value, None, |s, lock, out, now| {
                lock.end(token, End::Undelivered, now, &mut s.tokens, out);
            });
        }
    });
}

fn grant_waiters(ctx: &Context, place: Place) {
    state::with(|s| grant_waiters_now(ctx, s, place));
}

/// Grants the waiters that a waiter leaving from the head held up; while
/// writes are paused, once the pause is over.
fn grant_waiters_now(ctx: &Context, s: &mut State, place: Place) {
    if engine::paused(s) {
        engine::put_off(s, move |ctx, s| grant_waiters_now(ctx, s, place));
        return;
    }
    engine::open_lock_at(ctx, s, &place, |s, k, value| {
        engine::update(s, k, value, None, |s, lock, out, now| lock.grant_waiters(now, &mut s.tokens, out));
    });
}
