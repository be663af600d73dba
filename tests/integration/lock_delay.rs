//! Lock-delay (issue 31, Chubby's answer for resources that cannot check a
//! token): a grant that ends without its holder releasing it (its lease ran
//! out, its session ended) keeps the lock closed to everyone for its delay,
//! `LOCKDELAY ms` on the ACQUIRE or the module's `flock.lock-delay-ms`; a
//! RELEASE or a FORCERELEASE never waits.
use crate::common::*;

use std::time::{Duration, Instant};

fn acquire_delayed(c: &mut Connection, key: &str, owner: &str, lease_ms: u64, delay_ms: u64) -> Option<i64> {
    redis::cmd("FLOCK.ACQUIRE").arg(key).arg(owner).arg(lease_ms).arg("LOCKDELAY").arg(delay_ms).query(c).unwrap()
}

fn delayed_ms(c: &mut Connection, key: &str) -> i64 {
    int_field(c, key, "delayed-ms")
}

/// The lock-delay of `key`'s first holder, as FLOCK.INFO shows it.
fn holder_delay(c: &mut Connection, key: &str) -> i64 {
    let Some(Value::Array(holders)) = info_field(c, key, "holders") else { panic!("no holders of {key}") };
    let fields = fields_of(&holders[0]);
    int(&fields.iter().find(|(k, _)| k == "lock-delay-ms").expect("lock-delay-ms").1)
}

#[test]
fn a_lease_that_runs_out_keeps_the_next_waiter_out_for_its_lock_delay() {
    let s = Server::start();
    let mut c = s.conn();
    // Held long while b starts and queues, which a loaded machine may take
    // longer than the 100 ms lease under test to do.
    acquire_delayed(&mut c, "lock", "a", 60_000, 600).expect("a is granted");
    assert_eq!(holder_delay(&mut c, "lock"), 600);
    let b = waiter(&s, "lock", "b", 10_000);
    wait_queue(&mut c, "lock", &["b"]);
    let start = Instant::now();
    renew(&mut c, "lock", "a", 100).unwrap();
    wait_until("a's lease to end into its delay", 5 * SECOND, || delayed_ms(&mut c, "lock") > 0);
    assert_eq!(queue_of(&mut c, "lock"), ["b"], "b still waits");
    assert_eq!(owner_of(&mut c, "lock"), None, "nobody holds it meanwhile");
    assert_eq!(acquire(&mut c, "lock", "c", 1000).unwrap(), None, "a try is busy during the delay");
    granted(b, "b");
    let waited = start.elapsed();
    let lease_and_delay = Duration::from_millis(100 + 600 - SERVER_CLOCK_GRAIN_MS);
    assert!(waited >= lease_and_delay, "b was granted {waited:?} after a's RENEW, within its lease and delay");
    assert_eq!(delayed_ms(&mut c, "lock"), 0);
    assert_eq!(flock_stats(&mut c)["lock_delays"], 1);
}

#[test]
fn a_release_and_a_force_release_never_wait() {
    let s = Server::start();
    let mut c = s.conn();
    for end in ["RELEASE", "FORCERELEASE"] {
        let key = format!("lock:{end}");
        acquire_delayed(&mut c, &key, "a", 60_000, 60_000).expect("a is granted");
        let b = waiter(&s, &key, "b", 60_000);
        wait_queue(&mut c, &key, &["b"]);
        match end {
            "RELEASE" => assert_eq!(release(&mut c, &key, "a").unwrap(), 0),
            _ => assert_eq!(force_release(&mut c, &key).unwrap(), 1),
        }
        granted(b, "b");
        assert_eq!(delayed_ms(&mut c, &key), 0, "{end}");
    }
    assert_eq!(flock_stats(&mut c)["lock_delays"], 0);
}

#[test]
fn a_session_that_ends_keeps_its_grants_lock_closed_for_the_delay() {
    let s = Server::start();
    let mut c = s.conn();
    let mut holder = s.conn();
    let sid: String = redis::cmd("FLOCK.SESSION").query(&mut holder).unwrap();
    let granted_to_session: Option<i64> = redis::cmd("FLOCK.ACQUIRE")
        .arg(&["lock", "a", "0", "INBOX", &sid, "LOCKDELAY", "500"][..])
        .query(&mut holder)
        .unwrap();
    assert!(granted_to_session.is_some());
    let b = waiter(&s, "lock", "b", 10_000);
    wait_queue(&mut c, "lock", &["b"]);
    let closed = Instant::now();
    drop(holder);
    wait_until("the session's grant to end into its delay", 5 * SECOND, || delayed_ms(&mut c, "lock") > 0);
    granted(b, "b");
    let waited = closed.elapsed();
    assert!(waited >= Duration::from_millis(500 - SERVER_CLOCK_GRAIN_MS), "b granted {waited:?} after the close");
}

#[test]
fn the_module_default_applies_to_grants_without_lockdelay_and_a_delay_with_nobody_waiting_keeps_the_key() {
    let s = Server::start();
    let mut c = s.conn();
    config_set(&mut c, &[("flock.lock-delay-ms", "300")]);
    // Held long enough to be read on a loaded machine; the lease that runs
    // out is the RENEW's.
    acquire(&mut c, "lock", "a", 60_000).unwrap().expect("a is granted");
    assert_eq!(holder_delay(&mut c, "lock"), 300, "the default, read when the grant is made");
    acquire_delayed(&mut c, "own", "a", 60_000, 0).expect("granted");
    assert_eq!(holder_delay(&mut c, "own"), 0, "LOCKDELAY 0 asks for none");
    renew(&mut c, "lock", "a", 50).unwrap();
    wait_until("a's lease to end into its delay", 5 * SECOND, || delayed_ms(&mut c, "lock") > 0);
    assert!(exists(&mut c, "lock"), "the key stays while the delay runs, though nobody waits");
    let until = Instant::now() + Duration::from_millis(delayed_ms(&mut c, "lock") as u64);
    wait_gone(&mut c, "lock", until - Duration::from_millis(SERVER_CLOCK_GRAIN_MS), 5 * SECOND);
    let e = expect_err(try_config_set(&mut c, "flock.lock-delay-ms", "60001"), "a default above a minute");
    assert!(e.to_string().contains("lock-delay-ms"), "{e}");
}

#[test]
fn bad_lockdelay_values_are_refused_and_change_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    for args in [
        &["LOCKDELAY"][..],
        &["LOCKDELAY", "-1"],
        &["LOCKDELAY", "x"],
        &["LOCKDELAY", "60001"],
        &["LOCKDELAY", "1", "LOCKDELAY", "2"],
    ] {
        let e = expect_err(
            redis::cmd("FLOCK.ACQUIRE").arg(&["lock", "a", "1000"][..]).arg(args).query::<Value>(&mut c),
            &format!("{args:?}"),
        );
        assert!(e.to_string().contains("LOCKDELAY"), "{args:?}: {e}");
    }
    assert_eq!(dbsize(&mut c), 0);
}
