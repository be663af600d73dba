//! Deadlock detection for `FLOCK.ACQUIRE ... WAIT`: before a wait queues,
//! the wait-for graph of this server is walked from it
//! (`flock_core::deadlock`): through the owners it would wait for
//! (`Lock::blockers`), the locks those wait on (`Waiters::places_of`), and
//! so on. A wait that would close a cycle is refused instead of queued.
//! A cycle through another server of a Cluster is not seen.

use redis_module::Context;

use crate::ffi;
use crate::place::Place;
use crate::state::State;
use crate::value::read_lock_value;
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
    deadlock::cycle(owner, lock.blockers(owner, Some(want)), |q| {
        s.waiters
            .places_of(q)
            .flat_map(|p| if p == place { lock.blockers(q, None) } else { blockers_at(ctx, s, p, q) })
            .collect()
    })
}

/// The owners of the cycle that `owner` would close by waiting for
/// `blockers` (the holders and waiters ahead of it at each key of a wait
/// for several), `owner` first. No key is open.
pub fn cycle_from(ctx: &Context, s: &State, owner: &[u8], blockers: Vec<Box<[u8]>>) -> Option<Vec<Box<[u8]>>> {
    deadlock::cycle(owner, blockers, |q| s.waiters.places_of(q).flat_map(|p| blockers_at(ctx, s, p, q)).collect())
}

/// The owners `owner`, queued at `place`, waits for there.
fn blockers_at(ctx: &Context, s: &State, place: &Place, owner: &[u8]) -> Vec<Box<[u8]>> {
    if let Some(shadow) = s.shadows.get(place) {
        return shadow.value.lock.blockers(owner, None);
    }
    ffi::with_db(ctx, s.dbs.db(place.ident()), || {
        let key = ctx.open_key(&ffi::key_name(ctx, place.key()));
        match read_lock_value(&key) {
            Ok(Some(value)) => value.lock.blockers(owner, None),
            _ => Vec::new(),
        }
    })
}
