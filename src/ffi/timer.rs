//! How FLOCK's timers (`timers`) wake up on the monotonic clock.
//!
//! Redis's module timers are due on the wall clock (`ustime()`): stepped
//! back an hour, the server fires each an hour late; stepped forward, at
//! once. So FLOCK keeps its own timers, and the server's event loop watches
//! a Linux timerfd on `CLOCK_MONOTONIC` that becomes readable when the first
//! is due. The callback of a readable file has no context to open keys or
//! replicate with, so it sets a module timer due at once (the bridge), whose
//! callback runs the due timers with one.
//!
//! The bridge is due "now" on the wall clock: a step back in the moment it
//! waits would hold it back by the step. While it waits, the timerfd fires
//! again after `BACKSTOP_MS`; a bridge not yet due then (Redis tells the
//! time it has left) is set again, due now.

use std::ffi::c_void;
use std::os::raw::c_int;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::OnceLock;

use redis_module::{raw, Context};

use super::{module_ctx, monotonic_us, RawCtx};

/// How often a waiting bridge is looked at.
const BACKSTOP_MS: u64 = 10;

/// The timerfd (-1 before `start`), and the bridge waiting (0: none; a
/// module timer's id is the unix µs it was due at): only the main thread
/// reads or writes them.
static FD: AtomicI32 = AtomicI32::new(-1);
static BRIDGE: AtomicU64 = AtomicU64::new(0);
/// What the bridge runs: `timers`' due timers.
static RUN: OnceLock<fn(&Context)> = OnceLock::new();

/// Makes the timerfd and adds it to the event loop; `run` is called, with
/// a context, whenever a time set with `wake_at` or `wake_now` has come.
pub fn start(run: fn(&Context)) -> Result<(), String> {
    // SAFETY: plain syscall; the fd is owned by this module until the
    // process ends (the module cannot be unloaded).
    let fd = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC) };
    if fd < 0 {
        return Err(format!("timerfd_create: {}", std::io::Error::last_os_error()));
    }
    let _ = RUN.set(run);
    // SAFETY: `on_readable` matches the callback type and uses no user
    // data (null here): only this module's statics.
    let added = unsafe {
        api!(RedisModule_EventLoopAdd)(
            fd,
            raw::REDISMODULE_EVENTLOOP_READABLE as c_int,
            Some(on_readable),
            std::ptr::null_mut(),
        )
    };
    if added != raw::REDISMODULE_OK as c_int {
        // SAFETY: the fd made above, not shared with anything.
        unsafe { libc::close(fd) };
        return Err(format!("adding a timerfd to the event loop: {}", std::io::Error::last_os_error()));
    }
    FD.store(fd, Ordering::Relaxed);
    Ok(())
}

/// Wakes up at `mono_us` of the monotonic clock, in place of the time set
/// before; `None`: not at all (unless a bridge waits, which keeps its backstop).
pub fn wake_at(mono_us: Option<u64>) {
    if BRIDGE.load(Ordering::Relaxed) == 0 {
        arm(mono_us);
    }
}

/// Runs the due timers once the event loop has served what it has.
pub fn wake_now() {
    if BRIDGE.load(Ordering::Relaxed) == 0 {
        set_bridge();
        arm(Some(monotonic_us() + BACKSTOP_MS * 1000));
    }
}

fn arm(mono_us: Option<u64>) {
    let at = mono_us.map_or(libc::timespec { tv_sec: 0, tv_nsec: 0 }, |us| libc::timespec {
        tv_sec: (us / 1_000_000) as libc::time_t,
        // An absolute time of zero disarms: the earliest time is 1 ns.
        tv_nsec: ((us % 1_000_000) * 1000).max(1) as libc::c_long,
    });
    let spec = libc::itimerspec { it_interval: libc::timespec { tv_sec: 0, tv_nsec: 0 }, it_value: at };
    let fd = FD.load(Ordering::Relaxed);
    // The system call itself, not libc's wrapper: libfaketime (the tests'
    // wall-clock steps) shifts the wrapper's absolute times by its offset
    // even on CLOCK_MONOTONIC, which a real step never does.
    // SAFETY: `fd` is the timerfd made by `start`; pointers to locals, of
    // the types the system call reads and writes (no old value wanted).
    unsafe {
        libc::syscall(
            libc::SYS_timerfd_settime,
            fd,
            libc::TFD_TIMER_ABSTIME,
            &spec as *const _,
            std::ptr::null_mut::<libc::itimerspec>(),
        )
    };
}

fn set_bridge() {
    // SAFETY: the module context lives as long as the module; the callback
    // takes no data.
    let id = unsafe { api!(RedisModule_CreateTimer)(module_ctx(), 0, Some(on_bridge), std::ptr::null_mut()) };
    BRIDGE.store(id, Ordering::Relaxed);
}

/// The timerfd fired: the first timer is due, or a bridge has waited for
/// `BACKSTOP_MS`.
unsafe extern "C" fn on_readable(fd: c_int, _: *mut c_void, _: c_int) {
    let mut expirations = [0u8; 8];
    // SAFETY: reads 8 bytes into a local buffer of 8; a timerfd that has
    // not fired answers EAGAIN (it is non-blocking), which is fine.
    unsafe { libc::read(fd, expirations.as_mut_ptr().cast(), expirations.len()) };
    let bridge = BRIDGE.load(Ordering::Relaxed);
    if bridge == 0 {
        set_bridge();
    } else {
        let mut remaining: u64 = 0;
        let mut data: *mut c_void = std::ptr::null_mut();
        // SAFETY: out-pointers to locals; the bridge has not fired (it
        // clears `BRIDGE` when it does), and is not firing: callbacks of
        // files and timers never nest.
        let found = unsafe { api!(RedisModule_GetTimerInfo)(module_ctx(), bridge, &mut remaining, &mut data) };
        if found == raw::REDISMODULE_OK as c_int && remaining > 0 {
            // SAFETY: as above.
            unsafe { api!(RedisModule_StopTimer)(module_ctx(), bridge, &mut data) };
            set_bridge();
        }
    }
    arm(Some(monotonic_us() + BACKSTOP_MS * 1000));
}

unsafe extern "C" fn on_bridge(ctx: RawCtx, _: *mut c_void) {
    BRIDGE.store(0, Ordering::Relaxed);
    if let Some(run) = RUN.get() {
        run(&Context::new(ctx));
    }
}
