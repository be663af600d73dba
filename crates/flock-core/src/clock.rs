//! The lease clock: the time every deadline of a running server is on.
//!
//! It reads as unix milliseconds but runs on the monotonic clock: set to the
//! wall clock when the module loads, it then only moves forward with the
//! monotonic one, so a step of the wall clock (an NTP step, an operator's
//! `date -s`, a VM resumed with its clock reset) neither ends a lease early
//! nor makes one last longer. Deadlines leave it as unix milliseconds only
//! where they travel to another clock (`record`: the RDB, the AOF,
//! replication), converted by `Now`, and come back the same way.

/// A wall-clock change between two readings larger than this is a step: a
/// slewing NTP daemon moves the clocks apart by at most 0.5 ms per second,
/// and readings come many times a second while anything is timed.
pub const STEP_MS: u64 = 100;

/// Both clocks at one moment: what converts a deadline between them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Now {
    /// The lease clock (`LeaseClock`), in milliseconds.
    pub lease_ms: u64,
    /// The wall clock, in unix milliseconds.
    pub wall_ms: u64,
}

impl Now {
    /// What is left until `deadline_ms` of the lease clock; 0 once it passed.
    pub fn left(self, deadline_ms: u64) -> u64 {
        deadline_ms.saturating_sub(self.lease_ms)
    }

    /// A lease-clock deadline as the unix time it falls on now.
    pub fn to_wall(self, deadline_ms: u64) -> u64 {
        self.wall_ms.saturating_add(self.left(deadline_ms))
    }

    /// The lease-clock deadline of a unix deadline read from a record that
    /// had `left_ms` to go when it was written: never later than that from
    /// now, however far the writer's wall clock (or this one's since) is
    /// from this one's, so that no lease gets longer on its way.
    pub fn from_wall(self, wall_deadline_ms: u64, left_ms: u64) -> u64 {
        self.lease_ms.saturating_add(wall_deadline_ms.saturating_sub(self.wall_ms).min(left_ms))
    }
}

/// The lease clock of one process, and the wall-clock steps it has seen.
#[derive(Clone, Copy, Debug)]
pub struct LeaseClock {
    origin_wall_ms: u64,
    origin_mono_us: u64,
    /// The wall clock's lead over the lease clock at the last reading.
    last_lead_ms: i64,
    steps: u64,
}

impl LeaseClock {
    /// A clock that reads `wall_ms` at the moment the monotonic clock reads
    /// `mono_us`.
    pub fn new(wall_ms: u64, mono_us: u64) -> Self {
        Self { origin_wall_ms: wall_ms, origin_mono_us: mono_us, last_lead_ms: 0, steps: 0 }
    }

    /// Both clocks, from a reading of the wall and monotonic clocks taken
    /// together; counts a step if the wall clock jumped since the last one.
    pub fn now(&mut self, wall_ms: u64, mono_us: u64) -> Now {
        let elapsed_ms = mono_us.saturating_sub(self.origin_mono_us) / 1000;
        let lease_ms = self.origin_wall_ms.saturating_add(elapsed_ms);
        let lead = wall_ms as i64 - lease_ms as i64;
        if lead.abs_diff(self.last_lead_ms) > STEP_MS {
            self.steps += 1;
        }
        self.last_lead_ms = lead;
        Now { lease_ms, wall_ms }
    }

    /// Wall-clock steps seen so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// How far the wall clock is ahead of the lease clock (behind if
    /// negative), as of the last reading: the sum of the steps.
    pub fn lead_ms(&self) -> i64 {
        self.last_lead_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: u64 = 1_700_000_000_000;
    const HOUR: u64 = 3_600_000;

    #[test]
    fn the_lease_clock_follows_the_monotonic_one_through_wall_clock_steps() {
        let mut clock = LeaseClock::new(T, 5_000_000);
        assert_eq!(clock.now(T + 10, 5_010_000), Now { lease_ms: T + 10, wall_ms: T + 10 });
        // Stepped forward an hour: leases run on, the step is counted.
        assert_eq!(clock.now(T + 20 + HOUR, 5_020_000).lease_ms, T + 20);
        assert_eq!((clock.steps(), clock.lead_ms()), (1, HOUR as i64));
        // And back two hours.
        assert_eq!(clock.now(T + 30 - HOUR, 5_030_000).lease_ms, T + 30);
        assert_eq!((clock.steps(), clock.lead_ms()), (2, -(HOUR as i64)));
        // Slewing is not a step.
        let lease = clock.now(T + 1030 - HOUR + STEP_MS, 6_030_000).lease_ms;
        assert_eq!((lease, clock.steps()), (T + 1030, 2));
    }

    #[test]
    fn a_deadline_travels_as_the_unix_time_it_falls_on_and_never_comes_back_later() {
        // The wall clock an hour behind the lease clock (stepped back).
        let now = Now { lease_ms: T, wall_ms: T - HOUR };
        assert_eq!(now.to_wall(T + 500), T - HOUR + 500);
        assert_eq!(now.to_wall(T - 500), T - HOUR, "a past deadline is now");
        assert_eq!(now.left(T + 500), 500);
        assert_eq!(now.from_wall(T - HOUR + 500, 500), T + 500);
        // Written by a server whose wall clock is an hour ahead of this one:
        // it comes back with what it had left, not an hour more.
        assert_eq!(now.from_wall(T + 500, 500), T + 500);
        // An hour behind: it comes back as past, as the unix time says.
        assert_eq!(now.from_wall(T - 2 * HOUR + 500, 500), T);
        // Records that carry no time left (older encodings): the unix time.
        assert_eq!(now.from_wall(T - HOUR + 500, u64::MAX), T + 500);
    }
}
