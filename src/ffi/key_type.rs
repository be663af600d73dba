//! A module key type: its callbacks, and the RDB and AOF streams they use.

use std::ffi::c_void;
use std::os::raw::c_int;

use redis_module::{raw, RedisBuffer};

use super::{c_message, string_bytes, with_strings};

/// What the module does when Redis calls a key type's callbacks. Values are
/// boxed `Self::Value`s: `free` drops them (possibly on a background thread,
/// for FLUSHALL ASYNC: `Drop` must not touch main-thread state).
pub trait KeyType: 'static {
    type Value;
    /// Reads a value saved by `save` (encoding version `encver`); `None`
    /// refuses it (the caller logs why through `io`).
    fn load(io: &Io, encver: i32) -> Option<Self::Value>;
    fn save(io: &Io, value: &Self::Value);
    /// Writes commands that rebuild `value` to an AOF being rewritten.
    fn rewrite_aof(aof: &Aof, value: &Self::Value);
    /// Bytes `value` takes; `key` gives its (database, name) if needed.
    fn mem_usage(value: &Self::Value, key: &dyn Fn() -> (i32, Vec<u8>)) -> usize;
    /// The value leaves key `key` of database `db` (DEL, UNLINK, overwrite,
    /// expiry, RENAME or MOVE source), on the main thread, still intact.
    fn unlink(value: &mut Self::Value, db: i32, key: &[u8]);
    /// Module-global data, saved once before the keys.
    fn aux_save(io: &Io);
    /// Reads what `aux_save` wrote; false refuses the file.
    fn aux_load(io: &Io, encver: i32) -> bool;
}

/// The callbacks of `T`, for `RedisType::new`.
pub const fn type_methods<T: KeyType>() -> raw::RedisModuleTypeMethods {
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(rdb_load::<T>),
        rdb_save: Some(rdb_save::<T>),
        aof_rewrite: Some(aof_rewrite::<T>),
        mem_usage: None,
        digest: None,
        free: Some(free::<T>),
        aux_load: Some(aux_load::<T>),
        aux_save: Some(aux_save::<T>),
        aux_save2: None,
        aux_save_triggers: raw::REDISMODULE_AUX_BEFORE_RDB as i32,
        free_effort: None,
        unlink: None,
        // Without a copy callback Redis refuses COPY: a lock has one owner.
        copy: None,
        defrag: None,
        mem_usage2: Some(mem_usage::<T>),
        free_effort2: None,
        unlink2: Some(unlink::<T>),
        copy2: None,
    }
}

/// The RDB stream of one load or save callback.
pub struct Io(*mut raw::RedisModuleIO);

impl Io {
    pub fn save_unsigned(&self, n: u64) {
        raw::save_unsigned(self.0, n);
    }

    pub fn save_bytes(&self, bytes: &[u8]) {
        raw::save_slice(self.0, bytes);
    }

    /// `None` when the data ends early.
    pub fn load_unsigned(&self) -> Option<u64> {
        raw::load_unsigned(self.0).ok()
    }

    pub fn load_bytes(&self) -> Option<RedisBuffer> {
        raw::load_string_buffer(self.0).ok()
    }

    /// Database and name of the key being loaded.
    pub fn key(&self) -> (i32, Vec<u8>) {
        // SAFETY: the stream is valid during its callback, the only time an
        // `Io` exists; the name lives as long as the stream.
        unsafe {
            (api!(RedisModule_GetDbIdFromIO)(self.0), string_bytes(api!(RedisModule_GetKeyNameFromIO)(self.0)).to_vec())
        }
    }

    /// Logs why a load is refused: Redis adds the key's context.
    pub fn log_error(&self, message: &str) {
        let message = c_message(message);
        // SAFETY: as `key`; the strings are NUL-terminated, and the format
        // "%s" consumes exactly the one string argument given.
        unsafe { api!(RedisModule_LogIOError)(self.0, c"warning".as_ptr(), c"%s".as_ptr(), message.as_ptr()) };
    }
}

/// An AOF being rewritten, at one key.
pub struct Aof {
    io: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
}

impl Aof {
    /// Appends `cmd key args...`, each argument any bytes: the one way
    /// every record reaches the AOF, whatever its length.
    pub fn emit(&self, cmd: &std::ffi::CStr, args: &[&[u8]]) {
        with_strings(args, |argv, argc| {
            // SAFETY: the stream and key are valid during the rewrite callback,
            // the only time an `Aof` exists; in the format, "s" is the key and
            // "v" an array of strings and its length, exactly the arguments given.
            unsafe { api!(RedisModule_EmitAOF)(self.io, cmd.as_ptr(), c"sv".as_ptr(), self.key, argv, argc) };
        });
    }
}

unsafe extern "C" fn rdb_load<T: KeyType>(io: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    match T::load(&Io(io), encver) {
        Some(value) => Box::into_raw(Box::new(value)).cast::<c_void>(),
        None => std::ptr::null_mut(),
    }
}

unsafe extern "C" fn rdb_save<T: KeyType>(io: *mut raw::RedisModuleIO, value: *mut c_void) {
    // SAFETY: every value of this type is a boxed `T::Value` made by
    // `rdb_load` or put in a key by the module, alive during the callback.
    T::save(&Io(io), unsafe { &*value.cast::<T::Value>() });
}

unsafe extern "C" fn aof_rewrite<T: KeyType>(
    io: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    // SAFETY: as `rdb_save`.
    T::rewrite_aof(&Aof { io, key }, unsafe { &*value.cast::<T::Value>() });
}

unsafe extern "C" fn free<T: KeyType>(value: *mut c_void) {
    // SAFETY: as `rdb_save`; Redis frees each value once, after its last use.
    drop(unsafe { Box::from_raw(value.cast::<T::Value>()) });
}

unsafe extern "C" fn mem_usage<T: KeyType>(
    ctx: *mut raw::RedisModuleKeyOptCtx,
    value: *const c_void,
    _: usize,
) -> usize {
    // SAFETY: the key context is valid during the callback, and the name
    // lives as long as it.
    let key = || unsafe {
        (api!(RedisModule_GetDbIdFromOptCtx)(ctx), string_bytes(api!(RedisModule_GetKeyNameFromOptCtx)(ctx)).to_vec())
    };
    // SAFETY: as `rdb_save`.
    T::mem_usage(unsafe { &*value.cast::<T::Value>() }, &key)
}

unsafe extern "C" fn unlink<T: KeyType>(ctx: *mut raw::RedisModuleKeyOptCtx, value: *const c_void) {
    // SAFETY: as `mem_usage`. Redis hands out a const pointer, but the value
    // is the module's and nothing else references it during this callback.
    let (value, db, key) = unsafe {
        let key = string_bytes(api!(RedisModule_GetKeyNameFromOptCtx)(ctx));
        (&mut *value.cast_mut().cast::<T::Value>(), api!(RedisModule_GetDbIdFromOptCtx)(ctx), key)
    };
    T::unlink(value, db, key);
}

unsafe extern "C" fn aux_save<T: KeyType>(io: *mut raw::RedisModuleIO, _when: c_int) {
    T::aux_save(&Io(io));
}

unsafe extern "C" fn aux_load<T: KeyType>(io: *mut raw::RedisModuleIO, encver: c_int, _when: c_int) -> c_int {
    match T::aux_load(&Io(io), encver) {
        true => raw::REDISMODULE_OK as c_int,
        false => raw::REDISMODULE_ERR as c_int,
    }
}
