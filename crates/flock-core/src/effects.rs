//! What the lock's operations report, and the one table of what each
//! report means outside the lock: the counter it bumps, the keyspace event
//! it sends, what replicas hear of it, and the reply a waiting client gets.
//!
//! Core operations push `Outcome`s; the Redis layer applies `effects` of
//! each and does nothing else by hand, so a new way for a grant to end is
//! one variant and one row here.

use crate::holders::{Holder, Terms};

/// One thing an operation did to a lock.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome<P> {
    /// A holder was granted: at once, or (`Some`) a waiter was.
    Granted { token: u64, waiter: Option<P> },
    /// A holder's grant changed in place (holds, lease or session).
    Changed { token: u64, why: Change, old_session: Option<u64> },
    /// A holder's grant ended.
    Ended { holder: Holder, terms: Terms, why: End },
    /// A waiter left the queue without a grant.
    Left { waiter: P, why: Leave },
    /// A grant with a lock-delay ended unreleased: the lock grants nothing
    /// until then (unix ms), when the caller lifts it (`Lock::lift_delay`).
    Delayed { until_ms: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Acquired again by its owner: one more hold, a new lease.
    Reentered,
    Renewed,
    /// Released once, holds left.
    HoldReleased,
    /// Set as replicated or loaded state says.
    Restored,
    /// Bound to the session of a resend of the acquire that made it.
    Rebound,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Released,
    LeaseEnded,
    ForceReleased,
    /// Its SESSION connection closed.
    SessionClosed,
    /// The grant's reply never reached its waiter.
    Undelivered,
    /// The key was deleted, overwritten, expired or evicted.
    Deleted,
    /// The key went whole to another server (`MIGRATE`, a Cluster slot
    /// move): the grant goes on there, not here.
    Moved,
    /// Replicated or loaded state put another holder in its place.
    Replaced,
}

impl End {
    pub const ALL: [End; 8] = [
        End::Released,
        End::LeaseEnded,
        End::ForceReleased,
        End::SessionClosed,
        End::Undelivered,
        End::Deleted,
        End::Moved,
        End::Replaced,
    ];

    /// The word `FLOCK.LONGLOG` and `INFO flock` give it.
    pub fn name(self) -> &'static str {
        match self {
            End::Released => "released",
            End::LeaseEnded => "expired",
            End::ForceReleased => "forcereleased",
            End::SessionClosed => "sessionclosed",
            End::Undelivered => "undelivered",
            End::Deleted => "deleted",
            End::Moved => "moved",
            End::Replaced => "replaced",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leave {
    TimedOut,
    /// `CLIENT UNBLOCK`: counted as a timeout, answered nil.
    Unblocked,
    Disconnected,
    Deleted,
    /// This node became a replica.
    Demoted,
    /// A resend of its request took its place.
    Resent,
    /// `FLOCK.CANCEL`.
    Cancelled,
    /// A wait for several keys whose owner no longer held a key it held
    /// when it asked, once the others came free: nothing is granted.
    HoldLost,
}

impl Leave {
    /// The word `FLOCK.LONGLOG` and `INFO flock` give it.
    pub fn name(self) -> &'static str {
        match self {
            Leave::TimedOut => "timeout",
            Leave::Unblocked => "unblocked",
            Leave::Disconnected => "disconnected",
            Leave::Deleted => "deleted",
            Leave::Demoted => "demoted",
            Leave::Resent => "resent",
            Leave::Cancelled => "cancelled",
            Leave::HoldLost => "holdlost",
        }
    }
}

/// Why a grant its holder did not give back is no longer held here: what
/// the holder's session hears, and what a later NOTOWNER says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    Expired,
    ForceReleased,
    Deleted,
    /// This node became a replica (sessions only: the grant itself stays).
    Demoted,
    /// Not a loss: the grant went on with its key to another server, whose
    /// sessions must watch it from now (the session hears `moved`).
    Moved,
}

impl Loss {
    /// The word a session's `lost` event carries.
    pub fn name(self) -> &'static str {
        match self {
            Loss::Expired => "expired",
            Loss::ForceReleased => "forcereleased",
            Loss::Deleted => "deleted",
            Loss::Demoted => "demoted",
            Loss::Moved => "moved",
        }
    }
}

/// The counters of `INFO flock` that outcomes bump, in its order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    Grants,
    ImmediateGrants,
    Handoffs,
    ReentrantAcquires,
    Releases,
    LeaseExpiries,
    ForceReleases,
    SessionReleases,
    Deletions,
    UndeliveredGrants,
    WaitTimeouts,
    WaitDisconnects,
    WaitersDeleted,
    WaitersDemoted,
    WaitersResent,
    WaitCancels,
    Deadlocks,
    /// Sessions that ended because they were not heard from for their
    /// timeout (counted by the Redis layer, as deadlocks are).
    SessionExpiries,
    /// Grants that ended unreleased into a lock-delay.
    LockDelays,
}

impl Counter {
    pub const ALL: [Counter; 19] = [
        Counter::Grants,
        Counter::ImmediateGrants,
        Counter::Handoffs,
        Counter::ReentrantAcquires,
        Counter::Releases,
        Counter::LeaseExpiries,
        Counter::ForceReleases,
        Counter::SessionReleases,
        Counter::Deletions,
        Counter::UndeliveredGrants,
        Counter::WaitTimeouts,
        Counter::WaitDisconnects,
        Counter::WaitersDeleted,
        Counter::WaitersDemoted,
        Counter::WaitersResent,
        Counter::WaitCancels,
        Counter::Deadlocks,
        Counter::SessionExpiries,
        Counter::LockDelays,
    ];

    /// Its field in `INFO flock`, after the `flock_` prefix.
    pub fn name(self) -> &'static str {
        match self {
            Counter::Grants => "grants",
            Counter::ImmediateGrants => "immediate_grants",
            Counter::Handoffs => "handoffs",
            Counter::ReentrantAcquires => "reentrant_acquires",
            Counter::Releases => "releases",
            Counter::LeaseExpiries => "lease_expiries",
            Counter::ForceReleases => "force_releases",
            Counter::SessionReleases => "session_releases",
            Counter::Deletions => "deletions",
            Counter::UndeliveredGrants => "undelivered_grants",
            Counter::WaitTimeouts => "wait_timeouts",
            Counter::WaitDisconnects => "wait_disconnects",
            Counter::WaitersDeleted => "waiters_deleted",
            Counter::WaitersDemoted => "waiters_demoted",
            Counter::WaitersResent => "waiters_resent",
            Counter::WaitCancels => "wait_cancels",
            Counter::Deadlocks => "deadlocks",
            Counter::SessionExpiries => "session_expiries",
            Counter::LockDelays => "lock_delays",
        }
    }
}

/// The counters, indexed by `Counter`.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counters([u64; Counter::ALL.len()]);

impl Counters {
    pub fn bump(&mut self, counter: Counter, by: u64) {
        self.0[counter as usize] += by;
    }

    /// Takes back what was counted for a lock that only moved (RENAME, MOVE).
    pub fn unbump(&mut self, counter: Counter, by: u64) {
        self.0[counter as usize] = self.0[counter as usize].saturating_sub(by);
    }

    pub fn get(&self, counter: Counter) -> u64 {
        self.0[counter as usize]
    }
}

/// The keyspace events of `notify-keyspace-events` class `d` (module).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    Acquired,
    Released,
    Expired,
}

impl Event {
    /// Its name, as the server API takes it (no string made per event).
    pub fn name(self) -> &'static std::ffi::CStr {
        match self {
            Event::Acquired => c"flock.acquired",
            Event::Released => c"flock.released",
            Event::Expired => c"flock.expired",
        }
    }
}

/// What replicas and the AOF hear of an outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    Nothing,
    /// The holder as it is now.
    Holder,
    /// Its owner holds nothing any more.
    Gone,
}

/// The reply of a waiter that leaves without a grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    Nil,
    /// Nil to a blocked client; `cancelled` in a session's inbox.
    Cancelled,
    /// The error whose code the Redis layer's `errors` names.
    Error(Leave),
    /// Nothing: the client is gone.
    None,
}

/// What one outcome means outside the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Effects {
    pub counters: &'static [Counter],
    pub event: Option<Event>,
    /// Sent once per command however many holders it ends (FORCERELEASE).
    pub event_once: bool,
    pub sent: Sent,
    pub reply: Reply,
    /// A grant the server ended: its session hears this, and so does a
    /// later NOTOWNER of its owner.
    pub lost: Option<Loss>,
}

const NONE: Effects =
    Effects { counters: &[], event: None, event_once: false, sent: Sent::Nothing, reply: Reply::None, lost: None };

/// The table: each outcome's counters, event, replication and reply.
pub fn effects<P>(outcome: &Outcome<P>) -> Effects {
    use Counter::*;
    let granted = Effects { event: Some(Event::Acquired), sent: Sent::Holder, ..NONE };
    let changed = Effects { sent: Sent::Holder, ..NONE };
    let ended = |counters, event| Effects { counters, event, sent: Sent::Gone, ..NONE };
    let lost = |loss, e: Effects| Effects { lost: Some(loss), ..e };
    let left = |counters, reply| Effects { counters, reply, ..NONE };
    match outcome {
        Outcome::Granted { waiter: None, .. } => Effects { counters: &[Grants, ImmediateGrants], ..granted },
        Outcome::Granted { waiter: Some(_), .. } => Effects { counters: &[Grants, Handoffs], ..granted },
        Outcome::Changed { why: Change::Reentered, .. } => Effects { counters: &[ReentrantAcquires], ..changed },
        Outcome::Changed { why: Change::Renewed | Change::HoldReleased | Change::Rebound, .. } => changed,
        // Replicated or loaded: the master sent it and counted it.
        Outcome::Changed { why: Change::Restored, .. } => Effects { sent: Sent::Nothing, ..changed },
        Outcome::Ended { why, .. } => match why {
            End::Released => ended(&[Releases], Some(Event::Released)),
            End::LeaseEnded => lost(Loss::Expired, ended(&[LeaseExpiries], Some(Event::Expired))),
            End::ForceReleased => lost(
                Loss::ForceReleased,
                Effects { event_once: true, ..ended(&[ForceReleases], Some(Event::Released)) },
            ),
            End::SessionClosed => ended(&[SessionReleases], Some(Event::Released)),
            End::Undelivered => ended(&[UndeliveredGrants], Some(Event::Released)),
            // Redis sends the key's own event (del, expired, evicted) and
            // replicates the deletion.
            End::Deleted => lost(Loss::Deleted, Effects { sent: Sent::Nothing, ..ended(&[Deletions], None) }),
            End::Moved => lost(Loss::Moved, Effects { sent: Sent::Nothing, ..ended(&[], None) }),
            End::Replaced => Effects { sent: Sent::Nothing, ..ended(&[], None) },
        },
        Outcome::Left { why, .. } => match why {
            Leave::TimedOut => left(&[WaitTimeouts], Reply::Nil),
            Leave::Unblocked => left(&[WaitTimeouts], Reply::Nil),
            Leave::Disconnected => left(&[WaitDisconnects], Reply::None),
            Leave::Deleted => left(&[WaitersDeleted], Reply::Error(Leave::Deleted)),
            Leave::Demoted => left(&[WaitersDemoted], Reply::Error(Leave::Demoted)),
            Leave::Resent => left(&[WaitersResent], Reply::Error(Leave::Resent)),
            Leave::Cancelled => left(&[WaitCancels], Reply::Cancelled),
            Leave::HoldLost => left(&[], Reply::Error(Leave::HoldLost)),
        },
        // Kept on the master: a replica follows the grants it sends.
        Outcome::Delayed { .. } => Effects { counters: &[LockDelays], ..NONE },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(why: End) -> Outcome<()> {
        Outcome::Ended { holder: Holder::new(b"o".as_slice().into(), 1, 1, 0), terms: Terms::default(), why }
    }

    #[test]
    fn every_grant_counts_once_as_a_grant_and_once_as_immediate_or_handoff() {
        let now = effects(&Outcome::<()>::Granted { token: 1, waiter: None });
        let waited = effects(&Outcome::Granted { token: 1, waiter: Some(()) });
        assert_eq!(now.counters, [Counter::Grants, Counter::ImmediateGrants]);
        assert_eq!(waited.counters, [Counter::Grants, Counter::Handoffs]);
        for e in [now, waited] {
            assert_eq!((e.event, e.sent), (Some(Event::Acquired), Sent::Holder));
        }
    }

    #[test]
    fn every_end_has_its_own_counter_and_only_deletions_moves_and_replacements_are_not_sent() {
        let mut seen: Vec<Counter> = Vec::new();
        for why in End::ALL {
            let e = effects(&ended(why));
            seen.extend(e.counters);
            let redis_tells = matches!(why, End::Deleted | End::Moved | End::Replaced);
            assert_eq!(e.sent == Sent::Gone, !redis_tells, "{why:?}");
            assert_eq!(e.event.is_some(), !redis_tells, "{why:?}");
            assert_eq!(e.event_once, why == End::ForceReleased, "FORCERELEASE sends one event per command");
        }
        let unique: std::collections::HashSet<usize> = seen.iter().map(|&c| c as usize).collect();
        assert_eq!(unique.len(), seen.len(), "no two ends share a counter");
        assert_eq!(effects(&ended(End::LeaseEnded)).event, Some(Event::Expired));
    }

    #[test]
    fn a_waiter_leaving_is_counted_and_answered_by_its_reason() {
        let left = |why| effects(&Outcome::Left { waiter: (), why });
        assert_eq!(left(Leave::TimedOut).reply, Reply::Nil);
        assert_eq!(left(Leave::Unblocked).counters, [Counter::WaitTimeouts], "CLIENT UNBLOCK counts as a timeout");
        assert_eq!(left(Leave::Disconnected).reply, Reply::None, "nobody to answer");
        for why in [Leave::Deleted, Leave::Demoted, Leave::Resent] {
            assert_eq!(left(why).reply, Reply::Error(why));
        }
        assert!([Leave::TimedOut, Leave::Disconnected].iter().all(|&w| left(w).sent == Sent::Nothing));
        assert_eq!(left(Leave::Cancelled).counters, [Counter::WaitCancels]);
        assert_eq!(left(Leave::Cancelled).reply, Reply::Cancelled);
    }

    #[test]
    fn only_what_the_server_ends_is_a_loss() {
        let loss = |why| effects(&ended(why)).lost;
        assert_eq!(loss(End::LeaseEnded), Some(Loss::Expired));
        assert_eq!(loss(End::ForceReleased), Some(Loss::ForceReleased));
        assert_eq!(loss(End::Deleted), Some(Loss::Deleted));
        assert_eq!(loss(End::Moved), Some(Loss::Moved), "its session must watch it elsewhere");
        for why in [End::Released, End::SessionClosed, End::Undelivered, End::Replaced] {
            assert_eq!(loss(why), None, "{why:?}: the holder gave it up, or nobody holds it here");
        }
    }

    #[test]
    fn counters_have_distinct_names_in_order() {
        let names: Vec<_> = Counter::ALL.iter().map(|c| c.name()).collect();
        let unique: std::collections::HashSet<_> = names.iter().collect();
        assert_eq!(unique.len(), names.len());
        for (i, c) in Counter::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i, "ALL is in declaration order");
        }
    }
}
