//! The Rust client's `MultiLock` (`FLOCK.ACQUIREALL` / `FLOCK.RELEASEALL`)
//! against a real server: all or none, a wait for every key, one owner with
//! the thread's single locks.
use crate::common::*;

use std::time::Duration;

use flock_client::{Lock, MultiLock, FOREVER};

const LEASE: Duration = Duration::from_secs(30);

#[test]
fn a_try_takes_every_key_or_none_and_the_guard_releases_them_all() {
    let s = Server::start();
    let mut c = s.conn();
    let locks = MultiLock::new(["a", "b"], LEASE);
    let guard = locks.acquire(s.conn(), None).unwrap().expect("both free");
    assert_eq!(guard.tokens(), [token_of(&mut c, "a") as u64, token_of(&mut c, "b") as u64]);
    assert!(MultiLock::new(["c", "b"], LEASE).with_owner("other").acquire(s.conn(), None).unwrap().is_none());
    assert!(!exists(&mut c, "c"), "nothing taken");
    assert_eq!(guard.release().unwrap(), vec![0, 0]);
    assert_eq!(dbsize(&mut c), 0);
    let dropped = locks.acquire(s.conn(), None).unwrap().expect("free again");
    drop(dropped);
    assert_eq!(dbsize(&mut c), 0, "dropping the guard releases every key");
}

#[test]
fn a_wait_is_granted_every_key_when_the_last_comes_free() {
    let s = Server::start();
    let mut c = s.conn();
    let x = Lock::new("b", LEASE).with_owner("x").acquire(s.conn(), None).unwrap().expect("x holds b");
    let conn = s.conn();
    let waiting =
        std::thread::spawn(move || MultiLock::new(["a", "b"], LEASE).with_owner("o").acquire(conn, Some(FOREVER)));
    wait_queue(&mut c, "a", &["o"]);
    x.release().unwrap();
    let guard = waiting.join().unwrap().unwrap().expect("granted");
    assert_eq!(guard.tokens(), [token_of(&mut c, "a") as u64, token_of(&mut c, "b") as u64]);
    assert_eq!(owner_of(&mut c, "b").as_deref(), Some("o"));
}

#[test]
fn the_threads_own_lock_is_reentered_and_a_cycle_is_an_error_of_code_deadlock() {
    let s = Server::start();
    let mut c = s.conn();
    let single = Lock::new("a", LEASE).acquire(s.conn(), None).unwrap().expect("a");
    let both = MultiLock::new(["a", "b"], LEASE).acquire(s.conn(), None).unwrap().expect("a reentered, b free");
    assert_eq!(both.tokens()[0], single.token(), "one owner per thread: the same grant of a");
    assert_eq!(holds(&mut c, "a"), 2);
    // Another owner holds c and waits for a: this thread waiting for c closes the cycle.
    let _c = Lock::new("c", LEASE).with_owner("y").acquire(s.conn(), None).unwrap().expect("c");
    let y = spawn_waiter(&s, "a", "y", 30_000, 30_000);
    wait_queue(&mut c, "a", &["y"]);
    let e = MultiLock::new(["c", "d"], LEASE).acquire(s.conn(), Some(FOREVER)).expect_err("DEADLOCK");
    assert_eq!(e.code(), Some("DEADLOCK"), "{e}");
    drop(both);
    drop(single);
    assert!(granted(y, "y") > 0);
}

#[test]
fn a_release_after_one_key_was_lost_gives_back_the_others() {
    let s = Server::start();
    let mut c = s.conn();
    let guard = MultiLock::new(["a", "b"], LEASE).acquire(s.conn(), None).unwrap().expect("both");
    assert_eq!(force_release(&mut c, "a").unwrap(), 1);
    let e = guard.release().expect_err("a was lost");
    assert_eq!(e.code(), Some("NOTOWNER"), "{e}");
    assert!(!exists(&mut c, "b"), "b given back");
}

#[test]
fn renew_resets_every_lease() {
    let s = Server::start();
    let mut c = s.conn();
    let mut guard = MultiLock::new(["a", "b"], Duration::from_secs(5)).acquire(s.conn(), None).unwrap().expect("both");
    guard.renew(Duration::from_secs(60)).unwrap();
    assert!(ttl_ms(&mut c, "a") > 50_000 && ttl_ms(&mut c, "b") > 50_000);
}

#[test]
fn fenced_on_writes_with_each_keys_token_of_a_multi_guard() {
    let s = Server::start();
    let mut admin = s.conn();
    let mut guard =
        MultiLock::new(["{acct:1}:a", "{acct:1}:b"], LEASE).acquire(s.conn(), None).unwrap().expect("granted");

    let set: String = guard.fenced_on("{acct:1}:b", redis::cmd("SET").arg("{acct:1}:row").arg("v1")).unwrap();
    assert_eq!(set, "OK");
    let e = guard.fenced_on::<String>("{acct:1}:c", redis::cmd("GET").arg("{acct:1}:row")).expect_err("not a key");
    assert_eq!(e.kind(), redis::ErrorKind::ClientError, "{e}");

    force_release(&mut admin, "{acct:1}:b").unwrap();
    crate::client::stale(
        guard.fenced_on::<String>("{acct:1}:b", redis::cmd("SET").arg("{acct:1}:row").arg("v2")),
        "b's token",
    );
    // The other key's token still holds.
    let read: Option<String> = guard.fenced_on("{acct:1}:a", redis::cmd("GET").arg("{acct:1}:row")).unwrap();
    assert_eq!(read.as_deref(), Some("v1"));
    let row: Option<String> = redis::cmd("GET").arg("{acct:1}:row").query(&mut admin).unwrap();
    assert_eq!(row.as_deref(), Some("v1"));
}
