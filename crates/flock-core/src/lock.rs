//! The lock itself, free of any Redis API: who holds it, how often, under
//! which fencing token and until when, and who waits in which order.
//!
//! Time is passed in as unix milliseconds, so the Redis layer decides what
//! "now" is and tests can drive the clock by hand. Lease expiry is never
//! applied implicitly: the caller asks `expire_due` first, so every hand-off
//! that an expiry causes is visible to it and can be delivered.

use std::collections::HashMap;

use crate::args::MAX_TOKEN;
use crate::deadlines::DeadlineId;
use crate::holders::Shared;
pub use crate::holders::{Member, TableChange};
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

/// What an ACQUIRE asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// The lock alone (no `SHARED`, no `PERMITS`).
    Exclusive,
    /// The read side of a read-write lock.
    Shared,
    /// `n` of the `limit` permits of a semaphore.
    Permits { n: u32, limit: u32 },
}

#[derive(Debug)]
pub struct Waiter<P> {
    pub owner: Box<[u8]>,
    pub lease_ms: u64,
    pub session: Option<u64>,
    /// The request ID it waits under and how long its grant is remembered.
    pub request: Option<(Box<[u8]>, u64)>,
    pub want: Want,
    pub payload: P,
}

/// A waiter that just became a holder.
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
    /// A resend of the owner's queued request (same request ID and mode):
    /// its WAIT takes over that place in the queue (`enqueue_with`).
    Resent,
}

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum LockError {
    NotOwner,
    AlreadyQueued,
    /// A reentrant acquire beyond `u32::MAX` holds.
    TooManyHolds,
    /// The request ID was used with another command on this lock.
    IdReused(Kind),
    /// `PERMITS` on a lock, or no `PERMITS` or another `LIMIT` on a semaphore.
    WrongMode(Mode),
    /// An owner holding the lock shared asked for it exclusively.
    Upgrade,
    /// A semaphore holder asked again for another number of permits than it holds.
    PermitsDiffer(u32),
}

/// What a key is, once an ACQUIRE made it.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum Mode {
    /// Exclusive and shared holders.
    Lock,
    /// A semaphore of this many permits.
    Semaphore(u32),
}

pub struct Request<'a> {
    pub owner: &'a [u8],
    pub lease_ms: u64,
    pub session: Option<u64>,
    pub id: Option<RequestId<'a>>,
    pub want: Want,
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

/// What most locks never have: waiters, a SESSION binding, request IDs,
/// shared or semaphore holders. Boxed, and dropped when empty, so that a
/// plain held lock stays small.
struct Extra<P> {
    /// The client id whose disconnect releases the exclusive holder.
    session: Option<u64>,
    waiting: Option<Box<Waiting<P>>>,
    requests: Requests,
    /// Boxed once more, so that an exclusive lock's `Extra` (SESSION,
    /// waiters, request IDs) stays as small as before.
    shared: Option<Box<Shared>>,
}

impl<P> Default for Extra<P> {
    fn default() -> Self {
        Self { session: None, waiting: None, requests: Requests::default(), shared: None }
    }
}

pub struct Lock<P> {
    /// The exclusive holder. Shared and semaphore holders are in `Extra`.
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

    /// Replaces the exclusive holder as replicated or loaded state says;
    /// waiters stay. A holder ends any shared holders (they cannot coexist).
    pub fn set_holder(&mut self, holder: Option<Holder>, session: Option<u64>) {
        // The exclusive hot path (no shared state at all) skips the table.
        if holder.is_some() && self.shared().is_some() {
            self.clear_table();
            self.set_mode(Mode::Lock);
        }
        self.holder = holder;
        self.set_session(session.filter(|_| self.holder.is_some()));
    }

    /// The exclusive holder.
    pub fn holder(&self) -> Option<&Holder> {
        self.holder.as_ref()
    }

    pub fn holder_mut(&mut self) -> Option<&mut Holder> {
        self.holder.as_mut()
    }

    /// The client id a SESSION exclusive holder is bound to.
    pub fn session(&self) -> Option<u64> {
        self.extra.as_ref().and_then(|e| e.session)
    }

    /// What the key is: a semaphore once an ACQUIRE with PERMITS made it,
    /// a lock otherwise.
    pub fn mode(&self) -> Mode {
        self.shared().and_then(|p| p.limit).map_or(Mode::Lock, Mode::Semaphore)
    }

    /// Sets the key's mode as replicated or loaded state says.
    pub fn set_mode(&mut self, mode: Mode) {
        let limit = match mode {
            Mode::Lock => None,
            Mode::Semaphore(limit) => Some(limit),
        };
        if limit.is_some() || self.shared().is_some() {
            self.shared_mut().limit = limit;
        }
        self.trim();
    }

    fn shared(&self) -> Option<&Shared> {
        self.extra.as_ref()?.shared.as_deref()
    }

    fn shared_mut(&mut self) -> &mut Shared {
        self.extra_mut().shared.get_or_insert_with(Box::default)
    }

    fn shared_if_any(&mut self) -> Option<&mut Shared> {
        self.extra.as_mut()?.shared.as_deref_mut()
    }

    /// Shared or semaphore holders, in no particular order.
    pub fn members(&self) -> impl Iterator<Item = &Member> + '_ {
        self.shared().into_iter().flat_map(Shared::members)
    }

    pub fn members_mut(&mut self) -> impl Iterator<Item = &mut Member> + '_ {
        self.shared_if_any().into_iter().flat_map(Shared::members_mut)
    }

    /// The exclusive holder or the members' holders.
    pub fn holders_mut(&mut self) -> impl Iterator<Item = &mut Holder> + '_ {
        let shared = self.extra.as_mut().and_then(|e| e.shared.as_deref_mut()).into_iter();
        self.holder.as_mut().into_iter().chain(shared.flat_map(|s| s.members_mut().map(|m| &mut m.holder)))
    }

    pub fn member_count(&self) -> usize {
        self.shared().map_or(0, Shared::len)
    }

    /// The shared or semaphore holder with this token.
    pub fn member(&self, token: u64) -> Option<&Member> {
        self.shared()?.get(token)
    }

    pub fn member_mut(&mut self, token: u64) -> Option<&mut Member> {
        self.shared_if_any()?.get_mut(token)
    }

    fn member_of(&self, owner: &[u8]) -> Option<&Member> {
        self.shared()?.of_owner(owner)
    }

    /// `owner` holds the key, exclusively or as a member.
    pub fn is_holder(&self, owner: &[u8]) -> bool {
        self.token_of(owner).is_some()
    }

    /// The token of `owner`'s grant, exclusive or member.
    fn token_of(&self, owner: &[u8]) -> Option<u64> {
        match &self.holder {
            Some(h) if *h.owner == *owner => Some(h.token),
            _ => self.member_of(owner).map(|m| m.holder.token),
        }
    }

    /// Permits in use (semaphore).
    pub fn permits_used(&self) -> u64 {
        self.shared().map_or(0, Shared::used)
    }

    /// Every holder: the exclusive one or the members, and its session and
    /// permits.
    pub fn holders(&self) -> impl Iterator<Item = (&Holder, Option<u64>, u32)> + '_ {
        let exclusive = self.holder.as_ref().map(|h| (h, self.session(), 0));
        exclusive.into_iter().chain(self.members().map(|m| (&m.holder, m.session, m.permits)))
    }

    pub fn holder_count(&self) -> usize {
        usize::from(self.holder.is_some()) + self.member_count()
    }

    /// The changes to the table since the last call.
    pub fn take_changes(&mut self) -> Vec<TableChange> {
        let Some(shared) = self.shared_if_any() else { return Vec::new() };
        let changes = shared.take_changes();
        self.trim();
        changes
    }

    /// True if the holder with this token (exclusive or member) holds it now.
    pub fn holds_token(&self, token: u64) -> bool {
        self.holder.as_ref().is_some_and(|h| h.token == token) || self.member(token).is_some()
    }

    /// The session the holder with this token is bound to.
    pub fn session_of(&self, token: u64) -> Option<u64> {
        match &self.holder {
            Some(h) if h.token == token => self.session(),
            _ => self.member(token)?.session,
        }
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
        let Some(e) = self.extra.as_mut() else { return };
        if e.shared.as_ref().is_some_and(|p| p.is_empty()) {
            e.shared = None;
        }
        if e.session.is_none() && e.waiting.is_none() && e.requests.is_empty() && e.shared.is_none() {
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
        self.holder.is_none() && self.member_count() == 0 && self.waiting().is_none()
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
                Ok((self.token_of(owner) == Some(record.reply)).then_some(record.reply))
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
        match (want, self.mode()) {
            _ if self.is_unused() => Ok(()),
            (Want::Permits { limit, .. }, Mode::Semaphore(have)) if limit == have => Ok(()),
            (Want::Exclusive | Want::Shared, Mode::Lock) => Ok(()),
            (_, mode) => Err(LockError::WrongMode(mode)),
        }
    }

    /// Whether `want` could be granted now, ignoring the queue.
    fn fits(&self, want: Want) -> bool {
        match want {
            Want::Exclusive => self.holder.is_none() && self.member_count() == 0,
            Want::Shared => self.holder.is_none(),
            Want::Permits { n, limit } => self.permits_used() + u64::from(n) <= u64::from(limit),
        }
    }

    pub fn acquire(&mut self, req: &Request, now_ms: u64, tokens: &mut TokenSource) -> Result<Acquired, LockError> {
        self.check_mode(req.want)?;
        if let Some(holder) = self.holder.as_mut().filter(|h| *h.owner == *req.owner) {
            // A writer may also read: SHARED is one more hold on its grant.
            holder.holds = holder.holds.checked_add(1).ok_or(LockError::TooManyHolds)?;
            holder.deadline_ms = now_ms.saturating_add(req.lease_ms);
            let token = holder.token;
            if req.session.is_some() {
                self.set_session(req.session);
            }
            self.remember(req.id, Kind::Acquire, token, now_ms);
            return Ok(Acquired::Reentered(token));
        }
        if let Some(member) = self.member_of(req.owner) {
            let token = member.holder.token;
            match req.want {
                Want::Exclusive => return Err(LockError::Upgrade),
                Want::Permits { n, .. } if n != member.permits => return Err(LockError::PermitsDiffer(member.permits)),
                _ => {}
            }
            self.reenter_member(token, req, now_ms)?;
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
        self.install(holder, req.session, req.want);
        self.remember(req.id, Kind::Acquire, token, now_ms);
        Ok(Acquired::Granted(token))
    }

    fn reenter_member(&mut self, token: u64, req: &Request, now_ms: u64) -> Result<(), LockError> {
        let shared = self.shared_if_any().ok_or(LockError::NotOwner)?;
        let member = shared.get_mut(token).ok_or(LockError::NotOwner)?;
        member.holder.holds = member.holder.holds.checked_add(1).ok_or(LockError::TooManyHolds)?;
        member.holder.deadline_ms = now_ms.saturating_add(req.lease_ms);
        let old_session = member.session;
        if req.session.is_some() {
            member.session = req.session;
        }
        shared.touched(token, old_session);
        Ok(())
    }

    /// Makes `holder` the exclusive holder or a member, as `want` says.
    fn install(&mut self, holder: Holder, session: Option<u64>, want: Want) {
        match want {
            Want::Exclusive => self.set_holder(Some(holder), session),
            Want::Shared => self.insert_member(Member { holder, session, permits: 0 }, None),
            Want::Permits { n, limit } => self.insert_member(Member { holder, session, permits: n }, Some(limit)),
        }
    }

    fn insert_member(&mut self, member: Member, limit: Option<u32>) {
        let shared = self.shared_mut();
        shared.limit = limit;
        shared.insert(member);
    }

    /// Takes a member out; logged as gone unless it is being replaced.
    fn remove_member(&mut self, token: u64, log: bool) -> Option<Member> {
        let member = self.shared_if_any()?.remove(token, log);
        self.trim();
        member
    }

    fn clear_table(&mut self) {
        if let Some(shared) = self.shared_if_any() {
            shared.clear();
        }
        self.trim();
    }

    /// Sets a member as replicated or loaded state says; the key becomes
    /// what `mode` says, and an exclusive holder ends.
    pub fn set_member(&mut self, member: Member, mode: Mode) {
        self.holder = None;
        self.set_session(None);
        let limit = match mode {
            Mode::Lock => None,
            Mode::Semaphore(limit) => Some(limit),
        };
        self.insert_member(member, limit);
    }

    /// Ends the member of `owner`, as replicated state says.
    pub fn unset_member(&mut self, owner: &[u8]) -> Option<Member> {
        let token = self.member_of(owner)?.holder.token;
        self.remove_member(token, true)
    }

    /// Joins the tail of the queue; only after `acquire` answered `Busy`.
    pub fn enqueue(&mut self, req: &Request, payload: P) -> Result<WaiterId, LockError> {
        self.check_not_queued(req)?;
        Ok(self.push_waiter(req, payload))
    }

    /// As `enqueue`, but `payload` is made only once the owner is known not
    /// to be queued: a caller can block a client there with nothing to undo.
    /// A resend of a queued request (`Acquired::Resent`) takes over its
    /// place instead, with its lease and session, and gives back the payload
    /// it had. `Ok(None)` (and nothing changed) if `payload` makes none.
    pub fn enqueue_with(
        &mut self,
        req: &Request,
        payload: impl FnOnce() -> Option<P>,
    ) -> Result<Option<(WaiterId, Option<P>)>, LockError> {
        if self.resent(req).is_none() {
            self.check_not_queued(req)?;
        }
        let Some(payload) = payload() else { return Ok(None) };
        if let Some((place, waiter)) = self.resent(req) {
            waiter.lease_ms = req.lease_ms;
            waiter.session = req.session;
            return Ok(Some((place, Some(std::mem::replace(&mut waiter.payload, payload)))));
        }
        Ok(Some((self.push_waiter(req, payload), None)))
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
            .get_or_insert_with(|| Box::new(Waiting { queue: WaitQueue::default(), queued: HashMap::new() }));
        let id = waiting.queue.push_back(Waiter {
            owner: req.owner.into(),
            lease_ms: req.lease_ms,
            session: req.session,
            request: req.id.map(|id| (id.id.into(), id.window_ms)),
            want: req.want,
            payload,
        });
        waiting.queued.insert(req.owner.into(), id);
        id
    }

    /// A waiter leaves (timeout, disconnect); `None` if it is no longer
    /// queued. The waiters behind it may fit now (a big semaphore request
    /// or an exclusive one at the head left): `grant_waiters` grants them.
    pub fn remove_waiter(&mut self, id: WaiterId) -> Option<Waiter<P>> {
        self.take_waiter(|queue| queue.remove(id))
    }

    /// Empties the queue (the lock is being deleted).
    pub fn drain_waiters(&mut self) -> Vec<Waiter<P>> {
        std::iter::from_fn(|| self.take_waiter(WaitQueue::pop_front)).collect()
    }

    /// Releases one hold of `owner`: the holds left and, at zero, the grants
    /// it caused.
    pub fn release(
        &mut self,
        owner: &[u8],
        now_ms: u64,
        tokens: &mut TokenSource,
    ) -> Result<(u32, Vec<Grant<P>>), LockError> {
        if let Some(holder) = self.holder.as_mut().filter(|h| *h.owner == *owner) {
            holder.holds -= 1;
            if holder.holds > 0 {
                return Ok((holder.holds, Vec::new()));
            }
            return Ok((0, self.vacate(now_ms, tokens).1));
        }
        let token = self.member_of(owner).ok_or(LockError::NotOwner)?.holder.token;
        let shared = self.shared_if_any().ok_or(LockError::NotOwner)?;
        let member = shared.get_mut(token).ok_or(LockError::NotOwner)?;
        member.holder.holds -= 1;
        let (left, session) = (member.holder.holds, member.session);
        if left > 0 {
            shared.touched(token, session);
            return Ok((left, Vec::new()));
        }
        self.remove_member(token, true);
        Ok((0, self.grant_waiters(now_ms, tokens)))
    }

    /// Resets the lease of `owner`'s grant; its token.
    pub fn renew(&mut self, owner: &[u8], lease_ms: u64, now_ms: u64) -> Result<u64, LockError> {
        if let Some(holder) = self.holder.as_mut().filter(|h| *h.owner == *owner) {
            holder.deadline_ms = now_ms.saturating_add(lease_ms);
            return Ok(holder.token);
        }
        let token = self.member_of(owner).ok_or(LockError::NotOwner)?.holder.token;
        let shared = self.shared_if_any().ok_or(LockError::NotOwner)?;
        let member = shared.get_mut(token).ok_or(LockError::NotOwner)?;
        member.holder.deadline_ms = now_ms.saturating_add(lease_ms);
        let session = member.session;
        shared.touched(token, session);
        Ok(token)
    }

    /// True if the exclusive holder's lease has run out.
    pub fn is_expired(&self, now_ms: u64) -> bool {
        self.holder.as_ref().is_some_and(|h| h.deadline_ms <= now_ms)
    }

    /// Ends the exclusive lease if it has run out; `None` if it has not (or
    /// nobody holds it exclusively). Members' leases end by `expire_token`
    /// and `expire_owner`.
    pub fn expire_due(&mut self, now_ms: u64, tokens: &mut TokenSource) -> Option<(Holder, Vec<Grant<P>>)> {
        if !self.is_expired(now_ms) {
            return None;
        }
        let (old, grants) = self.vacate(now_ms, tokens);
        old.map(|old| (old, grants))
    }

    /// Ends the lease of the member with this token if it has run out.
    pub fn expire_token(
        &mut self,
        token: u64,
        now_ms: u64,
        tokens: &mut TokenSource,
    ) -> Option<(Holder, Vec<Grant<P>>)> {
        if self.member(token)?.holder.deadline_ms > now_ms {
            return None;
        }
        let member = self.remove_member(token, true)?;
        Some((member.holder, self.grant_waiters(now_ms, tokens)))
    }

    /// Ends the lease of `owner`'s member grant if it has run out: a command
    /// about that owner never sees a lease that should have ended.
    pub fn expire_owner(
        &mut self,
        owner: &[u8],
        now_ms: u64,
        tokens: &mut TokenSource,
    ) -> Option<(Holder, Vec<Grant<P>>)> {
        let token = self.member_of(owner)?.holder.token;
        self.expire_token(token, now_ms, tokens)
    }

    /// Removes the holder with this token whatever its holds (session
    /// closed, grant undelivered); `None` if no holder has it.
    pub fn end_holder(&mut self, token: u64, now_ms: u64, tokens: &mut TokenSource) -> Option<Vec<Grant<P>>> {
        if self.holder.as_ref().is_some_and(|h| h.token == token) {
            return Some(self.vacate(now_ms, tokens).1);
        }
        self.remove_member(token, true)?;
        Some(self.grant_waiters(now_ms, tokens))
    }

    /// Removes every holder (FORCERELEASE): how many, and the grants.
    pub fn remove_all(&mut self, now_ms: u64, tokens: &mut TokenSource) -> (usize, Vec<Grant<P>>) {
        let removed = self.holder_count();
        self.clear_table();
        (removed, self.vacate(now_ms, tokens).1)
    }

    /// Removes the exclusive holder whatever its holds, and grants the head
    /// of the queue (and those behind it that fit), each with its own lease
    /// from `now_ms`.
    pub fn vacate(&mut self, now_ms: u64, tokens: &mut TokenSource) -> (Option<Holder>, Vec<Grant<P>>) {
        let old = self.holder.take();
        self.set_session(None);
        (old, self.grant_waiters(now_ms, tokens))
    }

    /// Grants the head of the queue while it fits, in order: a head that
    /// does not fit is never overtaken.
    pub fn grant_waiters(&mut self, now_ms: u64, tokens: &mut TokenSource) -> Vec<Grant<P>> {
        let mut grants = Vec::new();
        while let Some(want) = self.grantable_head() {
            let Some(waiter) = self.take_waiter(WaitQueue::pop_front) else { break };
            let token = tokens.next(now_ms);
            let holder = Holder::new(waiter.owner, 1, token, now_ms.saturating_add(waiter.lease_ms));
            self.install(holder, waiter.session, want);
            // Remembered at the grant: if the reply never reaches the waiter,
            // the grant is passed on and its token no longer held, so a resend
            // is a new request.
            if let Some((id, window_ms)) = &waiter.request {
                self.remember(Some(RequestId { id, window_ms: *window_ms }), Kind::Acquire, token, now_ms);
            }
            grants.push(Grant { token, payload: waiter.payload });
        }
        grants
    }

    /// What the head of the queue wants, if it can be granted now.
    fn grantable_head(&self) -> Option<Want> {
        let want = self.waiters().next()?.want;
        self.fits(want).then_some(want)
    }

    /// The head of the queue could be granted now (a waiter that held it up left).
    pub fn head_fits(&self) -> bool {
        self.grantable_head().is_some()
    }

    /// Heap bytes owned by this lock (owner strings, queue, index, table).
    pub fn heap_size(&self) -> usize {
        let extra = self.extra.as_ref().map_or(0, |e| std::mem::size_of::<Extra<P>>() + e.requests.heap_size());
        let shared = self.shared().map_or(0, Shared::heap_size);
        let waiting = self.waiting().map_or(0, |w| {
            let owners: usize = w.queue.iter().map(|w| w.owner.len()).sum();
            std::mem::size_of::<Waiting<P>>()
                + w.queue.heap_size()
                + owners * 2
                + w.queued.capacity() * (std::mem::size_of::<(Box<[u8]>, WaiterId)>() + 1)
        });
        self.holder.as_ref().map_or(0, |h| h.owner.len()) + extra + shared + waiting
    }
}

#[cfg(test)]
#[path = "lock_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "shared_tests.rs"]
mod shared_tests;
