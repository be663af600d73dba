//! `FLOCK.FENCED key token command [arg ...]`: a command of the server run
//! only while `token` holds the lock under `key`, in one step, so that a
//! holder whose grant ended (a lease that ran out during a pause, a
//! force-release) cannot write after the lock moved on: the data refuses
//! the stale token (docs/fencing.md).
//!
//! The command runs as its caller would run it in a script: its own ACL
//! rules and keys, its own `deny-oom`, its own effects sent to replicas and
//! the AOF (never FLOCK.FENCED itself), its own reply. What could not run
//! at once or inside a script is refused before anything runs: blocking
//! commands, MULTI, EXEC, WATCH and the like, FLOCK's own commands.

use std::cell::RefCell;
use std::collections::HashMap;

use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use crate::clock;
use crate::commands;
use crate::errors::{self, Unfenced};
use crate::ffi;
use crate::value::read_lock_value;

/// Where the command starts in FLOCK.FENCED's arguments.
const COMMAND_AT: usize = 3;

/// What COMMAND INFO says of a command (or `container|subcommand`) that
/// FLOCK.FENCED needs: its arity (negative: at least that many words), why
/// it is refused, if it is, and whether its subcommand decides instead
/// (CONFIG, CLIENT, ...).
#[derive(Clone, Copy)]
struct Shape {
    arity: i64,
    refused: Option<Unfenced>,
    container: bool,
}

thread_local! {
    /// Shapes by lowercase name, asked once per command: the command table
    /// changes only when a module loads (a name not seen yet is asked).
    static SHAPES: RefCell<HashMap<Vec<u8>, Shape>> = RefCell::new(HashMap::new());
}

pub fn fenced(ctx: &Context, args: &[RedisString]) -> RedisResult {
    if ctx.is_keys_position_request() {
        ffi::report_keys(ctx, args, 1, COMMAND_AT);
        return Ok(RedisValue::NoReply);
    }
    if args.len() <= COMMAND_AT {
        return Err(RedisError::WrongArity);
    }
    let token = token(&args[2]).ok_or(RedisError::Str(errors::FENCED_TOKEN))?;
    let command = &args[COMMAND_AT..];
    let name = command[0].as_slice();
    if let Some(why) = refused(ctx, command) {
        return Err(errors::not_fenced(name, why));
    }
    commands::heard_from(ctx);
    if !ffi::permitted(ctx, command) {
        return Err(errors::call_refused(libc::EACCES));
    }
    check(ctx, &args[1], token)?;
    let name = std::ffi::CString::new(name).map_err(|_| errors::not_fenced(name, Unfenced::Unknown))?;
    ffi::call_replying(ctx, &name, &command[1..]).map_err(errors::call_refused)?;
    Ok(RedisValue::NoReply)
}

fn token(arg: &RedisString) -> Option<u64> {
    std::str::from_utf8(arg.as_slice()).ok()?.parse::<u64>().ok().filter(|&t| t >= 1)
}

/// Whether `token` holds the lock under `key` now. The key is closed when
/// this returns: the command may write it.
fn check(ctx: &Context, key: &RedisString, token: u64) -> Result<(), RedisError> {
    let key = ctx.open_key(key);
    let fenced = match read_lock_value(&key)? {
        Some(value) => value.lock.fence(token, clock::now_ms()),
        None => Err(flock_core::lock::Stale::Free),
    };
    fenced.map_err(|why| errors::stale(token, why))
}

/// Why `command` (its name, then its arguments) is not to be run, if so.
fn refused(ctx: &Context, command: &[RedisString]) -> Option<Unfenced> {
    let name = command[0].as_slice().to_ascii_lowercase();
    if name.starts_with(b"flock.") {
        return Some(Unfenced::Flock);
    }
    let Some(mut shape) = shape_of(ctx, &name) else { return Some(Unfenced::Unknown) };
    if let Some(sub) = command.get(1).filter(|_| shape.container) {
        let full = [&name[..], b"|", &sub.as_slice().to_ascii_lowercase()].concat();
        let Some(sub) = shape_of(ctx, &full) else { return Some(Unfenced::Unknown) };
        shape = sub;
    }
    let n = command.len() as i64;
    let fits = if shape.arity >= 0 { n == shape.arity } else { n >= -shape.arity };
    shape.refused.or((!fits).then_some(Unfenced::Arity))
}

fn shape_of(ctx: &Context, name: &[u8]) -> Option<Shape> {
    if let Some(known) = SHAPES.with(|shapes| shapes.borrow().get(name).copied()) {
        return Some(known);
    }
    // Unknown names are not kept: a client could fill the table with them.
    let shape = parse_info(ctx.call("COMMAND", &[&b"INFO"[..], name][..]).ok()?)?;
    SHAPES.with(|shapes| shapes.borrow_mut().insert(name.to_vec(), shape));
    Some(shape)
}

/// COMMAND INFO's answer for one name: `[[name, arity, [flag ...], first,
/// last, step, [category ...], [tip ...], [key spec ...], [subcommand ...]]]`,
/// or `[nil]` for a name the server does not know.
fn parse_info(info: RedisValue) -> Option<Shape> {
    let RedisValue::Array(mut found) = info else { return None };
    let RedisValue::Array(entry) = found.pop()? else { return None };
    let (Some(RedisValue::Integer(arity)), Some(RedisValue::Array(flags))) = (entry.get(1), entry.get(2)) else {
        return None;
    };
    let has = |flag: &str| flags.iter().any(|f| matches!(f, RedisValue::SimpleString(s) if s == flag));
    let refused = if has("blocking") {
        Some(Unfenced::Blocking)
    } else if has("noscript") {
        Some(Unfenced::NoScript)
    } else {
        None
    };
    let container = matches!(entry.get(9), Some(RedisValue::Array(subcommands)) if !subcommands.is_empty());
    Some(Shape { arity: *arity, refused, container })
}
