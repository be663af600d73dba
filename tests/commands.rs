//! The FLOCK commands as the spec describes them, one behaviour per test.
mod common;
use common::*;

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
