//! A grant's loss: why a lock was lost ([`LeaseLost`]), when it will be if
//! nothing confirms it ([`Term`], a session's [`SessionClock`]), and the
//! [`Loss`] that its guard, its watchdog, its session and the deadline timer
//! share, which is marked once and tells every receiver.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::mutex::lock;
use crate::timer::{self, Due};
use crate::times::margin;

/// Why a grant was lost. Each has the lowercase name of
/// docs/client-protocol.md ([`LeaseLost::as_str`], also its `Display`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LeaseLost {
    /// `notowner`: `FLOCK.RENEW` answered `NOTOWNER` (a renewal, or the
    /// check of a held grant after its session broke): the lease ran out or
    /// an administrator force-released the lock; another owner may hold it
    /// now.
    NotOwner,
    /// `unconfirmed`: the deadline of a session grant (the session's) or of
    /// a watchdog's grant passed without a heartbeat or renewal reply
    /// confirming it (the server cut off, or this process paused): the lock
    /// must be presumed lost.
    Unconfirmed,
    /// `expired`: a fixed lease reached its deadline, or the session heard
    /// that the lease ran out.
    Expired,
    /// `forcereleased`: the session heard of a `FLOCK.FORCERELEASE`.
    ForceReleased,
    /// `deleted`: the session heard that the key was deleted (DEL, FLUSH,
    /// eviction...).
    Deleted,
    /// `demoted`: the session heard that the server became a replica.
    Demoted,
    /// `sessionended`: the session that held the grant closed or expired
    /// (its connection closed, `NOSESSION`, [`close_session`](crate::close_session)):
    /// its session grants ended with it and are never taken again quietly.
    SessionEnded,
}

impl LeaseLost {
    /// Every reason, in the order of docs/client-protocol.md.
    pub const ALL: [LeaseLost; 7] = [
        LeaseLost::Expired,
        LeaseLost::Unconfirmed,
        LeaseLost::SessionEnded,
        LeaseLost::ForceReleased,
        LeaseLost::Deleted,
        LeaseLost::Demoted,
        LeaseLost::NotOwner,
    ];

    /// The reason's name in the protocol: `expired`, `unconfirmed`,
    /// `sessionended`, `forcereleased`, `deleted`, `demoted`, `notowner`.
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseLost::NotOwner => "notowner",
            LeaseLost::Unconfirmed => "unconfirmed",
            LeaseLost::Expired => "expired",
            LeaseLost::ForceReleased => "forcereleased",
            LeaseLost::Deleted => "deleted",
            LeaseLost::Demoted => "demoted",
            LeaseLost::SessionEnded => "sessionended",
        }
    }
}

impl std::fmt::Display for LeaseLost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One session's deadline on this process's monotonic clock: the send time
/// of the last `FLOCK.INBOX` (or `FLOCK.SESSION`) whose reply came, plus
/// its timeout T, less the drift margin; and, once it is over, why.
pub(crate) struct SessionClock {
    pub(crate) timeout: Duration,
    /// The deadline, and once the session is over why and since when.
    state: Mutex<(Instant, Option<Lost>)>,
}

/// Why a grant was lost, and since when (for a deadline, the deadline).
pub(crate) type Lost = (LeaseLost, Instant);

impl SessionClock {
    /// A session whose `FLOCK.SESSION` was sent at `sent` and answered
    /// timeout `timeout`.
    pub(crate) fn new(sent: Instant, timeout: Duration) -> Arc<SessionClock> {
        Arc::new(SessionClock { timeout, state: Mutex::new((sent + timeout - margin(timeout), None)) })
    }

    pub(crate) fn deadline(&self) -> Instant {
        lock(&self.state).0
    }

    /// What happened to the session's grants by `now`: `None` while it
    /// lives; `Unconfirmed` since its deadline once that passed unconfirmed;
    /// the reason it ended with.
    pub(crate) fn verdict(&self, now: Instant) -> Option<Lost> {
        let state = lock(&self.state);
        state.1.or((state.0 <= now).then_some((LeaseLost::Unconfirmed, state.0)))
    }

    /// A read sent at `sent` was answered now: the deadline moves to
    /// `sent` + T − m. False (and over, `Unconfirmed`) if the deadline had
    /// passed before the answer came: what it held is lost even if the
    /// server still keeps it.
    pub(crate) fn confirm(&self, sent: Instant) -> bool {
        let now = Instant::now();
        let mut state = lock(&self.state);
        if state.1.is_some() {
            return false;
        }
        if state.0 <= now {
            state.1 = Some((LeaseLost::Unconfirmed, state.0));
            return false;
        }
        state.0 = state.0.max(sent + self.timeout - margin(self.timeout));
        true
    }

    /// The session is over (`why`, unless its deadline passed first):
    /// returns what its grants were lost as, and since when.
    pub(crate) fn end(&self, why: LeaseLost) -> Lost {
        let now = Instant::now();
        let mut state = lock(&self.state);
        let verdict = state.1.unwrap_or(if state.0 <= now { (LeaseLost::Unconfirmed, state.0) } else { (why, now) });
        state.1 = Some(verdict);
        verdict
    }
}

/// Until when a grant is held if nothing confirms it again.
#[derive(Clone, Default)]
pub(crate) enum Term {
    /// Not granted (yet).
    #[default]
    None,
    /// Its own deadline: a fixed lease's (lost as `Expired`) or a
    /// watchdog's (`Unconfirmed`).
    Own { at: Instant, why: LeaseLost },
    /// A session grant (`lease-ms` 0): the session's deadline.
    Session(Arc<SessionClock>),
}

impl Term {
    /// The term of a grant of `lease_ms` (0: a session grant of `clock`)
    /// asked for (or read) at `sent`, with `left_ms` of it left then if the
    /// server said so (a `granted` event): never later than the server's
    /// end of it, by the drift margin.
    pub(crate) fn of(lease_ms: u64, sent: Instant, left_ms: Option<u64>, clock: Option<&Arc<SessionClock>>) -> Term {
        match (lease_ms, clock) {
            (0, Some(clock)) => Term::Session(Arc::clone(clock)),
            _ => {
                let lease = Duration::from_millis(lease_ms);
                let left = left_ms.map_or(lease, Duration::from_millis);
                let at = (sent + left).checked_sub(margin(lease)).unwrap_or(sent);
                Term::Own { at, why: LeaseLost::Expired }
            }
        }
    }
}

/// What a re-watch needs to know of a guard's lease.
#[derive(Clone, Copy)]
pub(crate) struct LeaseView {
    pub(crate) ms: u64,
    pub(crate) watchdog: bool,
    /// The deadline of a grant with a lease of its own.
    pub(crate) own: Option<Instant>,
    pub(crate) session: bool,
}

#[derive(Default)]
struct Lease {
    ms: u64,
    term: Term,
    watchdog: bool,
    entry: Option<timer::Entry>,
}

/// One grant's loss, shared by its guard, its watchdog, its session and
/// the deadline timer.
#[derive(Default)]
pub(crate) struct Loss {
    reason: Mutex<Option<Lost>>,
    flag: AtomicBool,
    closed: AtomicBool,
    subscribers: Mutex<Vec<Sender<LeaseLost>>>,
    lease: Mutex<Lease>,
}

impl Loss {
    /// Granted with a lease of `ms` (0: a session grant) and `term`.
    pub(crate) fn granted(self: &Arc<Self>, ms: u64, term: Term) {
        let mut lease = lock(&self.lease);
        lease.ms = ms;
        lease.term = term;
        self.arm(&mut lease);
        drop(lease);
        self.check();
    }

    /// Registers the term's own deadline with the timer (a session's
    /// deadline is the session's to watch).
    fn arm(self: &Arc<Self>, lease: &mut Lease) {
        if let Some(entry) = lease.entry.take() {
            entry.cancel();
        }
        if let Term::Own { at, .. } = lease.term {
            let me: Weak<dyn Due> = Arc::downgrade(self) as Weak<dyn Due>;
            lease.entry = Some(timer::at(at, me));
        }
    }

    /// A renewal sent at `sent` got through: its deadline is `sent` plus
    /// the lease, less the margin (never earlier than it was).
    pub(crate) fn renewed(&self, sent: Instant) {
        let mut lease = lock(&self.lease);
        let ms = lease.ms;
        if let Term::Own { at, .. } = &mut lease.term {
            let d = Duration::from_millis(ms);
            *at = (*at).max(sent + d - margin(d));
        }
    }

    /// A renewal (`FLOCK.RENEW key owner ms`, sent at `sent`) gave the grant
    /// a lease of its own of `ms`: a session grant no longer lives with its
    /// session.
    pub(crate) fn leased(self: &Arc<Self>, ms: u64, sent: Instant) {
        let mut lease = lock(&self.lease);
        let why = if lease.watchdog { LeaseLost::Unconfirmed } else { LeaseLost::Expired };
        lease.ms = ms;
        let d = Duration::from_millis(ms);
        lease.term = Term::Own { at: sent + d - margin(d), why };
        self.arm(&mut lease);
    }

    /// Another hold of the same grant was given a lease of its own ending
    /// at `at` (a reentry with a lease): this one's term is no later.
    pub(crate) fn tighten(self: &Arc<Self>, at: Instant) {
        let mut lease = lock(&self.lease);
        match &mut lease.term {
            Term::Own { at: mine, .. } => *mine = (*mine).min(at),
            _ => {
                lease.term = Term::Own { at, why: LeaseLost::Expired };
                self.arm(&mut lease);
            }
        }
    }

    /// How the guard's lease goes on now.
    pub(crate) fn view(&self) -> LeaseView {
        let lease = lock(&self.lease);
        LeaseView {
            ms: lease.ms,
            watchdog: lease.watchdog,
            own: match lease.term {
                Term::Own { at, .. } => Some(at),
                _ => None,
            },
            session: matches!(lease.term, Term::Session(_)),
        }
    }

    /// The session clock of a session grant.
    pub(crate) fn clock(&self) -> Option<Arc<SessionClock>> {
        match &lock(&self.lease).term {
            Term::Session(clock) => Some(Arc::clone(clock)),
            _ => None,
        }
    }

    /// The deadline the grant's renewals serve (its own term's).
    pub(crate) fn deadline(&self) -> Option<Instant> {
        match &lock(&self.lease).term {
            Term::Own { at, .. } => Some(*at),
            Term::Session(clock) => Some(clock.deadline()),
            Term::None => None,
        }
    }

    /// A watchdog renews the lease from now on: its deadline passing is
    /// `Unconfirmed`.
    pub(crate) fn set_watchdog(&self, on: bool) {
        let mut lease = lock(&self.lease);
        lease.watchdog = on;
        if let Term::Own { why, .. } = &mut lease.term {
            *why = if on { LeaseLost::Unconfirmed } else { LeaseLost::Expired };
        }
    }

    /// Marks the grant lost now (the first reason wins) and tells every
    /// subscriber.
    pub(crate) fn mark(&self, why: LeaseLost) -> bool {
        self.mark_at((why, Instant::now()))
    }

    /// Marks the grant lost since `at` (its deadline, say).
    pub(crate) fn mark_at(&self, (why, at): Lost) -> bool {
        let mut reason = lock(&self.reason);
        if reason.is_some() {
            return false;
        }
        *reason = Some((why, at));
        self.flag.store(true, Ordering::SeqCst);
        for subscriber in lock(&self.subscribers).drain(..) {
            let _ = subscriber.send(why);
        }
        true
    }

    /// Whether the grant is lost: marked so, or its deadline is past now
    /// (then it is marked, so that a process paused past it sees the loss
    /// at its first check).
    pub(crate) fn is_lost(&self) -> bool {
        self.flag.load(Ordering::SeqCst) || self.check()
    }

    /// Marks the grant lost if its term is over; whether it was.
    fn check(&self) -> bool {
        let now = Instant::now();
        let due = match &lock(&self.lease).term {
            Term::Own { at, why } => (*at <= now).then_some((*why, *at)),
            Term::Session(clock) => clock.verdict(now),
            Term::None => None,
        };
        match due {
            Some(lost) => {
                self.mark_at(lost);
                true
            }
            None => false,
        }
    }

    pub(crate) fn reason(&self) -> Option<LeaseLost> {
        self.lost_since().map(|(why, _)| why)
    }

    /// Why the grant was lost and since when, once it is.
    pub(crate) fn lost_since(&self) -> Option<Lost> {
        self.is_lost();
        *lock(&self.reason)
    }

    /// A receiver that gets the reason once (at once if already lost) and
    /// disconnects when the guard is released.
    pub(crate) fn subscribe(&self) -> Receiver<LeaseLost> {
        self.is_lost();
        let (tx, rx) = mpsc::channel();
        let reason = lock(&self.reason);
        match *reason {
            Some((why, _)) => {
                let _ = tx.send(why);
            }
            None => lock(&self.subscribers).push(tx),
        }
        rx
    }

    /// The guard is gone: its receivers disconnect and its deadline is no
    /// longer watched.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        if let Some(entry) = lock(&self.lease).entry.take() {
            entry.cancel();
        }
        let _reason = lock(&self.reason);
        lock(&self.subscribers).clear();
    }
}

impl Due for Loss {
    fn due(&self, now: Instant) -> Option<Instant> {
        if self.closed.load(Ordering::SeqCst) || self.flag.load(Ordering::SeqCst) {
            return None;
        }
        let (at, why) = match &lock(&self.lease).term {
            Term::Own { at, why } => (*at, *why),
            _ => return None,
        };
        if at > now {
            return Some(at);
        }
        self.mark_at((why, at));
        None
    }
}
