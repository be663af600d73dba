//! The Redis side of sessions: a session's blocked `FLOCK.INBOX` and its
//! reply, its timeout, and its end when its connection closes or it is
//! not heard from in time. The registry is `sessions`.

use redis_module::{Context, RedisResult, RedisValue};

use crate::blocking;
use crate::clock;
use crate::engine;
use crate::errors;
use crate::ffi::{self, BlockHandlers, BlockedId};
use crate::sessions::{Batch, Event, Kind};
use crate::state::{self, Bound, State};
use crate::timers;
use crate::waiters::WaitId;
use flock_core::args::SESSION_ID_LEN;
use flock_core::effects::{Counter, End, Leave, Loss};

/// `FLOCK.SESSION [TIMEOUT ms] [WITHTIMEOUT]` on connection `client`
/// (`pin`: WITHTIMEOUT): its session's ID and timeout, the session opened
/// (and its expiry timer set) if it had none.
pub fn open(s: &mut State, client: u64, timeout_ms: Option<u64>, pin: bool) -> ([u8; SESSION_ID_LEN], u64) {
    let opened = s.sessions.open(client, timeout_ms, pin, clock::monotonic_us());
    if opened.arm {
        arm_expiry(s, client);
    }
    (opened.id, opened.timeout_ms)
}

/// A FLOCK command came on connection `client`: its session, if it has one,
/// lives for its timeout from now.
pub fn heard(s: &mut State, client: u64) {
    if s.sessions.heard(client, clock::monotonic_us()) {
        arm_expiry(s, client);
    }
}

/// Sets the timer that looks whether `client`'s session is due when it
/// would be if not heard from again.
fn arm_expiry(s: &mut State, client: u64) {
    let now_us = clock::monotonic_us();
    if let Some(left_us) = s.sessions.left_us(client, now_us) {
        // Module timers count whole milliseconds: rounded up, never early.
        let left_ms = left_us.div_ceil(1000).max(1);
        let timer = timers::create_timer(left_ms, on_expiry, client);
        s.sessions.set_expiry(client, timer, now_us + left_ms * 1000);
    }
}

/// A session's timer: the session was heard from since (it lives on, and
/// the timer is set for its new deadline) or it expires now.
fn on_expiry(ctx: &Context, client: u64) {
    state::with(|s| match s.sessions.left_us(client, clock::monotonic_us()) {
        Some(0) => expire(ctx, s, client),
        Some(_) => arm_expiry(s, client),
        None => {}
    });
}

/// `client`'s session was not heard from for its timeout: it ends as if
/// its connection had closed, and the connection is closed so that a late
/// reader learns at once that its session is gone.
fn expire(ctx: &Context, s: &mut State, client: u64) {
    s.counters.bump(Counter::SessionExpiries, 1);
    end(ctx, s, client);
    // Closing a connection runs Redis's callbacks, which borrow the state:
    // done from a timer of its own.
    timers::create_timer(0, close_connection, client);
}

fn close_connection(ctx: &Context, client: u64) {
    // The connection may be gone already; there is nothing to do then.
    let _ = ctx.call("CLIENT", &["KILL", "ID", &client.to_string()][..]);
}

/// Blocks `client`'s `FLOCK.INBOX` until an event arrives or `timeout_ms`
/// passes (0: no limit), and at most a third of its session's timeout: the
/// nil that read answers then brings the next read, which keeps the session
/// alive. False if the server would not block it.
pub fn block(ctx: &Context, s: &mut State, client: u64, timeout_ms: u64) -> bool {
    let Some(heartbeat_ms) = s.sessions.get(client).map(|session| (session.timeout_ms() / 3).max(1)) else {
        return false;
    };
    let Some(bc) = ffi::block::<Reading>(ctx) else { return false };
    let timeout_ms = if timeout_ms == 0 { heartbeat_ms } else { timeout_ms.min(heartbeat_ms) };
    let timer = timers::create_timer(timeout_ms, on_read_timeout, client);
    s.sessions.block_reader(client, bc, Some(timer));
    true
}

fn on_read_timeout(_: &Context, client: u64) {
    state::with(|s| s.sessions.end_read(client));
}

/// Replies with `events` as an array of `kind key owner token detail`, or
/// nil if there are none (a read that timed out).
pub fn reply_events(ctx: &Context, events: &[Event]) -> RedisResult {
    if events.is_empty() {
        return Ok(RedisValue::Null);
    }
    ffi::reply_array(ctx, events.len());
    let now = clock::now_ms();
    for event in events {
        // The lease left now: a client counts its grant's deadline from the
        // moment it sent this read, which is before now.
        let lease_left = event.until_ms.map(|until| until.saturating_sub(now).to_string());
        let (kind, detail) = match event.kind {
            Kind::Granted => ("granted", lease_left.as_deref().unwrap_or("")),
            Kind::TimedOut => ("timeout", ""),
            Kind::Cancelled => ("cancelled", ""),
            Kind::Error(why) => ("error", errors::left_text(why)),
            // Not a loss: the grant is held on the server the key went to.
            Kind::Lost(Loss::Moved) => ("moved", ""),
            Kind::Lost(loss) => ("lost", loss.name()),
        };
        ffi::reply_array(ctx, 5);
        ffi::reply_bytes(ctx, kind.as_bytes());
        ffi::reply_bytes(ctx, event.place.key());
        ffi::reply_bytes(ctx, &event.owner);
        ctx.reply(Ok(RedisValue::Integer(event.token as i64)));
        ffi::reply_bytes(ctx, detail.as_bytes());
    }
    Ok(RedisValue::NoReply)
}

/// The callbacks of a session's blocked `FLOCK.INBOX`.
struct Reading;

impl BlockHandlers for Reading {
    type Answer = Batch;

    fn reply(ctx: &Context, batch: Option<&mut Batch>) -> RedisResult {
        let Some(batch) = batch else { return Ok(RedisValue::Null) };
        batch.delivered = true;
        reply_events(ctx, &batch.events)
    }

    /// Grants in a batch that never reached the session pass on, as an
    /// undelivered reply of a blocked ACQUIRE does.
    fn free(batch: Batch) {
        let undelivered = state::with(|s| {
            s.sessions.answer_done(batch.client);
            match batch.delivered {
                true => Vec::new(),
                false => s.sessions.untold_grants(batch.client, batch.events),
            }
        });
        for grant in undelivered {
            timers::create_timer(0, blocking::pass_on, grant);
        }
    }

    /// The reader closed (the session ends with its connection: `close`),
    /// or Redis 7.0 and 8.2 answered it themselves on a demotion: the events
    /// stay in the inbox.
    fn disconnect(_: &Context, bc: BlockedId) {
        state::with(|s| s.sessions.reader_gone(bc));
    }

    /// `CLIENT UNBLOCK` ends the read with nothing, as its timeout does.
    fn unblock_command(_: &Context, bc: Option<BlockedId>) -> RedisResult {
        if let Some(bc) = bc {
            state::with(|s| s.sessions.reader_gone(bc));
        }
        Ok(RedisValue::Null)
    }
}

/// `client`'s connection closed, or its session expired: if it had a
/// session, its waiters leave their queues and the grants in its inbox,
/// which it never read (nor heard of in a reply), pass on; the SESSION
/// grants bound to `client` end.
pub fn end(ctx: &Context, s: &mut State, client: u64) {
    if let Some(session) = s.sessions.close(client) {
        for number in session.waits {
            blocking::leave(ctx, s, WaitId::Session(number), Leave::Disconnected);
        }
        for event in session.inbox.into_iter().filter(|e| e.kind == Kind::Granted) {
            blocking::pass_on_now(ctx, s, &event.place, event.token);
        }
    }
    if let Some(bound) = s.bindings.remove(&client) {
        release_session_grants(ctx, s, client, bound);
    }
}

/// Ends the SESSION grants `bound` to the connection `client`; while
/// writes are paused, once the pause is over (they hold until then).
fn release_session_grants(ctx: &Context, s: &mut State, client: u64, bound: Bound) {
    if engine::paused(s) {
        engine::put_off(s, move |ctx, s| release_session_grants(ctx, s, client, bound));
        return;
    }
    for (place, token) in bound {
        engine::open_lock_at(ctx, s, &place, |s, k, value| {
            engine::update(s, k, value, None, |s, lock, out, now| {
                // Checked after `update` ended a due lease: the lock may have
                // passed on, or the binding may be stale (FLUSH, re-creation).
                if lock.session_of(token) == Some(client) {
                    lock.end(token, End::SessionClosed, now, &mut s.tokens, out);
                }
            });
        });
    }
}
