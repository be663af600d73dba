//! The Rust client's sessions (crate `flock-client`) against a real server:
//! waits of many threads over one session connection, FIFO through it,
//! losses pushed to the guard, a broken session connection (waits resent,
//! held grants re-watched, an unreachable server's waits time out), cancellation,
//! reentry and the server's refusals through the session.

use crate::common::*;

use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use flock_client::{CancelToken, LeaseLost, Lock, RwLock, Semaphore, FOREVER};

const MS: Duration = Duration::from_millis(1);

fn client(s: &Server) -> redis::Client {
    redis::Client::open(s.url()).expect("client")
}

fn info_clients(c: &mut Connection, field: &str) -> i64 {
    let text: String = redis::cmd("INFO").arg("clients").query(c).expect("INFO clients");
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in INFO clients"))
}

fn waiters(c: &mut Connection, key: &str) -> i64 {
    info_field(c, key, "waiters").map(|v| int(&v)).unwrap_or(0)
}

/// The `CLIENT ID` of the connection that reads the session's inbox.
fn session_client_id(c: &mut Connection) -> Option<i64> {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(c).expect("CLIENT LIST");
    list.lines()
        .find(|l| l.contains("cmd=flock.inbox"))
        .and_then(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")).and_then(|id| id.parse().ok()))
}

#[test]
fn two_hundred_waiting_threads_share_one_session_and_are_granted_in_fifo_order() {
    const N: usize = 200;
    let s = Server::start();
    let mut admin = s.conn();
    let client = client(&s);
    let lock = Lock::new("L", 10 * SECOND);
    let holder = lock.clone().with_owner("holder").acquire(s.conn(), None).unwrap().expect("granted");
    let before = info_clients(&mut admin, "connected_clients");

    let granted = Arc::new(Mutex::new(Vec::new()));
    let start = Arc::new(Barrier::new(N));
    let threads: Vec<_> = (0..N)
        .map(|_| {
            let (lock, client, granted, start) = (lock.clone(), client.clone(), granted.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                let guard = lock.acquire_on(&client, Some(FOREVER)).unwrap().expect("handed the lock");
                granted.lock().unwrap().push((guard.owner().to_string(), guard.token()));
                guard.release().unwrap();
            })
        })
        .collect();
    wait_until("200 session waiters queued", 20 * SECOND, || waiters(&mut admin, "L") == N as i64);
    let added = info_clients(&mut admin, "connected_clients") - before;
    // The session's, and the command connections the threads share (at
    // most 4, the pool's size), whatever their number.
    assert!(added <= 6, "200 waiting threads added {added} connections");
    // Only the session's FLOCK.INBOX blocks (between two reads, not even it).
    assert!(info_clients(&mut admin, "blocked_clients") <= 1);
    assert_eq!(s.stat("sessions"), 1);
    let queue = queue_of(&mut admin, "L");
    assert_eq!(queue.len(), N);

    let first = holder.token();
    drop(holder);
    for t in threads {
        t.join().expect("waiter thread");
    }
    let granted = granted.lock().unwrap();
    let order: Vec<&str> = granted.iter().map(|(o, _)| o.as_str()).collect();
    assert_eq!(order, queue.iter().map(String::as_str).collect::<Vec<_>>(), "granted in queue order");
    let tokens: Vec<u64> = granted.iter().map(|(_, t)| *t).collect();
    assert!(tokens.windows(2).all(|w| w[0] < w[1]) && tokens[0] > first, "tokens grow");
    assert!(info(&mut admin, "L").is_none());
}

#[test]
fn a_lock_with_a_client_waits_through_the_session_and_blocking_opts_out() {
    let s = Server::start();
    let mut admin = s.conn();
    let client = client(&s);
    let lock = Lock::new("L", 10 * SECOND);
    let holder = lock.clone().with_owner("holder").acquire(s.conn(), None).unwrap().expect("granted");

    // With a client: the caller's own connection sends one ACQUIRE and is
    // not blocked; the session is.
    let waiting = {
        let (lock, c) = (lock.clone().with_owner("w").with_client(&client), s.conn());
        std::thread::spawn(move || lock.acquire(c, Some(10 * SECOND)).map(|g| g.map(|g| g.token())))
    };
    wait_queue(&mut admin, "L", &["w"]);
    assert!(info_clients(&mut admin, "blocked_clients") <= 1, "the session's inbox only");
    // `blocking()`: the old form, its connection blocked.
    let blocked = {
        let (lock, c) = (lock.clone().with_owner("b").with_client(&client).blocking(), s.conn());
        std::thread::spawn(move || lock.acquire(c, Some(10 * SECOND)).map(|g| g.map(|g| g.token())))
    };
    wait_queue(&mut admin, "L", &["w", "b"]);
    wait_until("b's connection blocked", 5 * SECOND, || info_clients(&mut admin, "blocked_clients") >= 1);
    assert!(info_clients(&mut admin, "blocked_clients") <= 2);

    drop(holder);
    assert!(waiting.join().unwrap().unwrap().is_some(), "w granted through the session");
    assert!(blocked.join().unwrap().unwrap().is_some(), "b granted on its own connection");
}

#[test]
fn a_bounded_session_wait_times_out_and_leaves_no_waiter() {
    let s = Server::start();
    let mut admin = s.conn();
    let client = client(&s);
    let _holder = Lock::new("L", 10 * SECOND).with_owner("holder").acquire(s.conn(), None).unwrap();
    let started = Instant::now();
    assert!(Lock::new("L", SECOND).acquire_on(&client, Some(200 * MS)).unwrap().is_none());
    let took = started.elapsed();
    assert!(took >= 200 * MS && took < 2 * SECOND, "timed out by the server's event after {took:?}");
    assert_eq!(waiters(&mut admin, "L"), 0);
    // A try through the session: nil at once.
    assert!(Lock::new("L", SECOND).acquire_on(&client, None).unwrap().is_none());
}

#[test]
fn a_loss_is_pushed_on_forcerelease_without_a_watchdog() {
    let s = Server::start();
    let mut admin = s.conn();
    let client = client(&s);
    let guard = Lock::new("L", 60 * SECOND).acquire_on(&client, None).unwrap().expect("granted");
    let lost = guard.lost_channel();
    assert!(!guard.lost());
    assert_eq!(force_release(&mut admin, "L").unwrap(), 1);
    assert_eq!(lost.recv_timeout(5 * SECOND), Ok(LeaseLost::ForceReleased));
    assert!(guard.lost());
    assert_eq!(guard.lost_reason(), Some(LeaseLost::ForceReleased));
    // A channel asked for after the loss hears it at once.
    assert_eq!(guard.lost_channel().try_recv(), Ok(LeaseLost::ForceReleased));
    let e = guard.release().unwrap_err();
    assert_eq!(error_code(&e), "NOTOWNER");
    assert!(e.to_string().contains("force-released"), "the NOTOWNER text says why: {e}");
}

#[test]
fn a_fixed_lease_is_lost_at_its_deadline_and_its_release_fails() {
    let s = Server::start();
    let mut admin = s.conn();
    let client = client(&s);
    let guard = Lock::new("L", 10 * SECOND).lease(200 * MS).acquire_on(&client, None).unwrap().expect("granted");
    assert!(!guard.session_grant());
    let lost = guard.lost_channel();
    let started = Instant::now();
    assert_eq!(lost.recv_timeout(5 * SECOND), Ok(LeaseLost::Expired));
    assert!(started.elapsed() < 3 * SECOND);
    assert!(guard.lost());
    // Lost here before the server's end of it: the release still gives
    // back whatever the server has, and fails.
    let e = guard.release().unwrap_err();
    assert_eq!(error_code(&e), "NOTOWNER", "{e}");
    assert!(info(&mut admin, "L").is_none());
}

#[test]
fn a_session_grant_has_no_lease_and_ends_with_its_session_reported_as_sessionended() {
    let s = Server::start();
    let mut admin = s.conn();
    let client = client(&s);
    let mut guard = Lock::new("L", 200 * MS).acquire_on(&client, None).unwrap().expect("granted");
    assert!(guard.session_grant());
    assert_eq!(int_field(&mut admin, "L", "session"), 1);
    // No lease of its own, no renewal traffic: it outlives the lock's lease.
    let lost = guard.watchdog(&client).unwrap();
    std::thread::sleep(600 * MS);
    assert!(!guard.lost());
    assert_eq!(renew_calls(&mut admin), 0, "no watchdog for a session grant");
    // Its session ends: the server ends the grant, the guard says so, and
    // the new session does not take it again.
    let old = wait_session_client_id(&mut admin);
    let _: i64 = redis::cmd("CLIENT").arg("KILL").arg("ID").arg(old).query(&mut admin).unwrap();
    assert_eq!(lost.recv_timeout(5 * SECOND), Ok(LeaseLost::SessionEnded));
    assert_eq!(guard.lost_reason(), Some(LeaseLost::SessionEnded));
    assert!(info(&mut admin, "L").is_none(), "the session's end ended it");
    assert_eq!(error_code(&guard.release().unwrap_err()), "NOTOWNER");
    assert!(info(&mut admin, "L").is_none(), "nobody took it again");
}

#[test]
fn a_pushed_loss_reaches_the_watchdog_channel_of_a_granted_waiter() {
    let s = Server::start();
    let mut admin = s.conn();
    let client = client(&s);
    let lock = Lock::new("L", 30 * SECOND);
    let holder = lock.clone().with_owner("holder").acquire(s.conn(), None).unwrap().expect("granted");
    let waiting = {
        let (lock, client) = (lock.clone(), client.clone());
        std::thread::spawn(move || {
            let mut guard = lock.acquire_on(&client, Some(FOREVER)).unwrap().expect("handed the lock");
            let lost = guard.watchdog(&client).unwrap();
            (guard, lost)
        })
    };
    wait_until("the waiter to queue", 5 * SECOND, || waiters(&mut admin, "L") == 1);
    drop(holder);
    let (guard, lost) = waiting.join().unwrap();
    assert_eq!(force_release(&mut admin, "L").unwrap(), 1);
    assert_eq!(lost.recv_timeout(5 * SECOND), Ok(LeaseLost::ForceReleased), "pushed, long before a renewal");
    assert!(guard.lost());
}

#[test]
fn a_released_guard_hears_nothing_and_its_channel_disconnects() {
    let s = Server::start();
    let client = client(&s);
    let guard = Lock::new("L", 300 * MS).acquire_on(&client, None).unwrap().expect("granted");
    let lost = guard.lost_channel();
    assert_eq!(guard.release().unwrap(), 0);
    assert_eq!(lost.recv_timeout(SECOND), Err(std::sync::mpsc::RecvTimeoutError::Disconnected));
}

#[test]
fn killing_the_session_connection_resends_the_waits_which_are_still_granted() {
    let s = Server::start();
    let mut admin = s.conn();
    let client = client(&s);
    let lock = Lock::new("L", 10 * SECOND);
    let holder = lock.clone().with_owner("holder").acquire(s.conn(), None).unwrap().expect("granted");
    let owners = ["a", "b", "c"];
    let threads: Vec<_> = (0..owners.len())
        .map(|i| {
            let (lock, client) = (lock.clone().with_owner(owners[i]), client.clone());
            let t =
                std::thread::spawn(move || lock.acquire_on(&client, Some(30 * SECOND)).map(|g| g.map(|g| g.token())));
            wait_queue(&mut admin, "L", &owners[..=i]);
            t
        })
        .collect();
    let old = session_client_id(&mut admin).expect("the session's connection");
    let _: i64 = redis::cmd("CLIENT").arg("KILL").arg("ID").arg(old).query(&mut admin).unwrap();
    // The server dropped the waits with the session; the new session
    // queues them again, in the order this process sent them.
    wait_until("a new session with the three waits resent in order", 10 * SECOND, || {
        session_client_id(&mut admin).is_some_and(|id| id != old) && queue_of(&mut admin, "L") == owners
    });
    assert_eq!(s.stat("sessions"), 1);
    drop(holder);
    for t in threads {
        assert!(t.join().unwrap().unwrap().is_some(), "granted after the resend");
    }
}

#[test]
fn reentry_through_the_session_shares_the_token_and_both_guards_hear_a_loss() {
    let s = Server::start();
    let mut admin = s.conn();
    let client = client(&s);
    let lock = Lock::new("L", 60 * SECOND);
    let first = lock.acquire_on(&client, Some(SECOND)).unwrap().expect("granted");
    let second = lock.acquire_on(&client, Some(SECOND)).unwrap().expect("reentered");
    assert_eq!(first.token(), second.token());
    assert_eq!(holds(&mut admin, "L"), 2);
    assert_eq!(force_release(&mut admin, "L").unwrap(), 1);
    let (a, b) = (first.lost_channel(), second.lost_channel());
    assert_eq!(a.recv_timeout(5 * SECOND), Ok(LeaseLost::ForceReleased));
    assert_eq!(b.recv_timeout(5 * SECOND), Ok(LeaseLost::ForceReleased));
}

#[test]
fn a_cancel_token_ends_a_session_wait() {
    let s = Server::start();
    let mut admin = s.conn();
    let client = client(&s);
    let _holder = Lock::new("L", 10 * SECOND).with_owner("holder").acquire(s.conn(), None).unwrap();
    let token = CancelToken::new();
    let waiting = {
        let (lock, client) = (Lock::new("L", SECOND).with_owner("w").cancel_with(&token), client.clone());
        std::thread::spawn(move || lock.acquire_on(&client, Some(FOREVER)).map(|g| g.is_some()))
    };
    wait_queue(&mut admin, "L", &["w"]);
    token.cancel();
    let e = waiting.join().unwrap().unwrap_err();
    assert_eq!(error_code(&e), "CANCELLED");
    assert_eq!(waiters(&mut admin, "L"), 0);
    // A cancelled token refuses later waits at once.
    let e = Lock::new("L", SECOND).cancel_with(&token).acquire_on(&client, Some(FOREVER)).unwrap_err();
    assert_eq!(error_code(&e), "CANCELLED");
}

#[test]
fn a_semaphore_through_the_session_keeps_its_limit() {
    let s = Server::start();
    let mut admin = s.conn();
    let client = client(&s);
    let sem = Semaphore::new("S", 2, 10 * SECOND);
    let a = sem.clone().with_owner("a").acquire_on(&client, 1, None).unwrap().expect("1 of 2");
    let b = sem.clone().with_owner("b").acquire_on(&client, 1, Some(SECOND)).unwrap().expect("2 of 2");
    assert!(sem.clone().with_owner("c").acquire_on(&client, 1, None).unwrap().is_none(), "none left");
    let waiting = {
        let (sem, client) = (sem.clone().with_owner("c"), client.clone());
        std::thread::spawn(move || sem.acquire_on(&client, 2, Some(10 * SECOND)).map(|g| g.map(|g| g.token())))
    };
    wait_queue(&mut admin, "S", &["c"]);
    let e = expect_err(Semaphore::new("S", 3, SECOND).acquire_on(&client, 1, Some(SECOND)), "another limit");
    assert_eq!(error_code(&e), "WRONGMODE");
    drop(a);
    std::thread::sleep(50 * MS);
    assert_eq!(waiters(&mut admin, "S"), 1, "one permit free: the request for 2 still waits");
    let last = b.token();
    drop(b);
    assert!(waiting.join().unwrap().unwrap().expect("handed 2 permits") > last);
}

#[test]
fn wrongmode_and_upgrade_come_back_through_the_session() {
    let s = Server::start();
    let client = client(&s);
    let _lock = Lock::new("L", 10 * SECOND).acquire_on(&client, None).unwrap().expect("lock");
    let e = expect_err(Semaphore::new("L", 2, SECOND).acquire_on(&client, 1, Some(SECOND)), "a semaphore on a lock");
    assert_eq!(error_code(&e), "WRONGMODE");
    let rw = RwLock::new("RW", 10 * SECOND);
    let _read = rw.read_on(&client, Some(SECOND)).unwrap().expect("read");
    let e = expect_err(rw.write_on(&client, Some(SECOND)), "write while reading");
    assert_eq!(error_code(&e), "UPGRADE");
}

#[test]
fn closing_the_session_closes_its_connection() {
    let s = Server::start();
    let mut admin = s.conn();
    let client = client(&s);
    drop(Lock::new("L", SECOND).acquire_on(&client, None).unwrap());
    assert_eq!(s.stat("sessions"), 1);
    flock_client::close_session(&client).unwrap();
    wait_until("the session and its connection to end", 5 * SECOND, || {
        s.stat("sessions") == 0 && session_client_id(&mut admin).is_none()
    });
    // The next acquire opens a new one.
    drop(Lock::new("L", SECOND).acquire_on(&client, Some(SECOND)).unwrap());
    assert_eq!(s.stat("sessions"), 1);
}

#[test]
fn watchdogs_of_many_guards_renew_over_one_connection() {
    let s = Server::start();
    let mut admin = s.conn();
    let client = client(&s);
    // Held on bare connections: no session, so each lease is the watchdog's to renew.
    let lease = 1200 * MS;
    let mut guards: Vec<_> = (0..20)
        .map(|i| {
            Lock::new(format!("L{i}"), lease).acquire(client.get_connection().unwrap(), None).unwrap().expect("granted")
        })
        .collect();
    assert!(guards.iter().all(|g| !g.session_grant()));
    let before = info_clients(&mut admin, "connected_clients");
    let renewals = renew_calls(&mut admin);
    let lost: Vec<_> = guards.iter_mut().map(|g| g.watchdog(&client).unwrap()).collect();
    // Four renewals a lease on average, one every third of it: past the end
    // of the first lease, which without renewals would have ended them all.
    wait_until("renewals past the first lease", 10 * SECOND, || renew_calls(&mut admin) >= renewals + 4 * 20);
    assert_eq!(s.stat("lease_expiries"), 0);
    assert!(guards.iter().all(|g| !g.lost()));
    let added = info_clients(&mut admin, "connected_clients") - before;
    assert!(added <= 1, "20 watchdogs added {added} connections");
    for (guard, lost) in guards.into_iter().zip(lost) {
        assert_eq!(guard.release().unwrap(), 0);
        assert_eq!(lost.recv_timeout(SECOND), Err(std::sync::mpsc::RecvTimeoutError::Disconnected));
    }
}

#[test]
fn a_loss_is_known_before_the_next_waiter_of_the_process_is_granted() {
    let s = Server::start();
    let mut admin = s.conn();
    let client = client(&s);
    let lock = Lock::new("L", 60 * SECOND);
    let holder = lock.clone().with_owner("holder").acquire_on(&client, None).unwrap().expect("granted");
    let waiting = {
        let (lock, client) = (lock.clone().with_owner("next"), client.clone());
        std::thread::spawn(move || lock.acquire_on(&client, Some(FOREVER)).unwrap().expect("handed the lock"))
    };
    wait_queue(&mut admin, "L", &["next"]);
    assert_eq!(force_release(&mut admin, "L").unwrap(), 1);
    let next = waiting.join().unwrap();
    assert!(holder.lost(), "the holder's loss was read before the next grant");
    assert_eq!(holder.lost_reason(), Some(LeaseLost::ForceReleased));
    assert!(next.token() > holder.token());
}

#[test]
fn session_waiters_of_a_demoted_master_end_with_an_error() {
    let s = Server::start();
    let mut admin = s.conn();
    let client = client(&s);
    let lock = Lock::new("L", 60 * SECOND);
    let _holder = lock.clone().with_owner("holder").acquire(s.conn(), None).unwrap().expect("granted");
    let waiting: Vec<_> = ["a", "b"]
        .iter()
        .map(|owner| {
            let (lock, client) = (lock.clone().with_owner(*owner), client.clone());
            std::thread::spawn(move || lock.acquire_on(&client, Some(FOREVER)).map(|g| g.is_some()))
        })
        .collect();
    wait_until("two session waiters", 5 * SECOND, || waiters(&mut admin, "L") == 2);
    let port = free_port();
    let _: String = redis::cmd("REPLICAOF").arg("127.0.0.1").arg(port).query(&mut admin).unwrap();
    // Redis 8.2 answers the waits `error UNBLOCKED` in the inbox; Redis 7.0
    // closes the session's connection, so the resent waits meet READONLY.
    wait_until("both waiters answered", 10 * SECOND, || waiting.iter().all(|t| t.is_finished()));
    for t in waiting {
        let e = t.join().unwrap().expect_err("a waiter of a demoted master gets an error");
        assert!(["UNBLOCKED", "READONLY"].contains(&error_code(&e).as_str()), "{e}");
    }
}

/// The session connection's `CLIENT ID`, once its reader reads the inbox.
fn wait_session_client_id(c: &mut Connection) -> i64 {
    wait_until("the session's reader", 5 * SECOND, || session_client_id(c).is_some());
    session_client_id(c).expect("the session's connection")
}

/// Kills the session's connection and waits for the new session to have
/// re-watched `grants` held grants (one reentrant ACQUIRE each).
fn kill_session_and_wait_for_rewatch(s: &Server, admin: &mut Connection, grants: i64) {
    let old = wait_session_client_id(admin);
    let reentries = s.stat("reentrant_acquires");
    let _: i64 = redis::cmd("CLIENT").arg("KILL").arg("ID").arg(old).query(admin).unwrap();
    wait_until("a new session that re-watched the grants", 10 * SECOND, || {
        session_client_id(admin).is_some_and(|id| id != old) && s.stat("reentrant_acquires") == reentries + grants
    });
}

#[test]
fn a_fixed_lease_grant_is_rewatched_after_the_session_breaks_with_its_holds_and_lease_left() {
    let s = Server::start();
    let mut admin = s.conn();
    let client = client(&s);
    let lock = Lock::new("L", 60 * SECOND).lease(60 * SECOND);
    let first = lock.acquire_on(&client, None).unwrap().expect("granted");
    let second = lock.acquire_on(&client, None).unwrap().expect("reentered");
    assert_eq!(holds(&mut admin, "L"), 2);
    let before = ttl_ms(&mut admin, "L");
    kill_session_and_wait_for_rewatch(&s, &mut admin, 1);
    // One re-watch for the grant (two guards): its extra hold given back
    // (wait for the RELEASE), no lease longer than it had left.
    wait_until("the extra hold released", 5 * SECOND, || holds(&mut admin, "L") == 2);
    std::thread::sleep(100 * MS);
    assert_eq!(holds(&mut admin, "L"), 2, "the hold count is unchanged");
    let after = ttl_ms(&mut admin, "L");
    assert!(after <= before && after > 50_000, "the lease left is kept: {before} ms before, {after} ms after");
    assert_eq!(token_of(&mut admin, "L") as u64, first.token());
    assert!(!first.lost() && !second.lost());
    // No watchdog: only the moved watch can tell of this at once.
    let (a, b) = (first.lost_channel(), second.lost_channel());
    assert_eq!(force_release(&mut admin, "L").unwrap(), 1);
    assert_eq!(a.recv_timeout(5 * SECOND), Ok(LeaseLost::ForceReleased));
    assert_eq!(b.recv_timeout(5 * SECOND), Ok(LeaseLost::ForceReleased));
}

#[test]
fn a_watchdog_grant_is_rewatched_with_the_watchdogs_lease_and_released_with_its_holds_right() {
    let s = Server::start();
    let mut admin = s.conn();
    let client = client(&s);
    let mut guard =
        Semaphore::new("S", 3, 10 * SECOND).lease(10 * SECOND).acquire_on(&client, 2, None).unwrap().expect("granted");
    let lost = guard.watchdog(&client).unwrap();
    kill_session_and_wait_for_rewatch(&s, &mut admin, 1);
    wait_until("the extra hold released", 5 * SECOND, || holds(&mut admin, "S") == 1);
    assert!(ttl_ms(&mut admin, "S") > 5_000);
    assert!(!guard.lost());
    assert_eq!(guard.release().unwrap(), 0, "one hold left to release");
    assert!(info(&mut admin, "S").is_none());
    assert_eq!(lost.recv_timeout(SECOND), Err(std::sync::mpsc::RecvTimeoutError::Disconnected));
}

#[test]
fn a_grant_force_released_while_the_session_was_down_is_reported_lost_after_the_reconnect() {
    let s = Server::start();
    let mut admin = s.conn();
    let client = client(&s);
    let guard = Lock::new("L", 60 * SECOND).lease(60 * SECOND).acquire_on(&client, None).unwrap().expect("granted");
    let lost = guard.lost_channel();
    let old = wait_session_client_id(&mut admin);
    // The session is gone before the loss: its push goes nowhere.
    let _: (i64, i64) = redis::pipe()
        .atomic()
        .cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(old)
        .cmd("FLOCK.FORCERELEASE")
        .arg("L")
        .query(&mut admin)
        .unwrap();
    assert_eq!(lost.recv_timeout(10 * SECOND), Ok(LeaseLost::NotOwner), "the RENEW after the reconnect found it");
    assert!(guard.lost());
    assert!(info(&mut admin, "L").is_none(), "the re-watch made no grant");
}

#[test]
fn a_session_wait_whose_server_is_unreachable_past_its_deadline_ends_as_a_timeout() {
    let s = Server::start();
    let mut admin = s.conn();
    let proxy = crate::common::proxy::Proxy::start(s.port);
    let client = redis::Client::open(proxy.url()).expect("client");
    let _holder = Lock::new("L", 30 * SECOND).with_owner("holder").acquire(s.conn(), None).unwrap();
    let waiting = {
        let client = client.clone();
        std::thread::spawn(move || {
            let started = Instant::now();
            let outcome = Lock::new("L", SECOND).with_owner("w").acquire_on(&client, Some(1500 * MS));
            (outcome.map(|g| g.map(|g| g.token())), started.elapsed())
        })
    };
    wait_queue(&mut admin, "L", &["w"]);
    proxy.kill();
    let (outcome, took) = waiting.join().unwrap();
    assert!(matches!(outcome, Ok(None)), "a timeout, not an error: {outcome:?}");
    assert!(took >= 1400 * MS && took < 2500 * MS, "ended at its deadline: {took:?}");
}

#[test]
fn a_session_wait_whose_reply_is_lost_as_its_server_becomes_unreachable_ends_as_a_timeout() {
    let s = Server::start();
    let mut admin = s.conn();
    let proxy = crate::common::proxy::Proxy::start(s.port);
    let client = redis::Client::open(proxy.url()).expect("client");
    let _holder = Lock::new("L", 30 * SECOND).with_owner("holder").acquire(s.conn(), None).unwrap();
    // Queued on the server; its WAITING and every resend are lost.
    proxy.kill_at_reply_to("FLOCK.ACQUIRE");
    let started = Instant::now();
    let outcome = Lock::new("L", SECOND).with_owner("w").acquire_on(&client, Some(1500 * MS));
    let took = started.elapsed();
    assert!(matches!(outcome, Ok(None)), "a timeout, not an error: {:?}", outcome.map(|g| g.map(|g| g.token())));
    assert!(took >= 1400 * MS && took < 2500 * MS, "ended at its deadline: {took:?}");
    assert_eq!(proxy.dropped(), 1, "the reply was lost");
    wait_queue(&mut admin, "L", &[]);
}
