//! What a lock method is told to stop by: the end of a run, which the
//! runner plans and sets (runner.rs) and the methods and scenarios read.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::client::now_ns;

/// The end of a run, as the clients see it.
#[derive(Default)]
pub struct Stop {
    end_ns: AtomicU64,
    flag: AtomicBool,
}

impl Stop {
    /// The run is over: start nothing new.
    pub fn is_set(&self) -> bool {
        self.flag.load(Ordering::Relaxed)
    }

    /// Time left until the planned end; a client waiting on its own clock
    /// waits no longer than this.
    pub fn remaining(&self) -> Duration {
        Duration::from_nanos(self.end_ns.load(Ordering::Relaxed).saturating_sub(now_ns()))
    }

    /// Plans the end `duration` from now.
    pub fn plan(&self, duration: Duration) {
        self.end_ns.store(now_ns() + duration.as_nanos() as u64, Ordering::Relaxed);
    }

    /// The run is over.
    pub fn set(&self) {
        self.flag.store(true, Ordering::Relaxed);
    }
}
