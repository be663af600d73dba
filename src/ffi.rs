//! The raw module API that `redis-module` does not wrap safely: blocked
//! clients with timeout/disconnect callbacks, timers that own typed data,
//! the server clock, database selection, ordered map replies and key-type
//! callback contexts.
//!
//! Soundness: Redis calls every callback registered here on its main thread,
//! one at a time, with the pointers it documents as valid for that call. The
//! data handed to Redis (timer data, blocked-client private data) is always a
//! `Box<T>` leaked with `Box::into_raw` and reclaimed exactly once: by the
//! timer trampoline when the timer fires, by `stop_timer` when it is stopped
//! before that (Redis then no longer references it), or by the module's
//! `free_privdata` callback, which Redis calls once per `UnblockClient`.

use std::ffi::c_void;
use std::os::raw::{c_char, c_int};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicPtr, Ordering};

use redis_module::{raw, Context};

pub type RawCtx = *mut raw::RedisModuleCtx;
pub type TimerId = raw::RedisModuleTimerID;
pub type CmdFunc = unsafe extern "C" fn(RawCtx, *mut *mut raw::RedisModuleString, c_int) -> c_int;
pub type FreeFunc = unsafe extern "C" fn(RawCtx, *mut c_void);
pub type DisconnectFunc = unsafe extern "C" fn(RawCtx, *mut raw::RedisModuleBlockedClient);

/// Every raw API this module calls, checked once by `missing_api` when the
/// module loads, so that `api!` below never finds one missing at run time.
macro_rules! required_apis {
    ($($name:ident),* $(,)?) => {
        /// The first raw API this module needs that the server lacks.
        pub fn missing_api() -> Option<&'static str> {
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
    RedisModule_ReplyWithMap,
    RedisModule_ReplyWithArray,
    RedisModule_ReplyWithStringBuffer,
    RedisModule_GetDbIdFromOptCtx,
    RedisModule_GetKeyNameFromOptCtx,
    RedisModule_GetDbIdFromIO,
    RedisModule_GetKeyNameFromIO,
    RedisModule_StringPtrLen,
    RedisModule_CreateString,
    RedisModule_SubscribeToServerEvent,
    RedisModule_CommandFilterArgsCount,
    RedisModule_CommandFilterArgGet,
    RedisModule_CommandFilterArgReplace,
    RedisModule_RegisterCommandFilter,
    RedisModule_EmitAOF,
    RedisModule_GetCommand,
    RedisModule_SetCommandInfo,
    RedisModule_Log,
    RedisModule_LogIOError,
);

/// A raw API function; `missing_api` refused to load the module without it.
macro_rules! api {
    ($name:ident) => {
        raw::$name.expect(concat!(stringify!($name), " is missing in this Redis (checked at load)"))
    };
}

/// A client blocked in FLOCK.ACQUIRE ... WAIT. The pointer is owned by Redis
/// until the one `unblock` call for it; it is only used as an identity after.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockedClient(NonNull<raw::RedisModuleBlockedClient>);

/// A context that lives as long as the module, for timer operations made
/// outside a command (key-type callbacks, `free_privdata`).
static MODULE_CTX: AtomicPtr<raw::RedisModuleCtx> = AtomicPtr::new(std::ptr::null_mut());

pub fn init_module_ctx(ctx: RawCtx) {
    let detached = unsafe { api!(RedisModule_GetDetachedThreadSafeContext)(ctx) };
    MODULE_CTX.store(detached, Ordering::Release);
}

pub fn module_ctx() -> RawCtx {
    MODULE_CTX.load(Ordering::Acquire)
}

/// The server's unix-time clock in milliseconds.
pub fn now_ms() -> u64 {
    u64::try_from(unsafe { api!(RedisModule_Milliseconds)() }).unwrap_or(0)
}

/// True on a replica: it follows its master's state and acts on no timer.
pub fn is_replica() -> bool {
    let flags = unsafe { api!(RedisModule_GetContextFlags)(module_ctx()) };
    flags & raw::REDISMODULE_CTX_FLAGS_SLAVE as c_int != 0
}

pub fn client_id(ctx: RawCtx) -> u64 {
    unsafe { api!(RedisModule_GetClientId)(ctx) }
}

pub fn selected_db(ctx: RawCtx) -> i32 {
    unsafe { api!(RedisModule_GetSelectedDb)(ctx) }
}

/// Runs `f` with `db` selected on `ctx`, then restores the previous one: the
/// context may belong to a live client whose own selection must not change.
pub fn with_db<R>(ctx: RawCtx, db: i32, f: impl FnOnce() -> R) -> R {
    let previous = selected_db(ctx);
    unsafe { api!(RedisModule_SelectDb)(ctx, db) };
    let result = f();
    unsafe { api!(RedisModule_SelectDb)(ctx, previous) };
    result
}

/// Blocks the calling client; `None` if the server would not.
pub fn block(
    ctx: RawCtx,
    reply: CmdFunc,
    timeout: CmdFunc,
    free: FreeFunc,
    disconnect: DisconnectFunc,
) -> Option<BlockedClient> {
    // Redis-side timeout 0: WAIT limits are enforced by module timers, so a
    // grant, a timeout and a deletion all end in one UnblockClient call.
    let bc = unsafe { api!(RedisModule_BlockClient)(ctx, Some(reply), Some(timeout), Some(free), 0) };
    let bc = NonNull::new(bc)?;
    unsafe { api!(RedisModule_SetDisconnectCallback)(bc.as_ptr(), Some(disconnect)) };
    Some(BlockedClient(bc))
}

/// A key name made from any bytes: key names are binary, and the crate's
/// `create_string` panics (aborting the server) on a NUL byte.
pub fn key_name(ctx: &Context, bytes: &[u8]) -> redis_module::RedisString {
    redis_module::RedisString::create_from_slice(ctx.ctx, bytes)
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
    unsafe { api!(RedisModule_Log)(module_ctx(), level.as_ptr(), c"%s".as_ptr(), message.as_ptr()) };
}

/// As `log`, for an RDB load that is refused: Redis adds the key's context.
pub fn log_io_error(io: *mut raw::RedisModuleIO, message: &str) {
    let message = c_message(message);
    unsafe { api!(RedisModule_LogIOError)(io, c"warning".as_ptr(), c"%s".as_ptr(), message.as_ptr()) };
}

impl BlockedClient {
    pub fn from_raw(bc: *mut raw::RedisModuleBlockedClient) -> Option<Self> {
        NonNull::new(bc).map(Self)
    }

    /// The client currently being answered or timed out in `ctx`.
    pub fn of_ctx(ctx: RawCtx) -> Option<Self> {
        Self::from_raw(unsafe { api!(RedisModule_GetBlockedClientHandle)(ctx) })
    }

    /// Ends the block; `privdata` reaches the reply and free callbacks.
    pub fn unblock<T>(self, privdata: T) {
        let data = Box::into_raw(Box::new(privdata)).cast::<c_void>();
        unsafe { api!(RedisModule_UnblockClient)(self.0.as_ptr(), data) };
    }
}

/// The private data passed to `unblock`, inside the reply callback.
///
/// # Safety
/// `T` must be the type given to `unblock` for every client blocked with
/// the reply callback that calls this.
pub unsafe fn blocked_privdata<'a, T>(ctx: RawCtx) -> Option<&'a mut T> {
    unsafe { api!(RedisModule_GetBlockedClientPrivateData)(ctx).cast::<T>().as_mut() }
}

/// Reclaims private data in the `free_privdata` callback.
///
/// # Safety
/// `data` must come from `unblock::<T>` and be freed only here, once.
pub unsafe fn take_privdata<T>(data: *mut c_void) -> Option<Box<T>> {
    (!data.is_null()).then(|| unsafe { Box::from_raw(data.cast::<T>()) })
}

struct TimerData<T> {
    callback: fn(&Context, T),
    data: T,
}

/// The data of the timer whose callback is running. Redis 7.0 keeps a timer
/// registered during its own callback and frees it afterwards, so stopping
/// it from inside (directly, or through a key-type callback that the timer's
/// work triggers) would free it twice.
static FIRING: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

unsafe extern "C" fn timer_trampoline<T>(ctx: RawCtx, data: *mut c_void) {
    let previous = FIRING.swap(data, Ordering::AcqRel);
    let timer = unsafe { Box::from_raw(data.cast::<TimerData<T>>()) };
    (timer.callback)(&Context::new(ctx), timer.data);
    FIRING.store(previous, Ordering::Release);
}

/// Calls `callback(ctx, data)` on the main thread after `delay_ms`.
pub fn create_timer<T>(delay_ms: u64, callback: fn(&Context, T), data: T) -> TimerId {
    let data = Box::into_raw(Box::new(TimerData { callback, data })).cast::<c_void>();
    let delay = i64::try_from(delay_ms).unwrap_or(i64::MAX);
    unsafe { api!(RedisModule_CreateTimer)(module_ctx(), delay, Some(timer_trampoline::<T>), data) }
}

/// Cancels a timer made by `create_timer::<T>` and returns its data, or
/// `None` if it already fired or is firing now.
pub fn stop_timer<T>(id: TimerId) -> Option<T> {
    let mut data: *mut c_void = std::ptr::null_mut();
    let mut remaining: u64 = 0;
    let found = unsafe { api!(RedisModule_GetTimerInfo)(module_ctx(), id, &mut remaining, &mut data) };
    if found != raw::REDISMODULE_OK as c_int || data == FIRING.load(Ordering::Acquire) {
        return None;
    }
    let status = unsafe { api!(RedisModule_StopTimer)(module_ctx(), id, &mut data) };
    if status != raw::REDISMODULE_OK as c_int || data.is_null() {
        return None;
    }
    Some(unsafe { Box::from_raw(data.cast::<TimerData<T>>()) }.data)
}

/// Starts a map reply that keeps field order (RESP3 map, RESP2 flat array).
pub fn reply_map(ctx: &Context, fields: usize) {
    unsafe { api!(RedisModule_ReplyWithMap)(ctx.ctx, fields as _) };
}

pub fn reply_array(ctx: &Context, len: usize) {
    unsafe { api!(RedisModule_ReplyWithArray)(ctx.ctx, len as _) };
}

pub fn reply_bytes(ctx: &Context, bytes: &[u8]) {
    unsafe { api!(RedisModule_ReplyWithStringBuffer)(ctx.ctx, bytes.as_ptr().cast::<c_char>(), bytes.len()) };
}

/// Key name and database of a key-type callback.
pub fn opt_ctx_key(ctx: *mut raw::RedisModuleKeyOptCtx) -> (i32, Vec<u8>) {
    let db = unsafe { api!(RedisModule_GetDbIdFromOptCtx)(ctx) };
    let name = unsafe { api!(RedisModule_GetKeyNameFromOptCtx)(ctx) };
    (db, string_bytes(name).to_vec())
}

/// Key name and database of the key being loaded.
pub fn io_key(io: *mut raw::RedisModuleIO) -> (i32, Vec<u8>) {
    let db = unsafe { api!(RedisModule_GetDbIdFromIO)(io) };
    let name = unsafe { api!(RedisModule_GetKeyNameFromIO)(io) };
    (db, string_bytes(name).to_vec())
}

fn string_bytes<'a>(s: *const raw::RedisModuleString) -> &'a [u8] {
    if s.is_null() {
        return &[];
    }
    let mut len = 0usize;
    let ptr = unsafe { api!(RedisModule_StringPtrLen)(s, &mut len) };
    unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) }
}

/// Subscribes `callback` to a server event.
pub fn subscribe(ctx: RawCtx, id: u64, callback: unsafe extern "C" fn(RawCtx, raw::RedisModuleEvent, u64, *mut c_void)) {
    let event = raw::RedisModuleEvent { id, dataver: 1 };
    unsafe { api!(RedisModule_SubscribeToServerEvent)(ctx, event, Some(callback)) };
}

/// The arguments of a command seen by a command filter.
pub struct FilterArgs(pub *mut raw::RedisModuleCommandFilterCtx);

impl FilterArgs {
    pub fn len(&self) -> usize {
        usize::try_from(unsafe { api!(RedisModule_CommandFilterArgsCount)(self.0) }).unwrap_or(0)
    }

    pub fn get(&self, pos: usize) -> &[u8] {
        string_bytes(unsafe { api!(RedisModule_CommandFilterArgGet)(self.0, pos as c_int) })
    }

    pub fn replace(&self, pos: usize, bytes: &[u8]) {
        // The filter takes ownership of a string made without a context.
        let s = unsafe { api!(RedisModule_CreateString)(std::ptr::null_mut(), bytes.as_ptr().cast::<c_char>(), bytes.len()) };
        unsafe { api!(RedisModule_CommandFilterArgReplace)(self.0, pos as c_int, s) };
    }
}

pub fn register_filter(ctx: RawCtx, filter: unsafe extern "C" fn(*mut raw::RedisModuleCommandFilterCtx)) {
    unsafe { api!(RedisModule_RegisterCommandFilter)(ctx, Some(filter), 0) };
}

/// Appends `cmd key bytes n...` to an AOF being rewritten: FLOCK.STATE
/// (owner and 4 numbers) or FLOCK.ID (request ID and 3 numbers).
pub fn emit_aof(aof: *mut raw::RedisModuleIO, cmd: &std::ffi::CStr, key: *mut raw::RedisModuleString, bytes: &[u8], n: &[i64]) {
    let emit = unsafe { api!(RedisModule_EmitAOF) };
    let (ptr, len) = (bytes.as_ptr().cast::<c_char>(), bytes.len());
    // Variadic: the format string says how many numbers follow.
    match *n {
        [a, b, c, d] => unsafe { emit(aof, cmd.as_ptr(), c"sbllll".as_ptr(), key, ptr, len, a, b, c, d) },
        [a, b, c] => unsafe { emit(aof, cmd.as_ptr(), c"sblll".as_ptr(), key, ptr, len, a, b, c) },
        _ => unreachable!("FLOCK.STATE and FLOCK.ID take four and three numbers"),
    }
}

/// One argument of a command as `COMMAND DOCS` shows it.
pub struct ArgDoc {
    pub name: &'static str,
    pub kind: raw::RedisModuleCommandArgType,
    pub token: Option<&'static str>,
    pub optional: bool,
    pub subargs: &'static [ArgDoc],
}

/// What `COMMAND DOCS` and `COMMAND INFO` say of a command.
pub struct CommandDoc {
    pub name: &'static str,
    pub summary: &'static str,
    pub complexity: &'static str,
    pub arity: i32,
    pub key_flags: u32,
    /// ACL categories (space-separated) on servers that let modules set them.
    pub acl: &'static str,
    pub args: &'static [ArgDoc],
}

/// Registers `doc` for an already created command. Redis copies everything
/// it is given, so the C strings and arrays only live for this call.
pub fn set_command_info(ctx: RawCtx, doc: &CommandDoc, since: &str) -> bool {
    let mut strings: Vec<std::ffi::CString> = Vec::new();
    let mut cstr = |s: &str| -> *const c_char {
        strings.push(std::ffi::CString::new(s).unwrap_or_default());
        strings.last().map_or(std::ptr::null(), |c| c.as_ptr())
    };
    // Arrays are terminated by a zeroed entry.
    fn args(docs: &[ArgDoc], cstr: &mut dyn FnMut(&str) -> *const c_char, keep: &mut Vec<Vec<raw::RedisModuleCommandArg>>) -> *mut raw::RedisModuleCommandArg {
        let mut out: Vec<raw::RedisModuleCommandArg> = docs
            .iter()
            .map(|d| {
                let mut arg: raw::RedisModuleCommandArg = unsafe { std::mem::zeroed() };
                arg.name = cstr(d.name);
                arg.type_ = d.kind;
                arg.key_spec_index = if d.kind == raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY { 0 } else { -1 };
                arg.token = d.token.map_or(std::ptr::null(), &mut *cstr);
                arg.flags = if d.optional { raw::REDISMODULE_CMD_ARG_OPTIONAL as c_int } else { 0 };
                if !d.subargs.is_empty() {
                    arg.subargs = args(d.subargs, cstr, keep);
                }
                arg
            })
            .collect();
        out.push(unsafe { std::mem::zeroed() });
        let ptr = out.as_mut_ptr();
        keep.push(out);
        ptr
    }
    let mut keep = Vec::new();
    let args_ptr = args(doc.args, &mut cstr, &mut keep);
    let mut key_specs: [raw::RedisModuleCommandKeySpec; 2] = unsafe { std::mem::zeroed() };
    key_specs[0].flags = u64::from(doc.key_flags);
    key_specs[0].begin_search_type = raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
    key_specs[0].bs.index.pos = 1;
    key_specs[0].find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE;
    key_specs[0].fk.range.lastkey = 0;
    key_specs[0].fk.range.keystep = 1;
    key_specs[0].fk.range.limit = 0;
    let version = raw::RedisModuleCommandInfoVersion {
        version: 1,
        sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
        sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
        sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
    };
    let info = raw::RedisModuleCommandInfo {
        version: &version,
        summary: cstr(doc.summary),
        complexity: cstr(doc.complexity),
        since: cstr(since),
        history: std::ptr::null_mut(),
        tips: std::ptr::null(),
        arity: doc.arity,
        key_specs: key_specs.as_mut_ptr(),
        args: args_ptr,
    };
    let name = std::ffi::CString::new(doc.name).unwrap_or_default();
    let command = unsafe { api!(RedisModule_GetCommand)(ctx, name.as_ptr()) };
    !command.is_null() && unsafe { api!(RedisModule_SetCommandInfo)(command, &info) } == raw::REDISMODULE_OK as c_int
}

// Optional APIs: absent on Redis 7.0, so deliberately not in `required_apis!`;
// each checks for its function and, where it is missing, leaves Redis 7.0's
// behaviour (module commands in no ACL category) in place.

/// Registers the ACL category `name` so that rules such as `-@flock` work
/// (Redis 8.0+; only allowed while the module loads). False where the server
/// lacks the API or refuses the name.
pub fn add_acl_category(ctx: RawCtx, name: &std::ffi::CStr) -> bool {
    // Safety: the function pointer is checked, `ctx` is the loading context and
    // `name` a NUL-terminated string that Redis copies.
    match unsafe { raw::RedisModule_AddACLCategory } {
        Some(add) => (unsafe { add(ctx, name.as_ptr()) }) == raw::REDISMODULE_OK as c_int,
        None => false,
    }
}

/// Puts the already created command `name` into the ACL `categories`
/// (space-separated; Redis 7.2+ and Valkey, only while the module loads).
/// True where the server lacks the API (nothing to do); false if it refuses.
pub fn set_acl_categories(ctx: RawCtx, name: &str, categories: &str) -> bool {
    let Some(set) = (unsafe { raw::RedisModule_SetCommandACLCategories }) else { return true };
    let (Ok(name), Ok(categories)) = (std::ffi::CString::new(name), std::ffi::CString::new(categories)) else {
        return false;
    };
    // Safety: the function pointers are checked (GetCommand is a required API);
    // both strings outlive the calls and Redis copies what it keeps.
    let command = unsafe { api!(RedisModule_GetCommand)(ctx, name.as_ptr()) };
    !command.is_null() && unsafe { set(command, categories.as_ptr()) } == raw::REDISMODULE_OK as c_int
}
