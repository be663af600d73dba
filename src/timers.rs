//! Timers on the monotonic clock: each owns its data and calls a plain `fn`
//! with a context on the main thread, never early, and late by no step of
//! the wall clock (`ffi::timer` wakes the event loop for the first one).
//! Those due later wait in a wheel keyed by monotonic milliseconds (O(1) to
//! set and to stop), those due at once in a list: they run in the next turn
//! of the event loop, after the clients it serves.

use std::cell::RefCell;
use std::collections::VecDeque;

use redis_module::Context;
use rustc_hash::FxHashMap;

use crate::clock;
use crate::ffi;
use flock_core::deadlines::{DeadlineId, Deadlines, Pop};

/// A timer set by `create_timer`; `stop_timer` takes it. Only a number:
/// one that fired or stopped names nothing.
#[derive(Debug)]
pub struct Timer(u64);

struct Set {
    run: Box<dyn FnOnce(&Context)>,
    filed: Option<DeadlineId>,
}

#[derive(Default)]
struct Timers {
    set: FxHashMap<u64, Set>,
    /// Timers due later, by the monotonic millisecond they are due in.
    wheel: Deadlines<u64>,
    /// Timers due at once, in the order they were set.
    now: VecDeque<u64>,
    last: u64,
    /// The millisecond the event loop wakes up at for the wheel.
    armed: Option<u64>,
}

thread_local! {
    static TIMERS: RefCell<Timers> = RefCell::new(Timers::default());
}

/// Adds the timers' wake-up to the event loop; at load.
pub fn start() -> Result<(), String> {
    ffi::start_timers(run_due)
}

/// Calls `callback(ctx, data)` on the main thread `delay_ms` from now.
pub fn create_timer<T: 'static>(delay_ms: u64, callback: fn(&Context, T), data: T) -> Timer {
    let run = Box::new(move |ctx: &Context| callback(ctx, data));
    // Due in the millisecond after the delay has passed in full.
    let due = (clock::monotonic_us() + delay_ms.saturating_mul(1000)).div_ceil(1000);
    let (id, wake) = TIMERS.with_borrow_mut(|t| {
        t.last += 1;
        let id = t.last;
        let (filed, wake) = if delay_ms == 0 {
            t.now.push_back(id);
            (None, Some(None))
        } else {
            let earlier = t.armed.is_none_or(|armed| due < armed);
            if earlier {
                t.armed = Some(due);
            }
            (Some(t.wheel.insert(due, id)), earlier.then_some(Some(due)))
        };
        t.set.insert(id, Set { run, filed });
        (id, wake)
    });
    match wake {
        Some(None) => ffi::wake_now(),
        Some(Some(due)) => ffi::wake_at(Some(due * 1000)),
        None => {}
    }
    Timer(id)
}

/// Cancels a timer; nothing if it already fired or is firing now. The
/// event loop may still wake up once for it: cheaper than a system call
/// per stop.
pub fn stop_timer(timer: Timer) {
    TIMERS.with_borrow_mut(|t| {
        if let Some(Set { filed: Some(filed), .. }) = t.set.remove(&timer.0) {
            t.wheel.remove(filed);
        }
    });
}

/// Runs the timers due at once that were set before this turn, then those
/// of the wheel that are due, each with no borrow held (they set and stop
/// timers); then sets the next wake-up.
fn run_due(ctx: &Context) {
    let queued = TIMERS.with_borrow(|t| t.now.len());
    for _ in 0..queued {
        if let Some(set) = TIMERS.with_borrow_mut(|t| t.now.pop_front().and_then(|id| t.set.remove(&id))) {
            (set.run)(ctx);
        }
    }
    let now_ms = clock::monotonic_us() / 1000;
    loop {
        let due = TIMERS.with_borrow_mut(|t| loop {
            match t.wheel.pop_due(now_ms) {
                Pop::Due(_, id) => {
                    if let Some(set) = t.set.remove(&id) {
                        break Some(set);
                    }
                }
                Pop::Moved => continue,
                Pop::Idle => return None,
            }
        });
        match due {
            Some(set) => (set.run)(ctx),
            None => break,
        }
    }
    let (soon, next) = TIMERS.with_borrow_mut(|t| {
        t.armed = t.wheel.next_deadline();
        (!t.now.is_empty(), t.armed)
    });
    if soon {
        ffi::wake_now();
    } else {
        ffi::wake_at(next.map(|ms| ms * 1000));
    }
}
