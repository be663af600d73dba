//! `FLOCK.ACQUIREALL` and `FLOCK.RELEASEALL`: several locks of one owner,
//! all or none; a wait that holds its place in every key's queue and is
//! granted every key at once; each key an ordinary hold afterwards.
use crate::common::*;

use redis::{Connection, RedisResult, Value};
use std::thread::JoinHandle;

type Tokens = Option<Vec<i64>>;

fn all_cmd(keys: &[&str], owner: &str, lease_ms: u64) -> redis::Cmd {
    let mut cmd = redis::cmd("FLOCK.ACQUIREALL");
    cmd.arg(keys.len()).arg(keys).arg(owner).arg(lease_ms);
    cmd
}

fn acquire_all(c: &mut Connection, keys: &[&str], owner: &str) -> RedisResult<Tokens> {
    all_cmd(keys, owner, 30_000).query(c)
}

fn release_all(c: &mut Connection, keys: &[&str], owner: &str) -> RedisResult<Vec<i64>> {
    redis::cmd("FLOCK.RELEASEALL").arg(keys.len()).arg(keys).arg(owner).query(c)
}

/// `FLOCK.ACQUIREALL ... WAIT wait_ms` on its own connection, in a thread.
fn wait_all(s: &Server, keys: &[&str], owner: &str, wait_ms: u64) -> JoinHandle<RedisResult<Tokens>> {
    let mut c = s.conn();
    let mut cmd = all_cmd(keys, owner, 30_000);
    cmd.arg("WAIT").arg(wait_ms);
    std::thread::spawn(move || cmd.query(&mut c))
}

fn tokens(h: JoinHandle<RedisResult<Tokens>>, who: &str) -> Vec<i64> {
    h.join().expect("waiter thread").unwrap_or_else(|e| panic!("{who}: {e}")).unwrap_or_else(|| panic!("{who}: nil"))
}

#[test]
fn a_try_takes_every_key_or_none() {
    let s = Server::start();
    let mut c = s.conn();
    let t = acquire_all(&mut c, &["a", "b", "c"], "o").unwrap().expect("all free");
    assert_eq!(t.len(), 3);
    assert_eq!(t, vec![token_of(&mut c, "a"), token_of(&mut c, "b"), token_of(&mut c, "c")], "in the order named");
    assert!(t.windows(2).all(|w| w[0] < w[1]), "tokens rise");
    acquire(&mut c, "busy", "x", 30_000).unwrap().expect("x holds busy");
    assert_eq!(acquire_all(&mut c, &["d", "busy", "e"], "o").unwrap(), None, "one busy: nil");
    assert!(!exists(&mut c, "d") && !exists(&mut c, "e"), "nothing taken, no key left behind");
    assert_eq!(owner_of(&mut c, "busy").as_deref(), Some("x"));
    assert_eq!(release_all(&mut c, &["a", "b", "c"], "o").unwrap(), vec![0, 0, 0]);
    assert_eq!(dbsize(&mut c), 1, "only x's lock is left");
}

#[test]
fn a_wait_holds_its_place_in_every_queue_and_gets_every_key_in_one_step() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "b", "x", 30_000).unwrap().expect("x holds b");
    let all = wait_all(&s, &["a", "b"], "o", LONG_WAIT_MS);
    wait_queue(&mut c, "a", &["o"]);
    assert_eq!(queue_of(&mut c, "b"), ["o"], "queued at both keys as it arrived");
    assert_eq!(owner_of(&mut c, "a"), None, "a is free, but its place keeps it for o");
    assert_eq!(acquire(&mut c, "a", "y", 30_000).unwrap(), None, "a try never cuts in");
    let y = waiter(&s, "a", "y", 30_000);
    wait_queue(&mut c, "a", &["o", "y"]);
    assert_eq!(release(&mut c, "b", "x").unwrap(), 0);
    let t = tokens(all, "o");
    assert_eq!(t, vec![token_of(&mut c, "a"), token_of(&mut c, "b")]);
    assert_eq!(queue_of(&mut c, "a"), ["y"], "y waits behind o");
    // Each key is an ordinary hold now.
    assert!(renew(&mut c, "a", "o", 60_000).unwrap() > 0);
    assert_eq!(release(&mut c, "a", "o").unwrap(), 0);
    assert!(granted(y, "y") > t[0]);
    assert_eq!(release(&mut c, "b", "o").unwrap(), 0);
    assert_eq!(s.stat("waiters"), 0);
}

#[test]
fn two_waits_for_the_same_keys_in_opposite_orders_are_granted_in_arrival_order() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "k1", "x", 30_000).unwrap().expect("x holds k1");
    acquire(&mut c, "k2", "y", 30_000).unwrap().expect("y holds k2");
    let first = wait_all(&s, &["k1", "k2"], "first", LONG_WAIT_MS);
    wait_queue(&mut c, "k2", &["first"]);
    let second = wait_all(&s, &["k2", "k1"], "second", LONG_WAIT_MS);
    wait_queue(&mut c, "k1", &["first", "second"]);
    assert_eq!(queue_of(&mut c, "k2"), ["first", "second"]);
    release(&mut c, "k1", "x").unwrap();
    release(&mut c, "k2", "y").unwrap();
    let t1 = tokens(first, "first");
    assert_eq!(release_all(&mut c, &["k2", "k1"], "first").unwrap(), vec![0, 0]);
    let t2 = tokens(second, "second");
    assert!(t2[1] > t1[0] && t2[0] > t1[1], "second after first on each key: {t1:?} {t2:?}");
    assert_eq!(s.stat("deadlocks"), 0);
}

#[test]
fn a_key_the_owner_holds_counts_as_its_own() {
    let s = Server::start();
    let mut c = s.conn();
    let held = acquire(&mut c, "a", "o", 30_000).unwrap().expect("o holds a");
    acquire(&mut c, "b", "x", 30_000).unwrap().expect("x holds b");
    let all = wait_all(&s, &["a", "b"], "o", LONG_WAIT_MS);
    wait_queue(&mut c, "b", &["o"]);
    assert!(queue_of(&mut c, "a").is_empty(), "no place in the queue of a key it holds");
    release(&mut c, "b", "x").unwrap();
    let t = tokens(all, "o");
    assert_eq!(t[0], held, "a reentered: the same grant");
    assert_eq!(holds(&mut c, "a"), 2);
    assert_eq!(release_all(&mut c, &["a", "b"], "o").unwrap(), vec![1, 0]);
    assert_eq!(release(&mut c, "a", "o").unwrap(), 0);
}

#[test]
fn a_held_key_lost_while_waiting_ends_the_wait_and_grants_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "a", "o", 30_000).unwrap().expect("o holds a");
    acquire(&mut c, "b", "x", 30_000).unwrap().expect("x holds b");
    let all = wait_all(&s, &["a", "b"], "o", LONG_WAIT_MS);
    wait_queue(&mut c, "b", &["o"]);
    assert_eq!(force_release(&mut c, "a").unwrap(), 1);
    release(&mut c, "b", "x").unwrap();
    let e = all.join().unwrap().expect_err("NOTOWNER");
    assert_eq!(error_code(&e), "NOTOWNER", "{e}");
    assert_eq!(dbsize(&mut c), 0, "b was not granted, nothing is left");
}

#[test]
fn a_wait_that_times_out_leaves_every_queue() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "b", "x", 30_000).unwrap().expect("x holds b");
    let all = wait_all(&s, &["a", "b", "c"], "o", 200);
    assert_eq!(all.join().unwrap().unwrap(), None, "nil at its timeout");
    // Left in the timeout's own callback, before the nil reply was written.
    assert_eq!(dbsize(&mut c), 1, "a and c, kept only by its places, are gone");
    assert!(queue_of(&mut c, "b").is_empty());
    assert_eq!(acquire(&mut c, "a", "y", 30_000).unwrap().map(|t| t > 0), Some(true), "a is free again");
    assert_eq!(s.stat("wait_timeouts"), 1);
}

#[test]
fn a_disconnected_or_cancelled_wait_leaves_every_queue_and_lets_the_next_go() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "b", "x", 30_000).unwrap().expect("x holds b");
    let mut gone = s.conn();
    let id: i64 = redis::cmd("CLIENT").arg("ID").query(&mut gone).unwrap();
    let mut cmd = all_cmd(&["a", "b"], "o", 30_000);
    cmd.arg("WAIT").arg(0);
    let killed = std::thread::spawn(move || cmd.query::<Value>(&mut gone));
    wait_queue(&mut c, "a", &["o"]);
    redis::cmd("CLIENT").arg("KILL").arg("ID").arg(id).query::<i64>(&mut c).unwrap();
    assert!(killed.join().unwrap().is_err(), "its connection was closed");
    let cancelled = wait_all(&s, &["a", "b"], "p", LONG_WAIT_MS);
    // Queued first, so that y's wait is the one behind it.
    wait_queue(&mut c, "a", &["p"]);
    let y = waiter(&s, "a", "y", 30_000);
    wait_queue(&mut c, "a", &["p", "y"]);
    assert_eq!(redis::cmd("FLOCK.CANCEL").arg("a").arg("p").query::<i64>(&mut c).unwrap(), 1);
    assert_eq!(cancelled.join().unwrap().unwrap(), None, "a cancelled wait answers nil");
    assert!(granted(y, "y") > 0, "y was behind o and p on a");
    wait_until("b's queue empty", 5 * SECOND, || queue_of(&mut c, "b").is_empty());
}

#[test]
fn releaseall_releases_one_hold_of_each_or_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    acquire_all(&mut c, &["a", "b"], "o").unwrap().expect("both");
    acquire(&mut c, "a", "o", 30_000).unwrap().expect("reentered");
    let e = release_all(&mut c, &["a", "b", "c"], "o").expect_err("c is not o's");
    assert_eq!(error_code(&e), "NOTOWNER", "{e}");
    assert_eq!((holds(&mut c, "a"), holds(&mut c, "b")), (2, 1), "nothing released");
    assert_eq!(release_all(&mut c, &["a", "b"], "o").unwrap(), vec![1, 0]);
    assert!(!exists(&mut c, "b"), "a free lock leaves no key");
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    let cases: &[(&[&str], &str)] = &[
        (&["FLOCK.ACQUIREALL", "0", "a", "o", "1000"], "numkeys"),
        (&["FLOCK.ACQUIREALL", "3", "a", "b", "o"], "wrong number of arguments"),
        (&["FLOCK.ACQUIREALL", "9", "a", "b", "o"], "numkeys"),
        (&["FLOCK.ACQUIREALL", "257", "a", "o", "1000"], "numkeys"),
        (&["FLOCK.ACQUIREALL", "2", "a", "a", "o", "1000"], "named twice"),
        (&["FLOCK.ACQUIREALL", "2", "a", "b", "o", "1000", "PERMITS", "1", "LIMIT", "2"], "a semaphore is one key"),
        (&["FLOCK.ACQUIREALL", "1", "a", "o", "1000", "INBOX", "0123456789abcdef0123456789abcdef"], "not for several"),
        (&["FLOCK.ACQUIREALL", "2", "a", "b", "o", "0"], "lease"),
        (&["FLOCK.RELEASEALL", "2", "a", "a", "o"], "named twice"),
        (&["FLOCK.RELEASEALL", "x", "a", "o"], "numkeys"),
    ];
    for (args, text) in cases {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        let e = cmd.query::<Value>(&mut c).expect_err("refused");
        assert!(e.to_string().contains(text), "{args:?}: {e}");
    }
    redis::cmd("SET").arg("str").arg("v").query::<()>(&mut c).unwrap();
    redis::cmd("LPUSH").arg("list").arg("v").query::<()>(&mut c).unwrap();
    let e = acquire_all(&mut c, &["a", "list"], "o").expect_err("WRONGTYPE");
    assert_eq!(error_code(&e), "WRONGTYPE", "{e}");
    assert_eq!(dbsize(&mut c), 2, "nothing else made");
}

#[test]
fn inside_multi_a_wait_acts_as_a_try() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "b", "x", 30_000).unwrap().expect("x holds b");
    let (busy, free): (Tokens, Tokens) = redis::pipe()
        .atomic()
        .add_command(all_cmd(&["a", "b"], "o", 30_000).arg("WAIT").arg(0).clone())
        .add_command(all_cmd(&["a", "c"], "o", 30_000).arg("WAIT").arg(0).clone())
        .query(&mut c)
        .unwrap();
    assert_eq!(busy, None);
    assert_eq!(free.map(|t| t.len()), Some(2));
    assert!(queue_of(&mut c, "b").is_empty(), "nothing queued");
}

#[test]
fn a_resend_with_the_same_request_id_answers_the_first_reply() {
    let s = Server::start();
    let mut c = s.conn();
    let send =
        |c: &mut Connection| -> Tokens { all_cmd(&["a", "b"], "o", 30_000).arg("ID").arg("r1").query(c).unwrap() };
    let first = send(&mut c).expect("granted");
    assert_eq!(send(&mut c), Some(first.clone()), "the same tokens, not a reentry");
    assert_eq!((holds(&mut c, "a"), holds(&mut c, "b")), (1, 1));
    let rel = |c: &mut Connection| -> Vec<i64> {
        redis::cmd("FLOCK.RELEASEALL").arg(2).arg("a").arg("b").arg("o").arg("ID").arg("r2").query(c).unwrap()
    };
    assert_eq!(rel(&mut c), vec![0, 0]);
    assert_eq!(rel(&mut c), vec![0, 0], "a resend after the keys went is answered, not NOTOWNER");
    let e = all_cmd(&["a"], "o", 30_000).arg("ID").arg("r2").query::<Value>(&mut c).expect_err("reused");
    assert_eq!(error_code(&e), "IDREUSED", "{e}");
}

#[test]
fn a_wait_that_would_close_a_cycle_is_answered_deadlock() {
    let s = Server::start();
    let mut c = s.conn();
    let b = crossed(&s, &mut c);
    let e = all_cmd(&["L3", "L2"], "A", 30_000).arg("WAIT").arg(10_000).query::<Value>(&mut c).expect_err("cycle");
    assert_eq!(error_code(&e), "DEADLOCK", "{e}");
    assert!(e.to_string().contains("'A' -> 'B' -> 'A'"), "{e}");
    assert!(!exists(&mut c, "L3") && queue_of(&mut c, "L2").is_empty(), "nothing queued");
    // And a single wait that would wait for a waiting ACQUIREALL in a cycle.
    let all = wait_all(&s, &["L4", "L2"], "C", LONG_WAIT_MS);
    wait_queue(&mut c, "L2", &["C"]);
    let e = acquire_wait(&mut c, "L4", "B", 30_000, 10_000).expect_err("B -> C -> B");
    assert_eq!(error_code(&e), "DEADLOCK", "{e}");
    assert_eq!(release(&mut c, "L1", "A").unwrap(), 0);
    assert!(granted(b, "B") > 0);
    release(&mut c, "L1", "B").unwrap();
    release(&mut c, "L2", "B").unwrap();
    assert_eq!(tokens(all, "C").len(), 2);
}

#[test]
fn grants_replicate_and_survive_rdb_and_aof_reloads() {
    let s = Server::start_with(&["--appendonly", "yes"]);
    let r = Server::start();
    let mut c = s.conn();
    let mut rc = r.conn();
    redis::cmd("REPLICAOF").arg("127.0.0.1").arg(s.port).query::<()>(&mut rc).unwrap();
    wait_until("the replica in sync", 10 * SECOND, || {
        let info: String = redis::cmd("INFO").arg("replication").query(&mut rc).unwrap_or_default();
        info.contains("master_link_status:up")
    });
    acquire(&mut c, "b", "x", 30_000).unwrap().expect("x holds b");
    let all = wait_all(&s, &["a", "b"], "o", LONG_WAIT_MS);
    wait_queue(&mut c, "a", &["o"]);
    release(&mut c, "b", "x").unwrap();
    let t = tokens(all, "o");
    wait_replica_applied(&mut c, &mut rc);
    assert_eq!((token_of(&mut rc, "a"), token_of(&mut rc, "b")), (t[0], t[1]), "the replica has both grants");
    for reload in ["RELOAD", "LOADAOF"] {
        redis::cmd("DEBUG").arg(reload).query::<()>(&mut c).unwrap();
        assert_eq!((token_of(&mut c, "a"), token_of(&mut c, "b")), (t[0], t[1]), "after DEBUG {reload}");
    }
}

#[test]
fn each_grant_sends_its_key_event_and_counts() {
    let s = Server::start();
    let mut c = s.conn();
    config_set(&mut c, &[("notify-keyspace-events", "Kd")]);
    let mut sub = s.conn();
    let mut pubsub = sub.as_pubsub();
    pubsub.psubscribe("__keyspace@0__:*").unwrap();
    acquire_all(&mut c, &["a", "b"], "o").unwrap().expect("both");
    let mut seen = Vec::new();
    for _ in 0..2 {
        let m = pubsub.get_message().unwrap();
        seen.push((m.get_channel_name().to_string(), m.get_payload::<String>().unwrap()));
    }
    assert_eq!(
        seen,
        [("__keyspace@0__:a".into(), "flock.acquired".into()), ("__keyspace@0__:b".into(), "flock.acquired".into())]
    );
    assert_eq!(s.stat("grants"), 2);
}

#[test]
fn command_docs_and_getkeys_see_every_key() {
    let s = Server::start();
    let mut c = s.conn();
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg("FLOCK.ACQUIREALL")
        .arg(3)
        .arg("a")
        .arg("b")
        .arg("c")
        .arg("o")
        .arg(1)
        .query(&mut c)
        .unwrap();
    assert_eq!(keys, ["a", "b", "c"]);
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg("FLOCK.RELEASEALL")
        .arg(2)
        .arg("x")
        .arg("y")
        .arg("o")
        .query(&mut c)
        .unwrap();
    assert_eq!(keys, ["x", "y"]);
}

#[test]
fn a_wait_on_a_key_an_old_client_holds_is_granted_when_that_key_goes() {
    let s = Server::start();
    let mut c = s.conn();
    redis::cmd("SET").arg("legacy").arg("token").arg("NX").arg("PX").arg(30_000).query::<()>(&mut c).unwrap();
    let all = wait_all(&s, &["a", "legacy"], "o", LONG_WAIT_MS);
    wait_queue(&mut c, "a", &["o"]);
    redis::cmd("DEL").arg("legacy").query::<i64>(&mut c).unwrap();
    assert_eq!(tokens(all, "o").len(), 2);
    assert_eq!(owner_of(&mut c, "legacy").as_deref(), Some("o"));
}

#[test]
fn in_a_cluster_keys_of_one_slot_work_and_others_are_crossslot() {
    let cl = crate::common::cluster::Cluster::start();
    let slot = cl.keyslot("{acct}:1");
    let node = cl.owner_of_slot_seen_by(0, slot);
    let mut c = cl.nodes[node].conn();
    let t = acquire_all(&mut c, &["{acct}:1", "{acct}:2"], "o").unwrap().expect("one slot");
    assert_eq!(t.len(), 2);
    let e = acquire_all(&mut c, &["{acct}:1", "other"], "p").expect_err("two slots");
    assert_eq!(e.kind(), redis::ErrorKind::CrossSlot, "{e}");
    assert_eq!(release_all(&mut c, &["{acct}:1", "{acct}:2"], "o").unwrap(), vec![0, 0]);
}
