use super::*;
use crate::effects::{Counter, Counters};
use crate::limits::MAX_TOKEN;
use proptest::prelude::*;
use std::collections::{HashMap, VecDeque};

fn req(owner: &str, lease_ms: u64) -> Request<'_> {
    Request {
        owner: owner.as_bytes(),
        lease_ms,
        session: None,
        session_lease: false,
        id: None,
        want: Want::Exclusive,
        lock_delay_ms: 0,
    }
}

/// The holder of an exclusive lock and its terms (`None` for shared or
/// semaphore holders).
fn exclusive<P>(lock: &Lock<P>) -> Option<(&Holder, Terms)> {
    if lock.mode() != Mode::Exclusive {
        return None;
    }
    assert!(lock.holders().len() <= 1, "an exclusive lock has one holder at most");
    lock.holders().iter().next()
}

/// The one holder of an exclusive lock.
fn holder<P>(lock: &Lock<P>) -> Option<&Holder> {
    exclusive(lock).map(|(h, _)| h)
}

/// The client id the exclusive holder is bound to (SESSION).
fn session<P>(lock: &Lock<P>) -> Option<u64> {
    exclusive(lock).and_then(|(_, terms)| terms.session)
}

fn holder_owner<P>(lock: &Lock<P>) -> Option<&[u8]> {
    holder(lock).map(|h| &*h.owner)
}

/// The waiters that outcomes granted, in order: payload and token.
fn handed<P: Copy>(out: &[Outcome<P>]) -> Vec<(P, u64)> {
    out.iter()
        .filter_map(|o| match o {
            Outcome::Granted { token, waiter: Some(p) } => Some((*p, *token)),
            _ => None,
        })
        .collect()
}

/// The one waiter an exclusive hand-off grants, if any.
fn one<P: Copy>(out: &[Outcome<P>]) -> Option<(P, u64)> {
    let granted = handed(out);
    assert!(granted.len() <= 1, "an exclusive hand-off grants one waiter");
    granted.first().copied()
}

/// The grants that outcomes ended: owner, token and why.
fn ends<P>(out: &[Outcome<P>]) -> Vec<(&[u8], u64, End)> {
    out.iter()
        .filter_map(|o| match o {
            Outcome::Ended { holder, why, .. } => Some((&*holder.owner, holder.token, *why)),
            _ => None,
        })
        .collect()
}

/// A lock held by `a` (acquired at t=1000 with a 100 ms lease) with `b` queued.
fn held_by_a_with_b_queued(tokens: &mut TokenSource) -> (Lock<&'static str>, WaiterId) {
    let mut lock = Lock::default();
    let mut out = Vec::new();
    lock.acquire(&req("a", 100), 1000, tokens, &mut out).unwrap();
    out.clear();
    assert_eq!(lock.acquire(&req("b", 500), 1000, tokens, &mut out), Ok(Acquired::Busy));
    assert!(out.is_empty(), "a busy answer changes nothing");
    let b = lock.enqueue(&req("b", 500), "b").unwrap();
    (lock, b)
}

#[test]
fn grants_at_once_when_free() {
    let mut tokens = TokenSource::default();
    let mut lock = Lock::<()>::default();
    let mut out = Vec::new();
    let Ok(Acquired::Granted(token)) = lock.acquire(&req("a", 100), 1000, &mut tokens, &mut out) else {
        panic!("a free lock must be granted");
    };
    assert_eq!(out, [Outcome::Granted { token, waiter: None }], "an immediate grant");
    let h = holder(&lock).unwrap();
    assert_eq!((&*h.owner, h.holds, h.token, h.deadline_ms), (&b"a"[..], 1, token, 1100));
    assert!(matches!(lock.holders(), Holders::One(_)), "a plain lock's holder is inline");
}

#[test]
fn try_is_busy_while_held_and_queues_nothing() {
    let mut tokens = TokenSource::default();
    let mut lock = Lock::<()>::default();
    let mut out = Vec::new();
    lock.acquire(&req("a", 100), 1000, &mut tokens, &mut out).unwrap();
    out.clear();
    assert_eq!(lock.acquire(&req("b", 100), 1000, &mut tokens, &mut out), Ok(Acquired::Busy));
    assert_eq!(lock.waiter_count(), 0);
    assert!(out.is_empty());
}

#[test]
fn try_never_cuts_in_front_of_waiters() {
    let mut tokens = TokenSource::default();
    let (mut lock, _) = held_by_a_with_b_queued(&mut tokens);
    let mut out = Vec::new();
    assert_eq!(lock.acquire(&req("c", 100), 1000, &mut tokens, &mut out), Ok(Acquired::Busy));
    assert_eq!(lock.release(b"a", 1001, &mut tokens, &mut out), Ok(0));
    assert_eq!(one(&out).unwrap().0, "b");
    out.clear();
    assert_eq!(lock.acquire(&req("c", 100), 1001, &mut tokens, &mut out), Ok(Acquired::Busy));

    // Not reachable through the API, but the queue alone must still block a try.
    let mut orphaned = Lock::default();
    orphaned.enqueue(&req("b", 100), ()).unwrap();
    let mut out = Vec::new();
    assert_eq!(orphaned.acquire(&req("c", 100), 1000, &mut tokens, &mut out), Ok(Acquired::Busy));
    assert!(out.is_empty());
}

#[test]
fn reentry_counts_holds_resets_lease_and_keeps_token() {
    let mut tokens = TokenSource::default();
    let mut lock = Lock::<()>::default();
    let mut out = Vec::new();
    let Ok(Acquired::Granted(token)) = lock.acquire(&req("a", 100), 1000, &mut tokens, &mut out) else { panic!() };
    out.clear();
    assert_eq!(lock.acquire(&req("a", 300), 1050, &mut tokens, &mut out), Ok(Acquired::Reentered(token)));
    assert_eq!(out, [Outcome::Changed { token, why: Change::Reentered, old_session: None }]);
    let h = holder(&lock).unwrap();
    assert_eq!((h.holds, h.deadline_ms), (2, 1350));
}

#[test]
fn release_counts_down_then_hands_off_with_a_fresh_lease() {
    let mut tokens = TokenSource::default();
    let (mut lock, _) = held_by_a_with_b_queued(&mut tokens);
    let mut out = Vec::new();
    lock.acquire(&req("a", 100), 1000, &mut tokens, &mut out).unwrap();
    let old_token = holder(&lock).unwrap().token;
    out.clear();
    assert_eq!(lock.release(b"a", 1010, &mut tokens, &mut out), Ok(1));
    assert_eq!(out, [Outcome::Changed { token: old_token, why: Change::HoldReleased, old_session: None }]);
    assert_eq!(holder_owner(&lock), Some(&b"a"[..]));

    out.clear();
    assert_eq!(lock.release(b"a", 2000, &mut tokens, &mut out), Ok(0));
    assert_eq!(ends(&out), [(&b"a"[..], old_token, End::Released)]);
    let (payload, token) = one(&out).expect("the queue head takes over");
    assert_eq!(out.len(), 2, "the end, then the grant: {out:?}");
    assert!(matches!(out[1], Outcome::Granted { .. }), "the grant follows the end");
    assert_eq!(payload, "b");
    assert!(token > old_token);
    let h = holder(&lock).unwrap();
    // The waiter's lease counts from the hand-off, not from when it queued.
    assert_eq!((&*h.owner, h.holds, h.token, h.deadline_ms), (&b"b"[..], 1, token, 2500));
    assert_eq!(lock.waiter_count(), 0);
}

#[test]
fn release_by_non_owner_is_refused_and_changes_nothing() {
    let mut tokens = TokenSource::default();
    let (mut lock, _) = held_by_a_with_b_queued(&mut tokens);
    let before = holder(&lock).cloned();
    let mut out = Vec::new();
    for who in [&b"b"[..], b"c"] {
        assert_eq!(lock.release(who, 1010, &mut tokens, &mut out), Err(LockError::NotOwner));
    }
    assert!(out.is_empty());
    assert_eq!(holder(&lock).cloned(), before);
    assert_eq!(lock.waiter_count(), 1);
}

#[test]
fn renew_by_non_owner_is_refused() {
    let mut tokens = TokenSource::default();
    let (mut lock, _) = held_by_a_with_b_queued(&mut tokens);
    let mut out = Vec::new();
    assert_eq!(lock.renew(b"b", 100, 1010, &mut out), Err(LockError::NotOwner));
    assert!(out.is_empty());
    assert_eq!(holder(&lock).unwrap().deadline_ms, 1100);
}

#[test]
fn renew_returns_current_token_and_moves_deadline() {
    let mut tokens = TokenSource::default();
    let mut lock = Lock::<()>::default();
    let mut out = Vec::new();
    lock.acquire(&req("a", 100), 1000, &mut tokens, &mut out).unwrap();
    let token = holder(&lock).unwrap().token;
    out.clear();
    assert_eq!(lock.renew(b"a", 700, 1050, &mut out), Ok(token));
    assert_eq!(out, [Outcome::Changed { token, why: Change::Renewed, old_session: None }]);
    assert_eq!(holder(&lock).unwrap().deadline_ms, 1750);
}

#[test]
fn owner_already_queued_is_refused() {
    let mut tokens = TokenSource::default();
    let (mut lock, _) = held_by_a_with_b_queued(&mut tokens);
    let mut out = Vec::new();
    assert_eq!(lock.acquire(&req("b", 100), 1000, &mut tokens, &mut out), Err(LockError::AlreadyQueued));
    assert_eq!(lock.enqueue(&req("b", 100), "b2").unwrap_err(), LockError::AlreadyQueued);
    assert!(out.is_empty());
    assert_eq!(lock.waiter_count(), 1);
}

#[test]
fn removing_a_middle_waiter_keeps_the_others_in_order() {
    let mut tokens = TokenSource::default();
    let (mut lock, _) = held_by_a_with_b_queued(&mut tokens);
    let c = lock.enqueue(&req("c", 100), "c").unwrap();
    lock.enqueue(&req("d", 100), "d").unwrap();
    let mut out = Vec::new();
    assert!(lock.remove_waiter(c, Leave::TimedOut, &mut out));
    assert_eq!(out, [Outcome::Left { waiter: "c", why: Leave::TimedOut }]);
    assert_eq!(lock.waiters().map(|w| w.payload).collect::<Vec<_>>(), ["b", "d"]);
}

#[test]
fn a_waiter_is_removed_only_once_and_may_queue_again() {
    let mut tokens = TokenSource::default();
    let (mut lock, b) = held_by_a_with_b_queued(&mut tokens);
    let mut out = Vec::new();
    assert!(lock.remove_waiter(b, Leave::Disconnected, &mut out));
    assert!(!lock.remove_waiter(b, Leave::Disconnected, &mut out));
    assert_eq!(out, [Outcome::Left { waiter: "b", why: Leave::Disconnected }], "one leave, once");
    assert!(lock.enqueue(&req("b", 100), "b again").is_ok());
}

#[test]
fn a_stale_handle_never_removes_a_later_waiter() {
    let mut tokens = TokenSource::default();
    let (mut lock, b) = held_by_a_with_b_queued(&mut tokens);
    let mut out = Vec::new();
    lock.release(b"a", 1010, &mut tokens, &mut out).unwrap();
    lock.enqueue(&req("c", 100), "c").unwrap();
    out.clear();
    // b's timeout can fire in the same event-loop turn as its grant.
    assert!(!lock.remove_waiter(b, Leave::TimedOut, &mut out));
    assert!(out.is_empty());
    assert_eq!(lock.waiter_count(), 1);
}

#[test]
fn expire_waits_for_the_deadline_then_hands_off() {
    let mut tokens = TokenSource::default();
    let (mut lock, _) = held_by_a_with_b_queued(&mut tokens);
    let a = holder(&lock).unwrap().token;
    let mut out = Vec::new();
    lock.expire(None, 1099, &mut tokens, &mut out);
    assert!(!lock.expire_token(a, 1099, &mut tokens, &mut out));
    assert!(out.is_empty(), "not due yet");
    lock.expire(None, 1100, &mut tokens, &mut out);
    assert_eq!(ends(&out), [(&b"a"[..], a, End::LeaseEnded)]);
    assert_eq!(one(&out).unwrap().0, "b");
    assert_eq!(holder(&lock).unwrap().deadline_ms, 1600);
    out.clear();
    assert_eq!(lock.release(b"a", 1100, &mut tokens, &mut out), Err(LockError::NotOwner));
    assert!(!lock.expire_token(a, 2000, &mut tokens, &mut out), "a's grant is gone");
    assert!(out.is_empty());
}

#[test]
fn expire_ends_the_exclusive_holder_and_the_owners_own_lease_only() {
    let mut tokens = TokenSource::default();
    let mut lock = Lock::<()>::default();
    let mut out = Vec::new();
    fn shared(owner: &str, lease_ms: u64) -> Request<'_> {
        Request { want: Want::Shared, ..req(owner, lease_ms) }
    }
    let a = match lock.acquire(&shared("a", 10), 1000, &mut tokens, &mut out) {
        Ok(Acquired::Granted(token)) => token,
        other => panic!("{other:?}"),
    };
    lock.acquire(&shared("b", 10), 1000, &mut tokens, &mut out).unwrap();
    out.clear();
    lock.expire(None, 1010, &mut tokens, &mut out);
    assert!(out.is_empty(), "shared leases end on their timers, or for their owner's command");
    lock.expire(Some(b"a"), 1010, &mut tokens, &mut out);
    assert_eq!(ends(&out), [(&b"a"[..], a, End::LeaseEnded)]);
    assert_eq!(lock.holders().len(), 1);
}

#[test]
fn end_removes_the_holder_whatever_its_holds() {
    let mut tokens = TokenSource::default();
    let mut lock = Lock::<()>::default();
    let mut out = Vec::new();
    for _ in 0..3 {
        lock.acquire(&req("a", 100), 1000, &mut tokens, &mut out).unwrap();
    }
    let token = holder(&lock).unwrap().token;
    out.clear();
    assert!(lock.end(token, End::Undelivered, 1010, &mut tokens, &mut out));
    let [Outcome::Ended { holder: old, why: End::Undelivered, .. }] = &out[..] else { panic!("{out:?}") };
    assert_eq!(old.holds, 3);
    assert!(lock.is_idle());
    out.clear();
    assert!(!lock.end(token, End::Undelivered, 1010, &mut tokens, &mut out), "ended once");
    assert!(out.is_empty());
}

#[test]
fn drain_empties_the_queue_and_the_lock_is_idle_once_the_holder_goes() {
    let mut tokens = TokenSource::default();
    let (mut lock, _) = held_by_a_with_b_queued(&mut tokens);
    lock.enqueue(&req("c", 100), "c").unwrap();
    let mut out = Vec::new();
    lock.drain_waiters(Leave::Deleted, &mut out);
    let left = |waiter| Outcome::Left { waiter, why: Leave::Deleted };
    assert_eq!(out, [left("b"), left("c")]);
    assert!(!lock.is_idle(), "a still holds it");
    out.clear();
    assert_eq!(lock.release(b"a", 1010, &mut tokens, &mut out), Ok(0));
    assert!(handed(&out).is_empty());
    assert!(lock.is_idle());
    // Drained owners must not stay marked as queued.
    assert!(lock.enqueue(&req("b", 100), "b").is_ok());
}

#[test]
fn end_all_ends_every_holder_then_grants() {
    let mut tokens = TokenSource::default();
    let (mut lock, _) = held_by_a_with_b_queued(&mut tokens);
    let a = holder(&lock).unwrap().token;
    let mut out = Vec::new();
    assert_eq!(lock.end_all(End::ForceReleased, 1010, &mut tokens, &mut out), 1);
    assert_eq!(ends(&out), [(&b"a"[..], a, End::ForceReleased)]);
    assert_eq!(one(&out).unwrap().0, "b");
    out.clear();
    lock.release(b"b", 1010, &mut tokens, &mut out).unwrap();
    out.clear();
    assert_eq!(lock.end_all(End::ForceReleased, 1010, &mut tokens, &mut out), 0);
    assert!(out.is_empty());
}

#[test]
fn reentry_beyond_the_most_holds_is_refused_and_changes_nothing() {
    let mut tokens = TokenSource::default();
    let mut lock = Lock::<()>::default();
    let mut out = Vec::new();
    lock.restore(Holder::new(b"a"[..].into(), u32::MAX, 7, 1100), Terms::default(), Mode::Exclusive, &mut out);
    assert_eq!(out, [Outcome::Changed { token: 7, why: Change::Restored, old_session: None }]);
    out.clear();
    assert_eq!(lock.acquire(&req("a", 500), 1000, &mut tokens, &mut out), Err(LockError::TooManyHolds));
    assert!(out.is_empty());
    let h = holder(&lock).unwrap();
    assert_eq!((h.holds, h.token, h.deadline_ms), (u32::MAX, 7, 1100));
}

#[test]
fn session_and_waiters_take_memory_only_while_they_exist() {
    let mut tokens = TokenSource::default();
    let mut lock = Lock::<()>::default();
    let mut out = Vec::new();
    lock.acquire(&req("a", 100), 1000, &mut tokens, &mut out).unwrap();
    let plain = lock.heap_size();
    let bound = Request { session: Some(9), ..req("a", 100) };
    out.clear();
    lock.acquire(&bound, 1000, &mut tokens, &mut out).unwrap();
    let token = holder(&lock).unwrap().token;
    assert_eq!(out, [Outcome::Changed { token, why: Change::Reentered, old_session: None }]);
    assert_eq!(session(&lock), Some(9));
    assert!(lock.heap_size() > plain);
    let b = lock.enqueue(&req("b", 100), ()).unwrap();
    assert!(lock.remove_waiter(b, Leave::TimedOut, &mut out));
    lock.release(b"a", 1000, &mut tokens, &mut out).unwrap();
    assert_eq!(session(&lock), Some(9), "the session binds the holder until its last release");
    out.clear();
    assert_eq!(lock.release(b"a", 1000, &mut tokens, &mut out), Ok(0));
    let [Outcome::Ended { terms, why: End::Released, .. }] = &out[..] else { panic!("{out:?}") };
    assert_eq!(terms.session, Some(9), "the ended grant tells its session");
    assert!(lock.is_idle() && session(&lock).is_none());
    lock.acquire(&req("c", 100), 1000, &mut tokens, &mut out).unwrap();
    assert_eq!(lock.heap_size(), plain, "nothing is left over from the session or the queue");
}

#[test]
fn a_granted_waiter_brings_its_own_session() {
    let mut tokens = TokenSource::default();
    let mut lock = Lock::default();
    let mut out = Vec::new();
    lock.acquire(&Request { session: Some(1), ..req("a", 100) }, 1000, &mut tokens, &mut out).unwrap();
    lock.enqueue(&Request { session: Some(2), ..req("b", 100) }, "b").unwrap();
    lock.enqueue(&req("c", 100), "c").unwrap();
    lock.release(b"a", 1000, &mut tokens, &mut out).unwrap();
    assert_eq!((holder_owner(&lock), session(&lock)), (Some(&b"b"[..]), Some(2)));
    lock.release(b"b", 1000, &mut tokens, &mut out).unwrap();
    assert_eq!((holder_owner(&lock), session(&lock)), (Some(&b"c"[..]), None));
    assert_eq!(handed(&out).iter().map(|g| g.0).collect::<Vec<_>>(), ["b", "c"]);
}

/// A grant taken with `lease-ms` 0 lives with its session: its deadline
/// never ends it here (the caller moves it as the session is heard from);
/// a RENEW or a reentry with a lease gives it a lease of its own again.
#[test]
fn a_session_lease_is_never_ended_by_its_deadline_until_renewed_with_a_lease() {
    let mut tokens = TokenSource::default();
    let mut lock = Lock::default();
    let mut out = Vec::new();
    let with_session = Request { session: Some(7), session_lease: true, ..req("a", 100) };
    lock.acquire(&with_session, 1000, &mut tokens, &mut out).unwrap();
    let token = holder(&lock).unwrap().token;
    assert_eq!(lock.session_lease_of(token), Some(7));
    lock.enqueue(&Request { session: Some(8), session_lease: true, ..req("b", 100) }, "b").unwrap();
    assert!(!lock.expire_token(token, 5000, &mut tokens, &mut out), "past its deadline");
    lock.expire(None, 5000, &mut tokens, &mut out);
    assert_eq!(holder_owner(&lock), Some(&b"a"[..]));
    out.clear();
    lock.extend(token, 9000, &mut out).unwrap();
    assert_eq!(out, [Outcome::Changed { token, why: Change::Renewed, old_session: Some(7) }]);
    assert_eq!(holder(&lock).unwrap().deadline_ms, 9000);
    lock.renew(b"a", 50, 9000, &mut out).unwrap();
    assert_eq!(lock.session_lease_of(token), None, "renewed: a lease of its own");
    lock.acquire(&with_session, 9000, &mut tokens, &mut out).unwrap();
    assert_eq!(lock.session_lease_of(token), Some(7), "a reentry with 0 lives with the session again");
    lock.acquire(&req("a", 10), 9000, &mut tokens, &mut out).unwrap();
    assert_eq!((lock.session_lease_of(token), session(&lock)), (None, Some(7)), "a reentry with a lease");
    assert!(lock.expire_token(token, 9010, &mut tokens, &mut out));
    let b = holder(&lock).unwrap().token;
    assert_eq!((holder_owner(&lock), lock.session_lease_of(b)), (Some(&b"b"[..]), Some(8)), "the waiter's own terms");
}

#[test]
fn tokens_strictly_increase_and_follow_the_clock() {
    let mut tokens = TokenSource::default();
    let first = tokens.next(1000);
    assert!(first >= 1000 << 20);
    assert!(tokens.next(1000) > first);
    // A clock that stepped back must not make tokens go back.
    assert!(tokens.next(5) > first + 1);
    assert!(tokens.next(2000) >= 2000 << 20);
}

#[test]
fn observed_tokens_are_never_handed_out_again() {
    let mut tokens = TokenSource::default();
    let seen = (10_000 << 20) + 7;
    tokens.observe(seen);
    assert_eq!(tokens.next(1000), seen + 1);
    tokens.observe(5);
    assert_eq!(tokens.next(1000), seen + 2);
}

// --- Model test ---------------------------------------------------------

const OWNERS: [&[u8]; 4] = [b"a", b"b", b"c", b"d"];

#[derive(Debug, Clone)]
enum Op {
    Acquire(usize, u64),
    TryOrWait(usize, u64),
    Release(usize),
    Renew(usize, u64),
    ForceRelease,
    AdvanceTime(u64),
    RemoveWaiter(usize),
    /// FLOCK.CANCEL of an owner, waiting or not.
    Cancel(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let (who, lease) = (0..OWNERS.len(), 1u64..50);
    prop_oneof![
        2 => (who.clone(), lease.clone()).prop_map(|(o, l)| Op::Acquire(o, l)),
        4 => (who.clone(), lease.clone()).prop_map(|(o, l)| Op::TryOrWait(o, l)),
        3 => who.clone().prop_map(Op::Release),
        1 => (who, lease).prop_map(|(o, l)| Op::Renew(o, l)),
        1 => Just(Op::ForceRelease),
        2 => (0u64..60).prop_map(Op::AdvanceTime),
        2 => any::<usize>().prop_map(Op::RemoveWaiter),
        1 => (0..OWNERS.len()).prop_map(Op::Cancel),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    owner: usize,
    holds: u32,
    token: u64,
    deadline: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Queued {
    owner: usize,
    lease: u64,
    payload: u32,
    id: WaiterId,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Queued,
    Granted,
    Removed,
}

#[derive(Default)]
struct Model {
    now: u64,
    holder: Option<Held>,
    queue: VecDeque<Queued>,
    fate: HashMap<u32, Fate>,
    last_token: u64,
}

impl Model {
    fn grant(&mut self, owner: usize, token: u64, lease: u64) -> Result<(), TestCaseError> {
        prop_assert!(token > self.last_token, "token {} after {}", token, self.last_token);
        self.last_token = token;
        self.holder = Some(Held { owner, holds: 1, token, deadline: self.now + lease });
        Ok(())
    }

    /// The holder ended for `why` (the first outcome), then the head of the
    /// queue, and only it, was granted; nothing else happened.
    fn hand_off(&mut self, out: Outcomes<u32>, why: End) -> Result<(), TestCaseError> {
        let mut out = out.into_iter();
        match (self.holder.take(), out.next()) {
            (None, None) => return Ok(()),
            (Some(h), Some(Outcome::Ended { holder, terms, why: ended })) => {
                prop_assert_eq!((&*holder.owner, holder.token, ended), (OWNERS[h.owner], h.token, why));
                prop_assert_eq!(terms, Terms::default());
            }
            (h, o) => return Err(TestCaseError::fail(format!("holder {h:?} ended for {why:?}: {o:?}"))),
        }
        match (self.queue.pop_front(), out.next()) {
            (None, None) => {}
            (Some(w), Some(Outcome::Granted { token, waiter: Some(payload) })) => {
                prop_assert_eq!(payload, w.payload, "grants follow FIFO order");
                prop_assert_eq!(self.fate.insert(w.payload, Fate::Granted), Some(Fate::Queued));
                self.grant(w.owner, token, w.lease)?;
            }
            (w, o) => return Err(TestCaseError::fail(format!("head {w:?}, outcome {o:?}"))),
        }
        let rest: Vec<_> = out.collect();
        prop_assert!(rest.is_empty(), "unexpected outcomes {:?}", rest);
        Ok(())
    }

    fn check(&self, lock: &Lock<u32>) -> Result<(), TestCaseError> {
        prop_assert_eq!(lock.mode(), Mode::Exclusive);
        let held = exclusive(lock).map(|(h, t)| (&*h.owner, h.holds, h.token, h.deadline_ms, t));
        let want = self.holder.map(|h| (OWNERS[h.owner], h.holds, h.token, h.deadline, Terms::default()));
        prop_assert_eq!(held, want);
        prop_assert!(holder(lock).is_none_or(|h| h.holds >= 1));
        prop_assert_eq!(lock.holders().len(), usize::from(self.holder.is_some()));
        let queued: Vec<_> = lock.waiters().map(|w| (&*w.owner, w.payload)).collect();
        let want: Vec<_> = self.queue.iter().map(|w| (OWNERS[w.owner], w.payload)).collect();
        prop_assert_eq!(queued, want);
        prop_assert_eq!(lock.waiter_count(), self.queue.len());
        prop_assert!(!lock.head_fits(), "a waiter is never left behind a lock it could take");
        // Every payload ever enqueued is accounted for exactly once.
        let still_queued = self.fate.values().filter(|f| **f == Fate::Queued).count();
        prop_assert_eq!(still_queued, self.queue.len());
        prop_assert_eq!(lock.is_idle(), self.holder.is_none() && self.queue.is_empty());
        // Time only moves in AdvanceTime, which expires right away.
        prop_assert!(holder(lock).is_none_or(|h| h.deadline_ms > self.now));
        Ok(())
    }
}

fn request(who: usize, lease_ms: u64) -> Request<'static> {
    Request { owner: OWNERS[who], ..req("", lease_ms) }
}

/// Checks one acquire against the model; whether it answered `Busy`.
fn acquire(
    lock: &mut Lock<u32>,
    m: &mut Model,
    tokens: &mut TokenSource,
    who: usize,
    lease: u64,
) -> Result<bool, TestCaseError> {
    let mut out = Vec::new();
    let got = lock.acquire(&request(who, lease), m.now, tokens, &mut out);
    match (&mut m.holder, &got) {
        (Some(h), Ok(Acquired::Reentered(token))) if h.owner == who => {
            prop_assert_eq!(*token, h.token);
            prop_assert_eq!(out, vec![Outcome::Changed { token: h.token, why: Change::Reentered, old_session: None }]);
            h.holds += 1;
            h.deadline = m.now + lease;
        }
        (_, Err(LockError::AlreadyQueued)) => {
            prop_assert!(m.queue.iter().any(|w| w.owner == who));
            prop_assert!(out.is_empty());
        }
        (Some(h), Ok(Acquired::Busy)) => {
            prop_assert!(h.owner != who && m.queue.iter().all(|w| w.owner != who));
            prop_assert!(out.is_empty());
        }
        (None, Ok(Acquired::Granted(token))) if m.queue.is_empty() => {
            prop_assert_eq!(out, vec![Outcome::Granted { token: *token, waiter: None }]);
            m.grant(who, *token, lease)?;
        }
        (h, got) => return Err(TestCaseError::fail(format!("{got:?} with {h:?}, {:?}", m.queue))),
    }
    Ok(got == Ok(Acquired::Busy))
}

proptest! {
    #[test]
    fn lock_behaves_like_its_model(ops in prop::collection::vec(op(), 1..200)) {
        let mut lock = Lock::<u32>::default();
        let mut tokens = TokenSource::default();
        let mut m = Model { now: 1, ..Model::default() };
        let mut next_payload = 0u32;
        for op in ops {
            let mut out = Vec::new();
            match op {
                Op::Acquire(who, lease) => { acquire(&mut lock, &mut m, &mut tokens, who, lease)?; }
                Op::TryOrWait(who, lease) => {
                    if acquire(&mut lock, &mut m, &mut tokens, who, lease)? {
                        let id = lock.enqueue(&request(who, lease), next_payload).unwrap();
                        m.queue.push_back(Queued { owner: who, lease, payload: next_payload, id });
                        m.fate.insert(next_payload, Fate::Queued);
                        next_payload += 1;
                    }
                }
                Op::Release(who) => match (lock.release(OWNERS[who], m.now, &mut tokens, &mut out), &mut m.holder) {
                    (Ok(left), Some(h)) if h.owner == who && h.holds > 1 => {
                        h.holds -= 1;
                        prop_assert_eq!(left, h.holds);
                        let changed = Outcome::Changed { token: h.token, why: Change::HoldReleased, old_session: None };
                        prop_assert_eq!(std::mem::take(&mut out), vec![changed]);
                    }
                    (Ok(0), Some(h)) if h.owner == who && h.holds == 1 => {
                        m.hand_off(std::mem::take(&mut out), End::Released)?;
                    }
                    (Err(LockError::NotOwner), h) => prop_assert!(h.is_none_or(|h| h.owner != who)),
                    (got, h) => prop_assert!(false, "release by {} gave {:?}, {:?}", who, got, h),
                },
                Op::Renew(who, lease) => match (lock.renew(OWNERS[who], lease, m.now, &mut out), &mut m.holder) {
                    (Ok(token), Some(h)) if h.owner == who => {
                        prop_assert_eq!(token, h.token);
                        h.deadline = m.now + lease;
                        let changed = Outcome::Changed { token, why: Change::Renewed, old_session: None };
                        prop_assert_eq!(std::mem::take(&mut out), vec![changed]);
                    }
                    (Err(LockError::NotOwner), h) => prop_assert!(h.is_none_or(|h| h.owner != who)),
                    (got, h) => prop_assert!(false, "renew by {} gave {:?} with {:?}", who, got, h),
                },
                Op::ForceRelease => {
                    let ended = lock.end_all(End::ForceReleased, m.now, &mut tokens, &mut out);
                    prop_assert_eq!(ended, usize::from(m.holder.is_some()));
                    m.hand_off(std::mem::take(&mut out), End::ForceReleased)?;
                }
                Op::AdvanceTime(ms) => {
                    m.now += ms;
                    lock.expire(None, m.now, &mut tokens, &mut out);
                    let due = m.holder.is_some_and(|h| h.deadline <= m.now);
                    prop_assert_eq!(due, !out.is_empty(), "a lease ends when due, and only then: {:?}", out);
                    if due {
                        m.hand_off(std::mem::take(&mut out), End::LeaseEnded)?;
                    }
                }
                Op::RemoveWaiter(i) if !m.queue.is_empty() => {
                    let w = m.queue.remove(i % m.queue.len()).unwrap();
                    prop_assert!(lock.remove_waiter(w.id, Leave::TimedOut, &mut out));
                    prop_assert!(!lock.remove_waiter(w.id, Leave::TimedOut, &mut out), "a handle works once");
                    prop_assert_eq!(std::mem::take(&mut out), vec![Outcome::Left { waiter: w.payload, why: Leave::TimedOut }]);
                    prop_assert_eq!(m.fate.insert(w.payload, Fate::Removed), Some(Fate::Queued));
                }
                Op::RemoveWaiter(_) => {}
                Op::Cancel(who) => {
                    let at = m.queue.iter().position(|w| w.owner == who);
                    prop_assert_eq!(lock.cancel(OWNERS[who], m.now, &mut tokens, &mut out), at.is_some());
                    if let Some(at) = at {
                        let w = m.queue.remove(at).unwrap();
                        let left = vec![Outcome::Left { waiter: w.payload, why: Leave::Cancelled }];
                        prop_assert_eq!(std::mem::take(&mut out), left, "a waiter only leaves: the holder stays");
                        prop_assert_eq!(m.fate.insert(w.payload, Fate::Removed), Some(Fate::Queued));
                    }
                }
            }
            prop_assert!(out.is_empty(), "outcomes of a refused operation: {:?}", out);
            m.check(&lock)?;
        }
    }
}

// --- Multi-key model test -------------------------------------------------
//
// Several locks share one `TokenSource`, as in the module. The test plays
// the Redis layer's part (lease timers, WAIT timeouts, closed connections,
// SESSION bindings, undelivered grants) with plain bookkeeping, checks
// every answer and outcome of the core against a reference model after
// every step, and counts `INFO flock` as the module does: every outcome
// through the effects table.

mod multi {
    use super::*;

    const KEYS: usize = 3;
    const CONNS: usize = 5;
    const OWNERS: [&[u8]; 5] = [b"o0", b"o1", b"o2", b"o3", b"o4"];
    const MAX_LEASE: u64 = 200;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Wait {
        Try,
        Timeout,
        Forever,
    }

    #[derive(Debug, Clone)]
    enum Op {
        Acquire {
            conn: usize,
            owner: usize,
            key: usize,
            lease: u64,
            session: bool,
            wait: Wait,
        },
        Release {
            conn: usize,
            owner: usize,
            key: usize,
        },
        /// Release by whoever holds `key` now (random owners mostly get NOTOWNER).
        ReleaseHeld {
            conn: usize,
            key: usize,
        },
        Renew {
            conn: usize,
            owner: usize,
            key: usize,
            lease: u64,
        },
        RenewHeld {
            conn: usize,
            key: usize,
            lease: u64,
        },
        ForceRelease {
            conn: usize,
            key: usize,
        },
        /// Time passes and due lease timers fire.
        Advance(u64),
        /// The WAIT timeout of the i-th queued waiter that has one fires.
        Timeout(usize),
        /// The i-th pending grant reply reaches its client.
        Deliver(usize),
        /// The connection closes (its slot is reused by a new client id).
        Disconnect(usize),
        /// The i-th connection with a pending grant reply closes.
        DisconnectGranted(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        let (conn, owner, key, lease) = (0..CONNS, 0..OWNERS.len(), 0..KEYS, 1..MAX_LEASE);
        let wait = prop_oneof![Just(Wait::Try), Just(Wait::Timeout), Just(Wait::Forever)];
        prop_oneof![
            6 => (conn.clone(), owner.clone(), key.clone(), lease.clone(), any::<bool>(), wait).prop_map(
                |(conn, owner, key, lease, session, wait)| Op::Acquire { conn, owner, key, lease, session, wait }),
            2 => (conn.clone(), owner.clone(), key.clone()).prop_map(|(conn, owner, key)| Op::Release { conn, owner, key }),
            4 => (conn.clone(), key.clone()).prop_map(|(conn, key)| Op::ReleaseHeld { conn, key }),
            1 => (conn.clone(), owner, key.clone(), lease.clone())
                .prop_map(|(conn, owner, key, lease)| Op::Renew { conn, owner, key, lease }),
            1 => (conn.clone(), key.clone(), lease).prop_map(|(conn, key, lease)| Op::RenewHeld { conn, key, lease }),
            1 => (conn.clone(), key).prop_map(|(conn, key)| Op::ForceRelease { conn, key }),
            3 => (0u64..40).prop_map(Op::Advance),
            2 => any::<usize>().prop_map(Op::Timeout),
            1 => any::<usize>().prop_map(Op::Deliver),
            1 => conn.prop_map(Op::Disconnect),
            1 => any::<usize>().prop_map(Op::DisconnectGranted),
        ]
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct Held {
        owner: usize,
        holds: u32,
        token: u64,
        deadline: u64,
        session: Option<u64>,
    }

    #[derive(Debug, Clone, Copy)]
    struct Queued {
        owner: usize,
        conn: usize,
        lease: u64,
        session: bool,
        timeout: bool,
        payload: u32,
        id: WaiterId,
    }

    #[derive(Default)]
    struct Key {
        holder: Option<Held>,
        queue: VecDeque<Queued>,
        last_token: u64,
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Conn {
        Idle,
        /// Blocked in ACQUIRE ... WAIT: it can send nothing else.
        Waiting(u32),
        /// Granted, the reply not yet written: still blocked.
        Granted {
            key: usize,
            token: u64,
            id: WaiterId,
        },
    }

    /// The counter of `INFO flock` the model expects a grant's end to bump.
    fn counter_of(why: End) -> Counter {
        match why {
            End::Released => Counter::Releases,
            End::LeaseEnded => Counter::LeaseExpiries,
            End::ForceReleased => Counter::ForceReleases,
            End::SessionClosed => Counter::SessionReleases,
            End::Undelivered => Counter::UndeliveredGrants,
            End::Deleted => Counter::Deletions,
            End::Replaced => unreachable!("nothing is replicated here"),
            End::Moved => unreachable!("no key leaves for another server here"),
        }
    }

    /// The counter the model expects a waiter's leaving to bump.
    fn left_counter(why: Leave) -> Counter {
        match why {
            Leave::TimedOut | Leave::Unblocked => Counter::WaitTimeouts,
            Leave::Disconnected => Counter::WaitDisconnects,
            Leave::Deleted => Counter::WaitersDeleted,
            Leave::Demoted => Counter::WaitersDemoted,
            Leave::Resent => Counter::WaitersResent,
            Leave::Cancelled => Counter::WaitCancels,
            Leave::HoldLost => unreachable!("no wait for several keys here"),
        }
    }

    struct World {
        now: u64,
        locks: Vec<Lock<u32>>,
        tokens: TokenSource,
        keys: Vec<Key>,
        conns: [Conn; CONNS],
        /// The client id of the connection in each slot.
        client: [u64; CONNS],
        fate: HashMap<u32, Fate>,
        next_payload: u32,
        last_token: u64,
        /// `INFO flock` as the module counts it: each outcome of the core
        /// through `effects`.
        counters: Counters,
        /// What the model says they must be.
        expected: Counters,
        /// Waiters ever queued (no counter has them).
        enqueued: u64,
    }

    /// What the model says an acquire must answer.
    #[derive(Debug, PartialEq, Eq)]
    enum Expect {
        Reentered(u64),
        AlreadyQueued,
        Busy,
        Granted,
    }

    impl World {
        fn new() -> Self {
            World {
                now: 1,
                locks: (0..KEYS).map(|_| Lock::default()).collect(),
                tokens: TokenSource::default(),
                keys: (0..KEYS).map(|_| Key::default()).collect(),
                conns: [Conn::Idle; CONNS],
                client: std::array::from_fn(|i| i as u64 + 1),
                fate: HashMap::new(),
                next_payload: 0,
                last_token: 0,
                counters: Counters::default(),
                expected: Counters::default(),
                enqueued: 0,
            }
        }

        /// Runs one operation on `key`'s lock and counts each of its
        /// outcomes through the effects table, as the Redis layer does; the
        /// outcomes are the model's to check.
        fn run<R>(
            &mut self,
            key: usize,
            op: impl FnOnce(&mut Lock<u32>, u64, &mut TokenSource, &mut Outcomes<u32>) -> R,
        ) -> (R, Outcomes<u32>) {
            let mut out = Vec::new();
            let result = op(&mut self.locks[key], self.now, &mut self.tokens, &mut out);
            for outcome in &out {
                for &counter in crate::effects::effects(outcome).counters {
                    self.counters.bump(counter, 1);
                }
            }
            (result, out)
        }

        fn new_holder(
            &mut self,
            key: usize,
            owner: usize,
            token: u64,
            lease: u64,
            session: Option<u64>,
        ) -> Result<(), TestCaseError> {
            let k = &mut self.keys[key];
            prop_assert!(token > k.last_token, "key {}: token {} after {}", key, token, k.last_token);
            prop_assert!(token > self.last_token, "shared source: token {} after {}", token, self.last_token);
            (k.last_token, self.last_token) = (token, token);
            prop_assert!(k.holder.is_none(), "key {}: granted over holder {:?}", key, k.holder);
            k.holder = Some(Held { owner, holds: 1, token, deadline: self.now + lease, session });
            self.expected.bump(Counter::Grants, 1);
            Ok(())
        }

        /// The holder of `key`, if any, ended for `why` (the first outcome);
        /// then the head of its queue, and only it, was granted (the rest).
        /// Whether a holder ended.
        fn ended(&mut self, key: usize, out: Outcomes<u32>, why: End) -> Result<bool, TestCaseError> {
            let mut out = out.into_iter();
            let Some(h) = self.keys[key].holder.take() else {
                let rest: Vec<_> = out.collect();
                prop_assert!(rest.is_empty(), "key {}: nobody held it, yet {:?}", key, rest);
                return Ok(false);
            };
            match out.next() {
                Some(Outcome::Ended { holder, terms, why: ended }) => {
                    let got = (&*holder.owner, holder.token, holder.deadline_ms, terms.session, ended);
                    prop_assert_eq!(got, (OWNERS[h.owner], h.token, h.deadline, h.session, why), "key {}", key);
                }
                other => prop_assert!(false, "key {}: {:?} should have ended for {:?}: {:?}", key, h, why, other),
            }
            self.expected.bump(counter_of(why), 1);
            self.hand_off(key, out.collect())?;
            Ok(true)
        }

        /// `key` is free: the head of its queue, and only it, must have been
        /// granted, and its connection now has a grant reply pending.
        fn hand_off(&mut self, key: usize, out: Outcomes<u32>) -> Result<(), TestCaseError> {
            let mut out = out.into_iter();
            match (self.keys[key].queue.pop_front(), out.next()) {
                (None, None) => {}
                (Some(w), Some(Outcome::Granted { token, waiter: Some(payload) })) => {
                    prop_assert_eq!(payload, w.payload, "key {}: grants follow FIFO order", key);
                    prop_assert_eq!(self.fate.insert(w.payload, Fate::Granted), Some(Fate::Queued), "granted twice");
                    prop_assert_eq!(self.conns[w.conn], Conn::Waiting(w.payload));
                    self.conns[w.conn] = Conn::Granted { key, token, id: w.id };
                    self.expected.bump(Counter::Handoffs, 1);
                    let session = w.session.then_some(self.client[w.conn]);
                    self.new_holder(key, w.owner, token, w.lease, session)?;
                }
                (w, o) => prop_assert!(false, "key {}: head {:?}, outcome {:?}", key, w, o),
            }
            let rest: Vec<_> = out.collect();
            prop_assert!(rest.is_empty(), "key {}: unexpected outcomes {:?}", key, rest);
            Ok(())
        }

        /// What every command on `key` does first (`engine::update`), and
        /// what its lease timer does: end a lease that has run out.
        fn expire(&mut self, key: usize) -> Result<(), TestCaseError> {
            let holder = self.keys[key].holder;
            let ((), out) = self.run(key, |lock, now, tokens, out| lock.expire(None, now, tokens, out));
            if holder.is_some_and(|h| h.deadline <= self.now) {
                prop_assert!(self.ended(key, out, End::LeaseEnded)?);
            } else {
                prop_assert!(out.is_empty(), "key {}: {:?} not due, yet {:?}", key, holder, out);
            }
            Ok(())
        }

        /// A connection that sends a command has read any pending reply;
        /// false if it is blocked.
        fn ready(&mut self, conn: usize) -> Result<bool, TestCaseError> {
            match self.conns[conn] {
                Conn::Idle => Ok(true),
                Conn::Waiting(_) => Ok(false),
                Conn::Granted { .. } => self.deliver(conn).map(|_| true),
            }
        }

        fn deliver(&mut self, conn: usize) -> Result<(), TestCaseError> {
            if let Conn::Granted { key, id, .. } = self.conns[conn] {
                // A stale handle (its timer or disconnect firing late) never
                // removes a later waiter.
                self.stale(key, id)?;
                self.conns[conn] = Conn::Idle;
            }
            Ok(())
        }

        fn stale(&mut self, key: usize, id: WaiterId) -> Result<(), TestCaseError> {
            let (removed, out) = self.run(key, |lock, _, _, out| lock.remove_waiter(id, Leave::Disconnected, out));
            prop_assert!(!removed && out.is_empty(), "stale handle removed a waiter: {:?}", out);
            Ok(())
        }

        fn expected_acquire(&self, key: usize, owner: usize) -> Expect {
            let k = &self.keys[key];
            match k.holder {
                Some(h) if h.owner == owner => Expect::Reentered(h.token),
                _ if k.queue.iter().any(|w| w.owner == owner) => Expect::AlreadyQueued,
                Some(_) => Expect::Busy,
                None if !k.queue.is_empty() => Expect::Busy,
                None => Expect::Granted,
            }
        }

        fn acquire(
            &mut self,
            conn: usize,
            owner: usize,
            key: usize,
            lease: u64,
            session: bool,
            wait: Wait,
        ) -> Result<(), TestCaseError> {
            self.expire(key)?;
            let session = session.then_some(self.client[conn]);
            let req = Request {
                owner: OWNERS[owner],
                lease_ms: lease,
                session,
                session_lease: false,
                id: None,
                want: Want::Exclusive,
                lock_delay_ms: 0,
            };
            let expect = self.expected_acquire(key, owner);
            let (got, out) = self.run(key, |lock, now, tokens, out| lock.acquire(&req, now, tokens, out));
            match (expect, got) {
                (Expect::Reentered(t), Ok(Acquired::Reentered(token))) => {
                    prop_assert_eq!(token, t);
                    let h = self.keys[key].holder.as_mut().unwrap();
                    let changed = Outcome::Changed { token, why: Change::Reentered, old_session: h.session };
                    prop_assert_eq!(out, vec![changed]);
                    h.holds += 1;
                    h.deadline = self.now + lease;
                    if session.is_some() {
                        h.session = session;
                    }
                    self.expected.bump(Counter::ReentrantAcquires, 1);
                    return Ok(());
                }
                (Expect::AlreadyQueued, Err(LockError::AlreadyQueued)) => {}
                (Expect::Busy, Ok(Acquired::Busy)) if wait == Wait::Try => {}
                (Expect::Busy, Ok(Acquired::Busy)) => {
                    let payload = self.next_payload;
                    self.next_payload += 1;
                    let id = self.locks[key].enqueue(&req, payload);
                    prop_assert!(id.is_ok(), "enqueue after Busy: {:?}", id.err());
                    let timeout = wait == Wait::Timeout;
                    let w =
                        Queued { owner, conn, lease, session: session.is_some(), timeout, payload, id: id.unwrap() };
                    self.keys[key].queue.push_back(w);
                    self.fate.insert(payload, Fate::Queued);
                    self.conns[conn] = Conn::Waiting(payload);
                    self.enqueued += 1;
                }
                (Expect::Granted, Ok(Acquired::Granted(token))) => {
                    prop_assert_eq!(out, vec![Outcome::Granted { token, waiter: None }]);
                    self.expected.bump(Counter::ImmediateGrants, 1);
                    return self.new_holder(key, owner, token, lease, session);
                }
                (expect, got) => prop_assert!(
                    false,
                    "acquire {} by {} on {}: expected {:?}, got {:?}",
                    key,
                    owner,
                    conn,
                    expect,
                    got
                ),
            }
            prop_assert!(out.is_empty(), "a refused or busy acquire changed {:?}", out);
            Ok(())
        }

        fn release(&mut self, owner: usize, key: usize) -> Result<(), TestCaseError> {
            self.expire(key)?;
            let holder = self.keys[key].holder.filter(|h| h.owner == owner);
            let (got, out) = self.run(key, |lock, now, tokens, out| lock.release(OWNERS[owner], now, tokens, out));
            match (got, holder) {
                (Ok(left), Some(h)) if h.holds > 1 => {
                    prop_assert_eq!(left, h.holds - 1);
                    let changed =
                        Outcome::Changed { token: h.token, why: Change::HoldReleased, old_session: h.session };
                    prop_assert_eq!(out, vec![changed]);
                    self.keys[key].holder.as_mut().unwrap().holds -= 1;
                }
                (Ok(0), Some(h)) if h.holds == 1 => {
                    prop_assert!(self.ended(key, out, End::Released)?);
                }
                (Err(LockError::NotOwner), None) => prop_assert!(out.is_empty()),
                (got, h) => prop_assert!(false, "release {} by {}: {:?} with {:?}", key, owner, got, h),
            }
            Ok(())
        }

        fn renew(&mut self, owner: usize, key: usize, lease: u64) -> Result<(), TestCaseError> {
            self.expire(key)?;
            let (got, out) = self.run(key, |lock, now, _, out| lock.renew(OWNERS[owner], lease, now, out));
            let now = self.now;
            match (got, self.keys[key].holder.as_mut().filter(|h| h.owner == owner)) {
                (Ok(token), Some(h)) => {
                    prop_assert_eq!(token, h.token);
                    let changed = Outcome::Changed { token, why: Change::Renewed, old_session: h.session };
                    prop_assert_eq!(out, vec![changed]);
                    h.deadline = now + lease;
                }
                (Err(LockError::NotOwner), None) => prop_assert!(out.is_empty()),
                (got, h) => prop_assert!(false, "renew {} by {}: {:?} with {:?}", key, owner, got, h),
            }
            Ok(())
        }

        /// Ends the grant with `token` on `key` (a closed SESSION, an
        /// undelivered grant passed on); whether it was held.
        fn end(&mut self, key: usize, token: u64, why: End) -> Result<bool, TestCaseError> {
            let held = self.keys[key].holder.is_some_and(|h| h.token == token);
            let (ended, out) = self.run(key, |lock, now, tokens, out| lock.end(token, why, now, tokens, out));
            prop_assert_eq!(ended, held, "key {}: end of {}", key, token);
            if held {
                prop_assert!(self.ended(key, out, why)?);
            } else {
                prop_assert!(out.is_empty(), "key {}: ending a grant not held did {:?}", key, out);
            }
            Ok(held)
        }

        fn force_release(&mut self, key: usize) -> Result<(), TestCaseError> {
            self.expire(key)?;
            let (count, out) =
                self.run(key, |lock, now, tokens, out| lock.end_all(End::ForceReleased, now, tokens, out));
            prop_assert_eq!(count, usize::from(self.keys[key].holder.is_some()));
            self.ended(key, out, End::ForceReleased)?;
            Ok(())
        }

        fn advance(&mut self, ms: u64) -> Result<(), TestCaseError> {
            self.now += ms;
            (0..KEYS).try_for_each(|key| self.expire(key))
        }

        /// Takes a queued waiter out (timeout or disconnect).
        fn leave(&mut self, key: usize, index: usize, why: Leave) -> Result<usize, TestCaseError> {
            let w = self.keys[key].queue.remove(index).unwrap();
            let (removed, out) = self.run(key, |lock, _, _, out| lock.remove_waiter(w.id, why, out));
            prop_assert!(removed);
            prop_assert_eq!(out, vec![Outcome::Left { waiter: w.payload, why }]);
            self.expected.bump(left_counter(why), 1);
            self.stale(key, w.id)?;
            prop_assert!(!self.locks[key].head_fits(), "key {}: nobody behind it can take the lock", key);
            prop_assert_eq!(self.fate.insert(w.payload, Fate::Removed), Some(Fate::Queued));
            prop_assert_eq!(self.conns[w.conn], Conn::Waiting(w.payload));
            self.conns[w.conn] = Conn::Idle;
            Ok(w.conn)
        }

        fn timeout(&mut self, i: usize) -> Result<(), TestCaseError> {
            let timed: Vec<(usize, usize)> = (0..KEYS)
                .flat_map(|k| {
                    self.keys[k].queue.iter().enumerate().filter(|(_, w)| w.timeout).map(move |(i, _)| (k, i))
                })
                .collect();
            if let Some(&(key, index)) = timed.get(i % timed.len().max(1)) {
                self.leave(key, index, Leave::TimedOut)?;
            }
            Ok(())
        }

        /// The i-th connection whose grant reply is pending.
        fn granted_conn(&self, i: usize) -> Option<usize> {
            let pending: Vec<usize> = (0..CONNS).filter(|&c| matches!(self.conns[c], Conn::Granted { .. })).collect();
            pending.get(i % pending.len().max(1)).copied()
        }

        /// The owner holding `key` now (owner 0 if nobody does).
        fn holder_or_not(&self, key: usize) -> usize {
            self.keys[key].holder.map_or(0, |h| h.owner)
        }

        /// As the module does on a closed connection: its waiter leaves, its
        /// SESSION locks are released, and a grant it never read is passed on.
        fn disconnect(&mut self, conn: usize) -> Result<(), TestCaseError> {
            if let Conn::Waiting(payload) = self.conns[conn] {
                let key = (0..KEYS).find(|&k| self.keys[k].queue.iter().any(|w| w.payload == payload)).unwrap();
                let index = self.keys[key].queue.iter().position(|w| w.payload == payload).unwrap();
                self.leave(key, index, Leave::Disconnected)?;
            }
            let client = self.client[conn];
            for key in 0..KEYS {
                let bound = |k: &Key| k.holder.filter(|h| h.session == Some(client)).map(|h| h.token);
                if bound(&self.keys[key]).is_some() {
                    self.expire(key)?;
                }
                if let Some(token) = bound(&self.keys[key]) {
                    prop_assert!(self.end(key, token, End::SessionClosed)?);
                }
            }
            if let Conn::Granted { key, token, id } = self.conns[conn] {
                self.stale(key, id)?;
                // Passed on if still held (not yet expired, released, ...).
                self.end(key, token, End::Undelivered)?;
            }
            self.conns[conn] = Conn::Idle;
            self.client[conn] += CONNS as u64;
            Ok(())
        }

        fn apply(&mut self, op: Op) -> Result<(), TestCaseError> {
            // A command comes from a connection that is not blocked.
            let sender = match op {
                Op::Acquire { conn, .. }
                | Op::Release { conn, .. }
                | Op::ReleaseHeld { conn, .. }
                | Op::Renew { conn, .. }
                | Op::RenewHeld { conn, .. }
                | Op::ForceRelease { conn, .. } => Some(conn),
                _ => None,
            };
            if let Some(conn) = sender {
                if !self.ready(conn)? {
                    return Ok(());
                }
            }
            match op {
                Op::Acquire { conn, owner, key, lease, session, wait } => {
                    self.acquire(conn, owner, key, lease, session, wait)
                }
                Op::Release { owner, key, .. } => self.release(owner, key),
                Op::ReleaseHeld { key, .. } => self.release(self.holder_or_not(key), key),
                Op::Renew { owner, key, lease, .. } => self.renew(owner, key, lease),
                Op::RenewHeld { key, lease, .. } => self.renew(self.holder_or_not(key), key, lease),
                Op::ForceRelease { key, .. } => self.force_release(key),
                Op::Advance(ms) => self.advance(ms),
                Op::Timeout(i) => self.timeout(i),
                Op::Deliver(i) => self.granted_conn(i).map_or(Ok(()), |conn| self.deliver(conn)),
                Op::Disconnect(conn) => self.disconnect(conn),
                Op::DisconnectGranted(i) => self.granted_conn(i).map_or(Ok(()), |conn| self.disconnect(conn)),
            }
        }

        fn check(&self) -> Result<(), TestCaseError> {
            let mut queued = 0;
            for (key, (lock, k)) in self.locks.iter().zip(&self.keys).enumerate() {
                prop_assert_eq!(lock.mode(), Mode::Exclusive, "key {}", key);
                prop_assert!(lock.holders().len() <= 1, "key {}: an exclusive lock has one holder", key);
                let held =
                    exclusive(lock).map(|(h, t)| (&*h.owner, h.holds, h.token, h.deadline_ms, t.session, t.permits));
                let want = k.holder.map(|h| (OWNERS[h.owner], h.holds, h.token, h.deadline, h.session, 0));
                prop_assert_eq!(held, want, "key {} holder", key);
                prop_assert!(holder(lock).is_none_or(|h| h.holds >= 1));
                let got: Vec<_> = lock.waiters().map(|w| (&*w.owner, w.payload, w.lease_ms, w.session)).collect();
                let want: Vec<_> = k
                    .queue
                    .iter()
                    .map(|w| (OWNERS[w.owner], w.payload, w.lease, w.session.then_some(self.client[w.conn])))
                    .collect();
                prop_assert_eq!(got, want, "key {} queue", key);
                prop_assert_eq!(lock.waiter_count(), k.queue.len());
                prop_assert_eq!(lock.is_idle(), k.holder.is_none() && k.queue.is_empty());
                // Nobody waits behind itself, and an owner queues once per lock.
                let mut owners: Vec<usize> = k.queue.iter().map(|w| w.owner).collect();
                prop_assert!(k.holder.is_none_or(|h| !owners.contains(&h.owner)));
                owners.sort_unstable();
                owners.dedup();
                prop_assert_eq!(owners.len(), k.queue.len());
                // A queue is never left behind a free lock.
                prop_assert!(k.holder.is_some() || k.queue.is_empty(), "key {}: waiters behind a free lock", key);
                queued += k.queue.len();
            }
            // Every waiter ever queued is either still queued (exactly once,
            // its connection blocked on it), granted once, or gone once.
            let still = self.fate.values().filter(|f| **f == Fate::Queued).count();
            prop_assert_eq!(still, queued);
            let blocked = self.conns.iter().filter(|c| matches!(c, Conn::Waiting(_))).count();
            prop_assert_eq!(blocked, queued);
            // The outcomes counted what the model expects, counter by counter.
            for counter in Counter::ALL {
                prop_assert_eq!(self.counters.get(counter), self.expected.get(counter), "flock_{}", counter.name());
            }
            // INFO flock's sums: every grant was immediate or a hand-off,
            // and ended one way or is still held; every waiter was granted,
            // left or still waits.
            let c = |counter| self.counters.get(counter);
            let held = self.keys.iter().filter(|k| k.holder.is_some()).count() as u64;
            prop_assert_eq!(c(Counter::Grants), c(Counter::ImmediateGrants) + c(Counter::Handoffs));
            let ends = [
                Counter::Releases,
                Counter::LeaseExpiries,
                Counter::ForceReleases,
                Counter::SessionReleases,
                Counter::UndeliveredGrants,
            ];
            prop_assert_eq!(c(Counter::Grants), ends.iter().map(|&e| c(e)).sum::<u64>() + held);
            let waits = c(Counter::Handoffs) + c(Counter::WaitTimeouts) + c(Counter::WaitDisconnects);
            prop_assert_eq!(self.enqueued, waits + queued as u64);
            Ok(())
        }

        /// Releases everything: every connection reads its replies, then
        /// holders release all their holds until no lock is held (waiters
        /// are granted in turn); or, with `by_expiry`, time runs until every
        /// lease ran out.
        fn wind_down(&mut self, by_expiry: bool) -> Result<(), TestCaseError> {
            for _ in 0..(KEYS * (CONNS + 1) * 2) {
                for conn in 0..CONNS {
                    self.deliver(conn)?;
                }
                if by_expiry {
                    self.advance(MAX_LEASE)?;
                } else {
                    for key in 0..KEYS {
                        if let Some(h) = self.keys[key].holder {
                            // From any connection: the holder's own may be blocked.
                            (0..h.holds).try_for_each(|_| self.release(h.owner, key))?;
                        }
                    }
                }
                self.check()?;
            }
            for (key, lock) in self.locks.iter().enumerate() {
                prop_assert!(lock.is_idle(), "key {} not idle after everything was released", key);
            }
            prop_assert!(self.fate.values().all(|f| *f != Fate::Queued));
            prop_assert!(self.conns.iter().all(|c| *c == Conn::Idle));
            Ok(())
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]
        #[test]
        fn locks_behave_like_their_model(ops in prop::collection::vec(op(), 1..300), by_expiry in any::<bool>()) {
            let mut w = World::new();
            for op in ops {
                w.apply(op)?;
                w.check()?;
            }
            w.wind_down(by_expiry)?;
        }
    }
}

#[test]
fn tokens_saturate_at_the_largest_signed_64_bit_value_instead_of_wrapping() {
    let mut tokens = TokenSource::default();
    tokens.observe(MAX_TOKEN - 1);
    assert_eq!(tokens.next(1_700_000_000_000), MAX_TOKEN);
    assert_eq!(tokens.next(1_700_000_000_000), MAX_TOKEN);
    assert_eq!(tokens.next(u64::MAX), MAX_TOKEN, "the clock part never passes it either");
}

fn with_id<'a>(owner: &'a str, id: &'a str) -> Request<'a> {
    Request { id: Some(RequestId { id: id.as_bytes(), window_ms: 1000 }), ..req(owner, 100) }
}

#[test]
fn a_resent_acquire_answers_its_token_and_adds_no_hold_while_its_grant_is_held() {
    let mut tokens = TokenSource::default();
    let mut lock = Lock::<()>::default();
    let mut out = Vec::new();
    let Ok(Acquired::Granted(token)) = lock.acquire(&with_id("a", "r1"), 1000, &mut tokens, &mut out) else { panic!() };
    out.clear();
    assert_eq!(lock.repeat(b"r1", Kind::Acquire, b"a", 1500), Ok(Some(token)));
    assert_eq!(holder(&lock).unwrap().holds, 1, "asking changed nothing");
    // Released and taken by another: the ID's grant is gone, a resend is new.
    lock.release(b"a", 1600, &mut tokens, &mut out).unwrap();
    lock.acquire(&req("b", 100), 1600, &mut tokens, &mut out).unwrap();
    assert_eq!(lock.repeat(b"r1", Kind::Acquire, b"a", 1600), Ok(None));
}

#[test]
fn a_resent_release_answers_its_first_reply_until_the_window_ends() {
    let mut tokens = TokenSource::default();
    let (mut lock, _) = held_by_a_with_b_queued(&mut tokens);
    let mut out = Vec::new();
    let left = lock.release(b"a", 1010, &mut tokens, &mut out).unwrap();
    lock.remember(Some(RequestId { id: b"r2", window_ms: 1000 }), Kind::Release, u64::from(left), 1010);
    assert_eq!(one(&out).map(|g| g.0), Some("b"), "b got the lock");
    assert_eq!(lock.repeat(b"r2", Kind::Release, b"a", 2009), Ok(Some(0)), "not NOTOWNER");
    assert_eq!(lock.repeat(b"r2", Kind::Renew, b"a", 2009), Err(LockError::IdReused(Kind::Release)));
    assert_eq!(lock.repeat(b"r2", Kind::Release, b"a", 2010), Ok(None), "forgotten after the window");
}

#[test]
fn a_waiter_granted_later_remembers_its_id_with_the_grant() {
    let mut tokens = TokenSource::default();
    let mut lock = Lock::default();
    let mut out = Vec::new();
    lock.acquire(&req("a", 100), 1000, &mut tokens, &mut out).unwrap();
    lock.enqueue(&with_id("b", "rb"), "b").unwrap();
    out.clear();
    lock.release(b"a", 1050, &mut tokens, &mut out).unwrap();
    let (_, token) = one(&out).expect("b granted");
    assert_eq!(lock.repeat(b"rb", Kind::Acquire, b"b", 1100), Ok(Some(token)));
    // The grant was not delivered and is passed on.
    assert!(lock.end(token, End::Undelivered, 1100, &mut tokens, &mut out));
    assert_eq!(lock.repeat(b"rb", Kind::Acquire, b"b", 1100), Ok(None), "a resend is a new request");
}

#[test]
fn a_free_lock_gives_its_ids_away_and_takes_them_back_when_made_again() {
    let mut tokens = TokenSource::default();
    let mut lock = Lock::<()>::default();
    let mut out = Vec::new();
    lock.acquire(&with_id("a", "r"), 1000, &mut tokens, &mut out).unwrap();
    lock.release(b"a", 1000, &mut tokens, &mut out).unwrap();
    assert!(lock.is_idle());
    let ids = lock.take_requests().expect("the ID is remembered");
    assert!(lock.take_requests().is_none() && lock.heap_size() == 0, "nothing left in the lock");
    let mut again = Lock::<()>::default();
    again.adopt_requests(ids);
    assert_eq!(again.repeat(b"r", Kind::Release, b"a", 1500), Err(LockError::IdReused(Kind::Acquire)));
    assert_eq!(again.repeat(b"r", Kind::Acquire, b"a", 2000), Ok(None));
    assert_eq!(again.heap_size(), 0, "the window passed: nothing left");
}

#[test]
fn a_free_lock_that_remembers_ids_takes_any_mode() {
    let mut tokens = TokenSource::default();
    let mut lock = Lock::<()>::default();
    let mut out = Vec::new();
    let mut sem = with_id("a", "r");
    sem.want = Want::Permits { n: 1, limit: 3 };
    lock.acquire(&sem, 1000, &mut tokens, &mut out).unwrap();
    lock.release(b"a", 1000, &mut tokens, &mut out).unwrap();
    assert!(lock.requests().is_some_and(|r| r.len() == 1));
    assert!(matches!(lock.acquire(&req("b", 100), 1000, &mut tokens, &mut out), Ok(Acquired::Granted(_))));
}

#[test]
fn a_resent_wait_takes_over_its_place_in_the_queue_and_the_first_waiter_leaves() {
    let mut tokens = TokenSource::default();
    let mut lock = Lock::default();
    let mut out = Vec::new();
    lock.acquire(&req("a", 100), 1000, &mut tokens, &mut out).unwrap();
    out.clear();
    let first = lock.enqueue_with(&with_id("b", "w1"), || Some("b-first"), &mut out).unwrap().unwrap();
    assert!(out.is_empty(), "a new waiter replaces nobody");
    lock.enqueue(&req("c", 100), "c").unwrap();

    let resend = Request { lease_ms: 700, session: Some(9), ..with_id("b", "w1") };
    assert_eq!(lock.acquire(&resend, 1000, &mut tokens, &mut out), Ok(Acquired::Resent));
    assert!(out.is_empty(), "asking changed nothing");
    let taken = lock.enqueue_with(&resend, || Some("b-again"), &mut out).unwrap();
    assert_eq!(taken, Some(first), "the same place");
    assert_eq!(out, [Outcome::Left { waiter: "b-first", why: Leave::Resent }], "the first payload leaves");
    let queue: Vec<_> = lock.waiters().map(|w| (w.payload, w.lease_ms, w.session)).collect();
    assert_eq!(
        queue,
        [("b-again", 700, Some(9)), ("c", 100, None)],
        "b keeps its place before c, with the resend's lease and session"
    );
    out.clear();
    lock.release(b"a", 1001, &mut tokens, &mut out).unwrap();
    assert_eq!(one(&out).unwrap().0, "b-again");
}

/// A resend answered its grant's token from the request ID record binds
/// the grant to the resend's session (with that session's timeout as a
/// session grant's lease) and adds no hold; a resend with no session or
/// the same one changes nothing.
#[test]
fn a_resend_told_its_grant_binds_it_to_its_session_without_another_hold() {
    let mut tokens = TokenSource::default();
    let mut lock: Lock<&str> = Lock::default();
    let mut out = Vec::new();
    let first = Request { session: Some(7), session_lease: true, ..with_id("a", "w1") };
    let Acquired::Granted(token) = lock.acquire(&first, 1000, &mut tokens, &mut out).unwrap() else { panic!() };
    out.clear();
    for session in [None, Some(7)] {
        lock.rebind_resent(token, &Request { session, ..with_id("a", "w1") }, 2000, &mut out);
        assert!(out.is_empty(), "{session:?}");
    }
    let resend = Request { session: Some(8), session_lease: true, lease_ms: 600, ..with_id("a", "w1") };
    lock.rebind_resent(token, &resend, 2000, &mut out);
    assert_eq!(out, [Outcome::Changed { token, why: Change::Rebound, old_session: Some(7) }]);
    let held = holder(&lock).unwrap();
    assert_eq!((held.holds, held.deadline_ms, lock.session_lease_of(token)), (1, 2600, Some(8)));
}

#[test]
fn only_the_same_id_and_mode_resend_a_queued_wait() {
    let mut tokens = TokenSource::default();
    let mut lock = Lock::default();
    let mut out = Vec::new();
    lock.acquire(&req("a", 100), 1000, &mut tokens, &mut out).unwrap();
    lock.enqueue_with(&with_id("b", "w1"), || Some("b"), &mut out).unwrap();
    out.clear();
    for other in [req("b", 100), with_id("b", "w2"), Request { want: Want::Shared, ..with_id("b", "w1") }] {
        assert_eq!(lock.acquire(&other, 1000, &mut tokens, &mut out), Err(LockError::AlreadyQueued));
        assert_eq!(lock.enqueue_with(&other, || Some("x"), &mut out), Err(LockError::AlreadyQueued));
    }
    assert_eq!(lock.enqueue_with(&with_id("b", "w1"), || None, &mut out), Ok(None), "no payload: nothing changes");
    assert!(out.is_empty());
    assert_eq!(lock.waiters().map(|w| w.payload).collect::<Vec<_>>(), ["b"]);
}

#[test]
fn a_foreign_holder_keeps_every_mode_waiting_and_its_release_grants_them_in_order() {
    let mut tokens = TokenSource::default();
    let mut lock = Lock::<&str>::default();
    let mut out = Vec::new();
    lock.set_foreign();
    assert!(!lock.is_idle() && lock.is_foreign(), "held, though by no FLOCK holder");
    let mut readers = [req("r1", 100), req("r2", 100)];
    for r in &mut readers {
        r.want = Want::Shared;
    }
    assert_eq!(lock.acquire(&readers[0], 1000, &mut tokens, &mut out), Ok(Acquired::Busy), "a try finds it busy");
    lock.enqueue(&readers[0], "r1").unwrap();
    assert_eq!(lock.acquire(&readers[1], 1000, &mut tokens, &mut out), Ok(Acquired::Busy));
    lock.enqueue(&readers[1], "r2").unwrap();
    assert_eq!(lock.acquire(&req("w", 100), 1000, &mut tokens, &mut out), Ok(Acquired::Busy));
    lock.enqueue(&req("w", 100), "w").unwrap();
    assert!(out.is_empty());
    lock.clear_foreign(1010, &mut tokens, &mut out);
    let granted: Vec<&str> =
        out.iter().filter_map(|o| if let Outcome::Granted { waiter, .. } = o { *waiter } else { None }).collect();
    assert_eq!(granted, ["r1", "r2"], "the readers together, the writer after them");
    assert_eq!(lock.waiter_count(), 1);
    assert!(!lock.is_foreign());
}

#[test]
fn a_foreign_lock_whose_waiters_leave_keeps_nothing_but_the_flag() {
    let mut tokens = TokenSource::default();
    let mut lock = Lock::<&str>::default();
    let mut out = Vec::new();
    lock.set_foreign();
    let mut sem = req("s", 100);
    sem.want = Want::Permits { n: 1, limit: 2 };
    assert_eq!(lock.acquire(&sem, 1000, &mut tokens, &mut out), Ok(Acquired::Busy), "any mode may wait");
    let id = lock.enqueue(&sem, "s").unwrap();
    assert!(lock.remove_waiter(id, Leave::TimedOut, &mut out));
    assert!(!lock.head_fits() && lock.waiter_count() == 0 && lock.is_foreign() && !lock.is_idle());
}

#[test]
fn blockers_are_the_holders_and_earlier_waiters_whose_grants_exclude_the_owners() {
    let mut tokens = TokenSource::default();
    let mut out = Vec::new();
    let names = |v: Vec<Box<[u8]>>| v.into_iter().map(|o| String::from_utf8(o.into()).unwrap()).collect::<Vec<_>>();
    let with = |owner, want| Request { want, ..req(owner, 100) };
    // A writer holds; a reader and a writer wait.
    let mut lock = Lock::<&str>::default();
    lock.acquire(&req("w", 100), 1000, &mut tokens, &mut out).unwrap();
    lock.enqueue(&with("r1", Want::Shared), "r1").unwrap();
    lock.enqueue(&req("w2", 100), "w2").unwrap();
    assert_eq!(names(lock.blockers(b"new", Some(Want::Exclusive), true)), ["w", "r1", "w2"]);
    assert_eq!(
        names(lock.blockers(b"new", Some(Want::Shared), true)),
        ["w", "w2"],
        "another reader is granted with r1"
    );
    assert_eq!(names(lock.blockers(b"w2", None, true)), ["w", "r1"], "a queued waiter: only those ahead");
    assert_eq!(names(lock.blockers(b"r1", None, true)), ["w"]);
    assert!(lock.blockers(b"nobody", None, true).is_empty(), "not queued, no want: waits for nobody");
    assert_eq!(names(lock.blockers(b"new", Some(Want::Exclusive), false)), ["w"], "the holders alone");
    assert_eq!(names(lock.blockers(b"r1", None, false)), ["w"]);
    // A semaphore of 3: a holder of 2 blocks a request for 2, one of 1 does not.
    let mut sem = Lock::<&str>::default();
    let permits = |owner, n| with(owner, Want::Permits { n, limit: 3 });
    sem.acquire(&permits("two", 2), 1000, &mut tokens, &mut out).unwrap();
    sem.acquire(&permits("one", 1), 1000, &mut tokens, &mut out).unwrap();
    assert_eq!(names(sem.blockers(b"new", Some(Want::Permits { n: 2, limit: 3 }), true)), ["two"]);
    let mut both = names(sem.blockers(b"new", Some(Want::Permits { n: 3, limit: 3 }), true));
    both.sort();
    assert_eq!(both, ["one", "two"]);
}

#[test]
fn a_gated_waiter_holds_its_place_and_only_its_caller_grants_it() {
    let (mut lock, mut t, mut out) = (Lock::default(), TokenSource::default(), Vec::new());
    lock.acquire(&req("a", 100), 0, &mut t, &mut out).unwrap();
    lock.enqueue_gated(&req("g", 100), 'g').unwrap();
    lock.enqueue(&req("b", 100), 'b').unwrap();
    assert_eq!(lock.gated_head(), Some((&'g', false)), "first in line, but a holds the lock");
    assert_eq!(lock.acquire(&req("c", 100), 0, &mut t, &mut out), Ok(Acquired::Busy), "a try never cuts in");
    out.clear();
    lock.release(b"a", 1, &mut t, &mut out).unwrap();
    assert_eq!(handed(&out), vec![], "the lock does not grant it, nor anyone behind it");
    assert_eq!(lock.gated_head(), Some((&'g', true)));
    out.clear();
    let token = lock.grant_head(2, &mut t, &mut out).expect("granted");
    assert_eq!(handed(&out), vec![('g', token)]);
    assert_eq!(holder_owner(&lock), Some(&b"g"[..]));
    assert_eq!(lock.grant_head(2, &mut t, &mut out), None, "the head is an ordinary waiter now");
}

#[test]
fn a_gated_head_that_does_not_fit_is_not_granted_and_leaving_it_lets_the_queue_go_on() {
    let (mut lock, mut t, mut out) = (Lock::default(), TokenSource::default(), Vec::new());
    lock.acquire(&req("a", 100), 0, &mut t, &mut out).unwrap();
    let g = lock.enqueue_gated(&req("g", 100), 'g').unwrap();
    lock.enqueue(&req("b", 100), 'b').unwrap();
    assert_eq!(lock.gated_head(), Some((&'g', false)));
    assert_eq!(lock.grant_head(1, &mut t, &mut out), None);
    out.clear();
    lock.release(b"a", 1, &mut t, &mut out).unwrap();
    assert!(lock.remove_waiter(g, Leave::Cancelled, &mut out));
    lock.grant_waiters(2, &mut t, &mut out);
    assert_eq!(holder_owner(&lock), Some(&b"b"[..]));
}

#[test]
fn can_take_answers_what_acquire_would_without_changing_anything() {
    let (mut lock, mut t, mut out) = (Lock::<char>::default(), TokenSource::default(), Vec::new());
    assert_eq!(lock.can_take(b"a", Want::Exclusive), Ok(true), "a lock nobody uses");
    lock.acquire(&Request { want: Want::Shared, ..req("a", 100) }, 0, &mut t, &mut out).unwrap();
    assert_eq!(lock.can_take(b"a", Want::Shared), Ok(true), "reentry");
    assert_eq!(lock.can_take(b"a", Want::Exclusive), Err(LockError::Upgrade));
    assert_eq!(lock.can_take(b"b", Want::Shared), Ok(true));
    assert_eq!(lock.can_take(b"b", Want::Exclusive), Ok(false));
    let permits = Want::Permits { n: 1, limit: 2 };
    assert_eq!(lock.can_take(b"b", permits), Err(LockError::WrongMode(Mode::Shared)));
    lock.enqueue(&req("w", 100), 'w').unwrap();
    assert_eq!(lock.can_take(b"b", Want::Shared), Ok(false), "nobody cuts in");
    assert_eq!(lock.can_take(b"w", Want::Shared), Err(LockError::AlreadyQueued));
    lock.set_foreign();
    assert_eq!(Lock::<char>::default().can_take(b"b", Want::Shared), Ok(true));
    let mut foreign = Lock::<char>::default();
    foreign.set_foreign();
    assert_eq!(foreign.can_take(b"b", Want::Exclusive), Ok(false), "held outside FLOCK");
}

#[test]
fn a_fence_passes_the_holders_token_until_its_lease_ends_and_says_who_holds_it_after() {
    let mut tokens = TokenSource::default();
    let (mut lock, _) = held_by_a_with_b_queued(&mut tokens);
    let a = holder(&lock).unwrap().token;
    assert_eq!(lock.fence(a, 1099), Ok(()), "held until its deadline");
    assert_eq!(lock.fence(a, 1100), Err(Stale::Expired), "its deadline passed before the timer ran");
    assert_eq!(lock.fence(a + 1, 1000), Err(Stale::HeldBy(a)), "a token never granted holds nothing");
    let mut out = Vec::new();
    lock.release(b"a", 1050, &mut tokens, &mut out).unwrap();
    let b = one(&out).unwrap().1;
    assert_eq!(lock.fence(a, 1050), Err(Stale::HeldBy(b)), "the next holder's token is named");
    assert_eq!(lock.fence(b, 1050), Ok(()));
    lock.release(b"b", 1060, &mut tokens, &mut out).unwrap();
    assert_eq!(lock.fence(b, 1060), Err(Stale::Free));
}

#[test]
fn a_fence_passes_every_reader_and_permit_and_a_session_grant_whatever_its_deadline() {
    let mut tokens = TokenSource::default();
    let mut lock = Lock::<()>::default();
    let mut out = Vec::new();
    let shared = |owner| Request { want: Want::Shared, ..req(owner, 100) };
    let granted = |lock: &mut Lock<()>, r: &Request, tokens: &mut TokenSource, out: &mut Vec<_>| match lock
        .acquire(r, 1000, tokens, out)
    {
        Ok(Acquired::Granted(token)) => token,
        other => panic!("{other:?}"),
    };
    let r1 = granted(&mut lock, &shared("r1"), &mut tokens, &mut out);
    let r2 = granted(&mut lock, &shared("r2"), &mut tokens, &mut out);
    assert_eq!((lock.fence(r1, 1000), lock.fence(r2, 1000)), (Ok(()), Ok(())));
    lock.release(b"r1", 1000, &mut tokens, &mut out).unwrap();
    assert_eq!(lock.fence(r1, 1000), Err(Stale::Held(1)), "a reader left: the others are counted");

    let mut sem = Lock::<()>::default();
    let permits = |owner| Request { want: Want::Permits { n: 1, limit: 3 }, ..req(owner, 100) };
    let p = granted(&mut sem, &permits("p"), &mut tokens, &mut out);
    assert_eq!(sem.fence(p, 1000), Ok(()));

    let mut bound = Lock::<()>::default();
    let with_session = Request { session: Some(7), session_lease: true, ..req("s", 100) };
    let s = granted(&mut bound, &with_session, &mut tokens, &mut out);
    assert_eq!(bound.fence(s, 5000), Ok(()), "a grant that lives with its session has no lease to run out");
}

/// `req` with a lock-delay.
fn delayed(owner: &str, lease_ms: u64, lock_delay_ms: u32) -> Request<'_> {
    Request { lock_delay_ms, ..req(owner, lease_ms) }
}

#[test]
fn a_lease_that_ends_with_a_lock_delay_keeps_everyone_out_until_the_delay_is_lifted() {
    let mut tokens = TokenSource::default();
    let mut lock = Lock::default();
    let mut out = Vec::new();
    lock.acquire(&delayed("a", 100, 500), 1000, &mut tokens, &mut out).unwrap();
    lock.enqueue(&req("b", 100), "b").unwrap();
    out.clear();
    assert!(lock.expire_token(holder(&lock).unwrap().token, 1100, &mut tokens, &mut out));
    assert!(out.contains(&Outcome::Delayed { until_ms: 1600 }), "{out:?}");
    assert_eq!(one(&out), None, "the waiter is not granted during the delay");
    assert_eq!(lock.delayed_until(), Some(1600));
    assert!(!lock.is_idle(), "the key stays while the delay runs");
    out.clear();
    assert_eq!(lock.acquire(&req("c", 100), 1300, &mut tokens, &mut out), Ok(Acquired::Busy), "a try is busy");
    assert!(!lock.lift_delay(1599, &mut tokens, &mut out), "not before its time");
    assert!(lock.lift_delay(1600, &mut tokens, &mut out));
    assert_eq!(one(&out).map(|(w, _)| w), Some("b"), "the waiter is granted when it is lifted");
    assert_eq!(lock.delayed_until(), None);
}

#[test]
fn a_release_or_a_force_release_never_waits_and_a_session_that_closed_does() {
    let mut tokens = TokenSource::default();
    let mut out = Vec::new();
    for (why, waits) in [(End::Released, false), (End::ForceReleased, false), (End::SessionClosed, true)] {
        let mut lock = Lock::default();
        lock.acquire(&delayed("a", 100, 500), 1000, &mut tokens, &mut out).unwrap();
        lock.enqueue(&req("b", 100), "b").unwrap();
        out.clear();
        let token = holder(&lock).unwrap().token;
        match why {
            End::Released => assert_eq!(lock.release(b"a", 1010, &mut tokens, &mut out), Ok(0)),
            End::ForceReleased => assert_eq!(lock.end_all(why, 1010, &mut tokens, &mut out), 1),
            _ => assert!(lock.end(token, why, 1010, &mut tokens, &mut out)),
        }
        assert_eq!(one(&out).is_none(), waits, "{why:?}");
        assert_eq!(lock.delayed_until().is_some(), waits, "{why:?}");
    }
}

#[test]
fn a_free_lock_whose_delay_passed_before_its_timer_grants_at_once_and_without_one_frees_its_key() {
    let mut tokens = TokenSource::default();
    let mut lock = Lock::<()>::default();
    let mut out = Vec::new();
    lock.acquire(&delayed("a", 100, 500), 1000, &mut tokens, &mut out).unwrap();
    lock.expire_token(holder(&lock).unwrap().token, 1100, &mut tokens, &mut out);
    out.clear();
    assert!(matches!(lock.acquire(&req("c", 100), 1600, &mut tokens, &mut out), Ok(Acquired::Granted(_))));
    let mut alone = Lock::<()>::default();
    alone.acquire(&delayed("a", 100, 500), 1000, &mut tokens, &mut out).unwrap();
    alone.expire_token(holder(&alone).unwrap().token, 1100, &mut tokens, &mut out);
    assert!(alone.lift_delay(1600, &mut tokens, &mut out));
    assert!(alone.is_idle(), "nothing is left: the key may go");
}
