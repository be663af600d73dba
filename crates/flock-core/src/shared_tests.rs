//! Shared holders and semaphores: unit tests of each rule, and a
//! model-based property test of the generalized lock against a plain model
//! (a Vec of holders and a Vec queue).
use super::*;
use proptest::prelude::*;

fn ask(owner: &str, want: Want) -> Request<'_> {
    Request {
        owner: owner.as_bytes(),
        lease_ms: 100,
        session: None,
        session_lease: false,
        id: None,
        want,
        lock_delay_ms: 0,
    }
}

const SHARED: Want = Want::Shared;
const EXCL: Want = Want::Exclusive;

fn permits(n: u32, limit: u32) -> Want {
    Want::Permits { n, limit }
}

fn granted(r: Result<Acquired, LockError>) -> u64 {
    match r {
        Ok(Acquired::Granted(token)) => token,
        other => panic!("expected a grant, got {other:?}"),
    }
}

/// The waiters that outcomes granted, in order, and their tokens.
fn grants<P: Copy>(out: &[Outcome<P>]) -> Vec<(P, u64)> {
    out.iter()
        .filter_map(|o| match o {
            Outcome::Granted { token, waiter: Some(p) } => Some((*p, *token)),
            _ => None,
        })
        .collect()
}

fn payloads<P: Copy>(out: &[Outcome<P>]) -> Vec<P> {
    grants(out).into_iter().map(|(p, _)| p).collect()
}

/// The holder of an exclusive lock.
fn writer<P>(lock: &Lock<P>) -> Option<&[u8]> {
    match lock.mode() {
        Mode::Exclusive => lock.holders().iter().next().map(|(h, _)| &*h.owner),
        Mode::Shared | Mode::Semaphore(_) => None,
    }
}

/// `owner`'s grant.
fn grant_of<'a, P>(lock: &'a Lock<P>, owner: &[u8]) -> Option<(&'a Holder, Terms)> {
    lock.holders().get(lock.holders().token_of(owner)?)
}

#[test]
fn readers_share_and_a_writer_waits_for_all_of_them() {
    let mut t = TokenSource::default();
    let mut lock = Lock::default();
    let mut out = Vec::new();
    let a = granted(lock.acquire(&ask("a", SHARED), 1000, &mut t, &mut out));
    let b = granted(lock.acquire(&ask("b", SHARED), 1000, &mut t, &mut out));
    assert!(b > a, "readers granted together get different tokens");
    assert_eq!(out, [Outcome::Granted { token: a, waiter: None }, Outcome::Granted { token: b, waiter: None }]);
    assert_eq!((lock.mode(), lock.holders().len()), (Mode::Shared, 2));
    out.clear();
    assert_eq!(lock.acquire(&ask("w", EXCL), 1000, &mut t, &mut out), Ok(Acquired::Busy));
    lock.enqueue(&ask("w", EXCL), "w").unwrap();
    assert_eq!(
        lock.acquire(&ask("c", SHARED), 1000, &mut t, &mut out),
        Ok(Acquired::Busy),
        "no reader overtakes a writer"
    );
    lock.enqueue(&ask("c", SHARED), "c").unwrap();
    lock.enqueue(&ask("d", SHARED), "d").unwrap();
    lock.enqueue(&ask("x", EXCL), "x").unwrap();
    lock.enqueue(&ask("e", SHARED), "e").unwrap();
    assert!(out.is_empty());
    lock.release(b"a", 1001, &mut t, &mut out).unwrap();
    let [Outcome::Ended { holder, why: End::Released, .. }] = &out[..] else { panic!("{out:?}") };
    assert_eq!(holder.token, a, "a alone ended; w still waits for b");
    out.clear();
    lock.release(b"b", 1002, &mut t, &mut out).unwrap();
    assert_eq!(payloads(&out), ["w"]);
    assert_eq!(writer(&lock), Some(&b"w"[..]));
    out.clear();
    lock.release(b"w", 1003, &mut t, &mut out).unwrap();
    let granted = grants(&out);
    assert_eq!(payloads(&out), ["c", "d"], "readers behind the head up to the next writer, together");
    assert!(granted[1].1 > granted[0].1);
    assert_eq!((lock.mode(), lock.holders().len()), (Mode::Shared, 2));
    assert_eq!(lock.waiters().map(|w| w.payload).collect::<Vec<_>>(), ["x", "e"]);
}

#[test]
fn a_semaphore_grants_in_order_while_requests_fit_and_never_passes_a_big_head() {
    let mut t = TokenSource::default();
    let mut lock = Lock::default();
    let mut out = Vec::new();
    granted(lock.acquire(&ask("a", permits(3, 4)), 1000, &mut t, &mut out));
    assert_eq!(lock.acquire(&ask("b", permits(2, 4)), 1000, &mut t, &mut out), Ok(Acquired::Busy));
    lock.enqueue(&ask("b", permits(2, 4)), "b").unwrap();
    assert_eq!(
        lock.acquire(&ask("c", permits(1, 4)), 1000, &mut t, &mut out),
        Ok(Acquired::Busy),
        "one permit is free, but b waits"
    );
    lock.enqueue(&ask("c", permits(1, 4)), "c").unwrap();
    lock.enqueue(&ask("d", permits(1, 4)), "d").unwrap();
    out.clear();
    lock.release(b"a", 1001, &mut t, &mut out).unwrap();
    assert_eq!(payloads(&out), ["b", "c", "d"]);
    assert_eq!((lock.mode(), lock.holders().used()), (Mode::Semaphore(4), 4));
    assert_eq!(grant_of(&lock, b"b").map(|(_, terms)| terms.permits), Some(2));
}

#[test]
fn modes_are_checked_and_a_wrong_one_changes_nothing() {
    let mut t = TokenSource::default();
    let mut lock = Lock::<()>::default();
    let mut out = Vec::new();
    granted(lock.acquire(&ask("a", permits(1, 2)), 1000, &mut t, &mut out));
    out.clear();
    let wrong = Err(LockError::WrongMode(Mode::Semaphore(2)));
    assert_eq!(lock.acquire(&ask("b", SHARED), 1000, &mut t, &mut out), wrong);
    assert_eq!(lock.acquire(&ask("b", EXCL), 1000, &mut t, &mut out), wrong);
    assert_eq!(lock.acquire(&ask("b", permits(1, 3)), 1000, &mut t, &mut out), wrong);
    assert_eq!(lock.acquire(&ask("a", permits(2, 2)), 1000, &mut t, &mut out), Err(LockError::PermitsDiffer(1)));
    assert!(out.is_empty(), "refused: nothing changed");
    assert_eq!(
        lock.acquire(&ask("a", permits(1, 2)), 1000, &mut t, &mut out).map(|r| matches!(r, Acquired::Reentered(_))),
        Ok(true)
    );
    assert_eq!(lock.holders().len(), 1);

    let mut rw = Lock::<()>::default();
    let mut out = Vec::new();
    granted(rw.acquire(&ask("a", SHARED), 1000, &mut t, &mut out));
    out.clear();
    assert_eq!(rw.acquire(&ask("b", permits(1, 2)), 1000, &mut t, &mut out), Err(LockError::WrongMode(Mode::Shared)));
    assert_eq!(rw.acquire(&ask("a", EXCL), 1000, &mut t, &mut out), Err(LockError::Upgrade));
    assert!(out.is_empty());
    assert_eq!(grant_of(&rw, b"a").unwrap().0.holds, 1);
}

#[test]
fn a_writer_may_also_read_on_its_own_grant() {
    let mut t = TokenSource::default();
    let mut lock = Lock::<()>::default();
    let mut out = Vec::new();
    let token = granted(lock.acquire(&ask("w", EXCL), 1000, &mut t, &mut out));
    assert_eq!(lock.acquire(&ask("w", SHARED), 1000, &mut t, &mut out), Ok(Acquired::Reentered(token)));
    assert_eq!(grant_of(&lock, b"w").map(|(h, _)| h.holds), Some(2));
    assert_eq!((lock.mode(), lock.holders().len()), (Mode::Exclusive, 1), "still the one writer");
}

#[test]
fn each_holder_has_its_own_lease_and_a_force_release_counts_them() {
    let mut t = TokenSource::default();
    let mut lock = Lock::default();
    let mut out = Vec::new();
    let a = granted(lock.acquire(&Request { lease_ms: 50, ..ask("a", SHARED) }, 1000, &mut t, &mut out));
    granted(lock.acquire(&ask("b", SHARED), 1000, &mut t, &mut out));
    lock.enqueue(&ask("w", EXCL), "w").unwrap();
    out.clear();
    assert!(!lock.expire_token(a, 1049, &mut t, &mut out), "not due yet");
    assert!(out.is_empty());
    assert!(lock.expire_token(a, 1050, &mut t, &mut out));
    let [Outcome::Ended { holder, why: End::LeaseEnded, .. }] = &out[..] else { panic!("{out:?}") };
    assert_eq!(&*holder.owner, b"a", "and w still waits for b");
    assert_eq!(lock.holders().len(), 1);
    out.clear();
    assert_eq!(lock.end_all(End::ForceReleased, 1060, &mut t, &mut out), 1);
    assert_eq!(payloads(&out), ["w"]);
    assert_eq!(writer(&lock), Some(&b"w"[..]));
    out.clear();
    assert_eq!(lock.end_all(End::ForceReleased, 1070, &mut t, &mut out), 1);
    let [Outcome::Ended { holder, why: End::ForceReleased, .. }] = &out[..] else { panic!("{out:?}") };
    assert_eq!(&*holder.owner, b"w");
    assert!(lock.is_idle());
}

#[test]
fn the_table_takes_memory_only_while_it_has_holders() {
    let mut t = TokenSource::default();
    let mut lock = Lock::<()>::default();
    let mut out = Vec::new();
    granted(lock.acquire(&ask("a", EXCL), 1000, &mut t, &mut out));
    let plain = lock.heap_size();
    lock.release(b"a", 1000, &mut t, &mut out).unwrap();
    granted(lock.acquire(&ask("a", SHARED), 1000, &mut t, &mut out));
    assert!(lock.heap_size() > plain);
    lock.release(b"a", 1000, &mut t, &mut out).unwrap();
    granted(lock.acquire(&ask("a", EXCL), 1000, &mut t, &mut out));
    assert_eq!(lock.heap_size(), plain, "an exclusive grant after shared ones is as small as before");
}

#[test]
fn a_session_moves_with_reentry_and_each_change_tells_the_one_before() {
    let mut t = TokenSource::default();
    let mut lock = Lock::<()>::default();
    let mut out = Vec::new();
    let a = granted(lock.acquire(&Request { session: Some(1), ..ask("a", SHARED) }, 1000, &mut t, &mut out));
    out.clear();
    lock.acquire(&Request { session: Some(2), ..ask("a", SHARED) }, 1000, &mut t, &mut out).unwrap();
    lock.acquire(&ask("a", SHARED), 1000, &mut t, &mut out).unwrap();
    lock.renew(b"a", 100, 1000, &mut out).unwrap();
    lock.release(b"a", 1000, &mut t, &mut out).unwrap();
    let changed = |why, old_session| Outcome::Changed { token: a, why, old_session };
    assert_eq!(
        out,
        [
            changed(Change::Reentered, Some(1)),
            changed(Change::Reentered, Some(2)),
            changed(Change::Renewed, Some(2)),
            changed(Change::HoldReleased, Some(2)),
        ],
        "a reentry without SESSION keeps the binding"
    );
    assert_eq!(lock.session_of(a), Some(2));
}

// ---------------------------------------------------------------------------
// The model.

const OWNERS: [&str; 6] = ["o0", "o1", "o2", "o3", "o4", "o5"];
const CONNS: u64 = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ask {
    Exclusive,
    Shared,
    Permits(u32),
    /// PERMITS with another limit than the test's.
    OtherLimit(u32),
}

#[derive(Debug, Clone)]
enum Op {
    Acquire {
        owner: usize,
        ask: Ask,
        lease: u64,
        conn: u64,
        session: bool,
        wait: bool,
    },
    Release(usize),
    Renew(usize, u64),
    Advance(u64),
    /// The lease timer: every due lease ends, earliest grant first.
    Tick,
    /// A waiter leaves (WAIT timeout or disconnect of its connection).
    Leave(usize),
    /// A connection closes: its waiters leave, its SESSION holders end.
    Disconnect(u64),
    /// A grant whose reply never arrived is passed on.
    Undelivered(usize),
    ForceRelease,
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let ask = prop_oneof![
        3 => Just(Ask::Exclusive),
        6 => Just(Ask::Shared),
        6 => (1u32..=4).prop_map(Ask::Permits),
        1 => (1u32..=3).prop_map(Ask::OtherLimit),
    ];
    let op = prop_oneof![
        8 => (0..OWNERS.len(), ask, 1u64..200, 0..CONNS, any::<bool>(), any::<bool>()).prop_map(
            |(owner, ask, lease, conn, session, wait)| Op::Acquire { owner, ask, lease, conn, session, wait }
        ),
        4 => (0..OWNERS.len()).prop_map(Op::Release),
        2 => (0..OWNERS.len(), 1u64..200).prop_map(|(o, l)| Op::Renew(o, l)),
        3 => (1u64..80).prop_map(Op::Advance),
        2 => Just(Op::Tick),
        2 => (0usize..8).prop_map(Op::Leave),
        1 => (0..CONNS).prop_map(Op::Disconnect),
        1 => (0usize..8).prop_map(Op::Undelivered),
        1 => Just(Op::ForceRelease),
    ];
    prop::collection::vec(op, 1..120)
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct MHolder {
    owner: usize,
    want: Want,
    holds: u32,
    token: u64,
    deadline: u64,
    session: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct MWaiter {
    owner: usize,
    want: Want,
    lease: u64,
    session: Option<u64>,
    conn: u64,
    payload: u32,
    id: WaiterId,
}

/// What the model says a key in use is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyKind {
    Lock,
    Semaphore(u32),
}

struct Sim {
    lock: Lock<u32>,
    tokens: TokenSource,
    now: u64,
    limit: u32,
    holders: Vec<MHolder>,
    queue: Vec<MWaiter>,
    /// `None` while the key is unused (it takes any mode then).
    kind: Option<KeyKind>,
    last_token: u64,
    next_payload: u32,
}

fn kind_of(want: Want) -> KeyKind {
    match want {
        Want::Permits { limit, .. } => KeyKind::Semaphore(limit),
        Want::Exclusive | Want::Shared => KeyKind::Lock,
    }
}

impl Sim {
    fn fits(&self, want: Want) -> bool {
        let exclusive = self.holders.iter().any(|h| h.want == Want::Exclusive);
        match want {
            Want::Exclusive => self.holders.is_empty(),
            Want::Shared => !exclusive,
            Want::Permits { n, limit } => {
                let used: u32 = self.holders.iter().map(|h| permits_of(h.want)).sum();
                used + n <= limit
            }
        }
    }

    /// How the model says the key is held now.
    fn mode(&self) -> Mode {
        match self.kind {
            Some(KeyKind::Semaphore(limit)) => Mode::Semaphore(limit),
            _ if self.holders.iter().any(|h| h.want == Want::Shared) => Mode::Shared,
            _ => Mode::Exclusive,
        }
    }

    fn grant(
        &mut self,
        owner: usize,
        want: Want,
        lease: u64,
        session: Option<u64>,
        token: u64,
    ) -> Result<(), TestCaseError> {
        prop_assert!(
            token > self.last_token,
            "token {} after {}: tokens rise with every grant",
            token,
            self.last_token
        );
        self.last_token = token;
        self.kind = Some(kind_of(want));
        self.holders.push(MHolder { owner, want, holds: 1, token, deadline: self.now + lease, session });
        Ok(())
    }

    /// The model's hand-off: the head while it fits, in order; the core's
    /// outcomes must be exactly those grants.
    fn hand_off(&mut self, out: impl IntoIterator<Item = Outcome<u32>>) -> Result<(), TestCaseError> {
        let mut out = out.into_iter();
        while let Some(head) = self.queue.first().cloned().filter(|w| self.fits(w.want)) {
            self.queue.remove(0);
            let Some(Outcome::Granted { token, waiter: Some(payload) }) = out.next() else {
                return Err(TestCaseError::fail(format!("head {head:?} fits but was not granted")));
            };
            prop_assert_eq!(payload, head.payload, "grants follow the queue's order");
            self.grant(head.owner, head.want, head.lease, head.session, token)?;
        }
        let rest: Vec<_> = out.collect();
        prop_assert!(rest.is_empty(), "outcomes the model does not expect: {:?}", rest);
        self.forget_kind();
        Ok(())
    }

    /// An unused key is gone: the next ACQUIRE may make it anything.
    fn forget_kind(&mut self) {
        if self.holders.is_empty() && self.queue.is_empty() {
            self.kind = None;
        }
    }

    /// The holder with `token` ended for `why`: the first of `out` says so,
    /// the rest is the hand-off.
    fn ended(&mut self, token: u64, why: End, out: Outcomes<u32>) -> Result<(), TestCaseError> {
        let mut out = out.into_iter();
        let gone = self.remove_holder(token);
        let Some(gone) = gone else { return Err(TestCaseError::fail(format!("no holder has {token}"))) };
        self.check_ended(&gone, why, out.next())?;
        self.hand_off(out)
    }

    fn check_ended(&self, gone: &MHolder, why: End, outcome: Option<Outcome<u32>>) -> Result<(), TestCaseError> {
        let Some(Outcome::Ended { holder, terms, why: ended }) = outcome else {
            return Err(TestCaseError::fail(format!("{gone:?} should have ended for {why:?}: {outcome:?}")));
        };
        let got = (&*holder.owner, holder.token, holder.deadline_ms, terms.session, terms.permits, ended);
        let want = (OWNERS[gone.owner].as_bytes(), gone.token, gone.deadline, gone.session, permits_of(gone.want), why);
        prop_assert_eq!(got, want);
        Ok(())
    }

    fn remove_holder(&mut self, token: u64) -> Option<MHolder> {
        let i = self.holders.iter().position(|h| h.token == token)?;
        Some(self.holders.remove(i))
    }

    fn want_of(&self, ask: Ask) -> Want {
        match ask {
            Ask::Exclusive => Want::Exclusive,
            Ask::Shared => Want::Shared,
            Ask::Permits(n) => Want::Permits { n: n.min(self.limit), limit: self.limit },
            Ask::OtherLimit(n) => Want::Permits { n: n.min(self.limit + 1), limit: self.limit + 1 },
        }
    }

    fn acquire(
        &mut self,
        owner: usize,
        ask: Ask,
        lease: u64,
        conn: u64,
        session: bool,
        wait: bool,
    ) -> Result<(), TestCaseError> {
        let want = self.want_of(ask);
        let session = session.then_some(conn);
        let req = Request {
            owner: OWNERS[owner].as_bytes(),
            lease_ms: lease,
            session,
            session_lease: false,
            id: None,
            want,
            lock_delay_ms: 0,
        };
        let mut out = Vec::new();
        let got = self.lock.acquire(&req, self.now, &mut self.tokens, &mut out);
        let mode_ok = match self.kind {
            None => true,
            Some(kind) => kind == kind_of(want),
        };
        if !mode_ok {
            prop_assert_eq!(got, Err(LockError::WrongMode(self.mode())));
            prop_assert!(out.is_empty());
            return Ok(());
        }
        if let Some(i) = self.holders.iter().position(|h| h.owner == owner) {
            let h = self.holders[i].clone();
            let expected = match (h.want, want) {
                (Want::Shared, Want::Exclusive) => Err(LockError::Upgrade),
                (Want::Permits { n: have, .. }, Want::Permits { n, .. }) if have != n => {
                    Err(LockError::PermitsDiffer(have))
                }
                _ => Ok(Acquired::Reentered(h.token)),
            };
            prop_assert_eq!(&got, &expected, "reentry of {:?} asking {:?}", h, want);
            if expected.is_ok() {
                let changed = Outcome::Changed { token: h.token, why: Change::Reentered, old_session: h.session };
                prop_assert_eq!(out, vec![changed]);
                let h = &mut self.holders[i];
                h.holds += 1;
                h.deadline = self.now + lease;
                if session.is_some() {
                    h.session = session;
                }
            } else {
                prop_assert!(out.is_empty());
            }
            return Ok(());
        }
        if self.queue.iter().any(|w| w.owner == owner) {
            prop_assert_eq!(got, Err(LockError::AlreadyQueued));
            prop_assert!(out.is_empty());
            return Ok(());
        }
        if !self.queue.is_empty() || !self.fits(want) {
            prop_assert_eq!(got, Ok(Acquired::Busy), "a try never cuts in, and waits for room");
            prop_assert!(out.is_empty());
            if wait {
                let payload = self.next_payload;
                self.next_payload += 1;
                let id = self.lock.enqueue(&req, payload).map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
                self.queue.push(MWaiter { owner, want, lease, session, conn, payload, id });
            }
            return Ok(());
        }
        match got {
            Ok(Acquired::Granted(token)) => {
                prop_assert_eq!(out, vec![Outcome::Granted { token, waiter: None }]);
                self.grant(owner, want, lease, session, token)
            }
            other => Err(TestCaseError::fail(format!("{want:?} by {owner} fits and nobody waits, got {other:?}"))),
        }
    }

    fn release(&mut self, owner: usize) -> Result<(), TestCaseError> {
        let mut out = Vec::new();
        let got = self.lock.release(OWNERS[owner].as_bytes(), self.now, &mut self.tokens, &mut out);
        let Some(i) = self.holders.iter().position(|h| h.owner == owner) else {
            prop_assert_eq!(got, Err(LockError::NotOwner));
            prop_assert!(out.is_empty());
            return Ok(());
        };
        let Ok(left) = got else { return Err(TestCaseError::fail("release by a holder failed")) };
        self.holders[i].holds -= 1;
        let h = self.holders[i].clone();
        prop_assert_eq!(left, h.holds);
        if left > 0 {
            let changed = Outcome::Changed { token: h.token, why: Change::HoldReleased, old_session: h.session };
            prop_assert_eq!(out, vec![changed]);
            return Ok(());
        }
        self.ended(h.token, End::Released, out)
    }

    fn renew(&mut self, owner: usize, lease: u64) -> Result<(), TestCaseError> {
        let mut out = Vec::new();
        let got = self.lock.renew(OWNERS[owner].as_bytes(), lease, self.now, &mut out);
        match self.holders.iter_mut().find(|h| h.owner == owner) {
            Some(h) => {
                prop_assert_eq!(got, Ok(h.token));
                let changed = Outcome::Changed { token: h.token, why: Change::Renewed, old_session: h.session };
                prop_assert_eq!(out, vec![changed]);
                h.deadline = self.now + lease;
            }
            None => {
                prop_assert_eq!(got, Err(LockError::NotOwner));
                prop_assert!(out.is_empty());
            }
        }
        Ok(())
    }

    fn tick(&mut self) -> Result<(), TestCaseError> {
        let mut due: Vec<&MHolder> = self.holders.iter().filter(|h| h.deadline <= self.now).collect();
        due.sort_by_key(|h| h.token);
        let due: Vec<(u64, usize, Want)> = due.iter().map(|h| (h.token, h.owner, h.want)).collect();
        for (token, owner, want) in due {
            // A holder granted by an earlier expiry in this tick is not due.
            let mut out = Vec::new();
            let (lock, now, tokens) = (&mut self.lock, self.now, &mut self.tokens);
            match want {
                // A command's expiry: the exclusive holder's, and the owner's own.
                Want::Exclusive => lock.expire(None, now, tokens, &mut out),
                Want::Shared => lock.expire(Some(OWNERS[owner].as_bytes()), now, tokens, &mut out),
                // The lease timer.
                Want::Permits { .. } => prop_assert!(lock.expire_token(token, now, tokens, &mut out)),
            }
            self.ended(token, End::LeaseEnded, out)?;
        }
        Ok(())
    }

    fn leave(&mut self, i: usize, why: Leave) -> Result<(), TestCaseError> {
        if self.queue.is_empty() {
            return Ok(());
        }
        let w = self.queue.remove(i % self.queue.len());
        let mut out = Vec::new();
        prop_assert!(self.lock.remove_waiter(w.id, why, &mut out));
        prop_assert!(!self.lock.remove_waiter(w.id, why, &mut out), "a handle works once");
        prop_assert_eq!(out, vec![Outcome::Left { waiter: w.payload, why }]);
        let head_fits = self.queue.first().is_some_and(|head| self.fits(head.want));
        prop_assert_eq!(self.lock.head_fits(), head_fits, "the waiters behind it may fit now");
        let mut out = Vec::new();
        self.lock.grant_waiters(self.now, &mut self.tokens, &mut out);
        self.hand_off(out)
    }

    fn end(&mut self, token: u64, why: End) -> Result<(), TestCaseError> {
        let mut out = Vec::new();
        prop_assert!(self.lock.end(token, why, self.now, &mut self.tokens, &mut out), "end found no holder");
        self.ended(token, why, out)
    }

    fn disconnect(&mut self, conn: u64) -> Result<(), TestCaseError> {
        while let Some(i) = self.queue.iter().position(|w| w.conn == conn) {
            self.leave(i, Leave::Disconnected)?;
        }
        let mut bound: Vec<u64> = self.holders.iter().filter(|h| h.session == Some(conn)).map(|h| h.token).collect();
        bound.sort_unstable();
        for token in bound {
            prop_assert_eq!(self.lock.session_of(token), Some(conn));
            self.end(token, End::SessionClosed)?;
        }
        Ok(())
    }

    fn force_release(&mut self) -> Result<(), TestCaseError> {
        let mut out = Vec::new();
        let removed = self.lock.end_all(End::ForceReleased, self.now, &mut self.tokens, &mut out);
        prop_assert_eq!(removed, self.holders.len());
        let mut out = out.into_iter();
        // Every holder ended, in no particular order.
        let mut gone = std::mem::take(&mut self.holders);
        for _ in 0..removed {
            let outcome = out.next();
            let token = match &outcome {
                Some(Outcome::Ended { holder, .. }) => holder.token,
                other => return Err(TestCaseError::fail(format!("expected an end, got {other:?}"))),
            };
            let Some(i) = gone.iter().position(|h| h.token == token) else {
                return Err(TestCaseError::fail(format!("ended {token}, held by nobody")));
            };
            let h = gone.remove(i);
            self.check_ended(&h, End::ForceReleased, outcome)?;
        }
        self.hand_off(out)
    }

    fn check(&self) -> Result<(), TestCaseError> {
        let mut got: Vec<Seen> = self
            .lock
            .holders()
            .iter()
            .map(|(h, t)| (h.owner.to_vec(), h.holds, h.token, h.deadline_ms, t.session, t.permits))
            .collect();
        got.sort_by_key(|h| h.2);
        let want: Vec<_> = self
            .holders
            .iter()
            .map(|h| (OWNERS[h.owner].as_bytes().to_vec(), h.holds, h.token, h.deadline, h.session, permits_of(h.want)))
            .collect();
        prop_assert_eq!(got, want);
        for h in &self.holders {
            prop_assert_eq!(self.lock.holders().token_of(OWNERS[h.owner].as_bytes()), Some(h.token));
        }
        let queue: Vec<u32> = self.lock.waiters().map(|w| w.payload).collect();
        prop_assert_eq!(queue, self.queue.iter().map(|w| w.payload).collect::<Vec<_>>());
        // The rules themselves, stated once more on the core's own state.
        let holders = self.lock.holders();
        if self.lock.mode() == Mode::Exclusive {
            prop_assert!(holders.len() <= 1, "a writer never holds with anyone else");
        }
        match self.lock.mode() {
            Mode::Semaphore(limit) => {
                prop_assert!(holders.used() <= u64::from(limit), "permits in use within the limit");
                let permits: u64 = holders.iter().map(|(_, t)| u64::from(t.permits)).sum();
                prop_assert_eq!(holders.used(), permits);
            }
            Mode::Exclusive | Mode::Shared => prop_assert_eq!(holders.used(), holders.len() as u64),
        }
        if !self.lock.is_idle() {
            prop_assert_eq!(self.lock.mode(), self.mode());
        }
        prop_assert_eq!(self.lock.is_idle(), self.holders.is_empty() && self.queue.is_empty());
        Ok(())
    }
}

/// A holder as compared: owner, holds, token, deadline, session, permits.
type Seen = (Vec<u8>, u32, u64, u64, Option<u64>, u32);

fn permits_of(want: Want) -> u32 {
    match want {
        Want::Permits { n, .. } => n,
        Want::Exclusive | Want::Shared => 0,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn shared_and_semaphore_locks_behave_like_the_model(limit in 1u32..=5, ops in ops()) {
        let mut sim = Sim {
            lock: Lock::default(),
            tokens: TokenSource::default(),
            now: 1000,
            limit,
            holders: Vec::new(),
            queue: Vec::new(),
            kind: None,
            last_token: 0,
            next_payload: 0,
        };
        for op in ops {
            match op {
                Op::Acquire { owner, ask, lease, conn, session, wait } => sim.acquire(owner, ask, lease, conn, session, wait)?,
                Op::Release(owner) => sim.release(owner)?,
                Op::Renew(owner, lease) => sim.renew(owner, lease)?,
                Op::Advance(ms) => sim.now += ms,
                Op::Tick => sim.tick()?,
                Op::Leave(i) => sim.leave(i, Leave::TimedOut)?,
                Op::Disconnect(conn) => sim.disconnect(conn)?,
                Op::Undelivered(i) if !sim.holders.is_empty() => {
                    let token = sim.holders[i % sim.holders.len()].token;
                    sim.end(token, End::Undelivered)?;
                }
                Op::Undelivered(_) => {}
                Op::ForceRelease => sim.force_release()?,
            }
            sim.forget_kind();
            sim.check()?;
        }
    }
}
