//! Shared holders and semaphores: unit tests of each rule, and a
//! model-based property test of the generalized lock against a plain model
//! (a Vec of holders and a Vec queue).
use super::*;
use proptest::prelude::*;

fn ask(owner: &str, want: Want) -> Request<'_> {
    Request { owner: owner.as_bytes(), lease_ms: 100, session: None, id: None, want }
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

fn payloads<P: Copy>(grants: &[Grant<P>]) -> Vec<P> {
    grants.iter().map(|g| g.payload).collect()
}

#[test]
fn readers_share_and_a_writer_waits_for_all_of_them() {
    let mut t = TokenSource::default();
    let mut lock = Lock::default();
    let a = granted(lock.acquire(&ask("a", SHARED), 1000, &mut t));
    let b = granted(lock.acquire(&ask("b", SHARED), 1000, &mut t));
    assert!(b > a, "readers granted together get different tokens");
    assert_eq!(lock.acquire(&ask("w", EXCL), 1000, &mut t), Ok(Acquired::Busy));
    lock.enqueue(&ask("w", EXCL), "w").unwrap();
    assert_eq!(lock.acquire(&ask("c", SHARED), 1000, &mut t), Ok(Acquired::Busy), "no reader overtakes a writer");
    lock.enqueue(&ask("c", SHARED), "c").unwrap();
    lock.enqueue(&ask("d", SHARED), "d").unwrap();
    lock.enqueue(&ask("x", EXCL), "x").unwrap();
    lock.enqueue(&ask("e", SHARED), "e").unwrap();
    assert!(lock.release(b"a", 1001, &mut t).unwrap().1.is_empty());
    let (_, grants) = lock.release(b"b", 1002, &mut t).unwrap();
    assert_eq!(payloads(&grants), ["w"]);
    assert_eq!(lock.holder().map(|h| &*h.owner), Some(&b"w"[..]));
    let (_, grants) = lock.release(b"w", 1003, &mut t).unwrap();
    assert_eq!(payloads(&grants), ["c", "d"], "readers behind the head up to the next writer, together");
    assert!(grants[1].token > grants[0].token);
    assert_eq!(lock.member_count(), 2);
    assert_eq!(lock.waiters().map(|w| w.payload).collect::<Vec<_>>(), ["x", "e"]);
}

#[test]
fn a_semaphore_grants_in_order_while_requests_fit_and_never_passes_a_big_head() {
    let mut t = TokenSource::default();
    let mut lock = Lock::default();
    granted(lock.acquire(&ask("a", permits(3, 4)), 1000, &mut t));
    assert_eq!(lock.acquire(&ask("b", permits(2, 4)), 1000, &mut t), Ok(Acquired::Busy));
    lock.enqueue(&ask("b", permits(2, 4)), "b").unwrap();
    assert_eq!(
        lock.acquire(&ask("c", permits(1, 4)), 1000, &mut t),
        Ok(Acquired::Busy),
        "one permit is free, but b waits"
    );
    lock.enqueue(&ask("c", permits(1, 4)), "c").unwrap();
    lock.enqueue(&ask("d", permits(1, 4)), "d").unwrap();
    let (_, grants) = lock.release(b"a", 1001, &mut t).unwrap();
    assert_eq!(payloads(&grants), ["b", "c", "d"]);
    assert_eq!(lock.permits_used(), 4);
}

#[test]
fn modes_are_checked_and_a_wrong_one_changes_nothing() {
    let mut t = TokenSource::default();
    let mut lock = Lock::<()>::default();
    granted(lock.acquire(&ask("a", permits(1, 2)), 1000, &mut t));
    assert_eq!(lock.acquire(&ask("b", SHARED), 1000, &mut t), Err(LockError::WrongMode(Mode::Semaphore(2))));
    assert_eq!(lock.acquire(&ask("b", EXCL), 1000, &mut t), Err(LockError::WrongMode(Mode::Semaphore(2))));
    assert_eq!(lock.acquire(&ask("b", permits(1, 3)), 1000, &mut t), Err(LockError::WrongMode(Mode::Semaphore(2))));
    assert_eq!(lock.acquire(&ask("a", permits(2, 2)), 1000, &mut t), Err(LockError::PermitsDiffer(1)));
    assert_eq!(
        lock.acquire(&ask("a", permits(1, 2)), 1000, &mut t).map(|r| matches!(r, Acquired::Reentered(_))),
        Ok(true)
    );
    assert_eq!(lock.member_count(), 1);

    let mut rw = Lock::<()>::default();
    granted(rw.acquire(&ask("a", SHARED), 1000, &mut t));
    assert_eq!(rw.acquire(&ask("b", permits(1, 2)), 1000, &mut t), Err(LockError::WrongMode(Mode::Lock)));
    assert_eq!(rw.acquire(&ask("a", EXCL), 1000, &mut t), Err(LockError::Upgrade));
    assert_eq!(rw.member(rw.members().next().unwrap().holder.token).unwrap().holder.holds, 1);
}

#[test]
fn a_writer_may_also_read_on_its_own_grant() {
    let mut t = TokenSource::default();
    let mut lock = Lock::<()>::default();
    let token = granted(lock.acquire(&ask("w", EXCL), 1000, &mut t));
    assert_eq!(lock.acquire(&ask("w", SHARED), 1000, &mut t), Ok(Acquired::Reentered(token)));
    assert_eq!(lock.holder().map(|h| h.holds), Some(2));
    assert_eq!(lock.member_count(), 0);
}

#[test]
fn each_member_has_its_own_lease_and_a_force_release_counts_them() {
    let mut t = TokenSource::default();
    let mut lock = Lock::default();
    let a = granted(lock.acquire(&Request { lease_ms: 50, ..ask("a", SHARED) }, 1000, &mut t));
    granted(lock.acquire(&ask("b", SHARED), 1000, &mut t));
    lock.enqueue(&ask("w", EXCL), "w").unwrap();
    assert!(lock.expire_token(a, 1049, &mut t).is_none(), "not due yet");
    let (gone, grants) = lock.expire_token(a, 1050, &mut t).unwrap();
    assert_eq!((&*gone.owner, grants.len()), (&b"a"[..], 0));
    assert_eq!(lock.member_count(), 1);
    assert_eq!(lock.remove_all(1060, &mut t).0, 1);
    assert_eq!(lock.holder().map(|h| &*h.owner), Some(&b"w"[..]));
    assert_eq!(lock.remove_all(1070, &mut t).0, 1);
    assert!(lock.is_unused());
}

#[test]
fn the_table_takes_memory_only_while_it_has_members() {
    let mut t = TokenSource::default();
    let mut lock = Lock::<()>::default();
    granted(lock.acquire(&ask("a", EXCL), 1000, &mut t));
    let plain = lock.heap_size();
    lock.release(b"a", 1000, &mut t).unwrap();
    granted(lock.acquire(&ask("a", SHARED), 1000, &mut t));
    assert!(lock.heap_size() > plain);
    lock.release(b"a", 1000, &mut t).unwrap();
    lock.take_changes();
    granted(lock.acquire(&ask("a", EXCL), 1000, &mut t));
    assert_eq!(lock.heap_size(), plain, "an exclusive grant after shared ones is as small as before");
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

struct Sim {
    lock: Lock<u32>,
    tokens: TokenSource,
    now: u64,
    limit: u32,
    holders: Vec<MHolder>,
    queue: Vec<MWaiter>,
    mode: Option<Mode>,
    last_token: u64,
    next_payload: u32,
}

fn mode_of(want: Want) -> Mode {
    match want {
        Want::Permits { limit, .. } => Mode::Semaphore(limit),
        _ => Mode::Lock,
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
        self.mode = Some(mode_of(want));
        self.holders.push(MHolder { owner, want, holds: 1, token, deadline: self.now + lease, session });
        Ok(())
    }

    /// The model's hand-off: the head while it fits, in order; the core's
    /// grants must be exactly those.
    fn hand_off(&mut self, grants: Vec<Grant<u32>>) -> Result<(), TestCaseError> {
        let mut grants = grants.into_iter();
        while let Some(head) = self.queue.first().cloned().filter(|w| self.fits(w.want)) {
            self.queue.remove(0);
            let Some(g) = grants.next() else {
                return Err(TestCaseError::fail(format!("head {head:?} fits but was not granted")));
            };
            prop_assert_eq!(g.payload, head.payload, "grants follow the queue's order");
            self.grant(head.owner, head.want, head.lease, head.session, g.token)?;
        }
        prop_assert!(grants.next().is_none(), "a grant the model does not expect");
        self.forget_mode();
        Ok(())
    }

    fn forget_mode(&mut self) {
        if self.holders.is_empty() && self.queue.is_empty() {
            self.mode = None;
        }
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
        let req = Request { owner: OWNERS[owner].as_bytes(), lease_ms: lease, session, id: None, want };
        let got = self.lock.acquire(&req, self.now, &mut self.tokens);
        let mode_ok = match (self.mode, want) {
            (None, _) => true,
            (Some(Mode::Lock), Want::Exclusive | Want::Shared) => true,
            (Some(Mode::Semaphore(l)), Want::Permits { limit, .. }) => l == limit,
            _ => false,
        };
        if !mode_ok {
            prop_assert_eq!(got, Err(LockError::WrongMode(self.mode.unwrap_or(Mode::Lock))));
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
                let h = &mut self.holders[i];
                h.holds += 1;
                h.deadline = self.now + lease;
                if session.is_some() {
                    h.session = session;
                }
            }
            return Ok(());
        }
        if self.queue.iter().any(|w| w.owner == owner) {
            prop_assert_eq!(got, Err(LockError::AlreadyQueued));
            return Ok(());
        }
        if !self.queue.is_empty() || !self.fits(want) {
            prop_assert_eq!(got, Ok(Acquired::Busy), "a try never cuts in, and waits for room");
            if wait {
                let payload = self.next_payload;
                self.next_payload += 1;
                let id = self.lock.enqueue(&req, payload).map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
                self.queue.push(MWaiter { owner, want, lease, session, conn, payload, id });
            }
            return Ok(());
        }
        match got {
            Ok(Acquired::Granted(token)) => self.grant(owner, want, lease, session, token),
            other => Err(TestCaseError::fail(format!("{want:?} by {owner} fits and nobody waits, got {other:?}"))),
        }
    }

    fn release(&mut self, owner: usize) -> Result<(), TestCaseError> {
        let got = self.lock.release(OWNERS[owner].as_bytes(), self.now, &mut self.tokens);
        let Some(i) = self.holders.iter().position(|h| h.owner == owner) else {
            prop_assert!(matches!(got, Err(LockError::NotOwner)));
            return Ok(());
        };
        let Ok((left, grants)) = got else { return Err(TestCaseError::fail("release by a holder failed")) };
        self.holders[i].holds -= 1;
        prop_assert_eq!(left, self.holders[i].holds);
        if left == 0 {
            self.holders.remove(i);
        }
        self.hand_off(grants)
    }

    fn renew(&mut self, owner: usize, lease: u64) -> Result<(), TestCaseError> {
        let got = self.lock.renew(OWNERS[owner].as_bytes(), lease, self.now);
        match self.holders.iter_mut().find(|h| h.owner == owner) {
            Some(h) => {
                prop_assert_eq!(got, Ok(h.token));
                h.deadline = self.now + lease;
            }
            None => prop_assert_eq!(got, Err(LockError::NotOwner)),
        }
        Ok(())
    }

    fn tick(&mut self) -> Result<(), TestCaseError> {
        let mut due: Vec<&MHolder> = self.holders.iter().filter(|h| h.deadline <= self.now).collect();
        due.sort_by_key(|h| h.token);
        let due: Vec<(u64, Want)> = due.iter().map(|h| (h.token, h.want)).collect();
        for (token, want) in due {
            // A holder granted by an earlier expiry in this tick is not due.
            let got = match want {
                Want::Exclusive => self.lock.expire_due(self.now, &mut self.tokens),
                _ => self.lock.expire_token(token, self.now, &mut self.tokens),
            };
            let Some((gone, grants)) = got else { return Err(TestCaseError::fail("a due lease did not end")) };
            prop_assert_eq!(gone.token, token);
            self.remove_holder(token);
            self.hand_off(grants)?;
        }
        Ok(())
    }

    fn leave(&mut self, i: usize) -> Result<(), TestCaseError> {
        if self.queue.is_empty() {
            return Ok(());
        }
        let w = self.queue.remove(i % self.queue.len());
        prop_assert_eq!(self.lock.remove_waiter(w.id).map(|w| w.payload), Some(w.payload));
        prop_assert!(self.lock.remove_waiter(w.id).is_none(), "a handle works once");
        let grants = self.lock.grant_waiters(self.now, &mut self.tokens);
        self.hand_off(grants)
    }

    fn end(&mut self, token: u64) -> Result<(), TestCaseError> {
        let grants = self.lock.end_holder(token, self.now, &mut self.tokens);
        prop_assert!(self.remove_holder(token).is_some());
        self.hand_off(grants.ok_or_else(|| TestCaseError::fail("end_holder found no holder"))?)
    }

    fn disconnect(&mut self, conn: u64) -> Result<(), TestCaseError> {
        while let Some(i) = self.queue.iter().position(|w| w.conn == conn) {
            self.leave(i)?;
        }
        let mut bound: Vec<u64> = self.holders.iter().filter(|h| h.session == Some(conn)).map(|h| h.token).collect();
        bound.sort_unstable();
        for token in bound {
            prop_assert_eq!(self.lock.session_of(token), Some(conn));
            self.end(token)?;
        }
        Ok(())
    }

    fn check(&self) -> Result<(), TestCaseError> {
        let mut got: Vec<Seen> =
            self.lock.holders().map(|(h, s, p)| (h.owner.to_vec(), h.holds, h.token, h.deadline_ms, s, p)).collect();
        got.sort_by_key(|h| h.2);
        let want: Vec<_> = self
            .holders
            .iter()
            .map(|h| (OWNERS[h.owner].as_bytes().to_vec(), h.holds, h.token, h.deadline, h.session, permits_of(h.want)))
            .collect();
        prop_assert_eq!(got, want);
        let queue: Vec<u32> = self.lock.waiters().map(|w| w.payload).collect();
        prop_assert_eq!(queue, self.queue.iter().map(|w| w.payload).collect::<Vec<_>>());
        // The rules themselves, stated once more on the core's own state.
        let exclusive = self.lock.holder().is_some();
        prop_assert!(!exclusive || self.lock.member_count() == 0, "a writer never holds with anyone else");
        if let Some(Mode::Semaphore(limit)) = self.mode {
            prop_assert!(self.lock.permits_used() <= u64::from(limit), "permits in use within the limit");
        }
        if let Some(mode) = self.mode.filter(|_| !self.lock.is_unused()) {
            prop_assert_eq!(self.lock.mode(), mode);
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
        _ => 0,
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
            mode: None,
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
                Op::Leave(i) => sim.leave(i)?,
                Op::Disconnect(conn) => sim.disconnect(conn)?,
                Op::Undelivered(i) if !sim.holders.is_empty() => {
                    let token = sim.holders[i % sim.holders.len()].token;
                    sim.end(token)?;
                }
                Op::Undelivered(_) => {}
                Op::ForceRelease => {
                    let (removed, grants) = sim.lock.remove_all(sim.now, &mut sim.tokens);
                    prop_assert_eq!(removed, sim.holders.len());
                    sim.holders.clear();
                    sim.hand_off(grants)?;
                }
            }
            sim.forget_mode();
            sim.check()?;
            // The Redis layer drains the table's change log after each operation.
            sim.lock.take_changes();
        }
    }
}
