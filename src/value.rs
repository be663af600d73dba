//! The value stored under a lock's key, how commands find it in a key, and
//! the names of its persisted and replicated forms.

use std::ffi::CStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use redis_module::key::RedisKeyWritable;
use redis_module::{native_types::RedisType, RedisError};

use crate::errors::{NOT_CREATED, NOT_REGISTERED, WRONGTYPE};
use crate::ffi::MAX_ARGS;
use crate::waiters::WaitId;
use flock_core::holders::Mode;
use flock_core::lock::Lock;
use flock_core::record::Word;

pub const TYPE_NAME: &str = "flocklock";
/// 6: as 5; each holder adds the time its lease had left when saved
/// (`record::Shape::Left`), the most it has when loaded.
/// 5 (still loaded): as 4; the module's aux data adds the request IDs of free locks,
/// which have no key.
/// 4 (still loaded): the key's mode (`record::mode_words`), its holders (a count, then
/// each as `record::holder_words`), its remembered request IDs (a count,
/// then each as `record::request_words`).
/// 3 (still loaded): as 2, then the limit (0 for a lock) and the shared or
/// semaphore holders (a count, then each as `holder_words`).
/// 2 (still loaded): a holder flag, then the exclusive holder (its
/// `holder_words` without permits), then the request IDs.
/// 1 (still loaded): the exclusive holder alone.
pub const ENCODING_VERSION: i32 = 6;

/// The internal command that sets one holder of any kind, or the key's
/// mode, as replicas and the AOF see it: `FLOCK.HOLDER key mode limit
/// [owner [holds token deadline-unix-ms session permits [left-ms]]]` (without the
/// numbers: the owner holds nothing; without the owner: only the mode).
pub const HOLDER_COMMAND: &CStr = c"FLOCK.HOLDER";

/// The internal command that sets a remembered request ID on replicas and
/// in the AOF: `FLOCK.ID key request-id command reply expires-unix-ms`.
pub const ID_COMMAND: &CStr = c"FLOCK.ID";

/// The internal command that deletes a lock left free on replicas and in
/// the AOF, as DEL would, with a request ID riding on it:
/// `FLOCK.FREE key [ID request-id command reply expires-unix-ms]`.
pub const FREE_COMMAND: &CStr = c"FLOCK.FREE";

/// A SESSION lock whose connection is not on this server (loaded or
/// replicated): client ids start at 1, so this one never disconnects.
pub const REMOTE_SESSION: u64 = 0;

/// Live lock values, counted where they are made and freed: `free` may run
/// on a background thread (FLUSHALL ASYNC), so this is the one shared datum.
pub static LIVE_LOCKS: AtomicU64 = AtomicU64::new(0);

/// The value under a lock's key. 48 bytes: what a lock without waiters or
/// SESSION needs beyond its owner string and its entry in the deadline wheel.
/// Its queue names waiters by `WaitId`: `waiters` answers them.
pub struct LockValue {
    pub lock: Lock<WaitId>,
}

const _: () = assert!(std::mem::size_of::<LockValue>() == 48, "a held lock's value should stay in the 48-byte class");

impl LockValue {
    pub fn new(lock: Lock<WaitId>) -> Self {
        LIVE_LOCKS.fetch_add(1, Ordering::Relaxed);
        Self { lock }
    }
}

impl Drop for LockValue {
    fn drop(&mut self) {
        LIVE_LOCKS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The name FLOCK.INFO and FLOCK.TOP give a lock's mode.
pub fn mode_name(lock: &Lock<WaitId>) -> &'static str {
    match lock.mode() {
        _ if lock.is_foreign() => "foreign",
        Mode::Exclusive => "exclusive",
        Mode::Shared => "shared",
        Mode::Semaphore(_) => "semaphore",
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
    LOCK_TYPE.get().copied().ok_or(RedisError::Str(NOT_REGISTERED))
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

/// `value` stored under the empty `key`.
pub fn put_lock<'a>(key: &RedisKeyWritable, value: LockValue) -> Result<&'a mut LockValue, RedisError> {
    key.set_value(lock_type()?, value)?;
    lock_value(key)?.ok_or(RedisError::Str(NOT_CREATED))
}

/// Runs `f` on `words` as a command's arguments: numbers in decimal,
/// written on the stack, so that sending a record allocates nothing.
pub fn with_args<R>(words: &[Word], f: impl FnOnce(&[&[u8]]) -> R) -> R {
    assert!(words.len() <= MAX_ARGS, "a command of the module has at most {MAX_ARGS} arguments");
    let mut digits = [[0u8; 20]; MAX_ARGS];
    let mut args: [&[u8]; MAX_ARGS] = [&[]; MAX_ARGS];
    for ((arg, word), buf) in args.iter_mut().zip(words).zip(digits.iter_mut()) {
        *arg = match *word {
            Word::Bytes(b) => b,
            Word::Number(n) => decimal(n, buf),
        };
    }
    f(&args[..words.len()])
}

fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}
