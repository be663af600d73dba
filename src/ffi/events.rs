//! Server events and the command filter.

use std::ffi::c_void;
use std::os::raw::{c_char, c_int};

use redis_module::{raw, Context};

use super::{string_bytes, RawCtx};

/// What the module does on the server events it follows.
pub trait ServerEvents: 'static {
    /// FLUSHDB (`db`) or FLUSHALL (`db` -1) is about to free the keys.
    fn flush_starting(ctx: &Context, db: i32);
    fn swapdb(ctx: &Context, first: i32, second: i32);
    fn client_disconnected(ctx: &Context, client: u64);
    /// This master became a replica.
    fn now_replica(ctx: &Context);
    /// CONFIG SET applied its changes.
    fn config_changed(ctx: &Context);
    /// A replica connected or left, or the role changed: a replication
    /// stream may have started or ended.
    fn replication_changed();
    /// A child process was forked (a snapshot: for a replica's full sync,
    /// among others), or a load ended (a restart may keep a backlog, made
    /// after this event).
    fn stream_may_start();
    /// The server's cron, `hz` times a second.
    fn cron(hz: i32);
}

/// Subscribes `E` to flush, swapdb, client, role, config, replica, loading,
/// fork and cron events.
pub fn subscribe<E: ServerEvents>(ctx: &Context) {
    let events: [(u64, unsafe extern "C" fn(RawCtx, raw::RedisModuleEvent, u64, *mut c_void)); 9] = [
        (raw::REDISMODULE_EVENT_FLUSHDB, on_flush::<E>),
        (raw::REDISMODULE_EVENT_SWAPDB, on_swapdb::<E>),
        (raw::REDISMODULE_EVENT_CLIENT_CHANGE, on_client_change::<E>),
        (raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED, on_role_changed::<E>),
        // Fires after CONFIG SET applied its changes (module configs too),
        // and not for a CONFIG SET that failed and was rolled back.
        (raw::REDISMODULE_EVENT_CONFIG, on_config_change::<E>),
        (raw::REDISMODULE_EVENT_REPLICA_CHANGE, on_replica_change::<E>),
        (raw::REDISMODULE_EVENT_LOADING, on_loading::<E>),
        (raw::REDISMODULE_EVENT_FORK_CHILD, on_fork::<E>),
        (raw::REDISMODULE_EVENT_CRON_LOOP, on_cron::<E>),
    ];
    for (id, callback) in events {
        let event = raw::RedisModuleEvent { id, dataver: 1 };
        // SAFETY: `ctx` is the load context; each callback reads the data
        // of the event it is subscribed to, in the version given (1).
        unsafe { api!(RedisModule_SubscribeToServerEvent)(ctx.ctx, event, Some(callback)) };
    }
}

unsafe extern "C" fn on_flush<E: ServerEvents>(
    ctx: RawCtx,
    _: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    if subevent == raw::REDISMODULE_SUBEVENT_FLUSHDB_START {
        // SAFETY: a FLUSHDB event's data is a `RedisModuleFlushInfo`.
        let dbnum = unsafe { &*data.cast::<raw::RedisModuleFlushInfo>() }.dbnum;
        E::flush_starting(&Context::new(ctx), dbnum);
    }
}

unsafe extern "C" fn on_swapdb<E: ServerEvents>(ctx: RawCtx, _: raw::RedisModuleEvent, _: u64, data: *mut c_void) {
    // SAFETY: a SWAPDB event's data is a `RedisModuleSwapDbInfo`.
    let info = unsafe { &*data.cast::<raw::RedisModuleSwapDbInfo>() };
    E::swapdb(&Context::new(ctx), info.dbnum_first, info.dbnum_second);
}

unsafe extern "C" fn on_client_change<E: ServerEvents>(
    ctx: RawCtx,
    _: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    if subevent == raw::REDISMODULE_SUBEVENT_CLIENT_CHANGE_DISCONNECTED {
        // SAFETY: a client event's data is a `RedisModuleClientInfo`.
        let client = unsafe { &*data.cast::<raw::RedisModuleClientInfo>() }.id;
        E::client_disconnected(&Context::new(ctx), client);
    }
}

unsafe extern "C" fn on_role_changed<E: ServerEvents>(
    ctx: RawCtx,
    _: raw::RedisModuleEvent,
    subevent: u64,
    _: *mut c_void,
) {
    if subevent == raw::REDISMODULE_EVENT_REPLROLECHANGED_NOW_REPLICA {
        E::now_replica(&Context::new(ctx));
    }
    E::replication_changed();
}

unsafe extern "C" fn on_replica_change<E: ServerEvents>(_: RawCtx, _: raw::RedisModuleEvent, _: u64, _: *mut c_void) {
    E::replication_changed();
}

unsafe extern "C" fn on_loading<E: ServerEvents>(_: RawCtx, _: raw::RedisModuleEvent, subevent: u64, _: *mut c_void) {
    if subevent == raw::REDISMODULE_SUBEVENT_LOADING_ENDED || subevent == raw::REDISMODULE_SUBEVENT_LOADING_FAILED {
        E::stream_may_start();
    }
}

unsafe extern "C" fn on_fork<E: ServerEvents>(_: RawCtx, _: raw::RedisModuleEvent, subevent: u64, _: *mut c_void) {
    if subevent == raw::REDISMODULE_SUBEVENT_FORK_CHILD_BORN {
        E::stream_may_start();
    }
}

unsafe extern "C" fn on_cron<E: ServerEvents>(_: RawCtx, _: raw::RedisModuleEvent, _: u64, data: *mut c_void) {
    // SAFETY: a cron loop event's data is a `RedisModuleCronLoop` (version 1).
    E::cron(unsafe { &*data.cast::<raw::RedisModuleCronLoopV1>() }.hz);
}

unsafe extern "C" fn on_config_change<E: ServerEvents>(ctx: RawCtx, _: raw::RedisModuleEvent, _: u64, _: *mut c_void) {
    E::config_changed(&Context::new(ctx));
}

/// A command filter: sees (and may rewrite) every command before it runs.
pub trait CommandFilter: 'static {
    fn filter(args: &mut FilterArgs);
}

/// The arguments of a command seen by a command filter.
pub struct FilterArgs(*mut raw::RedisModuleCommandFilterCtx);

impl FilterArgs {
    pub fn len(&self) -> usize {
        // SAFETY: the filter context is valid during the filter call, the
        // only time a `FilterArgs` exists.
        usize::try_from(unsafe { api!(RedisModule_CommandFilterArgsCount)(self.0) }).unwrap_or(0)
    }

    pub fn get(&self, pos: usize) -> &[u8] {
        // SAFETY: as `len`; an index out of range gives null, read as empty.
        // The argument lives until the filter returns or replaces it, and
        // `replace` takes `&mut self`, so the slice cannot outlive it.
        unsafe { string_bytes(api!(RedisModule_CommandFilterArgGet)(self.0, pos as c_int)) }
    }

    pub fn replace(&mut self, pos: usize, bytes: &[u8]) {
        // The filter takes ownership of a string made without a context.
        // SAFETY: Redis copies `len` bytes from the pointer.
        let s = unsafe {
            api!(RedisModule_CreateString)(std::ptr::null_mut(), bytes.as_ptr().cast::<c_char>(), bytes.len())
        };
        // SAFETY: as `len`; `s` is a new string whose ownership passes to Redis.
        unsafe { api!(RedisModule_CommandFilterArgReplace)(self.0, pos as c_int, s) };
    }
}

pub fn register_filter<F: CommandFilter>(ctx: &Context) {
    // SAFETY: `ctx` is the load context; the trampoline matches the filter type.
    unsafe { api!(RedisModule_RegisterCommandFilter)(ctx.ctx, Some(on_filter::<F>), 0) };
}

unsafe extern "C" fn on_filter<F: CommandFilter>(fctx: *mut raw::RedisModuleCommandFilterCtx) {
    F::filter(&mut FilterArgs(fctx));
}
