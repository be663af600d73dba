//! The process's one deadline timer: a thread that calls each registered
//! [`Due`] at its time, for every grant and session of the process (not a
//! thread per grant). A deadline passes whether or not any I/O fails.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::Instant;

use crate::mutex::lock;

/// Something with a deadline: called at (or just after) its time with the
/// time now; returns a later time to be called again (its deadline moved
/// meanwhile), or `None` when it is done.
pub(crate) trait Due: Send + Sync {
    fn due(&self, now: Instant) -> Option<Instant>;
}

#[derive(Default)]
struct Queue {
    next_id: u64,
    entries: BTreeMap<(Instant, u64), Weak<dyn Due>>,
}

struct Timer {
    queue: Mutex<Queue>,
    changed: Condvar,
}

fn timer() -> &'static Arc<Timer> {
    static TIMER: OnceLock<Arc<Timer>> = OnceLock::new();
    TIMER.get_or_init(|| {
        let timer = Arc::new(Timer { queue: Mutex::default(), changed: Condvar::new() });
        let run = Arc::clone(&timer);
        std::thread::Builder::new()
            .name("flock-deadlines".into())
            .spawn(move || run.run())
            .expect("start the deadline timer thread");
        timer
    })
}

/// Calls `what` at `at` (and again while it asks to be); the returned
/// handle cancels it.
pub(crate) fn at(at: Instant, what: Weak<dyn Due>) -> Entry {
    let timer = timer();
    let mut queue = lock(&timer.queue);
    let id = queue.next_id;
    queue.next_id += 1;
    let first = queue.entries.keys().next().is_none_or(|(t, _)| at < *t);
    queue.entries.insert((at, id), what);
    if first {
        timer.changed.notify_one();
    }
    Entry { at, id }
}

/// A registration with the timer, as [`at`] made it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Entry {
    at: Instant,
    id: u64,
}

impl Entry {
    /// Not called any more (unless it is being called now, or asked to be
    /// called again at a later time).
    pub(crate) fn cancel(self) {
        lock(&timer().queue).entries.remove(&(self.at, self.id));
    }
}

impl Timer {
    fn run(&self) {
        let mut queue = lock(&self.queue);
        loop {
            let Some((&(at, id), _)) = queue.entries.iter().next() else {
                queue = self.changed.wait(queue).unwrap_or_else(|e| e.into_inner());
                continue;
            };
            let now = Instant::now();
            if at > now {
                queue = self.changed.wait_timeout(queue, at - now).unwrap_or_else(|e| e.into_inner()).0;
                continue;
            }
            let what = queue.entries.remove(&(at, id)).expect("the first entry");
            drop(queue);
            let again = what.upgrade().and_then(|w| w.due(now));
            queue = lock(&self.queue);
            if let Some(later) = again {
                // Under a new id: the first registration's cancel misses
                // it, and it stays until its time (its `due` then finds
                // nothing to do and ends it).
                let id = queue.next_id;
                queue.next_id += 1;
                queue.entries.insert((later.max(now), id), what);
            }
        }
    }
}
