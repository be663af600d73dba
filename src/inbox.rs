//! The Redis side of sessions: a session's blocked `FLOCK.INBOX` and its
//! reply, and the end of a session when its connection closes. The
//! registry is `sessions`.

use redis_module::{Context, RedisResult, RedisValue};

use crate::blocking;
use crate::errors;
use crate::ffi::{self, BlockHandlers, BlockedId};
use crate::sessions::{Batch, Event, Kind};
use crate::state::{self, State};
use crate::waiters::WaitId;
use flock_core::effects::{Leave, Loss};

/// Blocks `client`'s `FLOCK.INBOX` until an event arrives or `timeout_ms`
/// passes (0: no limit); false if the server would not block it.
pub fn block(ctx: &Context, s: &mut State, client: u64, timeout_ms: u64) -> bool {
    let Some(bc) = ffi::block::<Reading>(ctx) else { return false };
    let timer = (timeout_ms > 0).then(|| ffi::create_timer(timeout_ms, on_read_timeout, client));
    s.sessions.block_reader(client, bc, timer);
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
    for event in events {
        let (kind, detail) = match event.kind {
            Kind::Granted => ("granted", ""),
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
        state::with(|s| s.sessions.answer_done(batch.client));
        if batch.delivered {
            return;
        }
        for event in batch.events.into_iter().filter(|e| e.kind == Kind::Granted) {
            ffi::create_timer(0, blocking::pass_on, (event.place, event.token));
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

/// `client`'s connection closed: if it had a session, its waiters leave
/// their queues and the grants in its inbox, which it never read, pass on.
/// (Its SESSION grants are bound to `client` and end with the connection
/// like any.)
pub fn close(ctx: &Context, s: &mut State, client: u64) {
    let Some(session) = s.sessions.close(client) else { return };
    for number in session.waits {
        blocking::leave(ctx, s, WaitId::Session(number), Leave::Disconnected);
    }
    for event in session.inbox.into_iter().filter(|e| e.kind == Kind::Granted) {
        blocking::pass_on_now(ctx, s, &event.place, event.token);
    }
}
