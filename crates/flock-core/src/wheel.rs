//! The lease wheel: every deadline the server acts on by itself (leases,
//! lock-delays), when the one timer of the Redis layer must wake for them,
//! and how much of a backlog one wake-up works through, over a `Clock` that
//! tests drive by hand.
//!
//! The Redis layer files a deadline and sets its timer when `file` says so;
//! when the timer fires it takes the due entries one by one (`next_due`:
//! earliest first, for about `SLICE` of work), then sets the timer again
//! where `after_tick` says: at once if some are still due, so that clients
//! are served between slices of a backlog (after a slow command, a fork, a
//! load or a promotion), else at the next deadline.

use crate::deadlines::{DeadlineId, Deadlines, Pop};

/// The time a wheel runs on.
pub trait Clock {
    /// The lease clock, in milliseconds: what deadlines are on.
    fn now_ms(&self) -> u64;
    /// Microseconds on any monotonic scale: how long a tick has worked.
    fn work_us(&self) -> u64;
}

/// Work per tick, in microseconds.
pub const SLICE_US: u64 = 1000;
/// Entries taken (or steps of moving deadlines down the wheel) between
/// looks at the clock: each takes a few µs.
const CLOCK_EVERY: u64 = 64;

pub struct LeaseWheel<T> {
    deadlines: Deadlines<T>,
    /// When the timer is set to wake; `None`: not set (or it fired).
    wake: Option<u64>,
}

impl<T> Default for LeaseWheel<T> {
    fn default() -> Self {
        Self { deadlines: Deadlines::default(), wake: None }
    }
}

/// One wake-up's work: what is due at its start, and how much it did.
pub struct Tick {
    pub now_ms: u64,
    started_us: u64,
    taken: u64,
    /// The slice ran out with entries maybe still due.
    cut: bool,
}

impl<T> LeaseWheel<T> {
    /// Files `item`, due at `at`: its id, and the time to set the timer for
    /// (in place of the one set) if it must wake earlier than it would.
    pub fn file(&mut self, at: u64, item: T) -> (DeadlineId, Option<u64>) {
        (self.deadlines.insert(at, item), self.wake_for(at))
    }

    /// The timer must wake by `at` too (another deadline of the caller's):
    /// the time to set it for, if it would not wake by then.
    pub fn wake_for(&mut self, at: u64) -> Option<u64> {
        if self.wake.is_some_and(|set| set <= at) {
            return None;
        }
        self.wake = Some(at);
        Some(at)
    }

    pub fn get(&self, id: DeadlineId) -> Option<&T> {
        self.deadlines.get(id)
    }

    /// Takes an entry out. The timer stays as it is: waking once for
    /// nothing is cheaper than setting it again on every change.
    pub fn remove(&mut self, id: DeadlineId) -> Option<T> {
        self.deadlines.remove(id)
    }

    /// Takes out every entry whose item fails `keep` (O(entries)).
    pub fn retain(&mut self, keep: impl FnMut(&T) -> bool) {
        self.deadlines.retain(keep);
    }

    pub fn len(&self) -> usize {
        self.deadlines.len()
    }

    pub fn is_empty(&self) -> bool {
        self.deadlines.is_empty()
    }

    /// Bytes one entry takes.
    pub fn entry_size() -> usize {
        Deadlines::<T>::entry_size()
    }

    /// The timer fired: a tick starts, for what is due now.
    pub fn tick(&mut self, clock: &impl Clock) -> Tick {
        self.wake = None;
        Tick { now_ms: clock.now_ms(), started_us: clock.work_us(), taken: 0, cut: false }
    }

    /// The next entry due at the tick's time, earliest first; `None` when
    /// nothing is, or the tick has worked for `SLICE_US`.
    pub fn next_due(&mut self, tick: &mut Tick, clock: &impl Clock) -> Option<(DeadlineId, T)> {
        loop {
            tick.taken += 1;
            if tick.taken.is_multiple_of(CLOCK_EVERY) && clock.work_us().saturating_sub(tick.started_us) >= SLICE_US {
                tick.cut = true;
                return None;
            }
            match self.deadlines.pop_due(tick.now_ms) {
                Pop::Due(id, item) => return Some((id, item)),
                Pop::Moved => continue,
                Pop::Idle => return None,
            }
        }
    }

    /// The tick is over: the time to set the timer for (at once if the
    /// slice ran out, else the next deadline, or `also`, the caller's own,
    /// if sooner), unless it is set by then already.
    pub fn after_tick(&mut self, tick: &Tick, also: Option<u64>) -> Option<u64> {
        let next = if tick.cut { Some(tick.now_ms) } else { self.deadlines.next_deadline() };
        self.wake_for([next, also].into_iter().flatten().min()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A clock the test moves: `work` µs pass with every look at it.
    struct FakeClock {
        ms: Cell<u64>,
        us: Cell<u64>,
        work: u64,
    }

    impl FakeClock {
        fn at(ms: u64, work: u64) -> Self {
            Self { ms: Cell::new(ms), us: Cell::new(0), work }
        }
    }

    impl Clock for FakeClock {
        fn now_ms(&self) -> u64 {
            self.ms.get()
        }

        fn work_us(&self) -> u64 {
            self.us.set(self.us.get() + self.work);
            self.us.get()
        }
    }

    fn drain(wheel: &mut LeaseWheel<&'static str>, clock: &FakeClock) -> (Vec<&'static str>, Option<u64>) {
        let mut tick = wheel.tick(clock);
        let mut due = Vec::new();
        while let Some((_, item)) = wheel.next_due(&mut tick, clock) {
            due.push(item);
        }
        (due, wheel.after_tick(&tick, None))
    }

    #[test]
    fn the_timer_moves_only_for_an_earlier_deadline() {
        let mut wheel = LeaseWheel::default();
        assert_eq!(wheel.file(1000, "a").1, Some(1000), "the first sets it");
        assert_eq!(wheel.file(2000, "b").1, None, "a later one keeps it");
        assert_eq!(wheel.file(1000, "c").1, None, "so does one due at the same time");
        assert_eq!(wheel.file(500, "d").1, Some(500), "an earlier one moves it");
        assert_eq!(wheel.wake_for(700), None);
        assert_eq!(wheel.wake_for(400), Some(400));
    }

    #[test]
    fn a_tick_takes_what_is_due_earliest_first_and_wakes_for_the_next() {
        let clock = FakeClock::at(1000, 0);
        let mut wheel = LeaseWheel::default();
        for (at, item) in [(1500, "later"), (900, "second"), (800, "first"), (1000, "third")] {
            let _ = wheel.file(at, item);
        }
        let (id, _) = wheel.file(950, "removed");
        assert_eq!(wheel.remove(id), Some("removed"));
        let (due, mut wake) = drain(&mut wheel, &clock);
        assert_eq!(due, ["first", "second", "third"]);
        // The wheel may wake before a far deadline (to move it down a
        // level), never after it; the entry is due at its time, not before.
        while let Some(at) = wake {
            assert!(at > clock.now_ms() && at <= 1500, "woken at {at}");
            clock.ms.set(at);
            let due;
            (due, wake) = drain(&mut wheel, &clock);
            assert_eq!(due.is_empty(), at < 1500, "at {at}: {due:?}");
        }
        assert_eq!(clock.now_ms(), 1500);
        assert!(wheel.is_empty(), "nothing left: no timer");
    }

    #[test]
    fn a_backlog_ends_in_slices_and_the_timer_comes_back_at_once() {
        // Every look at the clock finds 100 µs gone: a slice is 10 looks.
        let clock = FakeClock::at(10_000, 100);
        let mut wheel = LeaseWheel::default();
        for at in 0..5000 {
            let _ = wheel.file(at, "due");
        }
        let (first, wake) = drain(&mut wheel, &clock);
        assert!(!first.is_empty() && first.len() < 5000, "one slice: {} of 5000", first.len());
        assert_eq!(wake, Some(10_000), "the rest at once, after the clients are served");
        let mut total = first.len();
        while !wheel.is_empty() {
            total += drain(&mut wheel, &clock).0.len();
        }
        assert_eq!(total, 5000);
    }

    #[test]
    fn an_idle_wheel_wakes_only_for_the_callers_own_deadline() {
        let clock = FakeClock::at(0, 0);
        let mut wheel: LeaseWheel<()> = LeaseWheel::default();
        let tick = wheel.tick(&clock);
        assert_eq!(wheel.after_tick(&tick, Some(300)), Some(300));
        assert_eq!(wheel.after_tick(&tick, Some(600)), None, "already set by then");
    }
}
