//! Timers that own typed data and call a plain `fn` on the main thread.

use std::ffi::c_void;
use std::marker::PhantomData;
use std::os::raw::c_int;
use std::sync::atomic::{AtomicPtr, Ordering};

use redis_module::{raw, Context};

use super::{module_ctx, RawCtx};

/// A timer made by `create_timer` with data `T`: the type `stop_timer`
/// gets back is the one it was made with.
#[derive(Debug)]
pub struct Timer<T> {
    id: raw::RedisModuleTimerID,
    data: PhantomData<fn(T)>,
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
    // SAFETY: `data` is the `TimerData<T>` leaked by `create_timer::<T>`;
    // Redis fires a timer once, and `stop_timer` never takes the data of one
    // that fired or is firing (`FIRING`), so it is reclaimed here alone.
    let timer = unsafe { Box::from_raw(data.cast::<TimerData<T>>()) };
    (timer.callback)(&Context::new(ctx), timer.data);
    FIRING.store(previous, Ordering::Release);
}

/// Calls `callback(ctx, data)` on the main thread after `delay_ms`.
pub fn create_timer<T>(delay_ms: u64, callback: fn(&Context, T), data: T) -> Timer<T> {
    let data = Box::into_raw(Box::new(TimerData { callback, data })).cast::<c_void>();
    let delay = i64::try_from(delay_ms).unwrap_or(i64::MAX);
    // SAFETY: the module context lives as long as the module; the trampoline
    // reads `data` as the `TimerData<T>` it is.
    let id = unsafe { api!(RedisModule_CreateTimer)(module_ctx(), delay, Some(timer_trampoline::<T>), data) };
    Timer { id, data: PhantomData }
}

/// Cancels a timer and returns its data, or `None` if it already fired or
/// is firing now.
pub fn stop_timer<T>(timer: Timer<T>) -> Option<T> {
    let mut data: *mut c_void = std::ptr::null_mut();
    let mut remaining: u64 = 0;
    // SAFETY: out-pointers to locals; an unknown id is reported, not undefined.
    let found = unsafe { api!(RedisModule_GetTimerInfo)(module_ctx(), timer.id, &mut remaining, &mut data) };
    if found != raw::REDISMODULE_OK as c_int || data == FIRING.load(Ordering::Acquire) {
        return None;
    }
    // SAFETY: as above; a stopped timer never fires, so its data is ours.
    let status = unsafe { api!(RedisModule_StopTimer)(module_ctx(), timer.id, &mut data) };
    if status != raw::REDISMODULE_OK as c_int || data.is_null() {
        return None;
    }
    // SAFETY: the data of a `Timer<T>` is the `TimerData<T>` leaked by
    // `create_timer`, and Redis just gave up its last reference to it.
    Some(unsafe { Box::from_raw(data.cast::<TimerData<T>>()) }.data)
}
