//! The `flocklock` key type: the value stored under a lock's key, and the
//! callbacks Redis calls on it (persistence, size, unlink).

use std::ffi::c_void;
use std::os::raw::c_int;
use std::sync::atomic::{AtomicU64, Ordering};

use redis_module::key::RedisKeyWritable;
use redis_module::{raw, native_types::RedisType, RedisError};

use crate::args;
use crate::deadlines::Deadlines;
use crate::ffi::{self, BlockedClient};
use crate::lock::{Holder, Lock};
use crate::requests::Record;
use crate::state::Lease;
use crate::{engine, state};

pub const TYPE_NAME: &str = "flocklock";
/// 2: a holder flag, then the holder, then the remembered request IDs.
/// 1 (still loaded): the holder alone.
const ENCODING_VERSION: i32 = 2;

/// The internal command that sets a lock's state as replicas and the AOF see
/// it: `FLOCK.STATE key` (no lock) or `FLOCK.STATE key owner holds token
/// deadline-unix-ms session`.
pub const STATE_COMMAND: &str = "FLOCK.STATE";

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
pub struct LockValue {
    pub lock: Lock<BlockedClient>,
}

const _: () = assert!(std::mem::size_of::<LockValue>() == 48, "a held lock's value should stay in the 48-byte class");

impl LockValue {
    pub fn new(lock: Lock<BlockedClient>) -> Self {
        LIVE_LOCKS.fetch_add(1, Ordering::Relaxed);
        Self { lock }
    }
}

impl Drop for LockValue {
    fn drop(&mut self) {
        LIVE_LOCKS.fetch_sub(1, Ordering::Relaxed);
    }
}

pub static FLOCK_TYPE: RedisType = RedisType::new(
    TYPE_NAME,
    ENCODING_VERSION,
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(rdb_load),
        rdb_save: Some(rdb_save),
        aof_rewrite: Some(aof_rewrite),
        mem_usage: None,
        digest: None,
        free: Some(free),
        aux_load: Some(aux_load),
        aux_save: Some(aux_save),
        aux_save2: None,
        aux_save_triggers: raw::REDISMODULE_AUX_BEFORE_RDB as i32,
        free_effort: None,
        unlink: None,
        // Without a copy callback Redis refuses COPY: a lock has one owner.
        copy: None,
        defrag: None,
        mem_usage2: Some(mem_usage),
        free_effort2: None,
        unlink2: Some(unlink),
        copy2: None,
    },
);

/// The lock stored under `key`, `None` if the key is empty, `WRONGTYPE` if
/// it holds something else.
pub fn lock_value<'a>(key: &RedisKeyWritable) -> Result<Option<&'a mut LockValue>, RedisError> {
    key.get_value::<LockValue>(&FLOCK_TYPE).map_err(|_| RedisError::Str(WRONGTYPE))
}

unsafe extern "C" fn free(value: *mut c_void) {
    drop(unsafe { Box::from_raw(value.cast::<LockValue>()) });
}

unsafe extern "C" fn mem_usage(ctx: *mut raw::RedisModuleKeyOptCtx, value: *const c_void, _: usize) -> usize {
    let value = unsafe { &*value.cast::<LockValue>() };
    let filed = value.lock.holder().is_some_and(|h| h.deadline_id.is_some());
    // A filed lease is a wheel entry plus its place: the key name and 4 bytes.
    let lease = if filed { Deadlines::<Lease>::entry_size() + 4 + ffi::opt_ctx_key(ctx).1.len() } else { 0 };
    std::mem::size_of::<LockValue>() + value.lock.heap_size() + lease
}

/// The key is leaving its name (DEL, UNLINK, overwrite, expiry, RENAME or
/// MOVE source). Runs on the main thread while the value is still intact.
unsafe extern "C" fn unlink(ctx: *mut raw::RedisModuleKeyOptCtx, value: *const c_void) {
    // Redis hands out a const pointer, but the value is ours and nothing else
    // references it during this callback.
    let value = unsafe { &mut *value.cast_mut().cast::<LockValue>() };
    let (db, key) = ffi::opt_ctx_key(ctx);
    engine::detach(value, db, &key);
}

unsafe extern "C" fn rdb_save(io: *mut raw::RedisModuleIO, value: *mut c_void) {
    let value = unsafe { &*value.cast::<LockValue>() };
    let holder = value.lock.holder();
    raw::save_unsigned(io, u64::from(holder.is_some()));
    if let Some(holder) = holder {
        raw::save_slice(io, &holder.owner);
        for n in state_numbers(holder, value.lock.session().is_some()) {
            raw::save_unsigned(io, n as u64);
        }
    }
    let requests = value.lock.requests();
    raw::save_unsigned(io, requests.map_or(0, |r| r.iter().count()) as u64);
    for (id, record) in requests.into_iter().flat_map(|r| r.iter()) {
        raw::save_slice(io, id);
        for n in request_numbers(record) {
            raw::save_unsigned(io, n);
        }
    }
}

unsafe extern "C" fn rdb_load(io: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    match load_lock(io, encver, ffi::now_ms()) {
        Ok(mut value) => {
            let (db, key) = ffi::io_key(io);
            let place = state::with(|s| s.place(db, &key));
            engine::file_loaded(&mut value, &place);
            Box::into_raw(Box::new(value)).cast::<c_void>()
        }
        Err(e) => {
            ffi::log_io_error(io, &format!("FLOCK cannot load a lock: {e}"));
            std::ptr::null_mut()
        }
    }
}

/// Reads one lock, checking every field against what a command could have
/// made: a crafted RESTORE payload or a corrupt file is refused whole.
fn load_lock(io: *mut raw::RedisModuleIO, encver: c_int, now: u64) -> Result<LockValue, String> {
    let short = |_| "the data ends early".to_string();
    let number = || raw::load_unsigned(io).map_err(short);
    let bytes = || raw::load_string_buffer(io).map_err(short);
    let has_holder = match encver {
        1 => true,
        2 => number()? == 1,
        _ => return Err(format!("encoding version {encver} is unknown: this FLOCK knows 1 and {ENCODING_VERSION}")),
    };
    let mut lock = Lock::default();
    if has_holder {
        let owner = bytes()?;
        let h = args::holder(owner.as_ref(), number()?, number()?, number()?, number()?, now)
            .map_err(|e| format!("no command could have made it: {e}"))?;
        state::with(|s| s.tokens.observe(h.token));
        // The connection a SESSION lock was bound to is not on this server;
        // the flag stays visible and the lease still bounds the lock.
        let holder = Holder::new(h.owner.into(), h.holds, h.token, h.deadline_ms);
        lock.set_holder(Some(holder), h.session.then_some(REMOTE_SESSION));
    }
    let records = if encver == 1 { 0 } else { number()? };
    for _ in 0..records {
        let id = bytes()?;
        let record = args::request(id.as_ref(), number()?, number()?, number()?, now)
            .map_err(|e| format!("no command could have made it: {e}"))?;
        lock.restore_request(id.as_ref(), record);
    }
    Ok(LockValue::new(lock))
}

unsafe extern "C" fn aof_rewrite(aof: *mut raw::RedisModuleIO, key: *mut raw::RedisModuleString, value: *mut c_void) {
    let value = unsafe { &*value.cast::<LockValue>() };
    if let Some(holder) = value.lock.holder() {
        let numbers = state_numbers(holder, value.lock.session().is_some());
        ffi::emit_aof(aof, c"FLOCK.STATE", key, &holder.owner, &numbers);
    }
    for (id, record) in value.lock.requests().into_iter().flat_map(|r| r.iter()) {
        ffi::emit_aof(aof, c"FLOCK.ID", key, id, &request_numbers(record).map(|n| n as i64));
    }
}

unsafe extern "C" fn aux_save(io: *mut raw::RedisModuleIO, _when: c_int) {
    raw::save_unsigned(io, state::with(|s| s.tokens.last()));
}

unsafe extern "C" fn aux_load(io: *mut raw::RedisModuleIO, encver: c_int, _when: c_int) -> c_int {
    match raw::load_unsigned(io) {
        Ok(last) if encver == ENCODING_VERSION && last <= args::MAX_TOKEN => {
            state::with(|s| s.tokens.observe(last));
            raw::REDISMODULE_OK as c_int
        }
        Ok(last) if encver == ENCODING_VERSION => {
            ffi::log_io_error(io, &format!("FLOCK refuses a highest token of {last}: tokens are at most {}", args::MAX_TOKEN));
            raw::REDISMODULE_ERR as c_int
        }
        _ => {
            ffi::log_io_error(io, &format!("FLOCK cannot load its module data (encoding version {encver})"));
            raw::REDISMODULE_ERR as c_int
        }
    }
}
