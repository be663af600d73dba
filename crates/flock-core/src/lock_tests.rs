use super::*;
use crate::requests::Kind;
use proptest::prelude::*;
use std::collections::{HashMap, VecDeque};

fn req(owner: &str, lease_ms: u64) -> Request<'_> {
    Request { owner: owner.as_bytes(), lease_ms, session: None, id: None, want: Want::Exclusive }
}

/// The one grant an exclusive hand-off makes, if any.
fn one<P>(grants: Vec<Grant<P>>) -> Option<Grant<P>> {
    assert!(grants.len() <= 1, "an exclusive hand-off grants one waiter");
    grants.into_iter().next()
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
    assert_eq!(one(grant).unwrap().payload, "b");
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
    assert!(matches!(lock.release(b"a", 1010, &mut tokens), Ok((1, ref g)) if g.is_empty()));
    assert_eq!(holder_owner(&lock), Some(&b"a"[..]));

    let (left, grant) = lock.release(b"a", 2000, &mut tokens).unwrap();
    let grant = one(grant).expect("the queue head takes over");
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
    assert_eq!(one(grant).unwrap().payload, "b");
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
    assert!(grant.is_empty());
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
    assert!(matches!(lock.release(b"a", 1010, &mut tokens), Ok((0, ref g)) if g.is_empty()));
    assert!(lock.is_idle());
    // Drained owners must not stay marked as queued.
    assert!(lock.enqueue(&req("b", 100), "b").is_ok());
}

#[test]
fn reentry_beyond_the_most_holds_is_refused_and_changes_nothing() {
    let mut tokens = TokenSource::default();
    let mut lock = Lock::<()>::with_holder(Holder::new(b"a"[..].into(), u32::MAX, 7, 1100), None);
    assert_eq!(lock.acquire(&req("a", 500), 1000, &mut tokens), Err(LockError::TooManyHolds));
    let h = lock.holder().unwrap();
    assert_eq!((h.holds, h.token, h.deadline_ms), (u32::MAX, 7, 1100));
}

#[test]
fn session_and_waiters_take_memory_only_while_they_exist() {
    let mut tokens = TokenSource::default();
    let mut lock = Lock::<()>::default();
    lock.acquire(&req("a", 100), 1000, &mut tokens).unwrap();
    let plain = lock.heap_size();
    let session = Request { session: Some(9), ..req("a", 100) };
    lock.acquire(&session, 1000, &mut tokens).unwrap();
    assert_eq!(lock.session(), Some(9));
    assert!(lock.heap_size() > plain);
    let b = lock.enqueue(&req("b", 100), ()).unwrap();
    lock.remove_waiter(b).unwrap();
    lock.release(b"a", 1000, &mut tokens).unwrap();
    assert_eq!(lock.session(), Some(9), "the session binds the holder until its last release");
    let (_, grant) = lock.release(b"a", 1000, &mut tokens).unwrap();
    assert!(grant.is_empty() && lock.is_idle() && lock.session().is_none());
    lock.acquire(&req("c", 100), 1000, &mut tokens).unwrap();
    assert_eq!(lock.heap_size(), plain, "nothing is left over from the session or the queue");
}

#[test]
fn a_granted_waiter_brings_its_own_session() {
    let mut tokens = TokenSource::default();
    let mut lock = Lock::default();
    lock.acquire(&Request { session: Some(1), ..req("a", 100) }, 1000, &mut tokens).unwrap();
    lock.enqueue(&Request { session: Some(2), ..req("b", 100) }, "b").unwrap();
    lock.enqueue(&req("c", 100), "c").unwrap();
    lock.release(b"a", 1000, &mut tokens).unwrap();
    assert_eq!((holder_owner(&lock), lock.session()), (Some(&b"b"[..]), Some(2)));
    lock.release(b"b", 1000, &mut tokens).unwrap();
    assert_eq!((holder_owner(&lock), lock.session()), (Some(&b"c"[..]), None));
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

    /// The holder is gone: the head of the queue, and only it, must be granted.
    fn hand_off(&mut self, grant: Vec<Grant<u32>>) -> Result<(), TestCaseError> {
        self.holder = None;
        match (self.queue.pop_front(), one(grant)) {
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
    Request { owner: OWNERS[who], lease_ms, session: None, id: None, want: Want::Exclusive }
}

/// Checks one acquire against the model; whether it answered `Busy`.
fn acquire(
    lock: &mut Lock<u32>,
    m: &mut Model,
    tokens: &mut TokenSource,
    who: usize,
    lease: u64,
) -> Result<bool, TestCaseError> {
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
                    (Ok((left, ref g)), Some(h)) if h.owner == who && h.holds > 1 && g.is_empty() => {
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

// --- Multi-key model test -------------------------------------------------
//
// Several locks share one `TokenSource`, as in the module. The test plays
// the Redis layer's part (lease timers, WAIT timeouts, closed connections,
// SESSION bindings, undelivered grants) with plain bookkeeping and checks
// every answer of the core against a reference model after every step.

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

    /// How holders and waiters left, as `INFO flock` counts them.
    #[derive(Debug, Default)]
    struct Counts {
        grants: u64,
        releases: u64,
        expiries: u64,
        forced: u64,
        sessions: u64,
        undelivered: u64,
        enqueued: u64,
        granted_waiters: u64,
        timeouts: u64,
        disconnects: u64,
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
        counts: Counts,
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
                counts: Counts::default(),
            }
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
            self.counts.grants += 1;
            Ok(())
        }

        /// The holder of `key` is gone: the head of its queue, and only it,
        /// must have been granted.
        fn hand_off(&mut self, key: usize, grant: Vec<Grant<u32>>) -> Result<(), TestCaseError> {
            self.keys[key].holder = None;
            match (self.keys[key].queue.pop_front(), one(grant)) {
                (None, None) => Ok(()),
                (Some(w), Some(g)) => {
                    prop_assert_eq!(g.payload, w.payload, "key {}: grants follow FIFO order", key);
                    prop_assert_eq!(self.fate.insert(w.payload, Fate::Granted), Some(Fate::Queued), "granted twice");
                    prop_assert_eq!(self.conns[w.conn], Conn::Waiting(w.payload));
                    self.conns[w.conn] = Conn::Granted { key, token: g.token, id: w.id };
                    self.counts.granted_waiters += 1;
                    let session = w.session.then_some(self.client[w.conn]);
                    self.new_holder(key, w.owner, g.token, w.lease, session)
                }
                (w, g) => Err(TestCaseError::fail(format!("key {key}: head {w:?}, grant {:?}", g.map(|g| g.payload)))),
            }
        }

        /// What every command on `key` does first (`engine::update`), and
        /// what its lease timer does: end a lease that has run out.
        fn expire(&mut self, key: usize) -> Result<(), TestCaseError> {
            let holder = self.keys[key].holder;
            match self.locks[key].expire_due(self.now, &mut self.tokens) {
                Some((old, grant)) => {
                    let due = holder.is_some_and(|h| h.deadline <= self.now && h.token == old.token);
                    prop_assert!(due, "key {}: expired {:?}, model holder {:?}", key, old, holder);
                    self.counts.expiries += 1;
                    self.hand_off(key, grant)
                }
                None => {
                    prop_assert!(holder.is_none_or(|h| h.deadline > self.now), "key {}: {:?} not expired", key, holder);
                    Ok(())
                }
            }
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
                prop_assert!(self.locks[key].remove_waiter(id).is_none(), "stale handle removed a waiter");
                self.conns[conn] = Conn::Idle;
            }
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
            let req = Request { owner: OWNERS[owner], lease_ms: lease, session, id: None, want: Want::Exclusive };
            let expect = self.expected_acquire(key, owner);
            let got = self.locks[key].acquire(&req, self.now, &mut self.tokens);
            match (expect, got) {
                (Expect::Reentered(t), Ok(Acquired::Reentered(token))) => {
                    prop_assert_eq!(token, t);
                    let h = self.keys[key].holder.as_mut().unwrap();
                    h.holds += 1;
                    h.deadline = self.now + lease;
                    if session.is_some() {
                        h.session = session;
                    }
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
                    self.counts.enqueued += 1;
                }
                (Expect::Granted, Ok(Acquired::Granted(token))) => {
                    self.new_holder(key, owner, token, lease, session)?
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
            Ok(())
        }

        fn release(&mut self, owner: usize, key: usize) -> Result<(), TestCaseError> {
            self.expire(key)?;
            let holder = self.keys[key].holder.filter(|h| h.owner == owner);
            match (self.locks[key].release(OWNERS[owner], self.now, &mut self.tokens), holder) {
                (Ok((left, ref g)), Some(h)) if h.holds > 1 && g.is_empty() => {
                    prop_assert_eq!(left, h.holds - 1);
                    self.keys[key].holder.as_mut().unwrap().holds -= 1;
                }
                (Ok((0, grant)), Some(h)) if h.holds == 1 => {
                    self.counts.releases += 1;
                    self.hand_off(key, grant)?;
                }
                (Err(LockError::NotOwner), None) => {}
                (got, h) => prop_assert!(false, "release {} by {}: {:?} with {:?}", key, owner, got.map(|r| r.0), h),
            }
            Ok(())
        }

        fn renew(&mut self, owner: usize, key: usize, lease: u64) -> Result<(), TestCaseError> {
            self.expire(key)?;
            let now = self.now;
            match (
                self.locks[key].renew(OWNERS[owner], lease, now),
                self.keys[key].holder.as_mut().filter(|h| h.owner == owner),
            ) {
                (Ok(token), Some(h)) => {
                    prop_assert_eq!(token, h.token);
                    h.deadline = now + lease;
                }
                (Err(LockError::NotOwner), None) => {}
                (got, h) => prop_assert!(false, "renew {} by {}: {:?} with {:?}", key, owner, got, h),
            }
            Ok(())
        }

        /// Vacates `key` (FORCERELEASE, a closed SESSION, an undelivered
        /// grant passed on); whether a holder was removed.
        fn vacate(&mut self, key: usize) -> Result<bool, TestCaseError> {
            let (old, grant) = self.locks[key].vacate(self.now, &mut self.tokens);
            prop_assert_eq!(old.as_ref().map(|h| h.token), self.keys[key].holder.map(|h| h.token));
            self.hand_off(key, grant)?;
            Ok(old.is_some())
        }

        fn force_release(&mut self, key: usize) -> Result<(), TestCaseError> {
            self.expire(key)?;
            if self.vacate(key)? {
                self.counts.forced += 1;
            }
            Ok(())
        }

        fn advance(&mut self, ms: u64) -> Result<(), TestCaseError> {
            self.now += ms;
            (0..KEYS).try_for_each(|key| self.expire(key))
        }

        /// Takes a queued waiter out (timeout or disconnect).
        fn leave(&mut self, key: usize, index: usize) -> Result<usize, TestCaseError> {
            let w = self.keys[key].queue.remove(index).unwrap();
            prop_assert_eq!(self.locks[key].remove_waiter(w.id).map(|w| w.payload), Some(w.payload));
            prop_assert!(self.locks[key].remove_waiter(w.id).is_none(), "a handle works once");
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
                self.leave(key, index)?;
                self.counts.timeouts += 1;
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
                self.leave(key, index)?;
                self.counts.disconnects += 1;
            }
            let client = self.client[conn];
            for key in 0..KEYS {
                if self.locks[key].session() == Some(client) {
                    self.expire(key)?;
                }
                if self.locks[key].session() == Some(client) {
                    prop_assert!(self.vacate(key)?);
                    self.counts.sessions += 1;
                }
            }
            if let Conn::Granted { key, token, id } = self.conns[conn] {
                prop_assert!(self.locks[key].remove_waiter(id).is_none(), "stale handle removed a waiter");
                if self.locks[key].holder().is_some_and(|h| h.token == token) {
                    prop_assert!(self.vacate(key)?);
                    self.counts.undelivered += 1;
                }
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
                // At most one holder (the type has room for one), the model's.
                let held = lock.holder().map(|h| (&*h.owner, h.holds, h.token, h.deadline_ms, lock.session()));
                let want = k.holder.map(|h| (OWNERS[h.owner], h.holds, h.token, h.deadline, h.session));
                prop_assert_eq!(held, want, "key {} holder", key);
                prop_assert!(lock.holder().is_none_or(|h| h.holds >= 1));
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
            let c = &self.counts;
            prop_assert_eq!(c.enqueued, c.granted_waiters + c.timeouts + c.disconnects + queued as u64);
            // INFO flock's sum: every grant ended one way or is still held.
            let held = self.keys.iter().filter(|k| k.holder.is_some()).count() as u64;
            prop_assert_eq!(
                c.grants,
                c.releases + c.expiries + c.forced + c.sessions + c.undelivered + held,
                "{:?}",
                c
            );
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
    tokens.observe(crate::args::MAX_TOKEN - 1);
    assert_eq!(tokens.next(1_700_000_000_000), crate::args::MAX_TOKEN);
    assert_eq!(tokens.next(1_700_000_000_000), crate::args::MAX_TOKEN);
    assert_eq!(tokens.next(u64::MAX), crate::args::MAX_TOKEN, "the clock part never passes it either");
}

fn with_id<'a>(owner: &'a str, id: &'a str) -> Request<'a> {
    Request { id: Some(RequestId { id: id.as_bytes(), window_ms: 1000 }), ..req(owner, 100) }
}

#[test]
fn a_resent_acquire_answers_its_token_and_adds_no_hold_while_its_grant_is_held() {
    let mut tokens = TokenSource::default();
    let mut lock = Lock::<()>::default();
    let Ok(Acquired::Granted(token)) = lock.acquire(&with_id("a", "r1"), 1000, &mut tokens) else { panic!() };
    assert_eq!(lock.repeat(b"r1", Kind::Acquire, b"a", 1500), Ok(Some(token)));
    assert_eq!(lock.holder().unwrap().holds, 1, "asking changed nothing");
    // Released and taken by another: the ID's grant is gone, a resend is new.
    lock.release(b"a", 1600, &mut tokens).unwrap();
    lock.acquire(&req("b", 100), 1600, &mut tokens).unwrap();
    assert_eq!(lock.repeat(b"r1", Kind::Acquire, b"a", 1600), Ok(None));
}

#[test]
fn a_resent_release_answers_its_first_reply_until_the_window_ends() {
    let mut tokens = TokenSource::default();
    let (mut lock, _) = held_by_a_with_b_queued(&mut tokens);
    let (left, grant) = lock.release(b"a", 1010, &mut tokens).unwrap();
    lock.remember(Some(RequestId { id: b"r2", window_ms: 1000 }), Kind::Release, u64::from(left), 1010);
    assert!(!grant.is_empty(), "b got the lock");
    assert_eq!(lock.repeat(b"r2", Kind::Release, b"a", 2009), Ok(Some(0)), "not NOTOWNER");
    assert_eq!(lock.repeat(b"r2", Kind::Renew, b"a", 2009), Err(LockError::IdReused(Kind::Release)));
    assert_eq!(lock.repeat(b"r2", Kind::Release, b"a", 2010), Ok(None), "forgotten after the window");
}

#[test]
fn a_waiter_granted_later_remembers_its_id_with_the_grant() {
    let mut tokens = TokenSource::default();
    let mut lock = Lock::default();
    lock.acquire(&req("a", 100), 1000, &mut tokens).unwrap();
    lock.enqueue(&with_id("b", "rb"), "b").unwrap();
    let (_, grant) = lock.release(b"a", 1050, &mut tokens).unwrap();
    let token = one(grant).expect("b granted").token;
    assert_eq!(lock.repeat(b"rb", Kind::Acquire, b"b", 1100), Ok(Some(token)));
    lock.vacate(1100, &mut tokens); // the grant was not delivered and passed on
    assert_eq!(lock.repeat(b"rb", Kind::Acquire, b"b", 1100), Ok(None), "a resend is a new request");
}

#[test]
fn remembered_ids_keep_a_free_lock_in_use_until_they_expire() {
    let mut tokens = TokenSource::default();
    let mut lock = Lock::<()>::default();
    lock.acquire(&with_id("a", "r"), 1000, &mut tokens).unwrap();
    lock.release(b"a", 1000, &mut tokens).unwrap();
    assert!(lock.is_idle() && !lock.is_unused(), "free, but the ID is remembered");
    assert_eq!(lock.repeat(b"r", Kind::Acquire, b"a", 2000), Ok(None));
    assert!(lock.is_unused(), "the window passed: nothing left");
    assert_eq!(lock.heap_size(), 0);
}

#[test]
fn a_resent_wait_takes_over_its_place_in_the_queue_and_gives_back_the_first_payload() {
    let mut tokens = TokenSource::default();
    let mut lock = Lock::default();
    lock.acquire(&req("a", 100), 1000, &mut tokens).unwrap();
    let first = lock.enqueue_with(&with_id("b", "w1"), || Some("b-first")).unwrap().unwrap();
    assert_eq!(first.1, None, "a new waiter replaces nobody");
    lock.enqueue(&req("c", 100), "c").unwrap();

    let resend = Request { lease_ms: 700, session: Some(9), ..with_id("b", "w1") };
    assert_eq!(lock.acquire(&resend, 1000, &mut tokens), Ok(Acquired::Resent));
    let taken = lock.enqueue_with(&resend, || Some("b-again")).unwrap().unwrap();
    assert_eq!(taken, (first.0, Some("b-first")), "the same place; the first payload comes back");
    let queue: Vec<_> = lock.waiters().map(|w| (w.payload, w.lease_ms, w.session)).collect();
    assert_eq!(
        queue,
        [("b-again", 700, Some(9)), ("c", 100, None)],
        "b keeps its place before c, with the resend's lease and session"
    );
    let (_, grants) = lock.release(b"a", 1001, &mut tokens).unwrap();
    assert_eq!(one(grants).unwrap().payload, "b-again");
}

#[test]
fn only_the_same_id_and_mode_resend_a_queued_wait() {
    let mut tokens = TokenSource::default();
    let mut lock = Lock::default();
    lock.acquire(&req("a", 100), 1000, &mut tokens).unwrap();
    lock.enqueue_with(&with_id("b", "w1"), || Some("b")).unwrap();
    for other in [req("b", 100), with_id("b", "w2"), Request { want: Want::Shared, ..with_id("b", "w1") }] {
        assert_eq!(lock.acquire(&other, 1000, &mut tokens), Err(LockError::AlreadyQueued));
        assert_eq!(lock.enqueue_with(&other, || Some("x")), Err(LockError::AlreadyQueued));
    }
    assert_eq!(lock.enqueue_with(&with_id("b", "w1"), || None), Ok(None), "no payload: nothing changes");
    assert_eq!(lock.waiters().map(|w| w.payload).collect::<Vec<_>>(), ["b"]);
}
