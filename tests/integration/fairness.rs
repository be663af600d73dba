//! Fairness, mutual exclusion and hand-off under contention and failures,
//! against a real server: one behaviour per test.
use crate::common::*;

use std::sync::{Arc, Barrier, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Client-side read limit for connections that may block: a lost reply
/// fails the test instead of hanging it.
const READ_LIMIT: Duration = Duration::from_secs(60);

fn guarded_conn(s: &Server) -> Connection {
    let c = s.conn();
    c.set_read_timeout(Some(READ_LIMIT)).expect("read timeout");
    c
}

// ---------------------------------------------------------------------------

#[test]
fn contending_clients_get_mutual_exclusion_and_increasing_tokens() {
    const CLIENTS: usize = 32;
    // Every client is granted in its first rounds already; the soak runs
    // longer for rarer interleavings.
    let run = Duration::from_secs(run_secs("FLOCK_FAIRNESS_SECS", 1, 30));
    let s = Server::start();
    let mut c = s.conn();
    let record: Arc<Mutex<Vec<i64>>> = Arc::default();
    let barrier = Arc::new(Barrier::new(CLIENTS));

    let threads: Vec<JoinHandle<usize>> = (0..CLIENTS)
        .map(|i| {
            let mut conn = guarded_conn(&s);
            let (record, barrier) = (record.clone(), barrier.clone());
            std::thread::spawn(move || {
                let owner = format!("client-{i}");
                barrier.wait();
                let deadline = Instant::now() + run;
                let mut grants = 0;
                // At least one round each, so that every client is expected
                // to be granted at least once.
                loop {
                    let token = acquire_wait(&mut conn, "L", &owner, 5_000, 0)
                        .unwrap_or_else(|e| panic!("{owner} ACQUIRE: {e}"))
                        .unwrap_or_else(|| panic!("{owner}: WAIT 0 answered nil"));
                    // Critical section: a non-atomic read-modify-write.
                    let n: Option<i64> = redis::cmd("GET").arg("counter").query(&mut conn).expect("GET");
                    let () = redis::cmd("SET").arg("counter").arg(n.unwrap_or(0) + 1).query(&mut conn).expect("SET");
                    record.lock().unwrap().push(token);
                    assert_eq!(release(&mut conn, "L", &owner).expect("RELEASE"), 0, "{owner}");
                    grants += 1;
                    if Instant::now() >= deadline {
                        return grants;
                    }
                }
            })
        })
        .collect();
    let per_client: Vec<usize> = threads.into_iter().map(|t| t.join().expect("client thread")).collect();

    let total: usize = per_client.iter().sum();
    eprintln!("{total} grants over {CLIENTS} clients: {per_client:?}");
    let counter: i64 = redis::cmd("GET").arg("counter").query(&mut c).unwrap();
    assert_eq!(counter as usize, total, "lost updates: the critical sections overlapped");
    let tokens = record.lock().unwrap().clone();
    assert_eq!(tokens.len(), total);
    if let Some(w) = tokens.windows(2).find(|w| w[1] <= w[0]) {
        panic!("token {} granted after token {}", w[1], w[0]);
    }
    assert!(per_client.iter().all(|&n| n >= 1), "a client was never granted: {per_client:?}");
    assert_eq!(s.stat("grants") as usize, total);
    assert_eq!(s.stat("waiters"), 0);
    assert!(!exists(&mut c, "L"), "the lock key outlived its last release");
}

#[test]
fn waiters_are_granted_in_queue_order() {
    const N: usize = 10;
    let s = Server::start();
    let mut c = s.conn();
    let t0 = acquire(&mut c, "L", "holder", 1_000_000).unwrap().unwrap();
    let record: Arc<Mutex<Vec<(String, i64)>>> = Arc::default();
    let mut threads = Vec::new();
    let mut expected: Vec<String> = Vec::new();
    for i in 0..N {
        let name = format!("w{i}");
        let mut conn = guarded_conn(&s);
        let record = record.clone();
        let owner = name.clone();
        threads.push(std::thread::spawn(move || {
            let token = acquire_wait(&mut conn, "L", &owner, 1_000_000, LONG_WAIT_MS)
                .unwrap_or_else(|e| panic!("{owner}: {e}"))
                .unwrap_or_else(|| panic!("{owner} was not granted"));
            record.lock().unwrap().push((owner.clone(), token));
            assert_eq!(release(&mut conn, "L", &owner).expect("RELEASE"), 0);
        }));
        expected.push(name);
        let refs: Vec<&str> = expected.iter().map(String::as_str).collect();
        wait_queue(&mut c, "L", &refs);
    }
    let queue = queue_of(&mut c, "L");
    assert_eq!(queue, expected);
    assert_eq!(release(&mut c, "L", "holder").unwrap(), 0);
    for t in threads {
        t.join().expect("waiter thread");
    }
    let record = record.lock().unwrap().clone();
    let order: Vec<String> = record.iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(order, queue, "grants did not follow the queue order");
    let mut last = t0;
    for (name, token) in &record {
        assert!(*token > last, "{name}'s token {token} is not above {last}");
        last = *token;
    }
    assert!(!exists(&mut c, "L"));
}

/// The holder releases: `next` gets the lock in the only hand-off, and
/// nothing was handed to the waiter that left before.
fn release_to_next_only(s: &Server, c: &mut Connection, next: JoinHandle<RedisResult<Option<i64>>>) {
    assert_eq!(release(c, "L", "holder").unwrap(), 0);
    granted(next, "next");
    assert_eq!(owner_of(c, "L").as_deref(), Some("next"));
    assert_eq!(s.stat("handoffs"), 1, "one hand-off, to `next`");
    assert_eq!(s.stat("undelivered_grants"), 0, "nothing was handed to the waiter that left");
}

#[test]
fn dropped_waiter_leaves_the_queue_and_never_gets_the_lock() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "L", "holder", 1_000_000).unwrap().unwrap();
    // `gone` sends its blocking ACQUIRE and its connection is then dropped
    // without reading the reply.
    let mut gone = s.conn();
    let acq = redis::cmd("FLOCK.ACQUIRE").arg("L").arg("gone").arg(1_000_000).arg("WAIT").arg(0).get_packed_command();
    gone.send_packed_command(&acq).unwrap();
    wait_queue(&mut c, "L", &["gone"]);
    let next = spawn_waiter(&s, "L", "next", 1_000_000, LONG_WAIT_MS);
    wait_queue(&mut c, "L", &["gone", "next"]);

    drop(gone);
    wait_until("the dropped waiter leaves the queue", 5 * SECOND, || queue_of(&mut c, "L") == ["next"]);
    assert_eq!(s.stat("wait_disconnects"), 1);
    assert_eq!(s.stat("waiters"), 1);

    release_to_next_only(&s, &mut c, next);
}

#[test]
fn killed_waiter_leaves_the_queue_and_never_gets_the_lock() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "L", "holder", 1_000_000).unwrap().unwrap();
    let mut killed_conn = guarded_conn(&s);
    let killed_id = client_id(&mut killed_conn);
    let killed = std::thread::spawn(move || acquire_wait(&mut killed_conn, "L", "killed", 1_000_000, LONG_WAIT_MS));
    wait_queue(&mut c, "L", &["killed"]);
    let next = spawn_waiter(&s, "L", "next", 1_000_000, LONG_WAIT_MS);
    wait_queue(&mut c, "L", &["killed", "next"]);

    let n: i64 = redis::cmd("CLIENT").arg("KILL").arg("ID").arg(killed_id).query(&mut c).unwrap();
    assert_eq!(n, 1);
    let r = killed.join().expect("killed thread");
    assert!(r.is_err(), "the killed waiter got a reply: {r:?}");
    wait_until("the killed waiter leaves the queue", 5 * SECOND, || queue_of(&mut c, "L") == ["next"]);
    assert_eq!(s.stat("wait_disconnects"), 1);

    release_to_next_only(&s, &mut c, next);
}

#[test]
fn grant_to_a_waiter_killed_before_its_reply_passes_to_the_next_waiter() {
    let s = Server::start();
    let mut holder = s.conn();
    // A's lease is long: were A's grant kept, B would time out.
    let (t0, a, a_id) = hold_with_waiter_a(&s, &mut holder);
    let b = spawn_waiter(&s, "L", "B", 1_000_000, LONG_WAIT_MS);
    wait_queue(&mut holder, "L", &["A", "B"]);

    release_and_kill(&mut holder, a_id);

    let tb = granted(b, "B");
    assert!(tb > t0);
    let ra = a.join().expect("A thread");
    assert!(ra.is_err(), "A was killed but got a reply: {ra:?}");
    let mut c = s.conn();
    assert_eq!(owner_of(&mut c, "L").as_deref(), Some("B"));
    assert!(s.stat("undelivered_grants") >= 1);
}

/// `holder` takes `L` and waiter `A` queues on its own connection: the
/// holder's token, A's pending ACQUIRE and A's client id.
fn hold_with_waiter_a(s: &Server, holder: &mut Connection) -> (i64, JoinHandle<RedisResult<Option<i64>>>, i64) {
    let t0 = acquire(holder, "L", "holder", 1_000_000).unwrap().unwrap();
    let mut a_conn = guarded_conn(s);
    let a_id = client_id(&mut a_conn);
    let a = std::thread::spawn(move || acquire_wait(&mut a_conn, "L", "A", 1_000_000, LONG_WAIT_MS));
    wait_queue(holder, "L", &["A"]);
    (t0, a, a_id)
}

/// One pipeline, so both run in the same event-loop turn: the release hands
/// the lock to the first waiter, which is killed before its reply is written.
fn release_and_kill(holder: &mut Connection, waiter_id: i64) {
    let (left, killed): (i64, i64) = redis::pipe()
        .cmd("FLOCK.RELEASE")
        .arg("L")
        .arg("holder")
        .cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(waiter_id)
        .query(holder)
        .unwrap();
    assert_eq!((left, killed), (0, 1));
}

#[test]
fn undelivered_grant_without_further_waiters_frees_the_lock() {
    let s = Server::start();
    let mut holder = s.conn();
    let (t0, a, a_id) = hold_with_waiter_a(&s, &mut holder);
    release_and_kill(&mut holder, a_id);
    assert!(a.join().expect("A thread").is_err());
    let mut c = s.conn();
    wait_until("the lock nobody received is freed", 5 * SECOND, || !exists(&mut c, "L"));
    assert!(s.stat("undelivered_grants") >= 1);
    let t = acquire(&mut c, "L", "next", 10_000).unwrap().expect("a free lock is granted at once");
    assert!(t > t0);
}

#[test]
fn holder_that_never_releases_loses_the_lock_to_next_waiter_after_its_lease() {
    const LEASE: u64 = 300;
    let s = Server::start();
    let mut c = s.conn();
    let t0 = acquire(&mut c, "L", "holder", 1_000_000).unwrap().unwrap();
    let mut w_conn = guarded_conn(&s);
    let waiter = std::thread::spawn(move || {
        let r = acquire_wait(&mut w_conn, "L", "next", 1_000_000, LONG_WAIT_MS);
        (r, Instant::now())
    });
    wait_queue(&mut c, "L", &["next"]);
    // The waiter is queued; from now on the holder has a 300 ms lease and
    // never releases nor renews.
    let started = Instant::now();
    assert_eq!(renew(&mut c, "L", "holder", LEASE).unwrap(), t0);
    let (r, at) = waiter.join().expect("waiter thread");
    let token = r.expect("ACQUIRE").expect("the waiter is granted once the lease ends");
    assert!(token > t0);
    // The server's clock has millisecond resolution: allow 1 ms of rounding.
    let after = at.duration_since(started);
    assert!(
        after >= Duration::from_millis(LEASE - 1),
        "granted {after:?} after the renew, before the {LEASE} ms lease ended"
    );
    assert_eq!(owner_of(&mut c, "L").as_deref(), Some("next"));
    assert_eq!(s.stat("lease_expiries"), 1);
    assert_eq!(s.stat("handoffs"), 1);
}
