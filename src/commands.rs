//! The FLOCK.* command handlers: parse, open the key, run one core
//! operation through `engine::update`, reply.

use redis_module::key::RedisKeyWritable;
use redis_module::{Context, ContextFlags, RedisError, RedisResult, RedisString, RedisValue};

use crate::args::{self, ArgError};
use crate::blocking;
use crate::config;
use crate::engine::{self, RELEASED};
use crate::ffi;
use crate::keytype::{lock_value, LockValue, FLOCK_TYPE, REMOTE_SESSION};
use crate::lock::{Acquired, Holder, Lock, LockError, Request};
use crate::requests::Kind;
use crate::state;

const NOTOWNER: &str = "NOTOWNER the lock is not held by this owner (never acquired, released, or its lease expired): only its holder may release or renew it";
const ALREADYQUEUED: &str =
    "QUEUED this owner is already waiting for this lock on another connection: an owner may wait once per lock, use a distinct owner per waiter";

const TOOMANYHOLDS: &str = "ERR this owner already holds the lock 4294967295 times, the most there can be: release it first";

fn lock_error(e: LockError) -> RedisError {
    RedisError::Str(match e {
        LockError::NotOwner => NOTOWNER,
        LockError::AlreadyQueued => ALREADYQUEUED,
        LockError::TooManyHolds => TOOMANYHOLDS,
        LockError::IdReused(kind) => return id_reused(kind),
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
fn place_of(ctx: &Context, key_name: &RedisString) -> state::Place {
    state::with(|s| s.place(ffi::selected_db(ctx.ctx), key_name.as_slice()))
}

/// The lock under `key`, made empty (free) if the key does not exist.
fn lock_or_create<'a>(key: &RedisKeyWritable) -> Result<&'a mut LockValue, RedisError> {
    if lock_value(key)?.is_none() {
        key.set_value(&FLOCK_TYPE, LockValue::new(Lock::default()))?;
    }
    lock_value(key)?
        .ok_or(RedisError::Str("ERR could not create the lock: the new key holds no lock value (internal error)"))
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

pub fn acquire(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let (key_name, rest) = split(&args, 4)?;
    let parsed = args::acquire(&rest).map_err(arg_error)?;
    check_max_lease(parsed.lease_ms, "lease-ms")?;
    check_max_lease(parsed.wait_ms.unwrap_or(0), "timeout-ms")?;
    let key = ctx.open_key_writable(key_name);
    let place = place_of(ctx, key_name);
    let value = lock_or_create(&key)?;
    let req = Request {
        owner: parsed.owner,
        lease_ms: parsed.lease_ms,
        session: parsed.session.then(|| ffi::client_id(ctx.ctx)),
        id: None,
    };
    // Inside MULTI, Lua and functions a WAIT acts as a try, as BLPOP does.
    let wait_ms = parsed.wait_ms.filter(|_| !ctx.get_flags().contains(ContextFlags::DENY_BLOCKING));
    engine::update(ctx, &key, key_name, &place, value, |s, value, changes| {
        match value.lock.acquire(&req, changes.now, &mut s.tokens).map_err(lock_error)? {
            Acquired::Granted(token) => {
                s.stats.grants += 1;
                s.stats.immediate_grants += 1;
                changes.event(engine::ACQUIRED);
                Ok(RedisValue::Integer(token as i64))
            }
            Acquired::Reentered(token) | Acquired::Repeated(token) => {
                s.stats.reentrant += 1;
                Ok(RedisValue::Integer(token as i64))
            }
            Acquired::Busy => match wait_ms {
                None => Ok(RedisValue::Null),
                Some(_) if value.lock.waiter_count() >= config::max_waiters() => Err(RedisError::String(format!(
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

pub fn release(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let (key_name, rest) = split(&args, 3)?;
    let owner = args::owner_only(&rest).map_err(arg_error)?;
    let result = with_existing(ctx, key_name, |s, value, changes| {
        let (left, grant) = value.lock.release(owner, changes.now, &mut s.tokens)?;
        if left == 0 {
            s.stats.releases += 1;
            changes.event(RELEASED);
            changes.grant(grant);
        }
        Ok(left)
    })?;
    let left = result.unwrap_or(Err(LockError::NotOwner)).map_err(lock_error)?;
    Ok(RedisValue::Integer(left as i64))
}

pub fn renew(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let (key_name, rest) = split(&args, 4)?;
    let (owner, lease_ms) = args::owner_lease(&rest).map_err(arg_error)?;
    check_max_lease(lease_ms, "lease-ms")?;
    let result = with_existing(ctx, key_name, |_, value, changes| value.lock.renew(owner, lease_ms, changes.now))?;
    let token = result.unwrap_or(Err(LockError::NotOwner)).map_err(lock_error)?;
    Ok(RedisValue::Integer(token as i64))
}

pub fn force_release(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() != 2 {
        return Err(RedisError::WrongArity);
    }
    let removed = with_existing(ctx, &args[1], |s, value, changes| {
        let (old, grant) = value.lock.vacate(changes.now, &mut s.tokens);
        if old.is_some() {
            s.stats.force_releases += 1;
            changes.event(RELEASED);
        }
        changes.grant(grant);
        old.is_some()
    })?;
    Ok(RedisValue::Integer(i64::from(removed == Some(true))))
}

pub fn info(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() != 2 {
        return Err(RedisError::WrongArity);
    }
    let key = ctx.open_key(&args[1]);
    let value = key.get_value::<LockValue>(&FLOCK_TYPE).map_err(|_| RedisError::Str(crate::keytype::WRONGTYPE))?;
    let Some(holder) = value.and_then(|v| v.lock.holder().map(|h| (v, h))) else {
        return Ok(RedisValue::Null);
    };
    let (value, holder) = holder;
    let ttl = holder.deadline_ms.saturating_sub(ffi::now_ms());
    ffi::reply_map(ctx, 7);
    ffi::reply_bytes(ctx, b"owner");
    ffi::reply_bytes(ctx, &holder.owner);
    let numbers = [
        ("holds", u64::from(holder.holds)),
        ("token", holder.token),
        ("ttl-ms", ttl),
        ("session", u64::from(value.lock.session().is_some())),
        ("waiters", value.lock.waiter_count() as u64),
    ];
    for (name, n) in numbers {
        ffi::reply_bytes(ctx, name.as_bytes());
        ctx.reply(Ok(RedisValue::Integer(n as i64)));
    }
    ffi::reply_bytes(ctx, b"queue");
    ffi::reply_array(ctx, value.lock.waiter_count());
    for waiter in value.lock.waiters() {
        ffi::reply_bytes(ctx, &waiter.owner);
    }
    Ok(RedisValue::NoReply)
}

/// `FLOCK.STATE key [owner holds token deadline-ms session]`: sets a lock's
/// state as its master or the AOF recorded it. Only the replication link and
/// AOF loading may send it: a client could otherwise forge a holder.
pub fn state(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let flags = ctx.get_flags();
    if !flags.intersects(ContextFlags::REPLICATED | ContextFlags::LOADING) {
        return Err(RedisError::Str(
            "ERR FLOCK.STATE is internal: only a master's replication stream and the AOF send it",
        ));
    }
    let (key_name, rest) = split(&args, 2)?;
    let parsed = args::state(&rest, ffi::now_ms()).map_err(arg_error)?;
    let key = ctx.open_key_writable(key_name);
    let Some(parsed) = parsed else {
        if lock_value(&key)?.is_some() {
            key.delete()?;
        }
        return Ok(RedisValue::SimpleStringStatic("OK"));
    };
    let holder = Holder::new(parsed.owner.into(), parsed.holds, parsed.token, parsed.deadline_ms);
    let value = lock_or_create(&key)?;
    let place = place_of(ctx, key_name);
    state::with(|s| s.tokens.observe(holder.token));
    engine::replace_holder(value, &place, holder, parsed.session.then_some(REMOTE_SESSION));
    Ok(RedisValue::SimpleStringStatic("OK"))
}
