//! Every error FLOCK answers, code and text, in one place: the core reports
//! plain variants, this turns them into replies. docs/commands.md lists
//! every code here (tests/integration/docs.rs checks it).
//!
//! Texts are ASCII: the crate sends an error's text char by char as bytes.

use std::ffi::CStr;

use redis_module::RedisError;

use flock_core::args::{self, ArgError};
use flock_core::effects::{Leave, Loss};
use flock_core::holders::Mode;
use flock_core::limits::{MAX_ALL_KEYS, MAX_ID_LEN, MAX_LOCK_DELAY_MS, MAX_MS, MAX_OWNER_LEN};
use flock_core::lock::{LockError, Stale};
use flock_core::record::Field;
use flock_core::requests::Kind;

pub const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
const NOTOWNER: &str = "NOTOWNER the lock is not held by this owner (never acquired, released, or its lease expired): only its holder may release or renew it";
const QUEUED: &str =
    "QUEUED this owner is already waiting for this lock on another connection: an owner may wait once per lock, use a distinct owner per waiter";
const HOLD_LOST: &str = "NOTOWNER a lock this owner held when it asked for all its keys was no longer its own when the others came free: nothing was granted";
const LOCKDELETED: &str = "LOCKDELETED the lock was deleted while waiting for it";
/// `UNBLOCKED` is the code Redis itself answers blocked clients with when a
/// master becomes a replica, so clients already treat it as "retry".
const UNBLOCKED: &str = "UNBLOCKED this node is no longer a master: retry on the new master";
const RESENT: &str = "RESENT this request was sent again on another connection, which now waits in its place";
pub const NOT_BLOCKED: &str = "ERR the server refused to block this client: retry without WAIT";
pub const NOT_REGISTERED: &str = "ERR the flocklock type is not registered (internal error)";
pub const NOT_CREATED: &str = "ERR could not create the lock: the new key holds no lock value (internal error)";
pub const NESTED: &str =
    "ERR a FLOCK command cannot run inside another FLOCK command (called from a keyspace event handler?)";

pub fn lock_error(e: LockError) -> RedisError {
    RedisError::String(match e {
        LockError::NotOwner => return not_owner(None),
        LockError::AlreadyQueued => QUEUED.into(),
        LockError::TooManyHolds => {
            "ERR this owner already holds the lock 4294967295 times, the most there can be: release it first".into()
        }
        LockError::IdReused(kind) => format!(
            "IDREUSED this request ID was used with {} on this lock: use a new ID for every command you send",
            command(kind)
        ),
        LockError::WrongMode(Mode::Semaphore(limit)) => {
            format!("WRONGMODE this key is a semaphore of {limit} permits: acquire it with PERMITS n LIMIT {limit}")
        }
        LockError::WrongMode(Mode::Exclusive | Mode::Shared) => {
            "WRONGMODE this key is a lock, not a semaphore: acquire it without PERMITS (with SHARED for the read side)"
                .into()
        }
        LockError::Upgrade => "UPGRADE this owner holds the lock shared and would wait for itself: release its shared holds first, then acquire it exclusively".into(),
        LockError::PermitsDiffer(n) => format!(
            "ERR this owner holds {n} permits of this semaphore: acquire again with PERMITS {n} for one more hold, or release first"
        ),
    })
}

/// The command a request ID was used with.
fn command(kind: Kind) -> &'static str {
    match kind {
        Kind::Acquire => "FLOCK.ACQUIRE",
        Kind::Release => "FLOCK.RELEASE",
        Kind::Renew => "FLOCK.RENEW",
        Kind::ForceRelease => "FLOCK.FORCERELEASE",
    }
}

pub fn arg_error(e: ArgError) -> RedisError {
    RedisError::String(match e {
        ArgError::Arity => return RedisError::WrongArity,
        ArgError::Owner => format!("ERR invalid owner: it must be 1 to {MAX_OWNER_LEN} bytes long"),
        ArgError::Lease => {
            format!("ERR invalid lease-ms: it must be an integer number of milliseconds from 1 to {MAX_MS}")
        }
        ArgError::Timeout => format!(
            "ERR invalid WAIT timeout-ms: it must be an integer number of milliseconds from 0 (no limit) to {MAX_MS}"
        ),
        ArgError::UnknownOption(o) => format!(
            "ERR unknown option '{o}': FLOCK.ACQUIRE takes only WAIT timeout-ms, SESSION, INBOX session-id, ID request-id and LOCKDELAY ms, and SHARED or PERMITS n LIMIT m"
        ),
        ArgError::LockDelay => {
            format!("ERR invalid LOCKDELAY: it must be an integer number of milliseconds from 0 (none) to {MAX_LOCK_DELAY_MS}")
        }
        ArgError::Id => format!("ERR invalid request ID: it must be 1 to {MAX_ID_LEN} bytes long"),
        ArgError::UnknownIdOption(o) => format!("ERR unknown option '{o}': the only option here is ID request-id"),
        ArgError::Repeated(o) => format!("ERR option {o} given more than once: each option may appear once"),
        ArgError::MissingValue("ID") => "ERR option ID has no value: write ID request-id".into(),
        ArgError::MissingValue("PERMITS") => "ERR option PERMITS has no value: write PERMITS n LIMIT m".into(),
        ArgError::MissingValue("INBOX") => "ERR option INBOX has no value: write INBOX session-id".into(),
        ArgError::MissingValue("LOCKDELAY") => "ERR option LOCKDELAY has no value: write LOCKDELAY ms".into(),
        ArgError::MissingValue("COUNT") => "ERR option COUNT has no value: write COUNT n (0: all)".into(),
        ArgError::MissingValue("MATCH") => "ERR option MATCH has no value: write MATCH pattern".into(),
        ArgError::MissingValue("BY") => "ERR option BY has no value: write BY waiters, BY wait or BY hold".into(),
        ArgError::MissingValue(o) => format!("ERR option {o} has no value: write {o} timeout-ms (0 waits without limit)"),
        ArgError::Permits => {
            "ERR invalid PERMITS: write PERMITS n LIMIT m with n an integer from 1 to m (the permits this owner takes)"
                .into()
        }
        ArgError::Limit => {
            format!("ERR invalid LIMIT: it must be an integer from 1 to {} (the permits of the semaphore)", u32::MAX)
        }
        ArgError::SessionId => "ERR invalid session ID: it is 32 lowercase hex digits, as FLOCK.SESSION answered".into(),
        ArgError::NumKeys => format!(
            "ERR numkeys must be 1 to {MAX_ALL_KEYS}, and no more than the keys given: write numkeys key [key ...] before the other arguments"
        ),
        ArgError::DuplicateKey(at) => format!("ERR key {at} is named twice: each key may appear once"),
        ArgError::NotForAll("PERMITS") => "ERR option PERMITS is not for several keys: a semaphore is one key".into(),
        ArgError::NotForAll(o) => {
            format!("ERR option {o} is not for several keys: FLOCK.ACQUIREALL ... WAIT blocks its own connection")
        }
        ArgError::SessionLease => "ERR lease-ms 0 (held while its session lives) needs INBOX session-id, the session it lives with: give a lease in milliseconds otherwise".into(),
        ArgError::SessionTimeout => format!(
            "ERR FLOCK.SESSION takes only TIMEOUT ms, an integer number of milliseconds from {} to {}, and WITHTIMEOUT, each once",
            args::SESSION_TIMEOUTS.start(),
            args::SESSION_TIMEOUTS.end()
        ),
        ArgError::InboxTimeout => format!(
            "ERR invalid timeout-ms: it must be an integer number of milliseconds from 0 (no limit) to {MAX_MS}"
        ),
        ArgError::Count => {
            "ERR invalid count: it must be a non-negative integer (FLOCK.TOP COUNT 0 and FLOCK.LONGLOG GET -1: all)".into()
        }
        ArgError::TopOption(o) => {
            format!("ERR unknown option '{o}': FLOCK.TOP takes only COUNT n, MATCH pattern and BY waiters|wait|hold")
        }
        ArgError::TopBy => "ERR invalid BY: FLOCK.TOP orders BY waiters, BY wait or BY hold".into(),
        ArgError::LongLog => {
            "ERR unknown FLOCK.LONGLOG subcommand or wrong number of arguments: use GET [count], LEN or RESET".into()
        }
        ArgError::SharedAndPermits => {
            "ERR SHARED and PERMITS exclude each other: SHARED is for a read-write lock, PERMITS for a semaphore".into()
        }
    })
}

pub fn above_max_lease(what: &str, ms: u64, max: u64) -> RedisError {
    RedisError::String(format!("ERR {what} {ms} is above flock.max-lease-ms: it must be at most {max}"))
}

pub fn max_waiters(waiters: usize) -> RedisError {
    RedisError::String(format!(
        "MAXWAITERS this lock already has {waiters} waiters, the most flock.max-waiters allows: retry later or try without WAIT"
    ))
}

pub fn eviction(policy: &str) -> RedisError {
    let safe = policy.replacen("allkeys-", "volatile-", 1);
    RedisError::String(format!(
        "EVICTION maxmemory-policy {policy} with maxmemory set can evict a held lock, so FLOCK grants none: \
         lock keys have no TTL, which volatile-* policies never evict (CONFIG SET maxmemory-policy {safe}), \
         or accept the risk with CONFIG SET flock.allow-eviction yes"
    ))
}

/// Owners a DEADLOCK error names at most (the rest are counted).
const DEADLOCK_SHOWN: usize = 8;

/// A wait refused because it would close `cycle` (its owner first, each
/// waiting for the next, the last for the first).
pub fn deadlock(cycle: &[Box<[u8]>]) -> RedisError {
    let mut owners: Vec<String> =
        cycle.iter().take(DEADLOCK_SHOWN).map(|o| format!("'{}'", args::shown(o, 64))).collect();
    if cycle.len() > DEADLOCK_SHOWN {
        owners.push(format!("... ({} owners in all)", cycle.len()));
    }
    owners.push(owners[0].clone());
    RedisError::String(format!(
        "DEADLOCK this wait would never end, so it was not queued: {} (each owner waits for the next)",
        owners.join(" -> ")
    ))
}

pub fn internal(command: &CStr) -> RedisError {
    let command = command.to_string_lossy();
    RedisError::String(format!("ERR {command} is internal: only a master's replication stream and the AOF send it"))
}

/// A waiter that leaves without a grant and is told why.
pub fn left(why: Leave) -> RedisError {
    RedisError::Str(left_text(why))
}

/// The error line of `left`, also the detail of a session's `error` event.
pub fn left_text(why: Leave) -> &'static str {
    match why {
        Leave::Deleted => LOCKDELETED,
        Leave::Demoted => UNBLOCKED,
        Leave::Resent => RESENT,
        Leave::HoldLost => HOLD_LOST,
        Leave::TimedOut | Leave::Unblocked | Leave::Disconnected | Leave::Cancelled => {
            "ERR the wait ended (internal error)"
        }
    }
}

/// NOTOWNER, saying why when the server ended the owner's grant lately.
pub fn not_owner(loss: Option<Loss>) -> RedisError {
    RedisError::Str(match loss {
        None => NOTOWNER,
        Some(Loss::Expired) => {
            "NOTOWNER the lease of this owner ended before this command: the lock may be another owner's now; acquire it again"
        }
        Some(Loss::ForceReleased) => {
            "NOTOWNER this owner's grant was force-released (FLOCK.FORCERELEASE): the lock may be another owner's now"
        }
        Some(Loss::Deleted) => {
            "NOTOWNER the lock was deleted while this owner held it (DEL, FLUSH, an overwrite, eviction, RENAME or MOVE)"
        }
        Some(Loss::Moved) => {
            "NOTOWNER the lock went with its key to another server (MIGRATE, a Cluster slot move) while this owner held it: send this command there"
        }
        Some(Loss::Demoted) => NOTOWNER,
    })
}

/// `INBOX session-id` names no open session.
pub const NO_SESSION: &str = "NOSESSION no open session of this server has that ID (its connection closed, or it is another node's): open one with FLOCK.SESSION and send the wait again";
/// FLOCK.INBOX on a connection without a session.
pub const NO_SESSION_HERE: &str = "NOSESSION this connection has no session: call FLOCK.SESSION on it first";

/// What a record must hold, for the error that refuses it.
pub fn field(field: Field) -> &'static str {
    match field {
        Field::Owner => "owner must be 1 to 256 bytes",
        Field::Holds => "holds must be an integer from 1 to 4294967295",
        Field::Token => "token must be an integer from 1 to 9223372036854775807",
        Field::Deadline => {
            "deadline-unix-ms must be an integer no later than 2^41 ms after this server's clock (a lease is at most 2^40 ms)"
        }
        Field::Session => "session must be 0 or 1",
        Field::Mode => "mode must be exclusive or shared with limit 0, or semaphore with a limit from 1 to 4294967295",
        Field::Permits => "permits must be 0 for a lock's holder and 1 to the limit for a semaphore holder",
        Field::Request => {
            "a request record is an ID of 1 to 64 bytes, a command code 0 to 3, a reply from 0 to \
             9223372036854775807 and an expiry no later than 2^41 ms after this server's clock"
        }
        Field::Length => "the record has too few or too many fields",
        Field::Holders => "two holders with one token or one owner, or an exclusive holder beside others",
        Field::Limit => "more permits in use than the semaphore's limit",
    }
}

/// A replicated or AOF record refused.
pub fn record(command: &CStr, f: Field) -> RedisError {
    match f {
        Field::Length => RedisError::WrongArity,
        f => RedisError::String(format!("ERR invalid {} record: {}", command.to_string_lossy(), field(f))),
    }
}

/// Why a lock in an RDB payload is refused (the server's log says it).
pub fn refused_load(f: Field) -> String {
    match f {
        Field::Length => "the data ends early".into(),
        f => format!("no command could have made it: {}", field(f)),
    }
}

/// FLOCK.FENCED's refusal: `token` no longer holds the lock, and what does.
pub fn stale(token: u64, why: Stale) -> RedisError {
    let now = match why {
        Stale::Expired => "its lease ran out".to_string(),
        Stale::HeldBy(holder) => format!("token {holder} holds it now"),
        Stale::Held(1) => "another holder holds it now".to_string(),
        Stale::Held(n) => format!("{n} other holders hold it now"),
        Stale::Free => "the lock is free".to_string(),
    };
    RedisError::String(format!("STALE token {token} does not hold this lock ({now}): the command was not run"))
}

pub const FENCED_TOKEN: &str =
    "ERR invalid token: it must be a fencing token, an integer from 1, as FLOCK.ACQUIRE answered";

/// A command FLOCK.FENCED will not run (`name` as given), and why.
pub fn not_fenced(name: &[u8], why: Unfenced) -> RedisError {
    let name = args::shown(name, 64);
    RedisError::String(match why {
        Unfenced::Unknown => format!("ERR unknown command '{name}': FLOCK.FENCED runs a command of this server"),
        Unfenced::Arity => format!("ERR wrong number of arguments for '{name}' command"),
        Unfenced::Flock => format!("ERR FLOCK.FENCED does not run FLOCK commands ('{name}')"),
        Unfenced::Blocking => {
            format!(
                "ERR FLOCK.FENCED does not run blocking commands ('{name}'): a fenced write runs at once or not at all"
            )
        }
        Unfenced::NoScript => {
            format!(
                "ERR FLOCK.FENCED does not run '{name}': it runs what a script may run (no MULTI, EXEC, WATCH, ...)"
            )
        }
    })
}

/// Why FLOCK.FENCED will not run a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unfenced {
    Unknown,
    Arity,
    Flock,
    Blocking,
    NoScript,
}

/// The command FLOCK.FENCED ran could not run: the `errno` of the server's call.
pub fn call_refused(errno: i32) -> RedisError {
    RedisError::String(match errno {
        libc::EACCES => "NOPERM this user has no permissions to run the command, or to access one of its keys".into(),
        libc::ENOSPC => "OOM command not allowed when used memory > 'maxmemory'".into(),
        libc::EPERM => "CROSSSLOT the command's keys are not all in this node's slots".into(),
        libc::ENETDOWN => "CLUSTERDOWN the cluster is down".into(),
        libc::EROFS => "READONLY the cluster cannot take writes now".into(),
        libc::ESPIPE => "ERR the command is not allowed in scripts, nor in FLOCK.FENCED".into(),
        e => format!("ERR the server would not run the command (errno {e})"),
    })
}
