//! The FLOCK commands as the spec describes them, one behaviour per test.
use crate::common::*;

use std::time::{Duration, Instant};

#[test]
fn free_lock_is_granted_at_once_with_a_token() {
    let s = Server::start();
    let mut c = s.conn();
    let token = acquire(&mut c, "L", "a", 10_000).unwrap().expect("granted");
    assert!(token > 0);
    let t: String = redis::cmd("TYPE").arg("L").query(&mut c).unwrap();
    assert_eq!(t, "flocklock");
}

#[test]
fn try_on_held_lock_is_nil_and_queues_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "L", "a", 10_000).unwrap();
    assert_eq!(acquire(&mut c, "L", "b", 10_000).unwrap(), None);
    assert!(queue_of(&mut c, "L").is_empty());
}

#[test]
fn waiter_is_handed_the_lock_on_release() {
    let s = Server::start();
    let mut c = s.conn();
    let t1 = acquire(&mut c, "L", "a", 10_000).unwrap().unwrap();
    let w = spawn_waiter(&s, "L", "b", 10_000, 0);
    wait_queue(&mut c, "L", &["b"]);
    assert_eq!(release(&mut c, "L", "a").unwrap(), 0);
    let t2 = w.join().unwrap().unwrap().expect("granted");
    assert!(t2 > t1);
    assert_eq!(owner_of(&mut c, "L").as_deref(), Some("b"));
}

#[test]
fn released_lock_without_waiters_leaves_no_key() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "L", "a", 10_000).unwrap();
    release(&mut c, "L", "a").unwrap();
    let n: i64 = redis::cmd("EXISTS").arg("L").query(&mut c).unwrap();
    assert_eq!(n, 0);
}

// ---------------------------------------------------------------------------
// Helpers local to this file.

fn assert_notowner<T: std::fmt::Debug>(r: RedisResult<T>, what: &str) {
    let e = expect_err(r, what);
    assert_eq!(error_code(&e), "NOTOWNER", "{what}: {e}");
}

// ---------------------------------------------------------------------------
// Reentrancy.

#[test]
fn reentrant_acquire_returns_same_token_and_counts_holds() {
    let s = Server::start();
    let mut c = s.conn();
    let t1 = acquire(&mut c, "L", "a", 10_000).unwrap().expect("granted");
    let t2 = acquire(&mut c, "L", "a", 10_000).unwrap().expect("reentered");
    assert_eq!(t1, t2, "a reentrant acquire returns the current token");
    assert_eq!(holds(&mut c, "L"), 2);
    assert_eq!(int_field(&mut c, "L", "token"), t1);
    assert_eq!(release(&mut c, "L", "a").unwrap(), 1);
    assert_eq!(holds(&mut c, "L"), 1);
    assert_eq!(owner_of(&mut c, "L").as_deref(), Some("a"));
    assert_eq!(release(&mut c, "L", "a").unwrap(), 0);
    assert!(info(&mut c, "L").is_none());
    assert!(!exists(&mut c, "L"));
}

#[test]
fn reentrant_acquire_from_another_connection_by_same_owner_reenters() {
    let s = Server::start();
    let (mut c1, mut c2) = (s.conn(), s.conn());
    let t1 = acquire(&mut c1, "L", "a", 10_000).unwrap().unwrap();
    assert_eq!(acquire_wait(&mut c2, "L", "a", 10_000, 0).unwrap(), Some(t1), "reentry never waits");
    assert_eq!(holds(&mut c1, "L"), 2);
}

#[test]
fn reentrant_acquire_resets_the_lease() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "L", "a", 1_000).unwrap().unwrap();
    assert!(ttl_ms(&mut c, "L") <= 1_000);
    acquire(&mut c, "L", "a", 1_000_000).unwrap().unwrap();
    let ttl = ttl_ms(&mut c, "L");
    assert!(ttl > 1_000 && ttl <= 1_000_000, "ttl-ms {ttl} after reentry with lease 1000000");
}

#[test]
fn reentrant_acquire_does_not_wait_behind_queued_waiters() {
    let s = Server::start();
    let mut c = s.conn();
    let t = acquire(&mut c, "L", "a", 10_000).unwrap().unwrap();
    let w = waiter(&s, "L", "b", 10_000);
    wait_queue(&mut c, "L", &["b"]);
    assert_eq!(acquire_wait(&mut c, "L", "a", 10_000, 0).unwrap(), Some(t), "WAIT 0 by the holder reenters at once");
    assert_eq!(holds(&mut c, "L"), 2);
    assert_eq!(queue_of(&mut c, "L"), ["b"]);
    assert_eq!(release(&mut c, "L", "a").unwrap(), 1);
    assert_eq!(release(&mut c, "L", "a").unwrap(), 0);
    assert!(granted(w, "b") > t);
}

// ---------------------------------------------------------------------------
// RENEW and ownership errors.

#[test]
fn renew_returns_current_token_and_resets_ttl() {
    let s = Server::start();
    let mut c = s.conn();
    let t = acquire(&mut c, "L", "a", 1_000).unwrap().unwrap();
    assert_eq!(renew(&mut c, "L", "a", 1_000_000).unwrap(), t);
    let ttl = ttl_ms(&mut c, "L");
    assert!(ttl > 1_000 && ttl <= 1_000_000, "ttl-ms {ttl} after RENEW 1000000");
    // A shorter lease also takes effect: the lease is reset, not extended.
    assert_eq!(renew(&mut c, "L", "a", 500).unwrap(), t);
    let ttl = ttl_ms(&mut c, "L");
    assert!((0..=500).contains(&ttl), "ttl-ms {ttl} after RENEW 500");
    assert_eq!(holds(&mut c, "L"), 1, "RENEW does not add a hold");
    assert_eq!(int_field(&mut c, "L", "token"), t);
}

/// `L` held twice by `a` with a long lease and `w` queued: the state that
/// refused commands must leave exactly as it was.
struct Baseline {
    w: std::thread::JoinHandle<RedisResult<Option<i64>>>,
    started: Instant,
    before: Option<Vec<(String, Value)>>,
    ttl_before: i64,
}

impl Baseline {
    fn new(s: &Server, c: &mut Connection) -> Self {
        acquire(c, "L", "a", 1_000_000).unwrap().unwrap();
        acquire(c, "L", "a", 1_000_000).unwrap().unwrap();
        let w = waiter(s, "L", "w", 10_000);
        wait_queue(c, "L", &["w"]);
        Baseline { w, started: Instant::now(), before: info_still(c, "L"), ttl_before: ttl_ms(c, "L") }
    }

    /// The lease only counted down; then `w` gets the lock.
    fn finish(self, c: &mut Connection) {
        let (ttl_before, ttl_after) = (self.ttl_before, ttl_ms(c, "L"));
        let elapsed = self.started.elapsed().as_millis() as i64;
        assert!(
            ttl_after <= ttl_before && ttl_before - ttl_after <= elapsed + 2,
            "lease changed: {ttl_before} -> {ttl_after}"
        );
        force_release(c, "L").unwrap();
        granted(self.w, "w");
    }
}

#[test]
fn renew_and_release_by_non_holder_are_notowner_and_change_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    let base = Baseline::new(&s, &mut c);
    assert_notowner(renew(&mut c, "L", "b", 1_000_000_000), "RENEW by non-holder");
    assert_notowner(renew(&mut c, "L", "b", 1), "RENEW by non-holder");
    assert_notowner(release(&mut c, "L", "b"), "RELEASE by non-holder");
    // A queued owner is not the holder either.
    assert_notowner(renew(&mut c, "L", "w", 1), "RENEW by a queued owner");
    assert_notowner(release(&mut c, "L", "w"), "RELEASE by a queued owner");
    assert_eq!(info_still(&mut c, "L"), base.before);
    assert_eq!(dbsize(&mut c), 1);
    base.finish(&mut c);
}

#[test]
fn renew_and_release_on_missing_key_are_notowner_and_create_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    assert_notowner(renew(&mut c, "M", "a", 1_000), "RENEW on a missing key");
    assert_notowner(release(&mut c, "M", "a"), "RELEASE on a missing key");
    assert!(info(&mut c, "M").is_none());
    assert_eq!(dbsize(&mut c), 0);
}

#[test]
fn release_after_full_release_is_notowner() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "L", "a", 10_000).unwrap().unwrap();
    assert_eq!(release(&mut c, "L", "a").unwrap(), 0);
    assert_notowner(release(&mut c, "L", "a"), "second RELEASE");
    assert_notowner(renew(&mut c, "L", "a", 10_000), "RENEW after RELEASE");
    assert_eq!(dbsize(&mut c), 0);
}

// ---------------------------------------------------------------------------
// FORCERELEASE.

#[test]
fn forcerelease_hands_lock_to_queue_head() {
    let s = Server::start();
    let mut c = s.conn();
    let t = acquire(&mut c, "L", "a", 1_000_000).unwrap().unwrap();
    acquire(&mut c, "L", "a", 1_000_000).unwrap().unwrap();
    let wb = waiter(&s, "L", "b", 10_000);
    wait_queue(&mut c, "L", &["b"]);
    let wc = waiter(&s, "L", "c", 10_000);
    wait_queue(&mut c, "L", &["b", "c"]);
    assert_eq!(force_release(&mut c, "L").unwrap(), 1, "whatever the holds");
    let tb = granted(wb, "b");
    assert!(tb > t);
    assert_eq!(owner_of(&mut c, "L").as_deref(), Some("b"));
    assert_eq!(holds(&mut c, "L"), 1);
    assert_eq!(int_field(&mut c, "L", "token"), tb);
    assert_eq!(queue_of(&mut c, "L"), ["c"]);
    assert_notowner(release(&mut c, "L", "a"), "RELEASE by the force-released holder");
    force_release(&mut c, "L").unwrap();
    assert!(granted(wc, "c") > tb);
}

#[test]
fn forcerelease_without_waiters_removes_the_key_and_is_zero_when_missing() {
    let s = Server::start();
    let mut c = s.conn();
    assert_eq!(force_release(&mut c, "M").unwrap(), 0, "missing key");
    assert_eq!(dbsize(&mut c), 0);
    acquire(&mut c, "L", "a", 10_000).unwrap().unwrap();
    assert_eq!(force_release(&mut c, "L").unwrap(), 1);
    assert!(!exists(&mut c, "L"));
    assert_eq!(force_release(&mut c, "L").unwrap(), 0, "already released");
}

// ---------------------------------------------------------------------------
// An owner queued on another connection.

#[test]
fn acquire_by_an_owner_already_queued_is_error_queued() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "L", "a", 10_000).unwrap().unwrap();
    let wb = waiter(&s, "L", "b", 10_000);
    wait_queue(&mut c, "L", &["b"]);
    let mut other = s.conn();
    let e = expect_err(acquire(&mut other, "L", "b", 10_000), "try by a queued owner");
    assert_eq!(error_code(&e), "QUEUED", "{e}");
    let e = expect_err(acquire_wait(&mut other, "L", "b", 10_000, 1_000), "WAIT by a queued owner");
    assert_eq!(error_code(&e), "QUEUED", "{e}");
    assert_eq!(queue_of(&mut c, "L"), ["b"], "the queue is unchanged");
    assert_eq!(owner_of(&mut c, "L").as_deref(), Some("a"));
    assert_eq!(release(&mut c, "L", "a").unwrap(), 0);
    granted(wb, "b");
}

// ---------------------------------------------------------------------------
// FLOCK.INFO.

/// The seven fields of an exclusive lock, then those of shared holders and
/// semaphores (tests/integration/shared_holders.rs checks those for them),
/// then the lock-delay left (tests/integration/lock_delay.rs).
#[test]
fn info_is_nil_for_missing_key() {
    let s = Server::start();
    let v: Value = redis::cmd("FLOCK.INFO").arg("M").query(&mut s.conn()).unwrap();
    assert_eq!(v, Value::Nil);
    let v: Value = redis::cmd("FLOCK.INFO").arg("M").query(&mut s.conn3()).unwrap();
    assert_eq!(v, Value::Nil);
}

/// Holder `a` with 2 holds (lease 1000000, no SESSION), waiters `b` then `c`.
fn info_fixture(s: &Server) -> (i64, Vec<std::thread::JoinHandle<RedisResult<Option<i64>>>>) {
    let mut c = s.conn();
    let t = acquire(&mut c, "L", "a", 1_000_000).unwrap().unwrap();
    acquire(&mut c, "L", "a", 1_000_000).unwrap().unwrap();
    let wb = waiter(s, "L", "b", 10_000);
    wait_queue(&mut c, "L", &["b"]);
    let wc = waiter(s, "L", "c", 10_000);
    wait_queue(&mut c, "L", &["b", "c"]);
    (t, vec![wb, wc])
}

fn check_info_pairs(pairs: &[(Value, Value)], token: i64) {
    let names: Vec<String> = pairs.iter().map(|(k, _)| redis::from_redis_value(k).expect("field name")).collect();
    assert_eq!(names, INFO_FIELDS, "field order");
    assert_eq!(pairs[0].1, Value::BulkString(b"a".to_vec()), "owner");
    assert_eq!(pairs[1].1, Value::Int(2), "holds");
    assert_eq!(pairs[2].1, Value::Int(token), "token");
    let ttl = int(&pairs[3].1);
    assert!(ttl > 0 && ttl <= 1_000_000, "ttl-ms {ttl}");
    assert_eq!(pairs[4].1, Value::Int(0), "session");
    assert_eq!(pairs[5].1, Value::Int(2), "waiters");
    assert_eq!(
        pairs[6].1,
        Value::Array(vec![Value::BulkString(b"b".to_vec()), Value::BulkString(b"c".to_vec())]),
        "queue, head first"
    );
    assert_eq!(pairs[7].1, Value::BulkString(b"exclusive".to_vec()), "mode");
    assert_eq!(pairs[8].1, Value::Int(0), "limit: none for a lock");
    let Value::Array(holders) = &pairs[9].1 else { panic!("holders is not an array: {:?}", pairs[9].1) };
    assert_eq!(holders.len(), 1, "the exclusive holder is the one holder listed");
    assert_eq!(pairs[10].1, Value::Int(0), "delayed-ms: no lock-delay runs");
    let [held, oldest, contended, handoffs, waits, longest, held_longest] =
        std::array::from_fn(|i| int(&pairs[11 + i].1));
    assert!(held >= oldest && contended >= oldest, "a held since before b queued: {pairs:?}");
    assert_eq!((handoffs, waits, longest, held_longest), (0, 0, 0, 0), "nothing handed off or ended yet");
}

fn finish_info_fixture(s: &Server, waiters: Vec<std::thread::JoinHandle<RedisResult<Option<i64>>>>) {
    let mut c = s.conn();
    for (w, name) in waiters.into_iter().zip(["b", "c"]) {
        force_release(&mut c, "L").unwrap();
        granted(w, name);
    }
}

#[test]
fn info_resp2_is_flat_array_in_field_order() {
    let s = Server::start();
    let (t, waiters) = info_fixture(&s);
    let v: Value = redis::cmd("FLOCK.INFO").arg("L").query(&mut s.conn()).unwrap();
    let Value::Array(items) = v else { panic!("RESP2 FLOCK.INFO is not a flat array: {v:?}") };
    assert_eq!(items.len(), 36);
    let pairs: Vec<(Value, Value)> = items.chunks(2).map(|p| (p[0].clone(), p[1].clone())).collect();
    check_info_pairs(&pairs, t);
    finish_info_fixture(&s, waiters);
}

#[test]
fn info_resp3_is_map_in_field_order() {
    let s = Server::start();
    let (t, waiters) = info_fixture(&s);
    let v: Value = redis::cmd("FLOCK.INFO").arg("L").query(&mut s.conn3()).unwrap();
    let Value::Map(pairs) = v else { panic!("RESP3 FLOCK.INFO is not a map: {v:?}") };
    check_info_pairs(&pairs, t);
    finish_info_fixture(&s, waiters);
}

// ---------------------------------------------------------------------------
// WAIT timeout.

#[test]
fn wait_timeout_returns_nil_and_leaves_the_queue() {
    // b's timeout is long enough to see it queued between c1 and c2 even on
    // a loaded machine; only a lower bound on its answer is asserted.
    const TIMEOUT_MS: u64 = 2_000;
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "L", "a", 1_000_000).unwrap().unwrap();
    let c1 = waiter(&s, "L", "c1", 1_000_000);
    wait_queue(&mut c, "L", &["c1"]);
    let started = Instant::now();
    let b = spawn_waiter(&s, "L", "b", 1_000_000, TIMEOUT_MS);
    wait_queue(&mut c, "L", &["c1", "b"]);
    let c2 = waiter(&s, "L", "c2", 1_000_000);
    wait_queue(&mut c, "L", &["c1", "b", "c2"]);
    assert_eq!(b.join().unwrap().unwrap(), None, "nil after the timeout");
    assert!(started.elapsed() >= Duration::from_millis(TIMEOUT_MS), "answered before its timeout");
    assert_eq!(queue_of(&mut c, "L"), ["c1", "c2"], "b left, the others kept their order");
    assert_eq!(int_field(&mut c, "L", "waiters"), 2);
    assert_eq!(owner_of(&mut c, "L").as_deref(), Some("a"));
    assert_eq!(s.stat("wait_timeouts"), 1);
    assert_eq!(release(&mut c, "L", "a").unwrap(), 0);
    granted(c1, "c1");
    force_release(&mut c, "L").unwrap();
    granted(c2, "c2");
}

#[test]
fn wait_timeout_of_sole_waiter_keeps_holder_and_key() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "L", "a", 1_000_000).unwrap().unwrap();
    let w = spawn_waiter(&s, "L", "b", 10_000, 100);
    assert_eq!(w.join().unwrap().unwrap(), None);
    assert!(queue_of(&mut c, "L").is_empty());
    assert_eq!(owner_of(&mut c, "L").as_deref(), Some("a"));
    assert_eq!(s.stat("waiters"), 0);
    assert_eq!(release(&mut c, "L", "a").unwrap(), 0);
    assert_eq!(dbsize(&mut c), 0);
}

#[test]
fn repeated_wait_timeouts_keep_the_server_healthy() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "L", "a", 1_000_000).unwrap().unwrap();
    let mut w = s.conn();
    for i in 0..5 {
        assert_eq!(acquire_wait(&mut w, "L", "b", 10_000, 20).unwrap(), None, "timeout {i}");
    }
    let all: RedisResult<String> = redis::cmd("INFO").arg("everything").query(&mut c);
    assert!(all.is_ok(), "INFO after WAIT timeouts: {all:?}");
    let pong: RedisResult<String> = redis::cmd("PING").query(&mut c);
    assert_eq!(pong.ok().as_deref(), Some("PONG"), "server is alive after WAIT timeouts");
    assert_eq!(s.stat("wait_timeouts"), 5);
    assert_eq!(owner_of(&mut c, "L").as_deref(), Some("a"));
}

// ---------------------------------------------------------------------------
// SESSION.

fn acquire_session(c: &mut Connection, key: &str, owner: &str, lease_ms: u64) -> RedisResult<Option<i64>> {
    redis::cmd("FLOCK.ACQUIRE").arg(key).arg(owner).arg(lease_ms).arg("SESSION").query(c)
}

#[test]
fn info_shows_session_one_for_session_holder() {
    let s = Server::start();
    let mut c = s.conn();
    acquire_session(&mut c, "L", "a", 10_000).unwrap().unwrap();
    assert_eq!(int_field(&mut c, "L", "session"), 1);
    acquire(&mut c, "K", "a", 10_000).unwrap().unwrap();
    assert_eq!(int_field(&mut c, "K", "session"), 0);
}

#[test]
fn closing_session_holder_connection_grants_next_waiter() {
    let s = Server::start();
    let mut holder = s.conn();
    let mut c = s.conn();
    let t = acquire_session(&mut holder, "L", "a", 1_000_000).unwrap().unwrap();
    // Whatever the hold count.
    acquire(&mut holder, "L", "a", 1_000_000).unwrap().unwrap();
    let w = waiter(&s, "L", "b", 10_000);
    wait_queue(&mut c, "L", &["b"]);
    drop(holder);
    let tb = granted(w, "b");
    assert!(tb > t);
    assert_eq!(owner_of(&mut c, "L").as_deref(), Some("b"));
    assert_eq!(int_field(&mut c, "L", "session"), 0, "b did not ask for SESSION");
    assert_eq!(s.stat("session_releases"), 1);
    assert_notowner(release(&mut c, "L", "a"), "RELEASE by the closed session's owner");
}

#[test]
fn closing_session_holder_connection_without_waiters_removes_the_lock() {
    let s = Server::start();
    let mut holder = s.conn();
    let mut c = s.conn();
    acquire_session(&mut holder, "L", "a", 1_000_000).unwrap().unwrap();
    drop(holder);
    wait_until("the session lock is released", 5 * SECOND, || !exists(&mut c, "L"));
    assert_eq!(s.stat("session_releases"), 1);
    assert_eq!(acquire(&mut c, "L", "b", 10_000).unwrap().map(|t| t > 0), Some(true));
}

#[test]
fn session_waiter_is_bound_to_its_connection_once_granted() {
    let s = Server::start();
    let mut c = s.conn();
    let t = acquire(&mut c, "L", "a", 1_000_000).unwrap().unwrap();
    let mut b_conn = s.conn();
    let b = std::thread::spawn(move || {
        let r: RedisResult<Option<i64>> = redis::cmd("FLOCK.ACQUIRE")
            .arg("L")
            .arg("b")
            .arg(1_000_000)
            .arg("WAIT")
            .arg(LONG_WAIT_MS)
            .arg("SESSION")
            .query(&mut b_conn);
        (r, b_conn)
    });
    wait_queue(&mut c, "L", &["b"]);
    let w = waiter(&s, "L", "c", 1_000_000);
    wait_queue(&mut c, "L", &["b", "c"]);
    assert_eq!(release(&mut c, "L", "a").unwrap(), 0);
    let (r, b_conn) = b.join().unwrap();
    let tb = r.unwrap().expect("b granted");
    assert!(tb > t);
    assert_eq!(int_field(&mut c, "L", "session"), 1);
    drop(b_conn);
    assert!(granted(w, "c") > tb, "closing b's connection hands the lock to c");
    assert_eq!(owner_of(&mut c, "L").as_deref(), Some("c"));
}

// ---------------------------------------------------------------------------
// Lease expiry.

#[test]
fn expired_lease_passes_to_waiter_and_old_holder_gets_notowner() {
    let s = Server::start();
    let mut c = s.conn();
    let t = acquire(&mut c, "L", "a", 1_000_000).unwrap().unwrap();
    let w = waiter(&s, "L", "b", 1_000_000);
    wait_queue(&mut c, "L", &["b"]);
    // From now on the holder has a 200 ms lease and never releases; no other
    // command touches the lock until the waiter has its answer.
    assert_eq!(renew(&mut c, "L", "a", 200).unwrap(), t);
    let tb = granted(w, "b");
    assert!(tb > t);
    assert_notowner(release(&mut c, "L", "a"), "RELEASE by the expired holder");
    assert_notowner(renew(&mut c, "L", "a", 10_000), "RENEW by the expired holder");
    assert_eq!(owner_of(&mut c, "L").as_deref(), Some("b"));
    assert_eq!(int_field(&mut c, "L", "token"), tb);
    assert_eq!(s.stat("lease_expiries"), 1);
}

#[test]
fn expired_lease_without_waiters_removes_the_key() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "L", "a", 200).unwrap().unwrap();
    // Only EXISTS/INFO (no FLOCK command) until the key is gone: the server's
    // timer must end the lease by itself.
    wait_until("the expired lock's key is removed", 10 * SECOND, || !exists(&mut c, "L"));
    assert_eq!(s.stat("lease_expiries"), 1);
    assert_eq!(dbsize(&mut c), 0);
    assert_notowner(release(&mut c, "L", "a"), "RELEASE after expiry");
    assert_notowner(renew(&mut c, "L", "a", 10_000), "RENEW after expiry");
}

// ---------------------------------------------------------------------------
// Bad input.

#[derive(Clone, Copy, Debug, PartialEq)]
enum Bad {
    /// `ERR wrong number of arguments ...`
    Arity,
    /// Any other `ERR ...`
    Err,
}

/// Commands with `{K}` for the key and `{O}` for the holder's owner.
fn bad_cases() -> Vec<(Vec<Vec<u8>>, Bad)> {
    let long = "x".repeat(257);
    let table: Vec<(Vec<&str>, Bad)> = vec![
        // Arity, every command.
        (vec!["FLOCK.ACQUIRE"], Bad::Arity),
        (vec!["FLOCK.ACQUIRE", "{K}"], Bad::Arity),
        (vec!["FLOCK.ACQUIRE", "{K}", "{O}"], Bad::Arity),
        (vec!["FLOCK.RELEASE"], Bad::Arity),
        (vec!["FLOCK.RELEASE", "{K}"], Bad::Arity),
        (vec!["FLOCK.RELEASE", "{K}", "{O}", "extra"], Bad::Err),
        (vec!["FLOCK.RENEW"], Bad::Arity),
        (vec!["FLOCK.RENEW", "{K}"], Bad::Arity),
        (vec!["FLOCK.RENEW", "{K}", "{O}"], Bad::Arity),
        (vec!["FLOCK.RENEW", "{K}", "{O}", "1000", "extra"], Bad::Err),
        (vec!["FLOCK.FORCERELEASE"], Bad::Arity),
        (vec!["FLOCK.FORCERELEASE", "{K}", "extra"], Bad::Err),
        (vec!["FLOCK.INFO"], Bad::Arity),
        (vec!["FLOCK.INFO", "{K}", "extra"], Bad::Arity),
        // Unknown, misspelled and repeated options.
        (vec!["FLOCK.ACQUIRE", "{K}", "{O}", "1000", "NX"], Bad::Err),
        (vec!["FLOCK.ACQUIRE", "{K}", "{O}", "1000", "extra"], Bad::Err),
        (vec!["FLOCK.ACQUIRE", "{K}", "{O}", "1000", "WAITS", "10"], Bad::Err),
        (vec!["FLOCK.ACQUIRE", "{K}", "{O}", "1000", "WAT", "10"], Bad::Err),
        (vec!["FLOCK.ACQUIRE", "{K}", "{O}", "1000", "SESION"], Bad::Err),
        (vec!["FLOCK.ACQUIRE", "{K}", "{O}", "1000", "SESSIONS"], Bad::Err),
        (vec!["FLOCK.ACQUIRE", "{K}", "{O}", "1000", "SESSION", "extra"], Bad::Err),
        (vec!["FLOCK.ACQUIRE", "{K}", "{O}", "1000", "WAIT", "10", "WAIT", "10"], Bad::Err),
        (vec!["FLOCK.ACQUIRE", "{K}", "{O}", "1000", "wait", "10", "WAIT", "20"], Bad::Err),
        (vec!["FLOCK.ACQUIRE", "{K}", "{O}", "1000", "SESSION", "session"], Bad::Err),
        (vec!["FLOCK.ACQUIRE", "{K}", "{O}", "1000", "SESSION", "WAIT", "10", "SESSION"], Bad::Err),
        // Missing WAIT value.
        (vec!["FLOCK.ACQUIRE", "{K}", "{O}", "1000", "WAIT"], Bad::Err),
        (vec!["FLOCK.ACQUIRE", "{K}", "{O}", "1000", "SESSION", "WAIT"], Bad::Err),
        (vec!["FLOCK.ACQUIRE", "{K}", "{O}", "1000", "WAIT", "SESSION"], Bad::Err),
        // Owners: empty, 257 bytes.
        (vec!["FLOCK.ACQUIRE", "{K}", "", "1000"], Bad::Err),
        (vec!["FLOCK.ACQUIRE", "{K}", &long, "1000"], Bad::Err),
        (vec!["FLOCK.RELEASE", "{K}", ""], Bad::Err),
        (vec!["FLOCK.RELEASE", "{K}", &long], Bad::Err),
        (vec!["FLOCK.RENEW", "{K}", "", "1000"], Bad::Err),
        (vec!["FLOCK.RENEW", "{K}", &long, "1000"], Bad::Err),
        // Negative timeout.
        (vec!["FLOCK.ACQUIRE", "{K}", "{O}", "1000", "WAIT", "-1"], Bad::Err),
    ];
    // Bad numbers, as ACQUIRE lease, RENEW lease and WAIT timeout.
    let numbers = [
        "abc",
        "",
        "1.5",
        "1.0",
        "1e3",
        "0x10",
        "+5",
        " 5",
        "5 ",
        "-5",
        "-0",
        "1099511627777",
        "9223372036854775808",
        "18446744073709551616",
        "99999999999999999999999",
    ];
    let mut table = table;
    for n in numbers {
        table.push((vec!["FLOCK.ACQUIRE", "{K}", "{O}", n], Bad::Err));
        table.push((vec!["FLOCK.RENEW", "{K}", "{O}", n], Bad::Err));
        table.push((vec!["FLOCK.ACQUIRE", "{K}", "{O}", "1000", "WAIT", n], Bad::Err));
    }
    // Zero lease (a zero timeout is valid: it waits without limit).
    table.push((vec!["FLOCK.ACQUIRE", "{K}", "{O}", "0"], Bad::Err));
    table.push((vec!["FLOCK.RENEW", "{K}", "{O}", "0"], Bad::Err));
    table.into_iter().map(|(args, class)| (args.into_iter().map(|a| a.as_bytes().to_vec()).collect(), class)).collect()
}

fn run_bad(c: &mut Connection, args: &[Vec<u8>], key: &str, owner: &str) -> RedisResult<Value> {
    let mut cmd = redis::cmd(std::str::from_utf8(&args[0]).unwrap());
    for a in &args[1..] {
        match a.as_slice() {
            b"{K}" => cmd.arg(key),
            b"{O}" => cmd.arg(owner),
            other => cmd.arg(other),
        };
    }
    cmd.query(c)
}

#[test]
fn bad_input_is_an_error_and_changes_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    // L: held by `a` twice with a long lease, SESSION off, `w` queued.
    // Any bad command accepted by mistake would show: a hold more or less, a
    // lease reset, a SESSION flag, a new key M.
    let base = Baseline::new(&s, &mut c);

    let cases = bad_cases();
    let mut failures = Vec::new();
    for (args, class) in &cases {
        for (key, owner) in [("L", "a"), ("M", "a")] {
            let shown: Vec<String> =
                args.iter().map(|a| String::from_utf8_lossy(&a[..a.len().min(20)]).into_owned()).collect();
            let what = format!("{shown:?} on {key}");
            match run_bad(&mut c, args, key, owner) {
                Ok(v) => failures.push(format!("{what}: accepted, replied {v:?}")),
                Err(e) => {
                    let code = error_code(&e);
                    let arity = e.detail().is_some_and(|d| d.contains("wrong number of arguments"));
                    let ok = code == "ERR" && (arity == (*class == Bad::Arity));
                    if !ok {
                        failures.push(format!("{what}: expected {class:?}, got {e}"));
                    }
                }
            }
            if dbsize(&mut c) != 1 {
                failures.push(format!("{what}: DBSIZE changed"));
            }
            if info(&mut c, "M").is_some() {
                failures.push(format!("{what}: created lock M"));
            }
            if info_still(&mut c, "L") != base.before {
                failures.push(format!("{what}: FLOCK.INFO L changed to {:?}", info_still(&mut c, "L")));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} bad commands misbehaved:\n{}",
        failures.len(),
        cases.len() * 2,
        failures.join("\n")
    );
    assert_eq!(holds(&mut c, "L"), 2);
    base.finish(&mut c);
}

#[test]
fn boundary_numbers_are_accepted() {
    let s = Server::start();
    let mut c = s.conn();
    let max = (1u64 << 40).to_string();
    let t: Option<i64> = redis::cmd("FLOCK.ACQUIRE").arg("L").arg("a").arg(&max).query(&mut c).unwrap();
    assert!(t.is_some());
    assert!(ttl_ms(&mut c, "L") > 1 << 39);
    assert_eq!(renew(&mut c, "L", "a", 1).map(|t2| Some(t2) == t), Ok(true));
    // lowercase options, WAIT 2^40 as a try on a free lock, SESSION (a lease
    // that outlives the FLOCK.INFO after it)
    let t: Option<i64> = redis::cmd("FLOCK.ACQUIRE")
        .arg("K")
        .arg("a")
        .arg(60_000)
        .arg("wait")
        .arg(&max)
        .arg("session")
        .query(&mut c)
        .unwrap();
    assert!(t.is_some());
    assert_eq!(int_field(&mut c, "K", "session"), 1);
}

#[test]
fn binary_owner_of_256_bytes_works() {
    let s = Server::start();
    let mut c = s.conn();
    let mut owner: Vec<u8> = (0..=255u8).collect();
    owner[10] = 0;
    owner[11] = b'\n';
    owner[12] = b'\r';
    owner[255] = 0;
    assert_eq!(owner.len(), 256);
    let t: Option<i64> = redis::cmd("FLOCK.ACQUIRE").arg("L").arg(&owner[..]).arg(10_000).query(&mut c).unwrap();
    assert!(t.is_some_and(|t| t > 0));
    assert_eq!(info_field(&mut c, "L", "owner"), Some(Value::BulkString(owner.clone())));
    // A prefix or a slightly different owner is somebody else.
    let e = expect_err(redis::cmd("FLOCK.RELEASE").arg("L").arg(&owner[..255]).query::<i64>(&mut c), "prefix owner");
    assert_eq!(error_code(&e), "NOTOWNER");
    let left: i64 = redis::cmd("FLOCK.RELEASE").arg("L").arg(&owner[..]).query(&mut c).unwrap();
    assert_eq!(left, 0);
    assert!(info(&mut c, "L").is_none());
    assert_eq!(dbsize(&mut c), 0);
}

// ---------------------------------------------------------------------------
// Fencing tokens.

#[test]
fn handoff_tokens_strictly_increase() {
    let s = Server::start();
    let mut c = s.conn();
    let mut last = acquire(&mut c, "L", "a", 1_000_000).unwrap().unwrap();
    assert_eq!(acquire(&mut c, "L", "a", 1_000_000).unwrap(), Some(last), "reentry keeps the token");
    let mut check = |t: i64, how: &str| {
        assert!(t > last, "{how}: token {t} is not above {last}");
        last = t;
    };

    // RELEASE hands off.
    let w = waiter(&s, "L", "b", 1_000_000);
    wait_queue(&mut c, "L", &["b"]);
    assert_eq!(release(&mut c, "L", "a").unwrap(), 1);
    assert_eq!(release(&mut c, "L", "a").unwrap(), 0);
    check(granted(w, "b"), "RELEASE");

    // FORCERELEASE hands off.
    let w = waiter(&s, "L", "c", 1_000_000);
    wait_queue(&mut c, "L", &["c"]);
    force_release(&mut c, "L").unwrap();
    check(granted(w, "c"), "FORCERELEASE");

    // Lease expiry hands off.
    let w = waiter(&s, "L", "d", 1_000_000);
    wait_queue(&mut c, "L", &["d"]);
    renew(&mut c, "L", "c", 50).unwrap();
    check(granted(w, "d"), "lease expiry");

    // A closed SESSION hands off.
    let mut e_conn = s.conn();
    release(&mut c, "L", "d").unwrap();
    let te = acquire_session(&mut e_conn, "L", "e", 1_000_000).unwrap().unwrap();
    check(te, "fresh acquire after release");
    let w = waiter(&s, "L", "f", 1_000_000);
    wait_queue(&mut c, "L", &["f"]);
    drop(e_conn);
    check(granted(w, "f"), "session close");

    // The key goes and comes back.
    release(&mut c, "L", "f").unwrap();
    assert_eq!(dbsize(&mut c), 0);
    check(acquire(&mut c, "L", "g", 1_000).unwrap().unwrap(), "re-created key");
}
