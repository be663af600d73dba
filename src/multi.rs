//! `FLOCK.ACQUIREALL` and `FLOCK.RELEASEALL`: several locks of one owner
//! in one step. A try takes every key or none. A `WAIT` queues one waiter
//! with a place in the queue of each key it does not hold yet (a gated
//! entry: no lock grants it alone); `grants::drain` grants it every key
//! at once in the turn the last one comes free to it. After the grant each
//! key is an ordinary hold.

use redis_module::{Context, ContextFlags, RedisError, RedisResult, RedisString, RedisValue};

use crate::blocking;
use crate::commands::{check_max_lease, entered, once_in, place_of, repeated, replay_free, with_key, with_window};
use crate::config;
use crate::deadlocks;
use crate::engine;
use crate::errors::{self, arg_error, lock_error};
use crate::eviction;
use crate::ffi;
use crate::grants;
use crate::state::State;
use crate::waiters::{Group, Reply};
use flock_core::args;
use flock_core::effects::Counter;
use flock_core::lock::{Acquired, LockError, Request};
use flock_core::requests::Kind;

/// What one key of an ACQUIREALL says before anything changes.
#[derive(Default)]
struct Look {
    /// Its to take now (free and nobody waits, or held by the owner).
    can: bool,
    held: bool,
    waiters: usize,
    /// Whom the owner would wait for there.
    blockers: Vec<Box<[u8]>>,
}

/// Answers Redis's question where the keys are, if that is what this call
/// is: Cluster's routing (MOVED, CROSSSLOT) asks the command itself, as
/// for every command flagged `getkeys-api`; it does not read key specs.
fn keys_asked(ctx: &Context, args: &[RedisString]) -> bool {
    if !ctx.is_keys_position_request() {
        return false;
    }
    let n = args.get(1).and_then(|n| n.parse_integer().ok()).and_then(|n| usize::try_from(n).ok()).unwrap_or(0);
    for pos in 2..(2 + n).min(args.len()) {
        ctx.key_at_pos(pos as i32);
    }
    true
}

/// The key names of a command on several keys, after `numkeys`.
fn key_names(args: &[RedisString], n: usize) -> &[RedisString] {
    &args[2..2 + n]
}

fn tokens_reply(tokens: Vec<u64>) -> RedisValue {
    RedisValue::Array(tokens.into_iter().map(|t| RedisValue::Integer(t as i64)).collect())
}

pub fn acquire_all(ctx: &Context, args: &[RedisString]) -> RedisResult {
    if keys_asked(ctx, args) {
        return Ok(RedisValue::NoReply);
    }
    let rest: Vec<&[u8]> = args.iter().skip(1).map(RedisString::as_slice).collect();
    let (keys, parsed) = args::acquire_all(&rest).map_err(arg_error)?;
    let names = key_names(args, keys.len());
    check_max_lease(parsed.lease_ms, "lease-ms")?;
    check_max_lease(parsed.wait_ms.unwrap_or(0), "timeout-ms")?;
    // Inside MULTI, Lua and functions a WAIT acts as a try, as BLPOP does.
    let wait_ms = parsed.wait_ms.filter(|_| !ctx.get_flags().contains(ContextFlags::DENY_BLOCKING));
    let req = Request {
        owner: parsed.owner,
        lease_ms: parsed.lease_ms,
        session_lease: false,
        session: parsed.session.then(|| ffi::client_id(ctx)),
        id: with_window(parsed.id),
        want: parsed.want,
        lock_delay_ms: config::lock_delay_ms(parsed.lock_delay_ms),
    };
    entered(ctx, |s| {
        eviction::check_acquire(s)?;
        if let Some(tokens) = replayed(ctx, s, names, parsed.id, Kind::Acquire, req.owner)? {
            return Ok(tokens_reply(tokens));
        }
        let mut looks = Vec::with_capacity(names.len());
        for name in names {
            looks.push(look(ctx, s, name, &req)?);
        }
        if looks.iter().all(|l| l.can) {
            return Ok(take_all(ctx, s, names, &req)?.map_or(RedisValue::Null, tokens_reply));
        }
        let Some(timeout_ms) = wait_ms else { return Ok(RedisValue::Null) };
        if let Some(l) = looks.iter().find(|l| !l.held && l.waiters >= config::max_waiters()) {
            return Err(errors::max_waiters(l.waiters));
        }
        let blockers = looks.iter_mut().flat_map(|l| std::mem::take(&mut l.blockers)).collect();
        if let Some(cycle) = deadlocks::cycle_from(ctx, s, req.owner, blockers) {
            s.counters.bump(Counter::Deadlocks, 1);
            return Err(errors::deadlock(&cycle));
        }
        queue(ctx, s, names, &looks, &req, timeout_ms)
    })
}

/// What `name` says to `req` before anything changes (leases that ended
/// end first, as for ACQUIRE).
fn look(ctx: &Context, s: &mut State, name: &RedisString, req: &Request) -> Result<Look, RedisError> {
    let look = with_key(ctx, s, name, true, |s, k, value| {
        engine::update(s, k, value, Some(req.owner), |s, lock, _, _| -> Result<Look, LockError> {
            let can = lock.can_take(req.owner, req.want)?;
            Ok(Look {
                can,
                held: lock.holders().token_of(req.owner).is_some(),
                waiters: lock.waiter_count(),
                blockers: if can { Vec::new() } else { deadlocks::blockers_of(s, lock, req.owner, req.want) },
            })
        })
    })?;
    look.ok_or(RedisError::Str(errors::NOT_CREATED))?.map_err(lock_error)
}

/// Takes every key now (each was found its to take): their tokens. If one
/// is not after all (its owner's lease ended in the millisecond between),
/// the keys taken are given back and the answer is that of a busy try.
fn take_all(
    ctx: &Context,
    s: &mut State,
    names: &[RedisString],
    req: &Request,
) -> Result<Option<Vec<u64>>, RedisError> {
    let mut tokens = Vec::with_capacity(names.len());
    let mut taken = Vec::with_capacity(names.len());
    for name in names {
        let acquired = with_key(ctx, s, name, true, |s, k, value| {
            engine::update(s, k, value, Some(req.owner), |s, lock, out, now| lock.acquire(req, now, &mut s.tokens, out))
        })?;
        match acquired {
            Some(Ok(Acquired::Granted(token) | Acquired::Reentered(token))) => {
                tokens.push(token);
                taken.push(place_of(ctx, s, name));
            }
            _ => {
                grants::give_back(ctx, s, req.owner, &taken);
                return Ok(None);
            }
        }
    }
    Ok(Some(tokens))
}

/// Queues the calling client at every key it does not hold, as one wait.
fn queue(
    ctx: &Context,
    s: &mut State,
    names: &[RedisString],
    looks: &[Look],
    req: &Request,
    timeout_ms: u64,
) -> RedisResult {
    let Some((wait, via)) = blocking::block_client(ctx) else { return Err(RedisError::Str(errors::NOT_BLOCKED)) };
    // Not registered until it is queued everywhere, but not stale either.
    s.forming = Some(wait);
    let mut keys = Vec::with_capacity(names.len());
    for (name, look) in names.iter().zip(looks) {
        let place = place_of(ctx, s, name);
        let entry = match look.held {
            true => None,
            // Each was looked at just before: it queues there.
            false => with_key(ctx, s, name, true, |s, k, value| {
                engine::update(s, k, value, None, |_, lock, _, _| lock.enqueue_gated(req, wait).ok())
            })
            .ok()
            .flatten()
            .flatten(),
        };
        keys.push((place, entry));
    }
    s.forming = None;
    let group = Box::new(Group {
        keys,
        lease_ms: req.lease_ms,
        session: req.session,
        want: req.want,
        lock_delay_ms: req.lock_delay_ms,
        request: req.id.map(|id| (id.id.into(), id.window_ms)),
    });
    // Each key it did not hold was found free to queue at, one of them busy.
    let Some(at) = group.keys.iter().find_map(|(p, id)| Some((p.clone(), (*id)?))) else {
        s.waiters.unblock(via, Reply::Nil);
        return Ok(RedisValue::NoReply);
    };
    blocking::register(s, wait, via, req.owner, at, timeout_ms, Some(group));
    Ok(RedisValue::NoReply)
}

/// The first replies of a command on several keys resent with request ID
/// `id`, if it was applied at every key; `None` for a new request.
fn replayed(
    ctx: &Context,
    s: &mut State,
    names: &[RedisString],
    id: Option<&[u8]>,
    kind: Kind,
    owner: &[u8],
) -> Result<Option<Vec<u64>>, RedisError> {
    let Some(id) = id else { return Ok(None) };
    let mut replies = Vec::with_capacity(names.len());
    for name in names {
        let found = with_key(ctx, s, name, false, |s, k, value| {
            engine::update(s, k, value, Some(owner), |_, lock, _, now| repeated(lock, Some(id), kind, owner, now))
        })?;
        let reply = match found {
            Some(found) => found?,
            None => replay_free(ctx, s, name, Some(id), kind)?,
        };
        match reply {
            Some(reply) => replies.push(reply),
            None => return Ok(None),
        }
    }
    Ok(Some(replies))
}

/// `FLOCK.RELEASEALL numkeys key [key ...] owner [ID request-id]`: one hold
/// of each key, released in one step; each key's holds left. NOTOWNER if
/// the owner does not hold one of them, and nothing is released.
pub fn release_all(ctx: &Context, args: &[RedisString]) -> RedisResult {
    if keys_asked(ctx, args) {
        return Ok(RedisValue::NoReply);
    }
    let rest: Vec<&[u8]> = args.iter().skip(1).map(RedisString::as_slice).collect();
    let (keys, rest) = args::keys(&rest).map_err(arg_error)?;
    let (owner, id) = args::release(rest).map_err(arg_error)?;
    let names = key_names(args, keys.len());
    entered(ctx, |s| {
        if let Some(left) = replayed(ctx, s, names, id, Kind::Release, owner)? {
            return Ok(tokens_reply(left));
        }
        for name in names {
            let held = with_key(ctx, s, name, false, |s, k, value| {
                engine::update(s, k, value, Some(owner), |_, lock, _, _| lock.holders().token_of(owner).is_some())
            })?;
            if held != Some(true) {
                let place = place_of(ctx, s, name);
                return Err(crate::commands::not_owner(s, place, owner));
            }
        }
        let mut left = Vec::with_capacity(names.len());
        for name in names {
            let holds = once_in(ctx, s, name, id, Kind::Release, Some(owner), |s, lock, out, now| {
                lock.release(owner, now, &mut s.tokens, out).map(u64::from)
            })?;
            left.push(holds.unwrap_or_default());
        }
        Ok(tokens_reply(left))
    })
}
