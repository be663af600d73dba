//! Deadlock detection: a `FLOCK.ACQUIRE ... WAIT` whose owner would, through
//! the holders and earlier waiters of the lock it asks for and what they in
//! turn wait for, end up waiting for itself is answered at once with
//! DEADLOCK and the owners of the cycle, and queues nothing.
use crate::common::*;

use redis::Connection;
use std::time::Instant;

fn deadlock_of(c: &mut Connection, key: &str, owner: &str) -> String {
    let e = acquire_wait(c, key, owner, 30_000, 10_000).expect_err("DEADLOCK");
    assert_eq!(error_code(&e), "DEADLOCK", "{e}");
    e.to_string()
}

/// Opens a session on its own connection (kept open by the caller) and
/// returns it with its ID, for waits sent with `INBOX`.
fn session(s: &Server) -> (Connection, String) {
    let mut c = s.conn();
    let id: String = redis::cmd("FLOCK.SESSION").query(&mut c).unwrap();
    (c, id)
}

fn wait_inbox(c: &mut Connection, key: &str, owner: &str, sid: &str) {
    let reply: String = redis::cmd("FLOCK.ACQUIRE")
        .arg(key)
        .arg(owner)
        .arg(30_000)
        .arg("WAIT")
        .arg(30_000)
        .arg("INBOX")
        .arg(sid)
        .query(c)
        .unwrap();
    assert_eq!(reply, "WAITING");
}

#[test]
fn two_owners_that_take_two_locks_in_opposite_orders_get_deadlock_instead_of_waiting() {
    let s = Server::start();
    let mut c = s.conn();
    let b = crossed(&s, &mut c);
    let asked = Instant::now();
    let e = deadlock_of(&mut c, "L2", "A");
    eprintln!("two-lock deadlock answered in {:?}", asked.elapsed());
    assert!(e.contains("'A' -> 'B' -> 'A'"), "{e}");
    assert!(queue_of(&mut c, "L2").is_empty(), "nothing queued");
    assert_eq!(owner_of(&mut c, "L1").as_deref(), Some("A"), "A keeps what it holds");
    assert_eq!(s.stat("deadlocks"), 1);
    // A gives up its lock, as a caller told of a deadlock does: B goes on.
    assert_eq!(release(&mut c, "L1", "A").unwrap(), 0);
    assert!(granted(b, "B") > 0);
}

#[test]
fn a_cycle_through_session_waits_and_a_third_owner_is_found() {
    let s = Server::start();
    let mut c = s.conn();
    let (_reader, sid) = session(&s);
    for (key, owner) in [("L1", "A"), ("L2", "B"), ("L3", "C")] {
        acquire(&mut c, key, owner, 30_000).unwrap().expect("held");
    }
    wait_inbox(&mut c, "L3", "B", &sid);
    let cw = waiter(&s, "L1", "C", 30_000);
    wait_queue(&mut c, "L1", &["C"]);
    let e = deadlock_of(&mut c, "L2", "A");
    assert!(e.contains("'A' -> 'B' -> 'C' -> 'A'"), "{e}");
    assert_eq!(release(&mut c, "L1", "A").unwrap(), 0);
    assert!(granted(cw, "C") > 0);
}

#[test]
fn a_waiter_queued_ahead_counts_as_well_as_the_holder() {
    // X holds L1; W waits for L1 and, on another connection, for L2, which
    // A holds. A asking for L1 would queue behind W, who waits for A.
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "L1", "X", 30_000).unwrap().expect("held");
    acquire(&mut c, "L2", "A", 30_000).unwrap().expect("held");
    let w1 = waiter(&s, "L1", "W", 30_000);
    wait_queue(&mut c, "L1", &["W"]);
    let w2 = waiter(&s, "L2", "W", 30_000);
    wait_queue(&mut c, "L2", &["W"]);
    let e = deadlock_of(&mut c, "L1", "A");
    assert!(e.contains("'A' -> 'W' -> 'A'"), "{e}");
    for (key, owner) in [("L2", "A"), ("L1", "X")] {
        assert_eq!(release(&mut c, key, owner).unwrap(), 0);
    }
    assert!(granted(w1, "W on L1") > 0 && granted(w2, "W on L2") > 0);
}

#[test]
fn an_owner_that_already_waits_finds_the_cycle_through_a_waiter_queued_behind_it() {
    // X holds L2 and W holds L1; A waits for L2, then W queues behind A
    // there (so W waits for A too). A asking for L1 would wait for W. Every
    // waiter waits at one lock, so only A's own wait elsewhere makes the
    // queue at L2 part of the walk.
    let s = Server::start();
    let mut c = s.conn();
    let (_reader, sid) = session(&s);
    acquire(&mut c, "L2", "X", 30_000).unwrap().expect("held");
    acquire(&mut c, "L1", "W", 30_000).unwrap().expect("held");
    wait_inbox(&mut c, "L2", "A", &sid);
    wait_inbox(&mut c, "L2", "W", &sid);
    wait_queue(&mut c, "L2", &["A", "W"]);
    let e = deadlock_of(&mut c, "L1", "A");
    assert!(e.contains("'A' -> 'W' -> 'A'"), "{e}");
    wait_queue(&mut c, "L1", &[]);
}

#[test]
fn waits_that_only_chain_or_are_granted_together_are_queued() {
    let s = Server::start();
    let mut c = s.conn();
    // A chain without a cycle: A -> B -> C.
    acquire(&mut c, "L1", "B", 30_000).unwrap().expect("held");
    acquire(&mut c, "L2", "C", 30_000).unwrap().expect("held");
    let b = waiter(&s, "L2", "B", 30_000);
    wait_queue(&mut c, "L2", &["B"]);
    let a = waiter(&s, "L1", "A", 30_000);
    wait_queue(&mut c, "L1", &["A"]);
    // Readers: R2 holds L; R1 waits for L, and to read S1 behind its
    // writer. R2 reading S1 queues behind R1 but is granted with it, not
    // after it: R2 waits only for the writer, so there is no cycle.
    let read_wait = |owner: &'static str| {
        let mut c = s.conn();
        std::thread::spawn(move || {
            redis::cmd("FLOCK.ACQUIRE")
                .arg("S1")
                .arg(owner)
                .arg(30_000)
                .arg("WAIT")
                .arg(30_000)
                .arg("SHARED")
                .query::<Option<i64>>(&mut c)
        })
    };
    acquire(&mut c, "S1", "writer", 30_000).unwrap().expect("held");
    acquire(&mut c, "L", "R2", 30_000).unwrap().expect("held");
    let r1_l = waiter(&s, "L", "R1", 30_000);
    wait_queue(&mut c, "L", &["R1"]);
    let r1 = read_wait("R1");
    wait_queue(&mut c, "S1", &["R1"]);
    let r2 = read_wait("R2");
    wait_queue(&mut c, "S1", &["R1", "R2"]);
    assert_eq!(s.stat("deadlocks"), 0);
    for (key, owner) in [("L2", "C"), ("L1", "B"), ("S1", "writer")] {
        assert_eq!(release(&mut c, key, owner).unwrap(), 0, "{owner} releases {key}");
    }
    assert!(granted(b, "B") > 0 && granted(a, "A") > 0);
    assert!(r1.join().unwrap().unwrap().is_some() && r2.join().unwrap().unwrap().is_some(), "read together");
    assert_eq!(release(&mut c, "L", "R2").unwrap(), 0);
    assert!(granted(r1_l, "R1 on L") > 0);
}

#[test]
fn a_try_and_a_wait_inside_multi_never_answer_deadlock() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "L1", "A", 30_000).unwrap().expect("held");
    acquire(&mut c, "L2", "B", 30_000).unwrap().expect("held");
    let _b = waiter(&s, "L1", "B", 30_000);
    wait_queue(&mut c, "L1", &["B"]);
    assert_eq!(acquire(&mut c, "L2", "A", 30_000).unwrap(), None, "a try is busy, not a deadlock");
    let (reply,): (Option<i64>,) = redis::pipe()
        .atomic()
        .cmd("FLOCK.ACQUIRE")
        .arg("L2")
        .arg("A")
        .arg(30_000)
        .arg("WAIT")
        .arg(1000)
        .query(&mut c)
        .unwrap();
    assert_eq!(reply, None, "inside MULTI a WAIT is a try");
    assert_eq!(s.stat("deadlocks"), 0);
    assert_eq!(release(&mut c, "L1", "A").unwrap(), 0);
}

#[test]
fn a_cycle_of_a_thousand_owners_is_found() {
    const N: usize = 1_000;
    let s = Server::start();
    let mut c = s.conn();
    let (_reader, sid) = session(&s);
    for i in 0..N {
        acquire(&mut c, &format!("L{i}"), &format!("o{i}"), 60_000).unwrap().expect("held");
    }
    // o_i waits for L_{i+1}, which o_{i+1} holds.
    for i in 0..N - 1 {
        wait_inbox(&mut c, &format!("L{}", i + 1), &format!("o{i}"), &sid);
    }
    let asked = Instant::now();
    let e = deadlock_of(&mut c, "L0", &format!("o{}", N - 1));
    eprintln!("a {N}-owner cycle answered in {:?}", asked.elapsed());
    assert!(e.contains(&format!("({N} owners in all)")), "{e}");
    assert!(e.starts_with("DEADLOCK") && e.contains(&format!("'o{}' -> 'o0' -> 'o1'", N - 1)), "{e}");
}
