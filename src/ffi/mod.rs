//! The raw module API, behind typed helpers: the one place with `unsafe`.
//!
//! Upper modules see safe functions and traits; every callback Redis calls
//! (blocked clients, key type, server events, command filter, timers) is a
//! trampoline here that turns raw pointers into typed values and calls a
//! safe function handed in from above (a trait implemented by the caller,
//! chosen at registration), so this layer imports nothing of the module.
//!
//! Soundness: Redis calls every callback registered here on its main thread,
//! one at a time, with the pointers it documents as valid for that call
//! (except a key type's `free`, see `key_type`). The data handed to Redis
//! (timer data, blocked-client private data, key values) is always a
//! `Box<T>` leaked with `Box::into_raw` and reclaimed exactly once, by the
//! one callback or call that Redis documents as its end.

use std::ffi::CStr;
use std::os::raw::c_int;
use std::sync::atomic::{AtomicPtr, Ordering};

use redis_module::{raw, Context, RedisString};

pub type RawCtx = *mut raw::RedisModuleCtx;

/// Every raw API this module calls, checked once by `missing_api` when the
/// module loads, so that `api!` below never finds one missing at run time.
macro_rules! required_apis {
    ($($name:ident),* $(,)?) => {
        /// The first raw API this module needs that the server lacks.
        pub fn missing_api() -> Option<&'static str> {
            // SAFETY: RedisModule_Init wrote every API pointer before the
            // module's code runs, and nothing writes them after.
            $(if unsafe { raw::$name }.is_none() {
                return Some(stringify!($name));
            })*
            None
        }
    };
}

required_apis!(
    RedisModule_GetDetachedThreadSafeContext,
    RedisModule_Milliseconds,
    RedisModule_GetContextFlags,
    RedisModule_NotifyKeyspaceEvent,
    RedisModule_AvoidReplicaTraffic,
    RedisModule_GetClientId,
    RedisModule_GetSelectedDb,
    RedisModule_SelectDb,
    RedisModule_BlockClient,
    RedisModule_SetDisconnectCallback,
    RedisModule_GetBlockedClientHandle,
    RedisModule_UnblockClient,
    RedisModule_GetBlockedClientPrivateData,
    RedisModule_CreateTimer,
    RedisModule_GetTimerInfo,
    RedisModule_StopTimer,
    RedisModule_EventLoopAdd,
    RedisModule_ReplyWithMap,
    RedisModule_ReplyWithArray,
    RedisModule_ReplyWithStringBuffer,
    RedisModule_GetDbIdFromOptCtx,
    RedisModule_GetKeyNameFromOptCtx,
    RedisModule_GetDbIdFromIO,
    RedisModule_GetKeyNameFromIO,
    RedisModule_StringPtrLen,
    RedisModule_CreateString,
    RedisModule_FreeString,
    RedisModule_SubscribeToServerEvent,
    RedisModule_CommandFilterArgsCount,
    RedisModule_CommandFilterArgGet,
    RedisModule_CommandFilterArgReplace,
    RedisModule_RegisterCommandFilter,
    RedisModule_EmitAOF,
    RedisModule_Replicate,
    RedisModule_CreateCommand,
    RedisModule_GetCommand,
    RedisModule_SetCommandInfo,
    RedisModule_Log,
    RedisModule_LogIOError,
    RedisModule_InfoAddSection,
    RedisModule_InfoAddFieldLongLong,
    RedisModule_InfoAddFieldCString,
    RedisModule_GetServerInfo,
    RedisModule_ServerInfoGetFieldUnsigned,
    RedisModule_ServerInfoGetFieldC,
    RedisModule_FreeServerInfo,
    RedisModule_OpenKey,
    RedisModule_CloseKey,
    RedisModule_KeyType,
    RedisModule_GetExpire,
    RedisModule_Call,
    RedisModule_ReplyWithCallReply,
    RedisModule_FreeCallReply,
    RedisModule_GetCommandKeysWithFlags,
    RedisModule_KeyAtPosWithFlags,
    RedisModule_Free,
    RedisModule_GetCurrentUserName,
    RedisModule_GetModuleUserFromUserName,
    RedisModule_ACLCheckCommandPermissions,
    RedisModule_ACLAddLogEntry,
    RedisModule_FreeModuleUser,
);

/// A raw API function; `missing_api` refused to load the module without it.
macro_rules! api {
    ($name:ident) => {
        redis_module::raw::$name.expect(concat!(stringify!($name), " is missing in this Redis (checked at load)"))
    };
}

// After `api!`: the submodules use it.
mod block;
mod call;
mod commands;
mod events;
mod key_type;
mod reply;
mod timer;

pub use block::{block, BlockHandlers, BlockedClient, BlockedId};
pub use call::{call_replying, permitted, report_keys};
pub use commands::{add_acl_category, create_commands, ArgDoc, Command, CommandTable};
pub use events::{register_filter, subscribe, CommandFilter, FilterArgs, ServerEvents};
pub use key_type::{type_methods, Aof, Io, KeyType};
pub use reply::{info_section, reply_array, reply_bytes, reply_map};
pub use timer::{start as start_timers, wake_at, wake_now};

/// A context that lives as long as the module, for timer operations made
/// outside a command (key-type callbacks, `free_privdata`).
static MODULE_CTX: AtomicPtr<raw::RedisModuleCtx> = AtomicPtr::new(std::ptr::null_mut());

pub fn init_module_ctx(ctx: RawCtx) {
    // SAFETY: `ctx` is the module's load context, valid during `init`.
    let detached = unsafe { api!(RedisModule_GetDetachedThreadSafeContext)(ctx) };
    MODULE_CTX.store(detached, Ordering::Release);
}

pub fn module_ctx() -> RawCtx {
    MODULE_CTX.load(Ordering::Acquire)
}

/// The server's unix-time clock in milliseconds: read through `clock` only.
pub fn wall_ms() -> u64 {
    // SAFETY: takes no arguments; only called on the main thread.
    u64::try_from(unsafe { api!(RedisModule_Milliseconds)() }).unwrap_or(0)
}

/// `CLOCK_MONOTONIC` in microseconds: read through `clock` only. Not the
/// server's `MonotonicMicroseconds`, which may count processor ticks from
/// another origin: FLOCK's timerfd (`timer`) counts on this one.
pub fn monotonic_us() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: an out-pointer to a local; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1000
}

/// Whether the server's context flags have `flag` now.
fn context_flag(flag: u32) -> bool {
    // SAFETY: the module context lives as long as the module.
    let flags = unsafe { api!(RedisModule_GetContextFlags)(module_ctx()) };
    flags & flag as c_int != 0
}

/// True on a replica: it follows its master's state and acts on no timer.
pub fn is_replica() -> bool {
    context_flag(raw::REDISMODULE_CTX_FLAGS_SLAVE)
}

/// True while the AOF is on (or being turned on): it reads what is propagated.
pub fn aof_on() -> bool {
    context_flag(raw::REDISMODULE_CTX_FLAGS_AOF)
}

/// True while the server keeps its data set still for its replicas: `CLIENT
/// PAUSE ... WRITE` (or `ALL`), and on a master during `FAILOVER` and `CLUSTER
/// FAILOVER`. Sending anything to replicas or the AOF then aborts the server
/// (an assertion in its propagation), and a change made without sending it
/// would be lost in the failover the pause is for. Asking also ends a pause
/// whose time is up, as the server's own checks do.
pub fn writes_paused() -> bool {
    // SAFETY: takes no arguments; only called on the main thread.
    unsafe { api!(RedisModule_AvoidReplicaTraffic)() != 0 }
}

pub fn client_id(ctx: &Context) -> u64 {
    // SAFETY: `ctx` is the context of the running command or callback.
    unsafe { api!(RedisModule_GetClientId)(ctx.ctx) }
}

pub fn selected_db(ctx: &Context) -> i32 {
    // SAFETY: `ctx` is the context of the running command or callback.
    unsafe { api!(RedisModule_GetSelectedDb)(ctx.ctx) }
}

/// Runs `f` with `db` selected on `ctx`, then restores the previous one: the
/// context may belong to a live client whose own selection must not change.
pub fn with_db<R>(ctx: &Context, db: i32, f: impl FnOnce() -> R) -> R {
    let previous = selected_db(ctx);
    // SAFETY: `ctx` is the context of the running command or callback; an
    // index out of range is refused by Redis, not undefined.
    unsafe { api!(RedisModule_SelectDb)(ctx.ctx, db) };
    let result = f();
    // SAFETY: as above, with the index Redis gave.
    unsafe { api!(RedisModule_SelectDb)(ctx.ctx, previous) };
    result
}

/// One section of INFO as the server gives it to a module, freed when
/// dropped.
///
/// Not the crate's `ServerInfo::field`: it retains the string Redis hands
/// over, which the caller already owns, so every call leaked it.
/// `GetFieldC` returns a pointer into the snapshot instead, nothing to free.
struct InfoSection<'a> {
    ctx: &'a Context,
    info: *mut raw::RedisModuleServerInfoData,
}

impl<'a> InfoSection<'a> {
    /// INFO `section`; `None` when it cannot be read.
    fn read(ctx: &'a Context, section: &CStr) -> Option<Self> {
        // SAFETY: `ctx` is the context of the running load, command or event
        // callback; the section name is NUL-terminated.
        let info = unsafe { api!(RedisModule_GetServerInfo)(ctx.ctx, section.as_ptr()) };
        (!info.is_null()).then_some(InfoSection { ctx, info })
    }

    /// A field's unsigned value; `None` when it is missing or not a number.
    fn unsigned(&self, name: &CStr) -> Option<u64> {
        let mut err: c_int = 0;
        // SAFETY: `info` lives until `self` is dropped; the name is
        // NUL-terminated and `err` outlives the call.
        let value = unsafe { api!(RedisModule_ServerInfoGetFieldUnsigned)(self.info, name.as_ptr(), &mut err) };
        (err == 0).then_some(value)
    }

    /// A field's text; `None` when it is missing.
    fn text(&self, name: &CStr) -> Option<String> {
        // SAFETY: as in `unsigned`.
        let value = unsafe { api!(RedisModule_ServerInfoGetFieldC)(self.info, name.as_ptr()) };
        // SAFETY: a NUL-terminated value inside `info`, copied out while it lives.
        (!value.is_null()).then(|| unsafe { CStr::from_ptr(value) }.to_string_lossy().into_owned())
    }
}

impl Drop for InfoSection<'_> {
    fn drop(&mut self) {
        // SAFETY: `info` came from GetServerInfo on this `ctx` and is freed
        // once; nothing read from it outlives `self`.
        unsafe { api!(RedisModule_FreeServerInfo)(self.ctx.ctx, self.info) };
    }
}

/// `maxmemory` and `maxmemory-policy` as INFO memory shows them (0 and ""
/// when a field is missing or unreadable).
pub fn memory_settings(ctx: &Context) -> (u64, String) {
    let Some(info) = InfoSection::read(ctx, c"memory") else {
        return (0, String::new());
    };
    (info.unsigned(c"maxmemory").unwrap_or(0), info.text(c"maxmemory_policy").unwrap_or_default())
}

/// Whether INFO replication shows a replication stream: a replica (it
/// serves its own replicas), a replica connected, or a backlog kept for
/// partial resyncs. True when it cannot be read.
pub fn replication_stream(ctx: &Context) -> bool {
    let Some(info) = InfoSection::read(ctx, c"replication") else {
        return true;
    };
    let some = |name: &CStr| info.unsigned(name).is_none_or(|n| n > 0);
    info.text(c"role").as_deref() != Some("master") || some(c"connected_slaves") || some(c"repl_backlog_active")
}

/// A key name made from any bytes: key names are binary, and the crate's
/// `create_string` panics (aborting the server) on a NUL byte.
pub fn key_name(ctx: &Context, bytes: &[u8]) -> redis_module::RedisString {
    redis_module::RedisString::create_from_slice(ctx.ctx, bytes)
}

/// A string key as a lock of another client leaves it: the time left of
/// its TTL.
pub struct StringKey {
    pub ttl_ms: Option<u64>,
}

/// The string key `name` of the selected database, `None` if it is no
/// string (or missing). Not its value: `RM_StringDMA` re-creates a shared
/// or embedded string in the database even to read it, which frees the
/// object a key handle open on it elsewhere still points to.
pub fn string_key(ctx: &Context, name: &redis_module::RedisString) -> Option<StringKey> {
    // SAFETY: `ctx` is the running callback's context and `name` a live
    // string; a key opened here is closed below, and only its type and
    // expiry are read.
    let key = unsafe { api!(RedisModule_OpenKey)(ctx.ctx, name.inner, raw::REDISMODULE_READ as c_int) };
    if key.is_null() {
        return None;
    }
    // SAFETY: `key` is the open key above.
    let string = unsafe { api!(RedisModule_KeyType)(key) } == raw::REDISMODULE_KEYTYPE_STRING as c_int;
    // SAFETY: as above; REDISMODULE_NO_EXPIRE (-1) for no TTL.
    let ttl = unsafe { api!(RedisModule_GetExpire)(key) };
    // SAFETY: opened above, closed once.
    unsafe { api!(RedisModule_CloseKey)(key) };
    string.then(|| StringKey { ttl_ms: u64::try_from(ttl).ok() })
}

/// A message as a C string whatever it holds: a NUL would end it early.
fn c_message(message: &str) -> std::ffi::CString {
    std::ffi::CString::new(message.replace('\0', "\\0")).unwrap_or_default()
}

/// Writes `message` to the server log at `level` ("warning", "notice").
/// Unlike the crate's `log_*`, the text is never read as a printf format
/// and may hold any byte: it can carry a client's key or owner.
pub fn log(level: &std::ffi::CStr, message: &str) {
    let message = c_message(message);
    // SAFETY: both strings are NUL-terminated and outlive the call; the
    // format "%s" consumes exactly the one string argument given.
    unsafe { api!(RedisModule_Log)(module_ctx(), level.as_ptr(), c"%s".as_ptr(), message.as_ptr()) };
}

/// The most arguments after the key a replicated or AOF command of the
/// module has: a `FLOCK.HOLDER` of a holder with a request ID riding on it.
pub const MAX_ARGS: usize = 14;

/// Words nearly every record repeats: the digits (hold counts, flags,
/// limits), the modes and the request mark. Each is made once and kept for
/// good, as Redis keeps its shared integers: Redis takes a reference of its
/// own to a string it propagates or appends (never a copy), and leaves a
/// string it shares unchanged. Making them anew was a tenth of what an
/// uncontended pair costs the server.
const SHARED_WORDS: [&[u8]; 14] =
    [b"0", b"1", b"2", b"3", b"4", b"5", b"6", b"7", b"8", b"9", b"exclusive", b"shared", b"semaphore", b"ID"];
static SHARED: [AtomicPtr<raw::RedisModuleString>; 14] = [const { AtomicPtr::new(std::ptr::null_mut()) }; 14];

/// The kept string of `word`, if it is one of `SHARED_WORDS`.
fn shared_word(word: &[u8]) -> Option<*mut raw::RedisModuleString> {
    let at = SHARED_WORDS.iter().position(|w| *w == word)?;
    let mut string = SHARED[at].load(Ordering::Relaxed);
    if string.is_null() {
        // SAFETY: as in `with_strings`; never freed, so it lives as long as
        // the server.
        string = unsafe { api!(RedisModule_CreateString)(std::ptr::null_mut(), word.as_ptr().cast(), word.len()) };
        SHARED[at].store(string, Ordering::Relaxed);
    }
    Some(string)
}

/// Runs `f` on `args` as Redis strings (an array and its length), made on
/// the stack and freed after (but for the shared words): the argument
/// vector of a command the module sends.
fn with_strings<R>(args: &[&[u8]], f: impl FnOnce(*mut *mut raw::RedisModuleString, usize) -> R) -> R {
    assert!(args.len() <= MAX_ARGS, "a command of the module has at most {MAX_ARGS} arguments");
    let mut strings = [std::ptr::null_mut(); MAX_ARGS];
    let mut made = [false; MAX_ARGS];
    for ((string, made), arg) in strings.iter_mut().zip(&mut made).zip(args) {
        *string = shared_word(arg).unwrap_or_else(|| {
            *made = true;
            // SAFETY: Redis copies `len` bytes from the pointer; a string made
            // without a context is the caller's to free, below.
            unsafe { api!(RedisModule_CreateString)(std::ptr::null_mut(), arg.as_ptr().cast(), arg.len()) }
        });
    }
    let result = f(strings.as_mut_ptr(), args.len());
    for (&string, _) in strings.iter().zip(made).filter(|(_, made)| *made) {
        // SAFETY: made above without a context, freed once here; Redis took
        // its own reference to any it keeps.
        unsafe { api!(RedisModule_FreeString)(std::ptr::null_mut(), string) };
    }
    result
}

/// Sends `cmd key args...` to replicas and the AOF after the running command
/// (or callback), as Redis's `alsoPropagate` does for its own commands.
pub fn replicate(ctx: &Context, cmd: &std::ffi::CStr, key: &RedisString, args: &[&[u8]]) {
    with_strings(args, |argv, argc| {
        // SAFETY: `ctx` is the running callback's context and `key` a string
        // alive during it (Redis takes its own reference); in the format, "s"
        // is the key and "v" an array of strings and its length, exactly the
        // arguments given.
        unsafe { api!(RedisModule_Replicate)(ctx.ctx, cmd.as_ptr(), c"sv".as_ptr(), key.inner, argv, argc) };
    });
}

/// Sends keyspace event `event` of the module class about `key`.
pub fn notify_module_event(ctx: &Context, event: &std::ffi::CStr, key: &RedisString) {
    // SAFETY: `ctx` is the running callback's context, `event` is
    // NUL-terminated and `key` a string alive during the call (Redis copies
    // what it keeps).
    unsafe {
        api!(RedisModule_NotifyKeyspaceEvent)(
            ctx.ctx,
            raw::REDISMODULE_NOTIFY_MODULE as c_int,
            event.as_ptr(),
            key.inner,
        )
    };
}

/// The bytes of a Redis string; empty for a null pointer.
///
/// # Safety
/// `s` must be null or a string Redis keeps alive for `'a`.
unsafe fn string_bytes<'a>(s: *const raw::RedisModuleString) -> &'a [u8] {
    if s.is_null() {
        return &[];
    }
    let mut len = 0usize;
    // SAFETY: `s` is a live string (the caller's contract).
    let ptr = unsafe { api!(RedisModule_StringPtrLen)(s, &mut len) };
    // SAFETY: Redis returns the string's buffer and its length; it lives as
    // long as the string.
    unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) }
}
