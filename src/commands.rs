//! The FLOCK.* command handlers: parse, open the key, run one core
//! operation through `engine::update`, reply.

use redis_module::{Context, ContextFlags, RedisError, RedisResult, RedisString, RedisValue};

use crate::args::{self, ArgError};
use crate::blocking;
use crate::config;
use crate::engine::{self, RELEASED};
use crate::eviction;
use crate::ffi;
use crate::lock::{Acquired, Holder, LockError, Member, Mode, Request, RequestId};
use crate::place::Place;
use crate::requests::Kind;
use crate::state;
use crate::value::{lock_or_create, lock_value, read_lock_value, LockValue, REMOTE_SESSION};

const NOTOWNER: &str = "NOTOWNER the lock is not held by this owner (never acquired, released, or its lease expired): only its holder may release or renew it";
const ALREADYQUEUED: &str =
    "QUEUED this owner is already waiting for this lock on another connection: an owner may wait once per lock, use a distinct owner per waiter";

const TOOMANYHOLDS: &str =
    "ERR this owner already holds the lock 4294967295 times, the most there can be: release it first";

fn lock_error(e: LockError) -> RedisError {
    RedisError::Str(match e {
        LockError::NotOwner => NOTOWNER,
        LockError::AlreadyQueued => ALREADYQUEUED,
        LockError::TooManyHolds => TOOMANYHOLDS,
        LockError::IdReused(kind) => return id_reused(kind),
        LockError::WrongMode(Mode::Lock) => {
            "WRONGMODE this key is a lock, not a semaphore: acquire it without PERMITS (with SHARED for the read side)"
        }
        LockError::WrongMode(Mode::Semaphore(limit)) => {
            return RedisError::String(format!(
                "WRONGMODE this key is a semaphore of {limit} permits: acquire it with PERMITS n LIMIT {limit}"
            ))
        }
        LockError::Upgrade => {
            "UPGRADE this owner holds the lock shared and would wait for itself: release its shared holds first, then acquire it exclusively"
        }
        LockError::PermitsDiffer(n) => {
            return RedisError::String(format!(
                "ERR this owner holds {n} permits of this semaphore: acquire again with PERMITS {n} for one more hold, or release first"
            ))
        }
    })
}

fn id_reused(kind: Kind) -> RedisError {
    RedisError::String(format!(
        "IDREUSED this request ID was used with {} on this lock: use a new ID for every command you send",
        kind.command()
    ))
}

fn arg_error(e: ArgError) -> RedisError {
    match e {
        ArgError::Arity => RedisError::WrongArity,
        e => RedisError::String(e.to_string()),
    }
}

/// Splits `CMD key rest...`, checking the arity the command needs.
fn split(args: &[RedisString], min: usize) -> Result<(&RedisString, Vec<&[u8]>), RedisError> {
    match args {
        [_, key, rest @ ..] if rest.len() + 2 >= min => Ok((key, rest.iter().map(|a| a.as_slice()).collect())),
        _ => Err(RedisError::WrongArity),
    }
}

/// Opens `key` for writing and runs `op` on its lock through the engine.
/// `None` when there is no lock under `key`.
fn with_existing<R>(
    ctx: &Context,
    key_name: &RedisString,
    op: impl FnOnce(&mut state::State, &mut LockValue, &mut engine::Changes) -> R,
) -> Result<Option<R>, RedisError> {
    let key = ctx.open_key_writable(key_name);
    let Some(value) = lock_value(&key)? else { return Ok(None) };
    let place = place_of(ctx, key_name);
    Ok(Some(engine::update(ctx, &key, key_name, &place, value, op)))
}

/// Where `key_name` lives for the calling client.
fn place_of(ctx: &Context, key_name: &RedisString) -> Place {
    state::with(|s| s.place(ffi::selected_db(ctx), key_name.as_slice()))
}

/// Leases and waits beyond `flock.max-lease-ms` are refused like bad input.
fn check_max_lease(ms: u64, what: &str) -> Result<(), RedisError> {
    let max = config::max_lease_ms();
    if ms > max {
        return Err(RedisError::String(format!(
            "ERR {what} {ms} is above flock.max-lease-ms: it must be at most {max}"
        )));
    }
    Ok(())
}

/// The request ID of a command, with the window it is remembered for.
fn with_window(id: Option<&[u8]>) -> Option<RequestId<'_>> {
    id.map(|id| RequestId { id, window_ms: config::retry_window_ms() })
}

pub fn acquire(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let (key_name, rest) = split(&args, 4)?;
    let parsed = args::acquire(&rest).map_err(arg_error)?;
    check_max_lease(parsed.lease_ms, "lease-ms")?;
    check_max_lease(parsed.wait_ms.unwrap_or(0), "timeout-ms")?;
    eviction::check_acquire()?;
    let key = ctx.open_key_writable(key_name);
    let place = place_of(ctx, key_name);
    let value = lock_or_create(&key)?;
    let req = Request {
        owner: parsed.owner,
        lease_ms: parsed.lease_ms,
        session: parsed.session.then(|| ffi::client_id(ctx)),
        id: with_window(parsed.id),
        want: parsed.want,
    };
    // Inside MULTI, Lua and functions a WAIT acts as a try, as BLPOP does.
    let wait_ms = parsed.wait_ms.filter(|_| !ctx.get_flags().contains(ContextFlags::DENY_BLOCKING));
    engine::update(ctx, &key, key_name, &place, value, |s, value, changes| {
        engine::expire_owner(s, value, changes, req.owner);
        if let Some(token) = repeated(value, parsed.id, Kind::Acquire, req.owner, changes.now)? {
            return Ok(RedisValue::Integer(token as i64));
        }
        match value.lock.acquire(&req, changes.now, &mut s.tokens).map_err(lock_error)? {
            Acquired::Granted(token) => {
                s.stats.grants += 1;
                s.stats.immediate_grants += 1;
                changes.event(engine::ACQUIRED);
                Ok(RedisValue::Integer(token as i64))
            }
            Acquired::Reentered(token) => {
                s.stats.reentrant += 1;
                Ok(RedisValue::Integer(token as i64))
            }
            acquired @ (Acquired::Busy | Acquired::Resent) => match wait_ms {
                None => Ok(RedisValue::Null),
                // A resend takes over its request's place: no waiter more.
                Some(_) if acquired == Acquired::Busy && value.lock.waiter_count() >= config::max_waiters() => Err(RedisError::String(format!(
                    "MAXWAITERS this lock already has {} waiters, the most flock.max-waiters allows: retry later or try without WAIT",
                    value.lock.waiter_count()
                ))),
                Some(timeout) => match blocking::wait(ctx, s, value, &place, &req, timeout).map_err(lock_error)? {
                    true => Ok(RedisValue::NoReply),
                    false => Err(RedisError::Str("ERR the server refused to block this client: retry without WAIT")),
                },
            },
        }
    })
}

/// The first reply of a command resent with request ID `id`, if that
/// command was applied; `None` for a new request.
fn repeated(
    value: &mut LockValue,
    id: Option<&[u8]>,
    kind: Kind,
    owner: &[u8],
    now: u64,
) -> Result<Option<u64>, RedisError> {
    let Some(id) = id else { return Ok(None) };
    value.lock.repeat(id, kind, owner, now).map_err(lock_error)
}

/// Runs `op` on the lock under `key` unless the command is a resend of one
/// already applied (its first reply, unchanged); `op` answers a number, and
/// that answer is remembered under the command's request ID.
fn once(
    ctx: &Context,
    key_name: &RedisString,
    id: Option<&[u8]>,
    kind: Kind,
    owner: &[u8],
    op: impl FnOnce(&mut state::State, &mut LockValue, &mut engine::Changes) -> Result<u64, LockError>,
) -> Result<Option<u64>, RedisError> {
    let result = with_existing(ctx, key_name, |s, value, changes| {
        engine::expire_owner(s, value, changes, owner);
        if let Some(reply) = repeated(value, id, kind, owner, changes.now)? {
            return Ok(reply);
        }
        let reply = op(s, value, changes).map_err(lock_error)?;
        value.lock.remember(with_window(id), kind, reply, changes.now);
        Ok(reply)
    })?;
    result.transpose()
}

pub fn release(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let (key_name, rest) = split(&args, 3)?;
    let (owner, id) = args::release(&rest).map_err(arg_error)?;
    let left = once(ctx, key_name, id, Kind::Release, owner, |s, value, changes| {
        let (left, grant) = value.lock.release(owner, changes.now, &mut s.tokens)?;
        if left == 0 {
            s.stats.releases += 1;
            changes.event(RELEASED);
            changes.grant(grant);
        }
        Ok(u64::from(left))
    })?;
    Ok(RedisValue::Integer(left.ok_or_else(|| lock_error(LockError::NotOwner))? as i64))
}

pub fn renew(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let (key_name, rest) = split(&args, 4)?;
    let (owner, lease_ms, id) = args::renew(&rest).map_err(arg_error)?;
    check_max_lease(lease_ms, "lease-ms")?;
    let token = once(ctx, key_name, id, Kind::Renew, owner, |_, value, changes| {
        value.lock.renew(owner, lease_ms, changes.now)
    })?;
    Ok(RedisValue::Integer(token.ok_or_else(|| lock_error(LockError::NotOwner))? as i64))
}

pub fn force_release(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let (key_name, rest) = split(&args, 2)?;
    let id = args::id_option(&rest).map_err(arg_error)?;
    let removed = once(ctx, key_name, id, Kind::ForceRelease, b"", |s, value, changes| {
        let (removed, grants) = value.lock.remove_all(changes.now, &mut s.tokens);
        if removed > 0 {
            s.stats.force_releases += removed as u64;
            changes.event(RELEASED);
        }
        changes.grant(grants);
        Ok(removed as u64)
    })?;
    Ok(RedisValue::Integer(removed.unwrap_or(0) as i64))
}

/// One holder as FLOCK.INFO shows it, after its name.
fn reply_holder_fields(ctx: &Context, holder: &Holder, session: bool, now: u64) {
    let numbers = [
        ("holds", u64::from(holder.holds)),
        ("token", holder.token),
        ("ttl-ms", holder.deadline_ms.saturating_sub(now)),
        ("session", u64::from(session)),
    ];
    for (name, n) in numbers {
        ffi::reply_bytes(ctx, name.as_bytes());
        ctx.reply(Ok(RedisValue::Integer(n as i64)));
    }
}

/// The seven fields of an exclusive lock (for shared or semaphore holders:
/// those of the earliest grant among them), then `mode`, `limit` and every
/// holder, earliest grant first.
pub fn info(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() != 2 {
        return Err(RedisError::WrongArity);
    }
    let key = ctx.open_key(&args[1]);
    let Some(value) = read_lock_value(&key)? else { return Ok(RedisValue::Null) };
    let mut holders: Vec<_> = value.lock.holders().collect();
    holders.sort_unstable_by_key(|(h, _, _)| h.token);
    let Some(&(first, first_session, _)) = holders.first() else { return Ok(RedisValue::Null) };
    let now = ffi::now_ms();
    ffi::reply_map(ctx, 10);
    ffi::reply_bytes(ctx, b"owner");
    ffi::reply_bytes(ctx, &first.owner);
    reply_holder_fields(ctx, first, first_session.is_some(), now);
    ffi::reply_bytes(ctx, b"waiters");
    ctx.reply(Ok(RedisValue::Integer(value.lock.waiter_count() as i64)));
    ffi::reply_bytes(ctx, b"queue");
    ffi::reply_array(ctx, value.lock.waiter_count());
    for waiter in value.lock.waiters() {
        ffi::reply_bytes(ctx, &waiter.owner);
    }
    let (mode, limit) = match value.lock.mode() {
        Mode::Semaphore(limit) => ("semaphore", limit),
        Mode::Lock if value.lock.holder().is_some() => ("exclusive", 0),
        Mode::Lock => ("shared", 0),
    };
    ffi::reply_bytes(ctx, b"mode");
    ffi::reply_bytes(ctx, mode.as_bytes());
    ffi::reply_bytes(ctx, b"limit");
    ctx.reply(Ok(RedisValue::Integer(i64::from(limit))));
    ffi::reply_bytes(ctx, b"holders");
    ffi::reply_array(ctx, holders.len());
    for (holder, session, permits) in holders {
        ffi::reply_map(ctx, 6);
        ffi::reply_bytes(ctx, b"owner");
        ffi::reply_bytes(ctx, &holder.owner);
        reply_holder_fields(ctx, holder, session.is_some(), now);
        ffi::reply_bytes(ctx, b"permits");
        ctx.reply(Ok(RedisValue::Integer(i64::from(permits))));
    }
    Ok(RedisValue::NoReply)
}

/// `FLOCK.STATE key [owner holds token deadline-ms session]`: sets a lock's
/// state as its master or the AOF recorded it. Only the replication link and
/// AOF loading may send it: a client could otherwise forge a holder.
/// Refuses what only the replication link and AOF loading may send: a
/// client could otherwise forge a holder or a remembered reply.
fn internal(ctx: &Context, name: &str) -> Result<(), RedisError> {
    if ctx.get_flags().intersects(ContextFlags::REPLICATED | ContextFlags::LOADING) {
        return Ok(());
    }
    Err(RedisError::String(format!("ERR {name} is internal: only a master's replication stream and the AOF send it")))
}

/// `FLOCK.STATE key [owner holds token deadline-ms session]`: sets a lock's
/// holder as its master or the AOF recorded it.
pub fn state(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    internal(ctx, "FLOCK.STATE")?;
    let (key_name, rest) = split(&args, 2)?;
    let parsed = args::state(&rest, ffi::now_ms()).map_err(arg_error)?;
    let holder = parsed.map(|p| {
        state::with(|s| s.tokens.observe(p.token));
        (Holder::new(p.owner.into(), p.holds, p.token, p.deadline_ms), p.session.then_some(REMOTE_SESSION))
    });
    set_replicated(ctx, key_name, holder.is_some(), |value, place| engine::replace_holder(value, place, holder))
}

/// Applies state a master or the AOF recorded (FLOCK.STATE, FLOCK.HOLDER) to
/// the lock at `key_name`: made only if `sets` gives it a holder, removed if
/// left unused.
fn set_replicated(
    ctx: &Context,
    key_name: &RedisString,
    sets: bool,
    set: impl FnOnce(&mut LockValue, &Place),
) -> RedisResult {
    let key = ctx.open_key_writable(key_name);
    if !sets && lock_value(&key)?.is_none() {
        return Ok(RedisValue::SimpleStringStatic("OK"));
    }
    let value = lock_or_create(&key)?;
    set(value, &place_of(ctx, key_name));
    if value.lock.is_unused() {
        key.delete()?;
    }
    Ok(RedisValue::SimpleStringStatic("OK"))
}

/// `FLOCK.ID key request-id command reply expires-unix-ms`: a request ID
/// its master or the AOF remembered for this lock.
pub fn request_id(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    internal(ctx, "FLOCK.ID")?;
    let (key_name, rest) = split(&args, 6)?;
    let (id, record) = args::request_args(&rest, ffi::now_ms()).map_err(arg_error)?;
    let key = ctx.open_key_writable(key_name);
    lock_or_create(&key)?.lock.restore_request(id, record);
    Ok(RedisValue::SimpleStringStatic("OK"))
}

/// `FLOCK.HOLDER key shared|semaphore limit [owner [holds token
/// deadline-ms session permits]]`: sets the key's mode and one owner's
/// shared or semaphore grant (or that it holds none) as its master or the
/// AOF recorded it.
pub fn member(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    internal(ctx, "FLOCK.HOLDER")?;
    let (key_name, rest) = split(&args, 4)?;
    let (mode, member) = args::member(&rest, ffi::now_ms()).map_err(arg_error)?;
    let sets_holder = member.as_ref().is_some_and(|(_, m)| m.is_some());
    let member = member.map(|(owner, m)| {
        let m = m.map(|m| {
            let h = m.holder;
            state::with(|s| s.tokens.observe(h.token));
            let holder = Holder::new(h.owner.into(), h.holds, h.token, h.deadline_ms);
            Member { holder, session: h.session.then_some(REMOTE_SESSION), permits: m.permits }
        });
        (owner, m)
    });
    set_replicated(ctx, key_name, sets_holder, |value, place| engine::replace_member(value, place, mode, member))
}
