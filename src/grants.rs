//! Waits for several keys (`ACQUIREALL`): each is granted every key at
//! once when it is first in every queue it waits in (`drain`, at the end of
//! every command and from a timer for other callbacks), or given back.

use std::time::Instant;

use redis_module::Context;

use crate::engine::{answer_left, open_lock_at, paused, update};
use crate::place::Place;
use crate::state::{self, State};
use crate::waiters::{self, WaitId};
use flock_core::distributions::WaitEnd;
use flock_core::effects::Leave;
use flock_core::lock::{Acquired, Request, RequestId};
use flock_core::queue::WaiterId;

/// The timer `engine` sets for what callbacks other than commands leave.
pub fn on_drain(ctx: &Context, (): ()) {
    state::with(|s| {
        s.drain_timer = None;
        drain(ctx, s);
    });
}

/// Grants the waits for several keys that became ready, each if every key
/// is its to take now, and takes the stale entries of waits that ended out
/// of their queues. Runs with no key open: at the end of every command, and
/// from a timer for other callbacks.
pub fn drain(ctx: &Context, s: &mut State) {
    if s.draining || (s.ready.is_empty() && s.waiters.stale.is_empty()) {
        return;
    }
    // Its grants wait for the end of the pause, which drains (`on_resume`).
    if paused(s) {
        return;
    }
    s.draining = true;
    loop {
        if let Some(wait) = s.ready.pop() {
            grant_all(ctx, s, wait);
        } else if let Some((place, id)) = s.waiters.stale.pop() {
            open_lock_at(ctx, s, &place, |s, k, value| {
                update(s, k, value, None, |s, lock, out, now| {
                    if lock.remove_waiter(id, Leave::Cancelled, out) {
                        lock.grant_waiters(now, &mut s.tokens, out);
                    }
                });
            });
        } else {
            break;
        }
    }
    s.draining = false;
}

/// Grants a wait for several keys every key at once, if each is its to
/// take: first in each queue it waits in, able to be granted there, and
/// the keys it held when it asked still its own (reentered, one more
/// hold). If one of those is not, the wait ends (`Leave::HoldLost`).
fn grant_all(ctx: &Context, s: &mut State, wait: WaitId) {
    let Some(w) = s.waiters.get(wait) else { return };
    let Some(group) = w.group.as_deref() else { return };
    let (owner, keys) = (w.owner.clone(), group.keys.clone());
    let (lease_ms, session, want, lock_delay_ms) = (group.lease_ms, group.session, group.want, group.lock_delay_ms);
    let request = group.request.clone().unwrap_or_default();
    for (place, _) in keys.iter().filter(|(_, id)| id.is_some()) {
        let mut first = false;
        open_lock_at(ctx, s, place, |_, _, value| first = value.lock.gated_head() == Some((&wait, true)));
        if !first {
            return;
        }
    }
    // An empty ID stands for none: a request ID has 1 to 64 bytes.
    let id = (!request.0.is_empty()).then_some(RequestId { id: &request.0, window_ms: request.1 });
    let req = Request { owner: &owner, lease_ms, session, session_lease: false, id, want, lock_delay_ms };
    match take_keys(ctx, s, &keys, &req) {
        Some(tokens) => {
            let grants = keys.into_iter().map(|(place, _)| place).zip(tokens).collect();
            let reply = waiters::Reply::GrantedAll { grants, delivered: false, at: Instant::now() };
            let (waiters, ends) = s.ends();
            waiters.answer(ends, wait, reply, WaitEnd::Granted);
        }
        None => answer_left(s, wait, Leave::HoldLost),
    }
}

/// Takes every key of a ready wait for several keys for `req`: reenters the
/// keys it held when it asked (first: if one is lost, only their extra holds
/// are undone, and `None`), then takes the head of each queue it waits in.
/// Each key's token, in order.
fn take_keys(ctx: &Context, s: &mut State, keys: &[(Place, Option<WaiterId>)], req: &Request) -> Option<Vec<u64>> {
    let mut tokens = vec![0; keys.len()];
    let mut reentered = Vec::new();
    for (i, (place, _)) in keys.iter().enumerate().filter(|(_, (_, id))| id.is_none()) {
        let mut token = None;
        open_lock_at(ctx, s, place, |s, k, value| {
            update(s, k, value, None, |s, lock, out, now| {
                if lock.holders().token_of(req.owner).is_some() {
                    if let Ok(Acquired::Reentered(t)) = lock.acquire(req, now, &mut s.tokens, out) {
                        token = Some(t);
                    }
                }
            });
        });
        let Some(token) = token else {
            give_back(ctx, s, req.owner, &reentered);
            return None;
        };
        tokens[i] = token;
        reentered.push(place.clone());
    }
    for (i, (place, _)) in keys.iter().enumerate().filter(|(_, (_, id))| id.is_some()) {
        open_lock_at(ctx, s, place, |s, k, value| {
            // Checked by the caller, with nothing but this function run since.
            if let Some(token) = update(s, k, value, None, |s, lock, out, now| lock.grant_head(now, &mut s.tokens, out))
            {
                tokens[i] = token;
            }
        });
    }
    Some(tokens)
}

/// Takes back one hold of `owner` at each place: the keys a request for
/// several took before it found one it could not.
pub fn give_back(ctx: &Context, s: &mut State, owner: &[u8], places: &[Place]) {
    for place in places {
        open_lock_at(ctx, s, place, |s, k, value| {
            update(s, k, value, None, |s, lock, out, now| {
                let _ = lock.release(owner, now, &mut s.tokens, out);
            });
        });
    }
}
