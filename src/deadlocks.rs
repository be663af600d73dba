//! Deadlock detection for `FLOCK.ACQUIRE ... WAIT`: before a wait queues,
//! the wait-for graph of this server is walked from it
//! (`flock_core::deadlock`): through the owners it would wait for
//! (`Lock::blockers`), the locks those wait on (`Waiters::places_of`), and
//! so on. A wait that would close a cycle is refused instead of queued.
//! A cycle through another server of a Cluster is not seen.
//!
//! The waiters queued ahead at a lock matter only if one of them waits at
//! another lock too, or the new wait's owner already waits somewhere (then
//! someone may wait behind it). Otherwise each of them waits for nothing
//! but that lock's holders and those ahead of it, already reached, and is
//! not the owner: the walk follows the holders alone, so that a queue of
//! thousands costs a new wait nothing (it cost every waiter queued ahead,
//! each with those ahead of it: a 10,000th waiter took seconds).

use redis_module::Context;

use crate::place::Place;
use crate::state::{read_lock, State};
use crate::waiters::WaitId;
use flock_core::deadlock;
use flock_core::holders::Want;
use flock_core::lock::Lock;

/// The owners of the cycle that `owner` would close by waiting for `want`
/// at `place` (whose lock, `lock`, the command has open), `owner` first.
pub fn cycle(
    ctx: &Context,
    s: &State,
    place: &Place,
    lock: &Lock<WaitId>,
    owner: &[u8],
    want: Want,
) -> Option<Vec<Box<[u8]>>> {
    let queues = queues_matter(s, owner);
    deadlock::cycle(owner, lock.blockers(owner, Some(want), queues), |q| {
        s.waiters
            .places_of(q)
            .flat_map(|p| if p == place { lock.blockers(q, None, queues) } else { blockers_at(ctx, s, p, q, queues) })
            .collect()
    })
}

/// The owners of the cycle that `owner` would close by waiting for
/// `blockers` (`blockers_of` each key of a wait for several), `owner`
/// first. No key is open.
pub fn cycle_from(ctx: &Context, s: &State, owner: &[u8], blockers: Vec<Box<[u8]>>) -> Option<Vec<Box<[u8]>>> {
    let queues = queues_matter(s, owner);
    deadlock::cycle(owner, blockers, |q| {
        s.waiters.places_of(q).flat_map(|p| blockers_at(ctx, s, p, q, queues)).collect()
    })
}

/// The owners a new wait of `owner` waits for at `lock`, as `cycle_from`
/// takes them.
pub fn blockers_of(s: &State, lock: &Lock<WaitId>, owner: &[u8], want: Want) -> Vec<Box<[u8]>> {
    lock.blockers(owner, Some(want), queues_matter(s, owner))
}

/// Whether the walk from a new wait of `owner` must go through the waiters
/// queued ahead (see the module's comment).
fn queues_matter(s: &State, owner: &[u8]) -> bool {
    s.waiters.spread() || s.waiters.places_of(owner).next().is_some()
}

/// The owners `owner`, queued at `place`, waits for there.
fn blockers_at(ctx: &Context, s: &State, place: &Place, owner: &[u8], queues: bool) -> Vec<Box<[u8]>> {
    read_lock(ctx, s, place, |lock| lock.blockers(owner, None, queues)).unwrap_or_default()
}
