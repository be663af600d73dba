//! The lock itself, free of any Redis API: who holds it, how often, under
//! which fencing token and until when, and who waits in which order.
//!
//! Time is passed in as unix milliseconds, so the Redis layer decides what
//! "now" is and tests can drive the clock by hand. Lease expiry is never
//! applied implicitly: the caller asks `expire` first. Every operation
//! pushes what it did to `out` (see `effects`), so the caller follows each
//! change the same way, whichever kind of holder it concerns.

use std::collections::HashMap;

use crate::effects::{Change, End, Leave, Outcome};
use crate::holders::{Holder, Holders, Mode, Terms, Want};
use crate::queue::{WaitQueue, WaiterId};
use crate::requests::{Kind, Record, Requests};
use crate::tokens::TokenSource;

/// Where operations report what they did.
pub type Outcomes<P> = Vec<Outcome<P>>;

#[derive(Debug)]
pub struct Waiter<P> {
    pub owner: Box<[u8]>,
    pub lease_ms: u64,
    pub session: Option<u64>,
    pub session_lease: bool,
    /// The request ID it waits under and how long its grant is remembered.
    pub request: Option<(Box<[u8]>, u64)>,
    pub want: Want,
    /// `Terms::lock_delay_ms` of its grant.
    pub lock_delay_ms: u32,
    /// One key's place of a wait for several keys (`enqueue_gated`): the
    /// caller grants it (`grant_head`) once every key is its to take.
    pub gated: bool,
    pub payload: P,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Acquired {
    /// A new grant with this token.
    Granted(u64),
    /// The owner already held it; the current token.
    Reentered(u64),
    /// Someone else holds it or is queued first.
    Busy,
    /// A resend of the owner's queued request (same request ID and mode):
    /// its WAIT takes over that place in the queue (`enqueue_with`).
    Resent,
}

/// Why a fencing token does not hold a lock now (`Lock::fence`).
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum Stale {
    /// Its holder's lease ran out; the lease timer has not ended it yet.
    Expired,
    /// An exclusive grant with this newer token holds the lock.
    HeldBy(u64),
    /// This many others hold it (readers, or permits of a semaphore).
    Held(usize),
    Free,
}

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum LockError {
    NotOwner,
    AlreadyQueued,
    /// A reentrant acquire beyond `u32::MAX` holds.
    TooManyHolds,
    /// The request ID was used with another command on this lock.
    IdReused(Kind),
    /// `PERMITS` on a lock, or no `PERMITS` or another `LIMIT` on a
    /// semaphore; the key's mode.
    WrongMode(Mode),
    /// An owner holding the lock shared asked for it exclusively.
    Upgrade,
    /// A semaphore holder asked again for another number of permits than it holds.
    PermitsDiffer(u32),
}

pub struct Request<'a> {
    pub owner: &'a [u8],
    /// With `session_lease`, the session's timeout: the lease replicas and
    /// the disk see.
    pub lease_ms: u64,
    pub session: Option<u64>,
    /// The grant lives while its `session` does (`Terms::session_lease`).
    pub session_lease: bool,
    pub id: Option<RequestId<'a>>,
    pub want: Want,
    /// `Terms::lock_delay_ms` of its grant.
    pub lock_delay_ms: u32,
}

/// A command's request ID and how long what it did is remembered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestId<'a> {
    pub id: &'a [u8],
    pub window_ms: u64,
}

/// The waiters of a contended lock.
struct Waiting<P> {
    queue: WaitQueue<Waiter<P>>,
    /// Where each owner waits: an owner queues once, and a resend of its
    /// request takes its place, both found in O(1).
    queued: HashMap<Box<[u8]>, WaiterId>,
}

/// What most locks never have: waiters, request IDs, a foreign holder.
/// Boxed, and dropped when empty, so that a plain held lock stays small.
struct Extra<P> {
    waiting: Option<Box<Waiting<P>>>,
    requests: Requests,
    /// Held by a lock that is not FLOCK's (the key holds another client's
    /// `SET NX` string): nothing is granted until that lets go.
    foreign: bool,
    /// A grant ended unreleased with a lock-delay: nothing is granted until
    /// this time (unix ms), when the caller lifts it (`lift_delay`).
    delayed_until: Option<u64>,
}

pub struct Lock<P> {
    holders: Holders,
    extra: Option<Box<Extra<P>>>,
}

/// What a holder of a key in `mode` holds, as a request for it.
fn held_want(mode: Mode, permits: u32) -> Want {
    match mode {
        Mode::Exclusive => Want::Exclusive,
        Mode::Shared => Want::Shared,
        Mode::Semaphore(limit) => Want::Permits { n: permits, limit },
    }
}

/// What a command resent with a request ID answers, given the record
/// `found` under that ID: `None` for a new request; `IdReused` if the ID
/// was used with another command; for ACQUIRE, its token only while that
/// grant is still `held` (the token the owner holds now, if any).
pub fn replay(found: Option<Record>, kind: Kind, held: Option<u64>) -> Result<Option<u64>, LockError> {
    match found {
        None => Ok(None),
        Some(record) if record.kind != kind => Err(LockError::IdReused(record.kind)),
        Some(record) if kind == Kind::Acquire => Ok((held == Some(record.reply)).then_some(record.reply)),
        Some(record) => Ok(Some(record.reply)),
    }
}

impl<P> Default for Lock<P> {
    fn default() -> Self {
        Self { holders: Holders::default(), extra: None }
    }
}

impl<P> Lock<P> {
    pub fn holders(&self) -> &Holders {
        &self.holders
    }

    /// Whether the grant with `token` holds the lock at `now_ms`, in any
    /// mode: a write fenced by it may go ahead. A lease past its deadline
    /// no longer counts though its timer has not run yet: the next holder
    /// may be granted any moment, and a write must not race that.
    pub fn fence(&self, token: u64, now_ms: u64) -> Result<(), Stale> {
        match self.holders.get(token) {
            Some((h, terms)) if terms.session_lease || h.deadline_ms > now_ms => Ok(()),
            Some(_) => Err(Stale::Expired),
            None => Err(match (self.mode(), self.holders.len()) {
                (_, 0) => Stale::Free,
                (Mode::Exclusive, _) => Stale::HeldBy(self.holders.iter().next().map_or(0, |(h, _)| h.token)),
                (_, n) => Stale::Held(n),
            }),
        }
    }

    /// A holder's lease, for the caller to note where it filed it.
    pub fn holder_mut(&mut self, token: u64) -> Option<&mut Holder> {
        self.holders.get_mut(token)
    }

    pub fn holders_mut(&mut self) -> impl Iterator<Item = &mut Holder> + '_ {
        self.holders.iter_mut()
    }

    /// How the key is held now (exclusive when free, unless a semaphore).
    pub fn mode(&self) -> Mode {
        self.holders.mode()
    }

    fn extra_mut(&mut self) -> &mut Extra<P> {
        self.extra.get_or_insert_with(|| {
            Box::new(Extra { waiting: None, requests: Requests::default(), foreign: false, delayed_until: None })
        })
    }

    fn trim(&mut self) {
        if self
            .extra
            .as_ref()
            .is_some_and(|e| e.waiting.is_none() && e.requests.is_empty() && !e.foreign && e.delayed_until.is_none())
        {
            self.extra = None;
        }
    }

    fn waiting(&self) -> Option<&Waiting<P>> {
        self.extra.as_ref()?.waiting.as_deref()
    }

    pub fn waiters(&self) -> impl Iterator<Item = &Waiter<P>> + '_ {
        self.waiting().into_iter().flat_map(|w| w.queue.iter())
    }

    pub fn waiter_count(&self) -> usize {
        self.waiting().map_or(0, |w| w.queue.len())
    }

    /// Nobody holds it, nobody waits and no lock-delay keeps it closed: it
    /// is free to grant, and its key may go.
    pub fn is_idle(&self) -> bool {
        self.is_open() && !self.is_foreign() && self.delayed_until().is_none()
    }

    /// Until when a lock-delay keeps the lock closed (unix ms), if one does.
    pub fn delayed_until(&self) -> Option<u64> {
        self.extra.as_ref()?.delayed_until
    }

    /// Ends the lock-delay if its time has come at `now_ms`, and grants the
    /// waiters that fit: false while it still runs (or there is none).
    pub fn lift_delay(&mut self, now_ms: u64, tokens: &mut TokenSource, out: &mut Outcomes<P>) -> bool {
        match self.delayed_until() {
            Some(until) if until <= now_ms => {
                self.extra_mut().delayed_until = None;
                self.trim();
                self.grant_waiters(now_ms, tokens, out);
                true
            }
            _ => false,
        }
    }

    /// No FLOCK holder and nobody waits: a request sets its mode.
    fn is_open(&self) -> bool {
        self.holders.is_empty() && self.waiting().is_none()
    }

    /// Held outside FLOCK (`set_foreign`).
    pub fn is_foreign(&self) -> bool {
        self.extra.as_ref().is_some_and(|e| e.foreign)
    }

    /// A lock that is not FLOCK's holds the key: nothing is granted until
    /// `clear_foreign`.
    pub fn set_foreign(&mut self) {
        self.extra_mut().foreign = true;
    }

    /// The foreign lock let go: the waiters are granted in order, as after a
    /// release.
    pub fn clear_foreign(&mut self, now_ms: u64, tokens: &mut TokenSource, out: &mut Outcomes<P>) {
        if let Some(extra) = self.extra.as_mut() {
            extra.foreign = false;
        }
        self.trim();
        self.grant_waiters(now_ms, tokens, out);
    }

    pub fn requests(&self) -> Option<&Requests> {
        self.extra.as_ref().map(|e| &e.requests)
    }

    /// What to answer a command sent again with request ID `id`: `Some` of
    /// the first reply if it was applied (for ACQUIRE: while the grant made
    /// under the ID is still held by `owner`), `None` if this is a new
    /// request. Forgets what has expired at `now_ms` first.
    pub fn repeat(&mut self, id: &[u8], kind: Kind, owner: &[u8], now_ms: u64) -> Result<Option<u64>, LockError> {
        let Some(extra) = self.extra.as_mut() else { return Ok(None) };
        let found = extra.requests.find(id, now_ms);
        self.trim();
        replay(found, kind, self.holders.token_of(owner))
    }

    /// Records that the command sent with `id` was applied and answered `reply`.
    pub fn remember(&mut self, id: Option<RequestId>, kind: Kind, reply: u64, now_ms: u64) {
        if let Some(id) = id {
            let expires_ms = now_ms.saturating_add(id.window_ms);
            self.extra_mut().requests.record(id.id, Record { kind, reply, expires_ms });
        }
    }

    /// The request IDs, for a lock that leaves its key.
    pub fn take_requests(&mut self) -> Option<Requests> {
        let requests = std::mem::take(&mut self.extra.as_mut()?.requests);
        self.trim();
        Some(requests).filter(|r| !r.is_empty())
    }

    /// The request IDs this lock remembered before it left its key.
    pub fn adopt_requests(&mut self, requests: Requests) {
        if !requests.is_empty() {
            self.extra_mut().requests.merge(requests);
        }
    }

    /// Sets a record as replicated or loaded state says.
    pub fn restore_request(&mut self, id: &[u8], record: Record) {
        self.extra_mut().requests.record(id, record);
    }

    fn is_queued(&self, owner: &[u8]) -> bool {
        self.waiting().is_some_and(|w| w.queued.contains_key(owner))
    }

    /// The queued waiter that `req` resends: the same owner, request ID and
    /// mode. Its first connection may be gone without the server knowing
    /// yet (a half-open TCP connection), so the resend takes over its place.
    fn resent(&mut self, req: &Request) -> Option<(WaiterId, &mut Waiter<P>)> {
        let id = req.id?;
        let waiting = self.extra.as_mut()?.waiting.as_mut()?;
        let &place = waiting.queued.get(req.owner)?;
        let waiter = waiting.queue.get_mut(place)?;
        let same = waiter.request.as_ref().is_some_and(|(first, _)| **first == *id.id) && waiter.want == req.want;
        same.then_some((place, waiter))
    }

    /// Takes a waiter out with `take` and drops the queue once it is empty.
    fn take_waiter(&mut self, take: impl FnOnce(&mut WaitQueue<Waiter<P>>) -> Option<Waiter<P>>) -> Option<Waiter<P>> {
        let extra = self.extra.as_mut()?;
        let waiting = extra.waiting.as_mut()?;
        let waiter = take(&mut waiting.queue)?;
        waiting.queued.remove(&waiter.owner);
        if waiting.queue.is_empty() {
            extra.waiting = None;
            self.trim();
        }
        Some(waiter)
    }

    /// `want` fits this key's mode: `PERMITS` with the key's limit on a
    /// semaphore, anything else on a lock; a key nobody uses takes any.
    fn check_mode(&self, want: Want) -> Result<(), LockError> {
        let mode = self.mode();
        if self.is_open() || mode.same_key_kind(want.mode()) {
            return Ok(());
        }
        Err(LockError::WrongMode(mode))
    }

    /// The owners `owner` waits for here (wanting `want`, or as queued if
    /// `want` is `None`): the holders and (with `queue`) the waiters queued
    /// ahead of it whose grants exclude its own (`Want::conflicts`), so each
    /// must be granted and leave before it can be. A new request (not
    /// queued) is behind every waiter. For deadlock detection
    /// (`deadlock::cycle`). O(holders), and O(waiters ahead) with `queue`.
    pub fn blockers(&self, owner: &[u8], want: Option<Want>, queue: bool) -> Vec<Box<[u8]>> {
        let Some(want) = want.or_else(|| self.queued_want(owner)) else { return Vec::new() };
        let mode = self.mode();
        let held = self.holders.iter().map(|(h, terms)| (&h.owner, held_want(mode, terms.permits)));
        let ahead = self.waiters().take_while(|w| queue && *w.owner != *owner).map(|w| (&w.owner, w.want));
        held.chain(ahead)
            .filter(|(o, other)| ***o != *owner && want.conflicts(*other))
            .map(|(o, _)| o.clone())
            .collect()
    }

    /// What `owner` waits for here, if it is queued.
    fn queued_want(&self, owner: &[u8]) -> Option<Want> {
        let waiting = self.waiting()?;
        waiting.queue.get(*waiting.queued.get(owner)?).map(|w| w.want)
    }

    /// Whether `want` could be granted now, ignoring the queue.
    fn fits(&self, want: Want) -> bool {
        if self.is_foreign() || self.delayed_until().is_some() {
            return false;
        }
        let free = self.holders.is_empty();
        match want {
            Want::Exclusive => free,
            Want::Shared => free || self.mode() == Mode::Shared,
            Want::Permits { n, limit } => self.holders.used() + u64::from(n) <= u64::from(limit),
        }
    }

    pub fn acquire(
        &mut self,
        req: &Request,
        now_ms: u64,
        tokens: &mut TokenSource,
        out: &mut Outcomes<P>,
    ) -> Result<Acquired, LockError> {
        self.check_mode(req.want)?;
        // Its time may have come before its timer ran.
        self.lift_delay(now_ms, tokens, out);
        if self.is_open() {
            // A key nobody uses becomes what this request makes it.
            self.holders.set_kind(req.want.mode());
        }
        if let Some(token) = self.holders.token_of(req.owner) {
            self.reenter(token, req, now_ms, out)?;
            self.remember(req.id, Kind::Acquire, token, now_ms);
            return Ok(Acquired::Reentered(token));
        }
        if self.is_queued(req.owner) {
            return self.resent(req).map(|_| Acquired::Resent).ok_or(LockError::AlreadyQueued);
        }
        if self.waiting().is_some() || !self.fits(req.want) {
            return Ok(Acquired::Busy);
        }
        let token = tokens.next(now_ms);
        let holder = Holder::new(req.owner.into(), 1, token, now_ms.saturating_add(req.lease_ms));
        let terms = Terms {
            session: req.session,
            permits: req.want.permits(),
            session_lease: req.session_lease,
            lock_delay_ms: req.lock_delay_ms,
        };
        self.holders.insert(holder, terms, req.want.mode());
        out.push(Outcome::Granted { token, waiter: None });
        self.remember(req.id, Kind::Acquire, token, now_ms);
        Ok(Acquired::Granted(token))
    }

    /// One more hold of `token`'s grant for its owner: a writer may also
    /// read (SHARED is one more hold on its grant), a reader may not write.
    fn reenter(&mut self, token: u64, req: &Request, now_ms: u64, out: &mut Outcomes<P>) -> Result<(), LockError> {
        let (holder, terms) = self.holders.get(token).ok_or(LockError::NotOwner)?;
        match (self.holders.mode(), req.want) {
            (Mode::Shared, Want::Exclusive) => return Err(LockError::Upgrade),
            (Mode::Semaphore(_), Want::Permits { n, .. }) if n != terms.permits => {
                return Err(LockError::PermitsDiffer(terms.permits))
            }
            _ => {}
        }
        let holds = holder.holds.checked_add(1).ok_or(LockError::TooManyHolds)?;
        let holder = self.holders.get_mut(token).ok_or(LockError::NotOwner)?;
        holder.holds = holds;
        holder.deadline_ms = now_ms.saturating_add(req.lease_ms);
        if req.session.is_some() {
            self.holders.set_session(token, req.session);
        }
        // A reentry sets the lease: its own, or its session's.
        self.holders.set_session_lease(token, req.session_lease);
        out.push(Outcome::Changed { token, why: Change::Reentered, old_session: terms.session });
        Ok(())
    }

    /// A resend of the acquire that made the grant with `token` (its
    /// request ID) was answered that token on behalf of `req.session`: the
    /// process that holds the grant hears of it through that session now,
    /// so a grant bound to another session is bound to this one (a session
    /// grant with this session's timeout as its lease), and the end of the
    /// one it leaves does not end it. No hold is added.
    pub fn rebind_resent(&mut self, token: u64, req: &Request, now_ms: u64, out: &mut Outcomes<P>) {
        let Some((_, terms)) = self.holders.get(token) else { return };
        if req.session.is_none() || req.session == terms.session {
            return;
        }
        self.holders.set_session(token, req.session);
        if terms.session_lease {
            if let Some(holder) = self.holders.get_mut(token) {
                holder.deadline_ms = now_ms.saturating_add(req.lease_ms);
            }
        }
        out.push(Outcome::Changed { token, why: Change::Rebound, old_session: terms.session });
    }

    /// Joins the tail of the queue; only after `acquire` answered `Busy`.
    pub fn enqueue(&mut self, req: &Request, payload: P) -> Result<WaiterId, LockError> {
        self.check_not_queued(req)?;
        Ok(self.push_waiter(req, payload, false))
    }

    /// Whether `owner` could take this key for `want` now as part of a
    /// request for several keys: it holds it already (one more hold), or
    /// nobody waits and `want` fits. The errors `acquire` would answer,
    /// and `AlreadyQueued`, are answered first; nothing changes.
    pub fn can_take(&self, owner: &[u8], want: Want) -> Result<bool, LockError> {
        self.check_mode(want)?;
        if let Some(token) = self.holders.token_of(owner) {
            let (holder, _) = self.holders.get(token).ok_or(LockError::NotOwner)?;
            if self.mode() == Mode::Shared && want == Want::Exclusive {
                return Err(LockError::Upgrade);
            }
            holder.holds.checked_add(1).ok_or(LockError::TooManyHolds)?;
            return Ok(true);
        }
        if self.is_queued(owner) {
            return Err(LockError::AlreadyQueued);
        }
        Ok(self.waiting().is_none() && self.fits(want))
    }

    /// Joins the tail of the queue as one key of a wait for several: never
    /// granted by the lock itself; its turn shows in `gated_head`, and the
    /// caller grants it with `grant_head` once every key is its to take.
    pub fn enqueue_gated(&mut self, req: &Request, payload: P) -> Result<WaiterId, LockError> {
        self.check_mode(req.want)?;
        if self.is_open() {
            self.holders.set_kind(req.want.mode());
        }
        self.check_not_queued(req)?;
        Ok(self.push_waiter(req, payload, true))
    }

    /// The head of the queue if it is one key of a wait for several, and
    /// whether it could be granted now.
    pub fn gated_head(&self) -> Option<(&P, bool)> {
        let head = self.waiters().next().filter(|w| w.gated)?;
        Some((&head.payload, self.fits(head.want)))
    }

    /// Grants the head, a gated waiter that fits (see `gated_head`), and
    /// then the waiters behind it that fit: its token, or `None` (nothing
    /// changed) if the head is not such a waiter.
    pub fn grant_head(&mut self, now_ms: u64, tokens: &mut TokenSource, out: &mut Outcomes<P>) -> Option<u64> {
        let want = self.waiters().next().filter(|w| w.gated && self.fits(w.want))?.want;
        let token = self.grant_front(want, now_ms, tokens, out);
        self.grant_waiters(now_ms, tokens, out);
        token
    }

    /// As `enqueue`, but `payload` is made only once the owner is known not
    /// to be queued: a caller can block a client there with nothing to undo.
    /// A resend of a queued request (`Acquired::Resent`) takes over its
    /// place instead, with its lease and session, and the waiter it
    /// replaces leaves (`Leave::Resent`). `Ok(None)` (and nothing changed)
    /// if `payload` makes none.
    pub fn enqueue_with(
        &mut self,
        req: &Request,
        payload: impl FnOnce() -> Option<P>,
        out: &mut Outcomes<P>,
    ) -> Result<Option<WaiterId>, LockError> {
        if self.resent(req).is_none() {
            self.check_not_queued(req)?;
        }
        let Some(payload) = payload() else { return Ok(None) };
        if let Some((place, waiter)) = self.resent(req) {
            waiter.lease_ms = req.lease_ms;
            waiter.session = req.session;
            waiter.session_lease = req.session_lease;
            waiter.lock_delay_ms = req.lock_delay_ms;
            let first = std::mem::replace(&mut waiter.payload, payload);
            out.push(Outcome::Left { waiter: first, why: Leave::Resent });
            return Ok(Some(place));
        }
        Ok(Some(self.push_waiter(req, payload, false)))
    }

    fn check_not_queued(&self, req: &Request) -> Result<(), LockError> {
        match self.is_queued(req.owner) {
            true => Err(LockError::AlreadyQueued),
            false => Ok(()),
        }
    }

    fn push_waiter(&mut self, req: &Request, payload: P, gated: bool) -> WaiterId {
        let waiting = self
            .extra_mut()
            .waiting
            .get_or_insert_with(|| Box::new(Waiting { queue: WaitQueue::default(), queued: HashMap::new() }));
        let id = waiting.queue.push_back(Waiter {
            owner: req.owner.into(),
            lease_ms: req.lease_ms,
            session: req.session,
            session_lease: req.session_lease,
            request: req.id.map(|id| (id.id.into(), id.window_ms)),
            want: req.want,
            lock_delay_ms: req.lock_delay_ms,
            gated,
            payload,
        });
        waiting.queued.insert(req.owner.into(), id);
        id
    }

    /// A waiter leaves (timeout, disconnect, ...); false if it is no longer
    /// queued. The waiters behind it may fit now (a big semaphore request
    /// or an exclusive one at the head left): `grant_waiters` grants them.
    pub fn remove_waiter(&mut self, id: WaiterId, why: Leave, out: &mut Outcomes<P>) -> bool {
        let Some(waiter) = self.take_waiter(|queue| queue.remove(id)) else { return false };
        out.push(Outcome::Left { waiter: waiter.payload, why });
        true
    }

    /// The head of the queue leaves (a wait for several keys that ended
    /// elsewhere); those behind it are not granted here.
    pub fn remove_head(&mut self, out: &mut Outcomes<P>) {
        if let Some(waiter) = self.take_waiter(WaitQueue::pop_front) {
            out.push(Outcome::Left { waiter: waiter.payload, why: Leave::Cancelled });
        }
    }

    /// `FLOCK.CANCEL`: `owner`'s wait ends, wherever it is in the queue;
    /// false if it does not wait. Those behind it that fit now are granted.
    pub fn cancel(&mut self, owner: &[u8], now_ms: u64, tokens: &mut TokenSource, out: &mut Outcomes<P>) -> bool {
        let Some(&id) = self.waiting().and_then(|w| w.queued.get(owner)) else { return false };
        self.remove_waiter(id, Leave::Cancelled, out);
        self.grant_waiters(now_ms, tokens, out);
        true
    }

    /// Empties the queue: every waiter leaves for `why`.
    pub fn drain_waiters(&mut self, why: Leave, out: &mut Outcomes<P>) {
        while let Some(waiter) = self.take_waiter(WaitQueue::pop_front) {
            out.push(Outcome::Left { waiter: waiter.payload, why });
        }
    }

    /// Releases one hold of `owner`'s grant: the holds left.
    pub fn release(
        &mut self,
        owner: &[u8],
        now_ms: u64,
        tokens: &mut TokenSource,
        out: &mut Outcomes<P>,
    ) -> Result<u32, LockError> {
        let token = self.holders.token_of(owner).ok_or(LockError::NotOwner)?;
        let session = self.session_of(token);
        let holder = self.holders.get_mut(token).ok_or(LockError::NotOwner)?;
        holder.holds -= 1;
        let left = holder.holds;
        if left > 0 {
            out.push(Outcome::Changed { token, why: Change::HoldReleased, old_session: session });
        } else {
            self.end(token, End::Released, now_ms, tokens, out);
        }
        Ok(left)
    }

    /// The session the grant with this token is bound to.
    pub fn session_of(&self, token: u64) -> Option<u64> {
        self.holders.get(token).and_then(|(_, terms)| terms.session)
    }

    /// Resets the lease of `owner`'s grant, a lease of its own from now
    /// on; its token.
    pub fn renew(&mut self, owner: &[u8], lease_ms: u64, now_ms: u64, out: &mut Outcomes<P>) -> Result<u64, LockError> {
        let token = self.holders.token_of(owner).ok_or(LockError::NotOwner)?;
        self.holders.set_session_lease(token, false);
        self.extend(token, now_ms.saturating_add(lease_ms), out).ok_or(LockError::NotOwner)?;
        Ok(token)
    }

    /// The session a grant that lives with its session (`lease-ms` 0) is
    /// bound to.
    pub fn session_lease_of(&self, token: u64) -> Option<u64> {
        self.holders.get(token).and_then(|(_, terms)| terms.session.filter(|_| terms.session_lease))
    }

    /// Moves the deadline of the grant with this token to `deadline_ms`
    /// (a session grant's, as its session is heard from); `None` if no
    /// holder has it.
    pub fn extend(&mut self, token: u64, deadline_ms: u64, out: &mut Outcomes<P>) -> Option<()> {
        let session = self.session_of(token);
        self.holders.get_mut(token)?.deadline_ms = deadline_ms;
        out.push(Outcome::Changed { token, why: Change::Renewed, old_session: session });
        Some(())
    }

    /// Ends the leases that a command must not see past their end: the
    /// exclusive holder's (it keeps everyone out) and `owner`'s own.
    /// Others end on their timers: a command stays O(1) in holders.
    pub fn expire(&mut self, owner: Option<&[u8]>, now_ms: u64, tokens: &mut TokenSource, out: &mut Outcomes<P>) {
        let exclusive = match self.mode() {
            Mode::Exclusive => self.holders.iter().next().map(|(h, _)| h.token),
            _ => None,
        };
        let own = owner.and_then(|owner| self.holders.token_of(owner)).filter(|&t| Some(t) != exclusive);
        for token in exclusive.into_iter().chain(own) {
            self.expire_token(token, now_ms, tokens, out);
        }
    }

    /// Ends the lease with this token if it has run out; false if it has
    /// not, no holder has it, or it lives with its session (which ends it).
    pub fn expire_token(&mut self, token: u64, now_ms: u64, tokens: &mut TokenSource, out: &mut Outcomes<P>) -> bool {
        if self.holders.get(token).is_none_or(|(h, terms)| h.deadline_ms > now_ms || terms.session_lease) {
            return false;
        }
        self.end(token, End::LeaseEnded, now_ms, tokens, out)
    }

    /// Ends the grant with this token whatever its holds, and grants the
    /// waiters that fit now; false if no holder has it.
    pub fn end(&mut self, token: u64, why: End, now_ms: u64, tokens: &mut TokenSource, out: &mut Outcomes<P>) -> bool {
        let Some((holder, terms)) = self.holders.remove(token) else { return false };
        // Its holder may not know yet: a lease that ran out, a session that
        // was not heard from. A holder that released, or an operator's
        // FORCERELEASE, means to let the next one in now.
        let unaware = matches!(why, End::LeaseEnded | End::SessionClosed);
        out.push(Outcome::Ended { holder, terms, why });
        if unaware && terms.lock_delay_ms > 0 {
            let until = now_ms.saturating_add(u64::from(terms.lock_delay_ms));
            let later = self.delayed_until().map_or(until, |t| t.max(until));
            self.extra_mut().delayed_until = Some(later);
            out.push(Outcome::Delayed { until_ms: later });
        }
        self.grant_waiters(now_ms, tokens, out);
        true
    }

    /// Ends every grant (FORCERELEASE): how many.
    pub fn end_all(&mut self, why: End, now_ms: u64, tokens: &mut TokenSource, out: &mut Outcomes<P>) -> usize {
        let ended = self.holders.drain();
        let count = ended.len();
        out.extend(ended.into_iter().map(|(holder, terms)| Outcome::Ended { holder, terms, why }));
        self.grant_waiters(now_ms, tokens, out);
        count
    }

    /// Grants the head of the queue while it fits, in order: a head that
    /// does not fit is never overtaken. Each grant has its own lease from
    /// `now_ms`.
    pub fn grant_waiters(&mut self, now_ms: u64, tokens: &mut TokenSource, out: &mut Outcomes<P>) {
        while let Some(want) = self.grantable_head() {
            if self.grant_front(want, now_ms, tokens, out).is_none() {
                break;
            }
        }
    }

    /// Grants the head of the queue, which wants `want` and fits: its token.
    fn grant_front(&mut self, want: Want, now_ms: u64, tokens: &mut TokenSource, out: &mut Outcomes<P>) -> Option<u64> {
        let waiter = self.take_waiter(WaitQueue::pop_front)?;
        let token = tokens.next(now_ms);
        let holder = Holder::new(waiter.owner, 1, token, now_ms.saturating_add(waiter.lease_ms));
        let terms = Terms {
            session: waiter.session,
            permits: want.permits(),
            session_lease: waiter.session_lease,
            lock_delay_ms: waiter.lock_delay_ms,
        };
        self.holders.insert(holder, terms, want.mode());
        // Remembered at the grant: if the reply never reaches the waiter,
        // the grant is passed on and its token no longer held, so a resend
        // is a new request.
        if let Some((id, window_ms)) = &waiter.request {
            self.remember(Some(RequestId { id, window_ms: *window_ms }), Kind::Acquire, token, now_ms);
        }
        out.push(Outcome::Granted { token, waiter: Some(waiter.payload) });
        Some(token)
    }

    /// What the head of the queue wants, if the lock may grant it now (a
    /// gated head waits for its caller).
    fn grantable_head(&self) -> Option<Want> {
        let head = self.waiters().next().filter(|w| !w.gated)?;
        self.fits(head.want).then_some(head.want)
    }

    /// The head of the queue could be granted now (a waiter that held it up left).
    pub fn head_fits(&self) -> bool {
        self.grantable_head().is_some()
    }

    /// Sets one holder as replicated or loaded state says: holders of
    /// another mode, the owner's other grant, another owner's grant under
    /// the same token go (only such state could bring them); waiters stay.
    pub fn restore(&mut self, holder: Holder, terms: Terms, mode: Mode, out: &mut Outcomes<P>) {
        if !self.holders.is_empty() && self.holders.mode() != mode {
            self.replace_all(out);
        }
        self.holders.set_kind(mode);
        let mut holder = holder;
        let mut old_session = None;
        let stale = [self.holders.token_of(&holder.owner), Some(holder.token)];
        for token in stale.into_iter().flatten() {
            let Some((old, old_terms)) = self.holders.remove(token) else { continue };
            if old.token == holder.token && old.owner == holder.owner {
                // The same grant, set again: it keeps its filed lease.
                holder.deadline_id = old.deadline_id;
                old_session = old_terms.session;
            } else {
                out.push(Outcome::Ended { holder: old, terms: old_terms, why: End::Replaced });
            }
        }
        let token = holder.token;
        self.holders.insert(holder, terms, mode);
        out.push(Outcome::Changed { token, why: Change::Restored, old_session });
    }

    /// Makes the key what `mode` says and ends `owner`'s grant, if any, as
    /// replicated or loaded state says.
    pub fn restore_absent(&mut self, owner: Option<&[u8]>, mode: Mode, out: &mut Outcomes<P>) {
        if !self.holders.set_kind(mode) {
            self.replace_all(out);
            self.holders.set_kind(mode);
        }
        let gone = owner.and_then(|owner| self.holders.token_of(owner)).and_then(|t| self.holders.remove(t));
        if let Some((holder, terms)) = gone {
            out.push(Outcome::Ended { holder, terms, why: End::Replaced });
        }
    }

    /// Nobody holds the key exclusively, as an AOF written before
    /// FLOCK.HOLDER carried every holder says (`FLOCK.STATE key`).
    pub fn restore_vacant(&mut self, out: &mut Outcomes<P>) {
        if self.mode() == Mode::Exclusive {
            self.replace_all(out);
        }
    }

    fn replace_all(&mut self, out: &mut Outcomes<P>) {
        let gone = self.holders.drain();
        out.extend(gone.into_iter().map(|(holder, terms)| Outcome::Ended { holder, terms, why: End::Replaced }));
    }

    /// Heap bytes owned by this lock (owner strings, queue, index, table).
    pub fn heap_size(&self) -> usize {
        let extra = self.extra.as_ref().map_or(0, |e| std::mem::size_of::<Extra<P>>() + e.requests.heap_size());
        let waiting = self.waiting().map_or(0, |w| {
            let owners: usize = w.queue.iter().map(|w| w.owner.len()).sum();
            std::mem::size_of::<Waiting<P>>()
                + w.queue.heap_size()
                + owners * 2
                + w.queued.capacity() * (std::mem::size_of::<(Box<[u8]>, WaiterId)>() + 1)
        });
        self.holders.heap_size() + extra + waiting
    }
}

#[cfg(test)]
#[path = "lock_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "shared_tests.rs"]
mod shared_tests;
