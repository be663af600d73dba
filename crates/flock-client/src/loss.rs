//! A grant's loss: why a lock was lost ([`LeaseLost`]), and the [`Loss`]
//! that its guard, its watchdog and its session share, which is marked once
//! and tells every receiver.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::mutex::lock;

/// Why a grant was lost: pushed by the session ([`Expired`],
/// [`ForceReleased`], [`Deleted`], [`Demoted`]) or found by a renewal
/// ([`NotOwner`], [`Unconfirmed`]).
///
/// [`Expired`]: LeaseLost::Expired
/// [`ForceReleased`]: LeaseLost::ForceReleased
/// [`Deleted`]: LeaseLost::Deleted
/// [`Demoted`]: LeaseLost::Demoted
/// [`NotOwner`]: LeaseLost::NotOwner
/// [`Unconfirmed`]: LeaseLost::Unconfirmed
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseLost {
    /// `FLOCK.RENEW` answered `NOTOWNER` (a renewal, or the check of a held
    /// grant after its session broke): the lease ran out or an
    /// administrator force-released the lock; another owner may hold it now.
    NotOwner,
    /// No renewal got through for a whole lease (server unreachable): the
    /// lock must be presumed lost.
    Unconfirmed,
    /// The session heard that the lease ran out (no renewal in time), or a
    /// fixed lease ran out while the session was being replaced.
    Expired,
    /// The session heard of a `FLOCK.FORCERELEASE`.
    ForceReleased,
    /// The session heard that the key was deleted (DEL, FLUSH, eviction...).
    Deleted,
    /// The session heard that the server became a replica.
    Demoted,
}

/// One grant's loss, shared by its guard, its watchdog and its session.
#[derive(Default)]
pub(crate) struct Loss {
    reason: Mutex<Option<LeaseLost>>,
    flag: AtomicBool,
    subscribers: Mutex<Vec<Sender<LeaseLost>>>,
    /// How the guard's lease goes on, for a re-watch on a new session.
    lease: Mutex<Lease>,
}

/// A guard's lease: its length (ms), when it ends if nothing renews it
/// (counted from when the grant's reply came), and whether a watchdog
/// renews it.
#[derive(Clone, Copy, Default)]
pub(crate) struct Lease {
    pub(crate) ms: u64,
    pub(crate) ends: Option<Instant>,
    pub(crate) watchdog: bool,
}

impl Loss {
    /// The grant's reply (or event) came at `at`, with a lease of `ms`.
    pub(crate) fn granted(&self, ms: u64, at: Instant) {
        let mut lease = lock(&self.lease);
        lease.ms = ms;
        lease.ends = Some(at + Duration::from_millis(ms));
    }

    /// A renewal sent at `at` got through: a fresh lease from then.
    pub(crate) fn renewed(&self, at: Instant) {
        let mut lease = lock(&self.lease);
        lease.ends = Some(at + Duration::from_millis(lease.ms));
    }

    /// How the guard's lease goes on now.
    pub(crate) fn lease(&self) -> Lease {
        *lock(&self.lease)
    }

    /// A watchdog renews the lease from now on.
    pub(crate) fn set_watchdog(&self, on: bool) {
        lock(&self.lease).watchdog = on;
    }

    /// Marks the grant lost (the first reason wins) and tells every subscriber.
    pub(crate) fn mark(&self, why: LeaseLost) -> bool {
        let mut reason = lock(&self.reason);
        if reason.is_some() {
            return false;
        }
        *reason = Some(why);
        self.flag.store(true, Ordering::SeqCst);
        for subscriber in lock(&self.subscribers).drain(..) {
            let _ = subscriber.send(why);
        }
        true
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    pub(crate) fn reason(&self) -> Option<LeaseLost> {
        *lock(&self.reason)
    }

    /// A receiver that gets the reason once (at once if already lost) and
    /// disconnects when the guard is released.
    pub(crate) fn subscribe(&self) -> Receiver<LeaseLost> {
        let (tx, rx) = mpsc::channel();
        let reason = lock(&self.reason);
        match *reason {
            Some(why) => {
                let _ = tx.send(why);
            }
            None => lock(&self.subscribers).push(tx),
        }
        rx
    }

    /// The guard is gone: its receivers disconnect.
    pub(crate) fn close(&self) {
        let _reason = lock(&self.reason);
        lock(&self.subscribers).clear();
    }
}
