//! The lock itself, free of any Redis API: who holds it, how often, under
//! which fencing token and until when, and who waits in which order.
//!
//! Time is passed in as unix milliseconds, so the Redis layer decides what
//! "now" is and tests can drive the clock by hand. Lease expiry is never
//! applied implicitly: the caller asks `expire_due` first, so every hand-off
//! that an expiry causes is visible to it and can be delivered.

use std::collections::HashSet;

use crate::args::MAX_TOKEN;
use crate::deadlines::DeadlineId;
use crate::queue::{WaitQueue, WaiterId};
use crate::requests::{Kind, Record, Requests};

/// Fencing tokens: strictly increasing for every grant this process makes.
///
/// A token is `max(last + 1, now_ms << 20)`, so tokens also keep rising
/// across restarts, failovers and slot migrations where `last` is lost, as
/// long as clocks do not step back by more than the time between grants.
#[derive(Debug, Default)]
pub struct TokenSource {
    last: u64,
}

impl TokenSource {
    /// Saturates at `MAX_TOKEN`: loaded tokens are at most that, and only a
    /// crafted one could bring `last` there (the clock part stays below half).
    pub fn next(&mut self, now_ms: u64) -> u64 {
        let clock = now_ms.saturating_mul(1 << 20).min(MAX_TOKEN / 2);
        self.last = self.last.saturating_add(1).max(clock).min(MAX_TOKEN);
        self.last
    }

    pub fn last(&self) -> u64 {
        self.last
    }

    /// Tokens seen elsewhere (loaded, replicated) are never handed out again.
    pub fn observe(&mut self, token: u64) {
        self.last = self.last.max(token);
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub owner: Box<[u8]>,
    pub token: u64,
    /// Absolute unix milliseconds.
    pub deadline_ms: u64,
    pub holds: u32,
    /// Where the caller filed this lease's deadline to be woken at it; a
    /// new holder has none. Kept here because it costs no extra bytes.
    pub deadline_id: Option<DeadlineId>,
}

impl Holder {
    pub fn new(owner: Box<[u8]>, holds: u32, token: u64, deadline_ms: u64) -> Self {
        Self { owner, token, deadline_ms, holds, deadline_id: None }
    }
}

#[derive(Debug)]
pub struct Waiter<P> {
    pub owner: Box<[u8]>,
    pub lease_ms: u64,
    pub session: Option<u64>,
    /// The request ID it waits under and how long its grant is remembered.
    pub request: Option<(Box<[u8]>, u64)>,
    pub payload: P,
}

/// A waiter that just became the holder.
#[derive(Debug)]
pub struct Grant<P> {
    pub token: u64,
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
}

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum LockError {
    NotOwner,
    AlreadyQueued,
    /// A reentrant acquire beyond `u32::MAX` holds.
    TooManyHolds,
    /// The request ID was used with another command on this lock.
    IdReused(Kind),
}

pub struct Request<'a> {
    pub owner: &'a [u8],
    pub lease_ms: u64,
    pub session: Option<u64>,
    pub id: Option<RequestId<'a>>,
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
    /// Owners in the queue, to refuse an owner queueing twice in O(1).
    queued: HashSet<Box<[u8]>>,
}

/// What most locks never have: waiters, a SESSION binding and request IDs.
/// Boxed, and dropped when empty, so that a plain held lock stays small.
struct Extra<P> {
    /// The client id whose disconnect releases the current holder.
    session: Option<u64>,
    waiting: Option<Box<Waiting<P>>>,
    requests: Requests,
}

impl<P> Default for Extra<P> {
    fn default() -> Self {
        Self { session: None, waiting: None, requests: Requests::default() }
    }
}

pub struct Lock<P> {
    holder: Option<Holder>,
    extra: Option<Box<Extra<P>>>,
}

impl<P> Default for Lock<P> {
    fn default() -> Self {
        Self { holder: None, extra: None }
    }
}

impl<P> Lock<P> {
    pub fn with_holder(holder: Holder, session: Option<u64>) -> Self {
        let mut lock = Self::default();
        lock.set_holder(Some(holder), session);
        lock
    }

    /// Replaces the holder as replicated or loaded state says; waiters stay.
    pub fn set_holder(&mut self, holder: Option<Holder>, session: Option<u64>) {
        self.holder = holder;
        self.set_session(session.filter(|_| self.holder.is_some()));
    }

    pub fn holder(&self) -> Option<&Holder> {
        self.holder.as_ref()
    }

    pub fn holder_mut(&mut self) -> Option<&mut Holder> {
        self.holder.as_mut()
    }

    /// The client id a SESSION holder is bound to.
    pub fn session(&self) -> Option<u64> {
        self.extra.as_ref().and_then(|e| e.session)
    }

    fn set_session(&mut self, session: Option<u64>) {
        match (&mut self.extra, session) {
            (Some(extra), _) => extra.session = session,
            (None, None) => {}
            (None, Some(_)) => self.extra_mut().session = session,
        }
        self.trim();
    }

    fn extra_mut(&mut self) -> &mut Extra<P> {
        self.extra.get_or_insert_with(Box::default)
    }

    fn trim(&mut self) {
        if self.extra.as_ref().is_some_and(|e| e.session.is_none() && e.waiting.is_none() && e.requests.is_empty()) {
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

    /// Nobody holds it and nobody waits: it is free to grant.
    pub fn is_idle(&self) -> bool {
        self.holder.is_none() && self.waiting().is_none()
    }

    /// Idle and remembering no request: the lock can disappear.
    pub fn is_unused(&self) -> bool {
        self.is_idle() && self.requests().is_none_or(Requests::is_empty)
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
        extra.requests.prune(now_ms);
        let found = extra.requests.get(id).copied();
        self.trim();
        match found {
            None => Ok(None),
            Some(record) if record.kind != kind => Err(LockError::IdReused(record.kind)),
            Some(record) if kind == Kind::Acquire => {
                let held = self.holder.as_ref().is_some_and(|h| *h.owner == *owner && h.token == record.reply);
                Ok(held.then_some(record.reply))
            }
            Some(record) => Ok(Some(record.reply)),
        }
    }

    /// Records that the command sent with `id` was applied and answered `reply`.
    pub fn remember(&mut self, id: Option<RequestId>, kind: Kind, reply: u64, now_ms: u64) {
        if let Some(id) = id {
            let expires_ms = now_ms.saturating_add(id.window_ms);
            self.extra_mut().requests.record(id.id, Record { kind, reply, expires_ms });
        }
    }

    /// Sets a record as replicated or loaded state says.
    pub fn restore_request(&mut self, id: &[u8], record: Record) {
        self.extra_mut().requests.record(id, record);
    }

    fn is_queued(&self, owner: &[u8]) -> bool {
        self.waiting().is_some_and(|w| w.queued.contains(owner))
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

    pub fn acquire(&mut self, req: &Request, now_ms: u64, tokens: &mut TokenSource) -> Result<Acquired, LockError> {
        if let Some(holder) = self.holder.as_mut().filter(|h| *h.owner == *req.owner) {
            holder.holds = holder.holds.checked_add(1).ok_or(LockError::TooManyHolds)?;
            holder.deadline_ms = now_ms.saturating_add(req.lease_ms);
            let token = holder.token;
            if req.session.is_some() {
                self.set_session(req.session);
            }
            self.remember(req.id, Kind::Acquire, token, now_ms);
            return Ok(Acquired::Reentered(token));
        }
        if self.is_queued(req.owner) {
            return Err(LockError::AlreadyQueued);
        }
        if !self.is_idle() {
            return Ok(Acquired::Busy);
        }
        let token = tokens.next(now_ms);
        let holder = Holder::new(req.owner.into(), 1, token, now_ms.saturating_add(req.lease_ms));
        self.set_holder(Some(holder), req.session);
        self.remember(req.id, Kind::Acquire, token, now_ms);
        Ok(Acquired::Granted(token))
    }

    /// Joins the tail of the queue; only after `acquire` answered `Busy`.
    pub fn enqueue(&mut self, req: &Request, payload: P) -> Result<WaiterId, LockError> {
        self.check_not_queued(req)?;
        Ok(self.push_waiter(req, payload))
    }

    /// As `enqueue`, but `payload` is made only once the owner is known not
    /// to be queued: a caller can block a client there with nothing to undo.
    /// `Ok(None)` (and nothing queued) if `payload` makes none.
    pub fn enqueue_with(
        &mut self,
        req: &Request,
        payload: impl FnOnce() -> Option<P>,
    ) -> Result<Option<WaiterId>, LockError> {
        self.check_not_queued(req)?;
        Ok(payload().map(|payload| self.push_waiter(req, payload)))
    }

    fn check_not_queued(&self, req: &Request) -> Result<(), LockError> {
        match self.is_queued(req.owner) {
            true => Err(LockError::AlreadyQueued),
            false => Ok(()),
        }
    }

    fn push_waiter(&mut self, req: &Request, payload: P) -> WaiterId {
        let waiting = self
            .extra_mut()
            .waiting
            .get_or_insert_with(|| Box::new(Waiting { queue: WaitQueue::default(), queued: HashSet::new() }));
        waiting.queued.insert(req.owner.into());
        waiting.queue.push_back(Waiter {
            owner: req.owner.into(),
            lease_ms: req.lease_ms,
            session: req.session,
            request: req.id.map(|id| (id.id.into(), id.window_ms)),
            payload,
        })
    }

    /// A waiter leaves (timeout, disconnect); `None` if it is no longer queued.
    pub fn remove_waiter(&mut self, id: WaiterId) -> Option<Waiter<P>> {
        self.take_waiter(|queue| queue.remove(id))
    }

    /// Empties the queue (the lock is being deleted).
    pub fn drain_waiters(&mut self) -> Vec<Waiter<P>> {
        std::iter::from_fn(|| self.take_waiter(WaitQueue::pop_front)).collect()
    }

    /// Releases one hold: the holds left and, at zero, the hand-off it caused.
    pub fn release(
        &mut self,
        owner: &[u8],
        now_ms: u64,
        tokens: &mut TokenSource,
    ) -> Result<(u32, Option<Grant<P>>), LockError> {
        let holder = self.holder_of(owner)?;
        holder.holds -= 1;
        if holder.holds > 0 {
            return Ok((holder.holds, None));
        }
        Ok((0, self.vacate(now_ms, tokens).1))
    }

    /// Resets the holder's lease; the current token.
    pub fn renew(&mut self, owner: &[u8], lease_ms: u64, now_ms: u64) -> Result<u64, LockError> {
        let holder = self.holder_of(owner)?;
        holder.deadline_ms = now_ms.saturating_add(lease_ms);
        Ok(holder.token)
    }

    pub fn is_expired(&self, now_ms: u64) -> bool {
        self.holder.as_ref().is_some_and(|h| h.deadline_ms <= now_ms)
    }

    /// Ends a lease that has run out; `None` if it has not (or nobody holds it).
    pub fn expire_due(&mut self, now_ms: u64, tokens: &mut TokenSource) -> Option<(Holder, Option<Grant<P>>)> {
        if !self.is_expired(now_ms) {
            return None;
        }
        let (old, grant) = self.vacate(now_ms, tokens);
        old.map(|old| (old, grant))
    }

    /// Removes the holder whatever its holds, and hands the lock to the head
    /// of the queue, which gets its own lease from `now_ms`.
    pub fn vacate(&mut self, now_ms: u64, tokens: &mut TokenSource) -> (Option<Holder>, Option<Grant<P>>) {
        let old = self.holder.take();
        self.set_session(None);
        let grant = self.take_waiter(WaitQueue::pop_front).map(|waiter| {
            let token = tokens.next(now_ms);
            let holder = Holder::new(waiter.owner, 1, token, now_ms.saturating_add(waiter.lease_ms));
            self.set_holder(Some(holder), waiter.session);
            // Remembered at the grant: if the reply never reaches the waiter,
            // the grant is passed on and its token no longer held, so a resend
            // is a new request.
            if let Some((id, window_ms)) = &waiter.request {
                self.remember(Some(RequestId { id, window_ms: *window_ms }), Kind::Acquire, token, now_ms);
            }
            Grant { token, payload: waiter.payload }
        });
        (old, grant)
    }

    /// Heap bytes owned by this lock (owner strings, queue, index).
    pub fn heap_size(&self) -> usize {
        let extra = self.extra.as_ref().map_or(0, |e| std::mem::size_of::<Extra<P>>() + e.requests.heap_size());
        let waiting = self.waiting().map_or(0, |w| {
            let owners: usize = w.queue.iter().map(|w| w.owner.len()).sum();
            std::mem::size_of::<Waiting<P>>()
                + w.queue.heap_size()
                + owners * 2
                + w.queued.capacity() * (std::mem::size_of::<Box<[u8]>>() + 1)
        });
        self.holder.as_ref().map_or(0, |h| h.owner.len()) + extra + waiting
    }

    fn holder_of(&mut self, owner: &[u8]) -> Result<&mut Holder, LockError> {
        self.holder.as_mut().filter(|h| *h.owner == *owner).ok_or(LockError::NotOwner)
    }
}

#[cfg(test)]
#[path = "lock_tests.rs"]
mod tests;
