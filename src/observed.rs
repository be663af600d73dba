//! What the operator's view reads: the index of contended locks
//! (`FLOCK.TOP`), the distributions of `INFO flock` and the record of long
//! holds and waits (`FLOCK.LONGLOG`). Kept up as waiters arrive and waits
//! and grants end, so that no question an operator asks takes a pass over
//! the keyspace. A lock nobody waits for has no entry: an idle lock costs
//! no byte more for any of it.

use rustc_hash::FxHashMap;

use crate::clock;
use crate::config;
use crate::place::Place;
use flock_core::distributions::{Distributions, WaitEnd};
use flock_core::effects::End;
use flock_core::longlog::{Ended, Kind, LongLog};

/// A lock with a waiter now, since it gained its first.
pub struct Contention {
    /// Its registered waiters (a wait for several keys counts at each).
    pub waiters: u32,
    /// When it gained its first waiter (monotonic microseconds).
    pub since_us: u64,
    pub handoffs: u64,
    /// Waits that ended here, granted or not.
    pub waits_ended: u64,
    pub longest_wait_us: u64,
    /// The longest grant that ended here meanwhile.
    pub longest_hold_ms: u64,
}

#[derive(Default)]
pub struct Observed {
    pub contended: FxHashMap<Place, Contention>,
    pub distributions: Distributions,
    pub longlog: LongLog,
}

impl Observed {
    /// A waiter queued at `place`.
    pub fn queued(&mut self, place: &Place, now_us: u64) {
        // The place is copied only for a lock's first waiter: `entry` would
        // take an owned key for every one.
        if let Some(entry) = self.contended.get_mut(place) {
            entry.waiters += 1;
            return;
        }
        let entry = Contention {
            waiters: 1,
            since_us: now_us,
            handoffs: 0,
            waits_ended: 0,
            longest_wait_us: 0,
            longest_hold_ms: 0,
        };
        self.contended.insert(place.clone(), entry);
    }

    /// A waiter queued at `place` for `waited_us` is no longer waiting.
    pub fn left(&mut self, place: &Place, waited_us: u64) {
        let Some(entry) = self.contended.get_mut(place) else { return };
        entry.waiters = entry.waiters.saturating_sub(1);
        entry.waits_ended += 1;
        entry.longest_wait_us = entry.longest_wait_us.max(waited_us);
        if entry.waiters == 0 {
            self.contended.remove(place);
        }
    }

    /// A wait of `owner` (at `key`, the first key of a wait for several)
    /// ended after `waited_us`.
    pub fn wait_ended(&mut self, key: &[u8], owner: &[u8], waited_us: u64, how: WaitEnd) {
        self.distributions.wait_ended(how, waited_us);
        let ended = Ended { kind: Kind::Wait, key, owner, duration_ms: waited_us / 1000, ended: how.name() };
        self.longlog.offer(ended, || clock::now().wall_ms, config::longlog_limits());
    }

    /// A grant of `owner` at `place` ended after `held_ms`.
    pub fn hold_ended(&mut self, place: &Place, owner: &[u8], held_ms: u64, how: End) {
        self.distributions.hold_ended(how, held_ms.saturating_mul(1000));
        // While no lock has waiters (most of the time, on most servers), no
        // lookup: an uncontended release costs the index nothing.
        let contended = if self.contended.is_empty() { None } else { self.contended.get_mut(place) };
        if let Some(entry) = contended {
            entry.longest_hold_ms = entry.longest_hold_ms.max(held_ms);
        }
        let ended = Ended { kind: Kind::Hold, key: place.key(), owner, duration_ms: held_ms, ended: how.name() };
        self.longlog.offer(ended, || clock::now().wall_ms, config::longlog_limits());
    }

    /// The lock at `place` was handed to one of its waiters.
    pub fn handed_off(&mut self, place: &Place) {
        if let Some(entry) = self.contended.get_mut(place) {
            entry.handoffs += 1;
        }
    }

    /// `CONFIG RESETSTAT`: the distributions start again (the index and the
    /// log are state, not statistics).
    pub fn reset_stats(&mut self) {
        self.distributions = Distributions::default();
    }
}

/// How long the holder with `token` has held its grant at `now_ms` (lease
/// clock): a token's upper bits are the lease clock at its grant
/// (`TokenSource`), so no lock stores a grant time.
pub fn held_ms(token: u64, now_ms: u64) -> u64 {
    now_ms.saturating_sub(token >> 20)
}
