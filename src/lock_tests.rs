use super::*;
use proptest::prelude::*;
use std::collections::{HashMap, VecDeque};

fn req(owner: &str, lease_ms: u64) -> Request<'_> {
    Request { owner: owner.as_bytes(), lease_ms, session: None }
}

fn holder_owner<P>(lock: &Lock<P>) -> Option<&[u8]> {
    lock.holder().map(|h| &*h.owner)
}

/// A lock held by `a` (acquired at t=1000 with a 100 ms lease) with `b` queued.
fn held_by_a_with_b_queued(tokens: &mut TokenSource) -> (Lock<&'static str>, WaiterId) {
    let mut lock = Lock::default();
    lock.acquire(&req("a", 100), 1000, tokens).unwrap();
    assert_eq!(lock.acquire(&req("b", 500), 1000, tokens), Ok(Acquired::Busy));
    let b = lock.enqueue(&req("b", 500), "b").unwrap();
    (lock, b)
}

#[test]
fn grants_at_once_when_free() {
    let mut tokens = TokenSource::default();
    let mut lock = Lock::<()>::default();
    let Ok(Acquired::Granted(token)) = lock.acquire(&req("a", 100), 1000, &mut tokens) else {
        panic!("a free lock must be granted");
    };
    let h = lock.holder().unwrap();
    assert_eq!((&*h.owner, h.holds, h.token, h.deadline_ms), (&b"a"[..], 1, token, 1100));
}

#[test]
fn try_is_busy_while_held_and_queues_nothing() {
    let mut tokens = TokenSource::default();
    let mut lock = Lock::<()>::default();
    lock.acquire(&req("a", 100), 1000, &mut tokens).unwrap();
    assert_eq!(lock.acquire(&req("b", 100), 1000, &mut tokens), Ok(Acquired::Busy));
    assert_eq!(lock.waiter_count(), 0);
}

#[test]
fn try_never_cuts_in_front_of_waiters() {
    let mut tokens = TokenSource::default();
    let (mut lock, _) = held_by_a_with_b_queued(&mut tokens);
    assert_eq!(lock.acquire(&req("c", 100), 1000, &mut tokens), Ok(Acquired::Busy));
    let (_, grant) = lock.release(b"a", 1001, &mut tokens).unwrap();
    assert_eq!(grant.unwrap().payload, "b");
    assert_eq!(lock.acquire(&req("c", 100), 1001, &mut tokens), Ok(Acquired::Busy));

    // Not reachable through the API, but the queue alone must still block a try.
    let mut orphaned = Lock::default();
    orphaned.enqueue(&req("b", 100), ()).unwrap();
    assert_eq!(orphaned.acquire(&req("c", 100), 1000, &mut tokens), Ok(Acquired::Busy));
}

#[test]
fn reentry_counts_holds_resets_lease_and_keeps_token() {
    let mut tokens = TokenSource::default();
    let mut lock = Lock::<()>::default();
    let Ok(Acquired::Granted(token)) = lock.acquire(&req("a", 100), 1000, &mut tokens) else { panic!() };
    assert_eq!(lock.acquire(&req("a", 300), 1050, &mut tokens), Ok(Acquired::Reentered(token)));
    let h = lock.holder().unwrap();
    assert_eq!((h.holds, h.deadline_ms), (2, 1350));
}

#[test]
fn release_counts_down_then_hands_off_with_a_fresh_lease() {
    let mut tokens = TokenSource::default();
    let (mut lock, _) = held_by_a_with_b_queued(&mut tokens);
    lock.acquire(&req("a", 100), 1000, &mut tokens).unwrap();
    let old_token = lock.holder().unwrap().token;
    assert!(matches!(lock.release(b"a", 1010, &mut tokens), Ok((1, None))));
    assert_eq!(holder_owner(&lock), Some(&b"a"[..]));

    let (left, grant) = lock.release(b"a", 2000, &mut tokens).unwrap();
    let grant = grant.expect("the queue head takes over");
    assert_eq!((left, grant.payload), (0, "b"));
    assert!(grant.token > old_token);
    let h = lock.holder().unwrap();
    // The waiter's lease counts from the hand-off, not from when it queued.
    assert_eq!((&*h.owner, h.holds, h.token, h.deadline_ms), (&b"b"[..], 1, grant.token, 2500));
    assert_eq!(lock.waiter_count(), 0);
}

#[test]
fn release_by_non_owner_is_refused_and_changes_nothing() {
    let mut tokens = TokenSource::default();
    let (mut lock, _) = held_by_a_with_b_queued(&mut tokens);
    let before = lock.holder().cloned();
    for who in [&b"b"[..], b"c"] {
        assert!(matches!(lock.release(who, 1010, &mut tokens), Err(LockError::NotOwner)));
    }
    assert_eq!(lock.holder().cloned(), before);
    assert_eq!(lock.waiter_count(), 1);
}

#[test]
fn renew_by_non_owner_is_refused() {
    let mut tokens = TokenSource::default();
    let (mut lock, _) = held_by_a_with_b_queued(&mut tokens);
    assert_eq!(lock.renew(b"b", 100, 1010), Err(LockError::NotOwner));
    assert_eq!(lock.holder().unwrap().deadline_ms, 1100);
}

#[test]
fn renew_returns_current_token_and_moves_deadline() {
    let mut tokens = TokenSource::default();
    let mut lock = Lock::<()>::default();
    lock.acquire(&req("a", 100), 1000, &mut tokens).unwrap();
    let token = lock.holder().unwrap().token;
    assert_eq!(lock.renew(b"a", 700, 1050), Ok(token));
    assert_eq!(lock.holder().unwrap().deadline_ms, 1750);
}

#[test]
fn owner_already_queued_is_refused() {
    let mut tokens = TokenSource::default();
    let (mut lock, _) = held_by_a_with_b_queued(&mut tokens);
    assert_eq!(lock.acquire(&req("b", 100), 1000, &mut tokens), Err(LockError::AlreadyQueued));
    assert_eq!(lock.enqueue(&req("b", 100), "b2").unwrap_err(), LockError::AlreadyQueued);
    assert_eq!(lock.waiter_count(), 1);
}

#[test]
fn removing_a_middle_waiter_keeps_the_others_in_order() {
    let mut tokens = TokenSource::default();
    let (mut lock, _) = held_by_a_with_b_queued(&mut tokens);
    let c = lock.enqueue(&req("c", 100), "c").unwrap();
    lock.enqueue(&req("d", 100), "d").unwrap();
    assert_eq!(lock.remove_waiter(c).unwrap().payload, "c");
    assert_eq!(lock.waiters().map(|w| w.payload).collect::<Vec<_>>(), ["b", "d"]);
}

#[test]
fn a_waiter_is_removed_only_once_and_may_queue_again() {
    let mut tokens = TokenSource::default();
    let (mut lock, b) = held_by_a_with_b_queued(&mut tokens);
    assert!(lock.remove_waiter(b).is_some());
    assert!(lock.remove_waiter(b).is_none());
    assert!(lock.enqueue(&req("b", 100), "b again").is_ok());
}

#[test]
fn a_stale_handle_never_removes_a_later_waiter() {
    let mut tokens = TokenSource::default();
    let (mut lock, b) = held_by_a_with_b_queued(&mut tokens);
    lock.release(b"a", 1010, &mut tokens).unwrap();
    lock.enqueue(&req("c", 100), "c").unwrap();
    // b's timeout can fire in the same event-loop turn as its grant.
    assert!(lock.remove_waiter(b).is_none());
    assert_eq!(lock.waiter_count(), 1);
}

#[test]
fn expire_due_waits_for_the_deadline_then_hands_off() {
    let mut tokens = TokenSource::default();
    let (mut lock, _) = held_by_a_with_b_queued(&mut tokens);
    assert!(lock.expire_due(1099, &mut tokens).is_none());
    let (old, grant) = lock.expire_due(1100, &mut tokens).unwrap();
    assert_eq!(&*old.owner, b"a");
    assert_eq!(grant.unwrap().payload, "b");
    assert_eq!(lock.holder().unwrap().deadline_ms, 1600);
    assert_eq!(lock.release(b"a", 1100, &mut tokens).unwrap_err(), LockError::NotOwner);
}

#[test]
fn vacate_removes_the_holder_whatever_its_holds() {
    let mut tokens = TokenSource::default();
    let mut lock = Lock::<()>::default();
    for _ in 0..3 {
        lock.acquire(&req("a", 100), 1000, &mut tokens).unwrap();
    }
    let (old, grant) = lock.vacate(1010, &mut tokens);
    assert_eq!(old.unwrap().holds, 3);
    assert!(grant.is_none());
    assert!(lock.is_idle());
}

#[test]
fn drain_empties_the_queue_and_the_lock_is_idle_once_the_holder_goes() {
    let mut tokens = TokenSource::default();
    let (mut lock, _) = held_by_a_with_b_queued(&mut tokens);
    lock.enqueue(&req("c", 100), "c").unwrap();
    let drained: Vec<_> = lock.drain_waiters().into_iter().map(|w| w.payload).collect();
    assert_eq!(drained, ["b", "c"]);
    assert!(!lock.is_idle(), "a still holds it");
    assert!(matches!(lock.release(b"a", 1010, &mut tokens), Ok((0, None))));
    assert!(lock.is_idle());
    // Drained owners must not stay marked as queued.
    assert!(lock.enqueue(&req("b", 100), "b").is_ok());
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
    ]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held { owner: usize, holds: u64, token: u64, deadline: u64 }

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Queued { owner: usize, lease: u64, payload: u32, id: WaiterId }

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate { Queued, Granted, Removed }

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

    /// The holder is gone: the head of the queue, and only it, must be granted.
    fn hand_off(&mut self, grant: Option<Grant<u32>>) -> Result<(), TestCaseError> {
        self.holder = None;
        match (self.queue.pop_front(), grant) {
            (None, None) => Ok(()),
            (Some(w), Some(g)) => {
                prop_assert_eq!(g.payload, w.payload, "grants follow FIFO order");
                prop_assert_eq!(self.fate.insert(w.payload, Fate::Granted), Some(Fate::Queued));
                self.grant(w.owner, g.token, w.lease)
            }
            (w, g) => Err(TestCaseError::fail(format!("head {w:?}, grant {:?}", g.map(|g| g.payload)))),
        }
    }

    fn check(&self, lock: &Lock<u32>) -> Result<(), TestCaseError> {
        let held = lock.holder().map(|h| (&*h.owner, h.holds, h.token, h.deadline_ms));
        let want = self.holder.map(|h| (OWNERS[h.owner], h.holds, h.token, h.deadline));
        prop_assert_eq!(held, want);
        prop_assert!(lock.holder().is_none_or(|h| h.holds >= 1));
        let queued: Vec<_> = lock.waiters().map(|w| (&*w.owner, w.payload)).collect();
        let want: Vec<_> = self.queue.iter().map(|w| (OWNERS[w.owner], w.payload)).collect();
        prop_assert_eq!(queued, want);
        prop_assert_eq!(lock.waiter_count(), self.queue.len());
        // Every payload ever enqueued is accounted for exactly once.
        let still_queued = self.fate.values().filter(|f| **f == Fate::Queued).count();
        prop_assert_eq!(still_queued, self.queue.len());
        prop_assert_eq!(lock.is_idle(), self.holder.is_none() && self.queue.is_empty());
        // Time only moves in AdvanceTime, which expires right away.
        prop_assert!(!lock.is_expired(self.now));
        Ok(())
    }
}

fn request(who: usize, lease_ms: u64) -> Request<'static> {
    Request { owner: OWNERS[who], lease_ms, session: None }
}

/// Checks one acquire against the model; whether it answered `Busy`.
fn acquire(lock: &mut Lock<u32>, m: &mut Model, tokens: &mut TokenSource, who: usize, lease: u64)
    -> Result<bool, TestCaseError> {
    let got = lock.acquire(&request(who, lease), m.now, tokens);
    match (&mut m.holder, &got) {
        (Some(h), Ok(Acquired::Reentered(token))) if h.owner == who => {
            prop_assert_eq!(*token, h.token);
            h.holds += 1;
            h.deadline = m.now + lease;
        }
        (_, Err(LockError::AlreadyQueued)) => prop_assert!(m.queue.iter().any(|w| w.owner == who)),
        (Some(h), Ok(Acquired::Busy)) => {
            prop_assert!(h.owner != who && m.queue.iter().all(|w| w.owner != who));
        }
        (None, Ok(Acquired::Granted(token))) if m.queue.is_empty() => m.grant(who, *token, lease)?,
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
                Op::Release(who) => match (lock.release(OWNERS[who], m.now, &mut tokens), &mut m.holder) {
                    (Ok((left, None)), Some(h)) if h.owner == who && h.holds > 1 => {
                        h.holds -= 1;
                        prop_assert_eq!(left, h.holds);
                    }
                    (Ok((0, grant)), Some(h)) if h.owner == who && h.holds == 1 => m.hand_off(grant)?,
                    (Err(LockError::NotOwner), h) => prop_assert!(h.is_none_or(|h| h.owner != who)),
                    (got, h) => prop_assert!(false, "release by {} gave {:?}, {:?}", who, got.map(|r| r.0), h),
                },
                Op::Renew(who, lease) => match (lock.renew(OWNERS[who], lease, m.now), &mut m.holder) {
                    (Ok(token), Some(h)) if h.owner == who => {
                        prop_assert_eq!(token, h.token);
                        h.deadline = m.now + lease;
                    }
                    (Err(LockError::NotOwner), h) => prop_assert!(h.is_none_or(|h| h.owner != who)),
                    (got, h) => prop_assert!(false, "renew by {} gave {:?} with {:?}", who, got, h),
                },
                Op::ForceRelease => {
                    let (old, grant) = lock.vacate(m.now, &mut tokens);
                    prop_assert_eq!(old.map(|h| h.token), m.holder.map(|h| h.token));
                    m.hand_off(grant)?;
                }
                Op::AdvanceTime(ms) => {
                    m.now += ms;
                    match lock.expire_due(m.now, &mut tokens) {
                        Some((old, grant)) => {
                            let due = m.holder.is_some_and(|h| h.deadline <= m.now && h.token == old.token);
                            prop_assert!(due, "expired {:?} but model holder is {:?}", old, m.holder);
                            m.hand_off(grant)?;
                        }
                        None => prop_assert!(m.holder.is_none_or(|h| h.deadline > m.now)),
                    }
                }
                Op::RemoveWaiter(i) if !m.queue.is_empty() => {
                    let w = m.queue.remove(i % m.queue.len()).unwrap();
                    prop_assert_eq!(lock.remove_waiter(w.id).map(|w| w.payload), Some(w.payload));
                    prop_assert!(lock.remove_waiter(w.id).is_none());
                    prop_assert_eq!(m.fate.insert(w.payload, Fate::Removed), Some(Fate::Queued));
                }
                Op::RemoveWaiter(_) => {}
            }
            m.check(&lock)?;
        }
    }
}
