//! The FLOCK.* handlers: parse, borrow the state once, open the key, run
//! one core operation through `engine::update`, reply.

use redis_module::{Context, ContextFlags, RedisError, RedisResult, RedisString, RedisValue};

use crate::blocking;
use crate::clock;
use crate::config;
use crate::deadlocks;
use crate::engine::{self, Key};
use crate::errors::{self, arg_error, lock_error};
use crate::eviction;
use crate::ffi;
use crate::grants;
use crate::inbox;
use crate::legacy;
use crate::observed::held_ms;
use crate::place::Place;
use crate::state::{self, State};
use crate::value::{
    lock_value, mode_name, read_lock_value, LockValue, FREE_COMMAND, HOLDER_COMMAND, ID_COMMAND, REMOTE_SESSION,
};
use crate::waiters::WaitId;
use flock_core::args;
use flock_core::effects::{Counter, End};
use flock_core::holders::{Holder, Terms};
use flock_core::limits::MAX_OWNER_LEN;
use flock_core::lock::{self, Acquired, Lock, LockError, Outcomes, Request, RequestId};
use flock_core::record::{self, Set};
use flock_core::requests::Kind;

/// Splits `CMD key rest...`, checking the arity the command needs.
fn split(args: &[RedisString], min: usize) -> Result<(&RedisString, Vec<&[u8]>), RedisError> {
    match args {
        [_, key, rest @ ..] if rest.len() + 2 >= min => Ok((key, rest.iter().map(|a| a.as_slice()).collect())),
        _ => Err(RedisError::WrongArity),
    }
}

/// Borrows the state for one command; a FLOCK command that another module
/// runs from inside one (a keyspace event handler) is refused. A command on
/// a session's connection renews the session. Before it returns, the waits
/// for several keys whose turn it brought are granted.
pub fn entered<R>(ctx: &Context, f: impl FnOnce(&mut State) -> Result<R, RedisError>) -> Result<R, RedisError> {
    let result = state::try_with(|s| {
        renew_session(ctx, s);
        let result = f(s);
        grants::drain(ctx, s);
        result
    });
    result.unwrap_or(Err(RedisError::Str(errors::NESTED)))
}

/// The calling connection's session, if it has one, is heard from now.
fn renew_session(ctx: &Context, s: &mut State) {
    if !s.sessions.is_empty() {
        inbox::heard(s, ffi::client_id(ctx));
    }
}

/// `renew_session` for a command that reads its lock without the state
/// (FLOCK.INFO, FLOCK.FENCED): it is heard from as any command.
pub fn heard_from(ctx: &Context) {
    state::try_with(|s| renew_session(ctx, s));
}

/// Runs `f` on the lock under `key_name` (`legacy::with_lock`), or on a
/// new one when `create` (else `Ok(None)` when there is none).
pub fn with_key<R>(
    ctx: &Context,
    s: &mut State,
    key_name: &RedisString,
    create: bool,
    f: impl FnOnce(&mut State, &Key, &mut LockValue) -> R,
) -> Result<Option<R>, RedisError> {
    let place = place_of(ctx, s, key_name);
    legacy::with_lock(ctx, s, key_name, &place, create, f)
}

/// Leases and waits beyond `flock.max-lease-ms` are refused like bad input.
pub fn check_max_lease(ms: u64, what: &str) -> Result<(), RedisError> {
    let max = config::max_lease_ms();
    match ms > max {
        true => Err(errors::above_max_lease(what, ms, max)),
        false => Ok(()),
    }
}

/// The request ID of a command, with the window it is remembered for.
pub fn with_window(id: Option<&[u8]>) -> Option<RequestId<'_>> {
    id.map(|id| RequestId { id, window_ms: config::retry_window_ms() })
}

fn token_reply(token: u64) -> RedisValue {
    RedisValue::Integer(token as i64)
}

pub fn acquire(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let (key_name, rest) = split(args, 4)?;
    let parsed = args::acquire(&rest).map_err(arg_error)?;
    check_max_lease(parsed.lease_ms, "lease-ms")?;
    check_max_lease(parsed.wait_ms.unwrap_or(0), "timeout-ms")?;
    // Inside MULTI, Lua and functions a WAIT acts as a try, as BLPOP does.
    let wait_ms = parsed.wait_ms.filter(|_| !ctx.get_flags().contains(ContextFlags::DENY_BLOCKING));
    entered(ctx, |s| {
        // The connection of the session the command is sent for, if any: its
        // SESSION binding, its inbox for the outcome and any loss.
        let inbox = match parsed.inbox {
            Some(id) => Some(s.sessions.client_of(id).ok_or(RedisError::Str(errors::NO_SESSION))?),
            None => None,
        };
        // `lease-ms` 0: the grant lives with the session it is bound to, and
        // replicas and the disk see the session's timeout as its lease.
        let session_lease = parsed.lease_ms == 0;
        let lease_ms = match inbox.and_then(|client| s.sessions.get(client)).filter(|_| session_lease) {
            Some(session) => session.timeout_ms(),
            None => parsed.lease_ms,
        };
        let req = Request {
            owner: parsed.owner,
            lease_ms,
            session_lease,
            session: parsed.session.then(|| inbox.unwrap_or_else(|| ffi::client_id(ctx))),
            id: with_window(parsed.id),
            want: parsed.want,
            lock_delay_ms: config::lock_delay_ms(parsed.lock_delay_ms),
        };
        eviction::check_acquire(s)?;
        let acquired = with_key(ctx, s, key_name, true, |s, k, value| {
            engine::update(s, k, value, Some(req.owner), |s, lock, out, now| {
                if let Some(token) = repeated(lock, parsed.id, Kind::Acquire, req.owner, now)? {
                    // This reply tells the grant: the session the resend names
                    // holds it now, and an event of it still unread in an
                    // inbox is not told again nor passed on unread.
                    lock.rebind_resent(token, &req, now, out);
                    s.sessions.told(inbox, token, k.place, req.owner);
                    return Ok(token_reply(token));
                }
                match lock.acquire(&req, now, &mut s.tokens, out).map_err(lock_error)? {
                    Acquired::Granted(token) | Acquired::Reentered(token) => {
                        if let Some(client) = inbox {
                            s.sessions.watch(client, token, k.place, req.owner, true);
                        }
                        Ok(token_reply(token))
                    }
                    acquired @ (Acquired::Busy | Acquired::Resent) => match wait_ms {
                        None => Ok(RedisValue::Null),
                        // A resend takes over its request's place: no waiter more.
                        Some(_) if acquired == Acquired::Busy && lock.waiter_count() >= config::max_waiters() => {
                            Err(errors::max_waiters(lock.waiter_count()))
                        }
                        Some(timeout) => {
                            if acquired == Acquired::Busy {
                                if let Some(cycle) = deadlocks::cycle(ctx, s, k.place, lock, req.owner, req.want) {
                                    s.counters.bump(Counter::Deadlocks, 1);
                                    return Err(errors::deadlock(&cycle));
                                }
                            }
                            match blocking::wait(ctx, s, lock, k.place, &req, timeout, inbox, out) {
                                Ok(true) if inbox.is_some() => Ok(RedisValue::SimpleStringStatic("WAITING")),
                                Ok(true) => Ok(RedisValue::NoReply),
                                Ok(false) => Err(RedisError::Str(errors::NOT_BLOCKED)),
                                Err(e) => Err(lock_error(e)),
                            }
                        }
                    },
                }
            })
        })?;
        acquired.unwrap_or(Err(RedisError::Str(errors::NOT_CREATED)))
    })
}

/// `FLOCK.CANCEL key owner`: ends `owner`'s wait, from any connection.
pub fn cancel(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let (key_name, rest) = split(args, 3)?;
    let owner = args::cancel(&rest).map_err(arg_error)?;
    let cancelled = entered(ctx, |s| {
        with_key(ctx, s, key_name, false, |s, k, value| {
            engine::update(s, k, value, None, |s, lock, out, now| lock.cancel(owner, now, &mut s.tokens, out))
        })
    })?;
    Ok(RedisValue::Integer(i64::from(cancelled.unwrap_or(false))))
}

/// `FLOCK.SESSION [TIMEOUT ms] [WITHTIMEOUT]`: the calling connection's
/// session ID, opened now if it has none; `TIMEOUT` sets its timeout.
/// `WITHTIMEOUT` answers the timeout too, and the session keeps it: its
/// client counts its deadlines from it, so a later `CONFIG SET` must not
/// shorten it.
pub fn session(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let rest: Vec<&[u8]> = args.iter().skip(1).map(RedisString::as_slice).collect();
    let (timeout_ms, with_timeout) = args::session(&rest).map_err(arg_error)?;
    let (id, timeout_ms) = entered(ctx, |s| Ok(inbox::open(s, ffi::client_id(ctx), timeout_ms, with_timeout)))?;
    if with_timeout {
        ffi::reply_array(ctx, 2);
        ffi::reply_bytes(ctx, &id);
        return Ok(RedisValue::Integer(timeout_ms as i64));
    }
    ffi::reply_bytes(ctx, &id);
    Ok(RedisValue::NoReply)
}

/// `FLOCK.INBOX timeout-ms`: the events of the calling connection's
/// session, blocking until there is one.
pub fn inbox(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let rest: Vec<&[u8]> = args.iter().skip(1).map(RedisString::as_slice).collect();
    let timeout_ms = args::inbox(&rest).map_err(arg_error)?;
    check_max_lease(timeout_ms, "timeout-ms")?;
    let client = ffi::client_id(ctx);
    entered(ctx, |s| {
        if !s.sessions.has(client) {
            return Err(RedisError::Str(errors::NO_SESSION_HERE));
        }
        if let Some(events) = s.sessions.take(client) {
            return inbox::reply_events(ctx, &events);
        }
        // Inside MULTI it answers at once, as BLPOP does.
        if ctx.get_flags().contains(ContextFlags::DENY_BLOCKING) || !inbox::block(ctx, s, client, timeout_ms) {
            return Ok(RedisValue::Null);
        }
        Ok(RedisValue::NoReply)
    })
}

/// The first reply of a command resent with request ID `id`, if that
/// command was applied; `None` for a new request.
pub fn repeated(
    lock: &mut Lock<WaitId>,
    id: Option<&[u8]>,
    kind: Kind,
    owner: &[u8],
    now: u64,
) -> Result<Option<u64>, RedisError> {
    let Some(id) = id else { return Ok(None) };
    lock.repeat(id, kind, owner, now).map_err(lock_error)
}

/// Runs `op` on the lock under `key` unless the command is a resend of one
/// already applied (its first reply, unchanged); `op` answers a number, and
/// that answer is remembered under the command's request ID. `None` when
/// there is no lock under `key` and the command is about no owner; about an
/// owner, that is NOTOWNER.
fn once(
    ctx: &Context,
    key_name: &RedisString,
    id: Option<&[u8]>,
    kind: Kind,
    owner: Option<&[u8]>,
    op: impl FnOnce(&mut State, &mut Lock<WaitId>, &mut Outcomes<WaitId>, u64) -> Result<u64, LockError>,
) -> Result<Option<u64>, RedisError> {
    entered(ctx, |s| once_in(ctx, s, key_name, id, kind, owner, op))
}

/// `once`, in a command that has the state already.
pub fn once_in(
    ctx: &Context,
    s: &mut State,
    key_name: &RedisString,
    id: Option<&[u8]>,
    kind: Kind,
    owner: Option<&[u8]>,
    op: impl FnOnce(&mut State, &mut Lock<WaitId>, &mut Outcomes<WaitId>, u64) -> Result<u64, LockError>,
) -> Result<Option<u64>, RedisError> {
    let done = with_key(ctx, s, key_name, false, |s, k, value| {
        engine::update(s, k, value, owner, |s, lock, out, now| {
            if let Some(reply) = repeated(lock, id, kind, owner.unwrap_or_default(), now)? {
                return Ok(reply);
            }
            let reply = op(s, lock, out, now).map_err(|e| match (e, owner) {
                (LockError::NotOwner, Some(owner)) => not_owner(s, k.place.clone(), owner),
                (e, _) => lock_error(e),
            })?;
            lock.remember(with_window(id), kind, reply, now);
            Ok(reply)
        })
    })?;
    if let Some(reply) = done {
        return reply.map(Some);
    }
    if let Some(reply) = replay_free(ctx, s, key_name, id, kind)? {
        return Ok(Some(reply));
    }
    match owner {
        Some(owner) => {
            let place = place_of(ctx, s, key_name);
            Err(not_owner(s, place, owner))
        }
        None => Ok(None),
    }
}

/// The first reply of a command resent with request ID `id` to a name
/// whose lock is free (no key): what it remembered is kept elsewhere.
pub fn replay_free(
    ctx: &Context,
    s: &mut State,
    key_name: &RedisString,
    id: Option<&[u8]>,
    kind: Kind,
) -> Result<Option<u64>, RedisError> {
    let place = place_of(ctx, s, key_name);
    let found = id.and_then(|id| s.remembered.find(&place, id, clock::now_ms()));
    lock::replay(found, kind, None).map_err(lock_error)
}

/// Where `key_name` of the selected database lives.
pub fn place_of(ctx: &Context, s: &mut State, key_name: &RedisString) -> Place {
    s.place(ffi::selected_db(ctx), key_name.as_slice())
}

/// NOTOWNER, with why if the server ended `owner`'s grant on this lock lately.
pub fn not_owner(s: &State, place: Place, owner: &[u8]) -> RedisError {
    errors::not_owner(s.losses.get(&(place, owner.into()), clock::now_ms()))
}

pub fn release(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let (key_name, rest) = split(args, 3)?;
    let (owner, id) = args::release(&rest).map_err(arg_error)?;
    let left = once(ctx, key_name, id, Kind::Release, Some(owner), |s, lock, out, now| {
        lock.release(owner, now, &mut s.tokens, out).map(u64::from)
    })?;
    Ok(RedisValue::Integer(left.unwrap_or_default() as i64))
}

pub fn renew(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let (key_name, rest) = split(args, 4)?;
    let (owner, lease_ms, id) = args::renew(&rest).map_err(arg_error)?;
    check_max_lease(lease_ms, "lease-ms")?;
    let token =
        once(ctx, key_name, id, Kind::Renew, Some(owner), |_, lock, out, now| lock.renew(owner, lease_ms, now, out))?;
    Ok(token_reply(token.unwrap_or_default()))
}

pub fn force_release(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let (key_name, rest) = split(args, 2)?;
    let id = args::id_option(&rest).map_err(arg_error)?;
    let removed = once(ctx, key_name, id, Kind::ForceRelease, None, |s, lock, out, now| {
        Ok(lock.end_all(End::ForceReleased, now, &mut s.tokens, out) as u64)
    })?;
    Ok(RedisValue::Integer(removed.unwrap_or(0) as i64))
}

/// One holder as FLOCK.INFO shows it, after its name: holds, token, the
/// lease left (-1: none), the session flag.
fn reply_holder_fields(ctx: &Context, holds: u32, token: u64, ttl_ms: i64, session: bool) {
    let numbers =
        [("holds", i64::from(holds)), ("token", token as i64), ("ttl-ms", ttl_ms), ("session", i64::from(session))];
    for (name, n) in numbers {
        ffi::reply_bytes(ctx, name.as_bytes());
        ctx.reply(Ok(RedisValue::Integer(n)));
    }
}

/// One holder's entry in FLOCK.INFO's `holders`.
fn reply_holder(ctx: &Context, owner: &[u8], holds: u32, token: u64, ttl_ms: i64, session: bool, terms: Terms) {
    ffi::reply_map(ctx, 7);
    ffi::reply_bytes(ctx, b"owner");
    ffi::reply_bytes(ctx, owner);
    reply_holder_fields(ctx, holds, token, ttl_ms, session);
    for (name, n) in [("permits", terms.permits), ("lock-delay-ms", terms.lock_delay_ms)] {
        ffi::reply_bytes(ctx, name.as_bytes());
        ctx.reply(Ok(RedisValue::Integer(i64::from(n))));
    }
}

/// FLOCK.INFO's last field: how long a lock-delay keeps the lock closed.
fn reply_delayed(ctx: &Context, ms: u64) {
    ffi::reply_bytes(ctx, b"delayed-ms");
    ctx.reply(Ok(RedisValue::Integer(ms as i64)));
}

/// The fields after the first holder's: the queue, the mode and its limit.
fn reply_queue_and_mode<'a>(
    ctx: &Context,
    count: usize,
    waiters: impl Iterator<Item = &'a [u8]>,
    mode: &str,
    limit: u32,
) {
    ffi::reply_bytes(ctx, b"waiters");
    ctx.reply(Ok(RedisValue::Integer(count as i64)));
    ffi::reply_bytes(ctx, b"queue");
    ffi::reply_array(ctx, count);
    for owner in waiters {
        ffi::reply_bytes(ctx, owner);
    }
    ffi::reply_bytes(ctx, b"mode");
    ffi::reply_bytes(ctx, mode.as_bytes());
    ffi::reply_bytes(ctx, b"limit");
    ctx.reply(Ok(RedisValue::Integer(i64::from(limit))));
}

/// The seven fields of the earliest grant, then `mode`, `limit` and every
/// holder, earliest grant first. A key that a lock of another client holds
/// (`legacy`) shows it as the one holder: the key's value as its owner,
/// token 0, its TTL as the lease; mode `foreign`.
pub fn info(ctx: &Context, args: &[RedisString]) -> RedisResult {
    if args.len() != 2 {
        return Err(RedisError::WrongArity);
    }
    heard_from(ctx);
    let key = ctx.open_key(&args[1]);
    let value = match read_lock_value(&key) {
        Ok(value) => value,
        Err(_) if info_foreign(ctx, &args[1]) => return Ok(RedisValue::NoReply),
        Err(e) => return Err(e),
    };
    let Some(value) = value else { return Ok(RedisValue::Null) };
    let mut holders: Vec<(&Holder, Terms)> = value.lock.holders().iter().collect();
    holders.sort_unstable_by_key(|(h, _)| h.token);
    let now = clock::now_ms();
    let ttl = |h: &Holder| h.deadline_ms.saturating_sub(now) as i64;
    let first = holders.first();
    let held = first.map_or(0, |(h, _)| held_ms(h.token, now));
    let delayed = value.lock.delayed_until().map_or(0, |until| until.saturating_sub(now));
    if first.is_none() && value.lock.waiter_count() == 0 && delayed == 0 {
        return Ok(RedisValue::Null);
    }
    ffi::reply_map(ctx, 18);
    ffi::reply_bytes(ctx, b"owner");
    match first {
        Some(&(first, first_terms)) => {
            ffi::reply_bytes(ctx, &first.owner);
            reply_holder_fields(ctx, first.holds, first.token, ttl(first), first_terms.session.is_some());
        }
        // Free, but an ACQUIREALL waits first in its queue for its other keys.
        None => {
            ctx.reply(Ok(RedisValue::Null));
            reply_holder_fields(ctx, 0, 0, -1, false);
        }
    }
    let (mode, limit) = (mode_name(&value.lock), value.lock.mode().limit().unwrap_or(0));
    reply_queue_and_mode(ctx, value.lock.waiter_count(), value.lock.waiters().map(|w| &*w.owner), mode, limit);
    ffi::reply_bytes(ctx, b"holders");
    ffi::reply_array(ctx, holders.len());
    for (h, terms) in holders {
        reply_holder(ctx, &h.owner, h.holds, h.token, ttl(h), terms.session.is_some(), terms);
    }
    reply_delayed(ctx, delayed);
    let figures = state::try_with(|s| {
        let place = place_of(ctx, s, &args[1]);
        contention(s, &place, &value.lock)
    });
    reply_figures(ctx, held, figures.unwrap_or_default());
    Ok(RedisValue::NoReply)
}

/// While the lock at `place` has waiters: how long the oldest has waited,
/// and, since it gained its first (`observed::Contention`), how long ago
/// that was, hand-offs, waits ended, the longest wait and the longest hold.
/// All 0 without.
fn contention(s: &State, place: &Place, lock: &Lock<WaitId>) -> [u64; 6] {
    let Some(c) = s.observed.contended.get(place) else { return [0; 6] };
    let now_us = clock::monotonic_us();
    let oldest = s.waiters.first_queued_us(lock).unwrap_or(now_us);
    let ms = |us: u64| us / 1000;
    let (since, longest_wait) = (ms(now_us - c.since_us), ms(c.longest_wait_us));
    [ms(now_us - oldest), since, c.handoffs, c.waits_ended, longest_wait, c.longest_hold_ms]
}

/// FLOCK.INFO's last fields: how long its first holder has held it, then
/// `contention`'s figures.
fn reply_figures(ctx: &Context, held_ms: u64, [oldest, contended, handoffs, waits, longest, held_longest]: [u64; 6]) {
    let fields = [
        ("held-ms", held_ms),
        ("oldest-wait-ms", oldest),
        ("contended-ms", contended),
        ("handoffs", handoffs),
        ("waits-ended", waits),
        ("longest-wait-ms", longest),
        ("longest-hold-ms", held_longest),
    ];
    for (field, n) in fields {
        ffi::reply_bytes(ctx, field.as_bytes());
        ctx.reply(Ok(RedisValue::Integer(i64::try_from(n).unwrap_or(i64::MAX))));
    }
}

/// FLOCK.INFO of a key that a lock of another client holds, with the
/// FLOCK waiters queued on it; false (nothing sent) if the key holds no
/// such lock.
fn info_foreign(ctx: &Context, name: &RedisString) -> bool {
    let Some(held) = legacy::foreign_holder(ctx, name) else { return false };
    let ttl = held.ttl_ms.map_or(-1, |ttl| ttl as i64);
    // Through GET, which reads the value without changing how it is stored.
    let value = match ctx.call("GET", &[name][..]) {
        Ok(RedisValue::SimpleString(s)) => s.into_bytes(),
        Ok(RedisValue::BulkString(s)) => s.into_bytes(),
        Ok(RedisValue::BulkRedisString(s)) => s.as_slice().to_vec(),
        Ok(RedisValue::StringBuffer(b)) => b,
        _ => Vec::new(),
    };
    let owner = &value[..value.len().min(MAX_OWNER_LEN)];
    let (queue, figures): (Vec<Vec<u8>>, [u64; 6]) = state::try_with(|s| {
        let place = place_of(ctx, s, name);
        legacy::shadow(s, &place).map_or_else(Default::default, |lock| {
            (lock.waiters().map(|w| w.owner.to_vec()).collect(), contention(s, &place, lock))
        })
    })
    .unwrap_or_default();
    ffi::reply_map(ctx, 18);
    ffi::reply_bytes(ctx, b"owner");
    ffi::reply_bytes(ctx, owner);
    reply_holder_fields(ctx, 1, 0, ttl, false);
    reply_queue_and_mode(ctx, queue.len(), queue.iter().map(Vec::as_slice), "foreign", 0);
    ffi::reply_bytes(ctx, b"holders");
    ffi::reply_array(ctx, 1);
    reply_holder(ctx, owner, 1, 0, ttl, false, Terms::default());
    reply_delayed(ctx, 0);
    // The other client's lock has no grant time FLOCK knows.
    reply_figures(ctx, 0, figures);
    true
}

/// Refuses what only the replication link and AOF loading may send: a
/// client could otherwise forge a holder or a remembered reply.
fn internal(ctx: &Context, name: &std::ffi::CStr) -> Result<(), RedisError> {
    match ctx.get_flags().intersects(ContextFlags::REPLICATED | ContextFlags::LOADING) {
        true => Ok(()),
        false => Err(errors::internal(name)),
    }
}

/// `FLOCK.HOLDER key mode limit [owner [holds token deadline-unix-ms
/// session permits]] [ID request-id command reply expires-unix-ms]`: sets
/// the key's mode and one owner's grant (or that it holds none) as its
/// master or the AOF recorded it, after the request ID it carries.
pub fn holder(ctx: &Context, args: &[RedisString]) -> RedisResult {
    internal(ctx, HOLDER_COMMAND)?;
    let (key_name, rest) = split(args, 4)?;
    let (set, request) = record::holder_command(&rest, clock::now()).map_err(|f| errors::record(HOLDER_COMMAND, f))?;
    set_replicated(ctx, key_name, set, request)
}

/// `FLOCK.STATE key [owner holds token deadline-unix-ms session]`: the
/// exclusive holder, as AOFs written before FLOCK.HOLDER carried every
/// holder have it.
pub fn state(ctx: &Context, args: &[RedisString]) -> RedisResult {
    internal(ctx, c"FLOCK.STATE")?;
    let (key_name, rest) = split(args, 2)?;
    let set = record::state_command(&rest, clock::now()).map_err(|f| errors::record(c"FLOCK.STATE", f))?;
    set_replicated(ctx, key_name, set, None)
}

/// Applies a replicated or AOF holder record to the lock at `key_name`
/// (made only if the record gives it a holder, removed if left free), after
/// the request ID that came with it.
fn set_replicated(ctx: &Context, key_name: &RedisString, set: Set, request: Option<record::Request>) -> RedisResult {
    entered(ctx, |s| {
        if let Some(request) = request {
            restore_request(ctx, s, key_name, request)?;
        }
        let creates = matches!(set, Set::Holder(..));
        with_key(ctx, s, key_name, creates, |s, k, value| {
            if let Set::Holder(_, record) = &set {
                s.tokens.observe(record.holder.token);
            }
            engine::restore(s, k, value, |lock, out| match set {
                Set::Kind(mode) => lock.restore_absent(None, mode, out),
                Set::Absent(mode, owner) => lock.restore_absent(Some(&owner), mode, out),
                Set::Holder(mode, r) => {
                    let terms =
                        Terms { session: r.session.then_some(REMOTE_SESSION), permits: r.permits, ..Terms::default() };
                    lock.restore(r.holder, terms, mode, out)
                }
                Set::Vacant => lock.restore_vacant(out),
            });
        })?;
        Ok(RedisValue::SimpleStringStatic("OK"))
    })
}

/// `FLOCK.ID key request-id command reply expires-unix-ms`: a request ID
/// its master or the AOF remembered for this lock.
pub fn request_id(ctx: &Context, args: &[RedisString]) -> RedisResult {
    internal(ctx, ID_COMMAND)?;
    let (key_name, rest) = split(args, 6)?;
    let request = record::request_command(&rest, clock::now()).map_err(|f| errors::record(ID_COMMAND, f))?;
    entered(ctx, |s| restore_request(ctx, s, key_name, request))?;
    Ok(RedisValue::SimpleStringStatic("OK"))
}

/// `FLOCK.FREE key [ID request-id command reply expires-unix-ms]`: the
/// lock its master or the AOF left free goes, as with DEL (whatever the key
/// holds), after the request ID it carries; the lock's request IDs are
/// remembered as a DEL's are.
pub fn free(ctx: &Context, args: &[RedisString]) -> RedisResult {
    internal(ctx, FREE_COMMAND)?;
    let (key_name, rest) = split(args, 2)?;
    let request = record::free_command(&rest, clock::now()).map_err(|f| errors::record(FREE_COMMAND, f))?;
    entered(ctx, |s| {
        if let Some(request) = request {
            restore_request(ctx, s, key_name, request)?;
        }
        ctx.open_key_writable(key_name).delete()?;
        Ok(RedisValue::SimpleStringStatic("OK"))
    })
}

/// Keeps a request ID its master or the AOF remembered for the lock at
/// `key_name`.
fn restore_request(
    ctx: &Context,
    s: &mut State,
    key_name: &RedisString,
    (id, record): record::Request,
) -> Result<(), RedisError> {
    let key = ctx.open_key_writable(key_name);
    match lock_value(&key)? {
        Some(value) => value.lock.restore_request(&id, record),
        // Before the grant it belongs to makes the key, or for a free lock.
        None => {
            let place = place_of(ctx, s, key_name);
            s.remembered.record(place, &id, record);
            engine::wake_for_remembered(s);
        }
    }
    Ok(())
}
