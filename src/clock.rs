//! Where time enters FLOCK: the lease clock (`flock_core::clock`), read from
//! the server's wall and monotonic clocks together. Every deadline of the
//! running server is on it; `Now` converts one where it travels.

use std::cell::Cell;

use crate::ffi;
use flock_core::clock::{LeaseClock, Now};
use flock_core::wheel::Clock;

thread_local! {
    /// Set at the first reading, as the module loads. A forked child (a
    /// BGSAVE) reads its copy, as the parent would at that moment.
    static CLOCK: Cell<Option<LeaseClock>> = const { Cell::new(None) };
}

/// Both clocks now; a step of the wall clock since the last reading is
/// counted and logged.
pub fn now() -> Now {
    let (wall_ms, mono_us) = (ffi::wall_ms(), ffi::monotonic_us());
    let mut clock = CLOCK.get().unwrap_or_else(|| LeaseClock::new(wall_ms, mono_us));
    let (steps, lead) = (clock.steps(), clock.lead_ms());
    let now = clock.now(wall_ms, mono_us);
    CLOCK.set(Some(clock));
    if clock.steps() > steps {
        let step = clock.lead_ms() - lead;
        ffi::log(
            c"notice",
            &format!("FLOCK: the wall clock stepped {step:+} ms; leases and timeouts run on the monotonic clock"),
        );
    }
    now
}

/// The monotonic clock, in microseconds: what timers and session timeouts
/// count on.
pub fn monotonic_us() -> u64 {
    ffi::monotonic_us()
}

/// The lease clock now, in milliseconds.
pub fn now_ms() -> u64 {
    now().lease_ms
}

/// The server's clocks, as the lease wheel reads them.
pub struct ServerClock;

impl Clock for ServerClock {
    fn now_ms(&self) -> u64 {
        now_ms()
    }

    fn work_us(&self) -> u64 {
        monotonic_us()
    }
}

/// The wall-clock steps seen, this one included.
pub fn steps() -> u64 {
    now();
    CLOCK.get().map_or(0, |clock| clock.steps())
}
