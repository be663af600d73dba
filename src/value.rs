//! The value stored under a lock's key, how commands find it in a key, and
//! the numbers it is persisted and replicated as.

use std::ffi::CStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use redis_module::key::RedisKeyWritable;
use redis_module::{native_types::RedisType, RedisError};

use crate::ffi::BlockedId;
use crate::lock::{Holder, Lock, Member, Mode};
use crate::requests::Record;

pub const TYPE_NAME: &str = "flocklock";
/// 3: as 2, then the key's limit (0 for a lock) and its shared or
/// semaphore holders (a count, then per holder: owner, holds, token,
/// deadline-unix-ms, session, permits).
/// 2 (still loaded): a holder flag, then the exclusive holder, then the
/// remembered request IDs.
/// 1 (still loaded): the holder alone.
pub const ENCODING_VERSION: i32 = 3;

/// The internal command that sets a lock's state as replicas and the AOF see
/// it: `FLOCK.STATE key` (no lock) or `FLOCK.STATE key owner holds token
/// deadline-unix-ms session`.
pub const STATE_COMMAND: &str = "FLOCK.STATE";

/// The internal command that sets the shared or semaphore holder of one
/// owner as replicas and the AOF see it: `FLOCK.HOLDER key shared|semaphore
/// limit [owner [holds token deadline-unix-ms session permits]]` (without
/// the numbers: the owner holds nothing; without the owner: only the mode).
pub const HOLDER_COMMAND: &str = "FLOCK.HOLDER";

/// The mode word and limit of `FLOCK.HOLDER`.
pub fn mode_args(mode: Mode) -> (&'static CStr, u32) {
    match mode {
        Mode::Lock => (c"shared", 0),
        Mode::Semaphore(limit) => (c"semaphore", limit),
    }
}

/// The numbers of `FLOCK.HOLDER` (and of the RDB) for `member`, in order.
pub fn member_numbers(member: &Member) -> [u64; 5] {
    let h = &member.holder;
    [u64::from(h.holds), h.token, h.deadline_ms, u64::from(member.session.is_some()), u64::from(member.permits)]
}

/// The internal command that sets a remembered request ID on replicas and
/// in the AOF: `FLOCK.ID key request-id command reply expires-unix-ms`.
pub const ID_COMMAND: &str = "FLOCK.ID";

/// The numbers of `FLOCK.ID` (and of the RDB) for `record`, in order.
pub fn request_numbers(record: &Record) -> [u64; 3] {
    [record.kind.code(), record.reply, record.expires_ms]
}

/// The numbers of `FLOCK.STATE` for `holder`, in order.
pub fn state_numbers(holder: &Holder, session: bool) -> [i64; 4] {
    [u64::from(holder.holds), holder.token, holder.deadline_ms, u64::from(session)].map(|n| n as i64)
}

/// A SESSION lock whose connection is not on this server (loaded or
/// replicated): client ids start at 1, so this one never disconnects.
pub const REMOTE_SESSION: u64 = 0;

pub const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

/// Live lock values, counted where they are made and freed: `free` may run
/// on a background thread (FLUSHALL ASYNC), so this is the one shared datum.
pub static LIVE_LOCKS: AtomicU64 = AtomicU64::new(0);

/// The value under a lock's key. 48 bytes: what a lock without waiters or
/// SESSION needs beyond its owner string and its entry in the deadline wheel.
/// Its queue names waiters by `BlockedId`: `waiters` owns the clients.
pub struct LockValue {
    pub lock: Lock<BlockedId>,
}

const _: () = assert!(std::mem::size_of::<LockValue>() == 48, "a held lock's value should stay in the 48-byte class");

impl LockValue {
    pub fn new(lock: Lock<BlockedId>) -> Self {
        LIVE_LOCKS.fetch_add(1, Ordering::Relaxed);
        Self { lock }
    }
}

impl Drop for LockValue {
    fn drop(&mut self) {
        LIVE_LOCKS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The `flocklock` type as registered. Its callbacks (`keytype`) sit at the
/// top of the Redis layer and call down into the engine, which needs to
/// find values in keys: so the type is handed down here once, at load,
/// before Redis can run a command or load a key.
static LOCK_TYPE: OnceLock<&'static RedisType> = OnceLock::new();

pub fn register_type(lock_type: &'static RedisType) {
    let _ = LOCK_TYPE.set(lock_type);
}

fn lock_type() -> Result<&'static RedisType, RedisError> {
    LOCK_TYPE.get().copied().ok_or(RedisError::Str("ERR the flocklock type is not registered (internal error)"))
}

/// The lock stored under `key`, `None` if the key is empty, `WRONGTYPE` if
/// it holds something else.
pub fn lock_value<'a>(key: &RedisKeyWritable) -> Result<Option<&'a mut LockValue>, RedisError> {
    key.get_value::<LockValue>(lock_type()?).map_err(|_| RedisError::Str(WRONGTYPE))
}

/// As `lock_value` for a key opened read-only.
pub fn read_lock_value(key: &redis_module::key::RedisKey) -> Result<Option<&LockValue>, RedisError> {
    key.get_value::<LockValue>(lock_type()?).map_err(|_| RedisError::Str(WRONGTYPE))
}

/// The lock under `key`, made empty (free) if the key does not exist.
pub fn lock_or_create<'a>(key: &RedisKeyWritable) -> Result<&'a mut LockValue, RedisError> {
    if lock_value(key)?.is_none() {
        key.set_value(lock_type()?, LockValue::new(Lock::default()))?;
    }
    lock_value(key)?
        .ok_or(RedisError::Str("ERR could not create the lock: the new key holds no lock value (internal error)"))
}
