//! Key names are binary-safe in Redis: a lock whose name holds NUL, CR/LF
//! and high bytes must work through every path that reopens its key by
//! name (lease timer, WAIT timeout, SESSION close, hand-off, RENAME/MOVE,
//! FLUSHDB, DEBUG RELOAD, AOF, replication, cluster), and the server must
//! stay up.
use crate::common::*;

use std::time::{Duration, Instant};

use crate::common::cluster::Cluster;

const KEY: &[u8] = b"a\0b\r\n\xff";
const OTHER: &[u8] = b"\0\xfe\n{}";

/// The owner and token of a `FLOCK.INFO` reply.
fn owner_and_token(info: &Value) -> (String, i64) {
    let fields = fields_of(info);
    let get = |name: &str| {
        fields.iter().find(|(k, _)| k == name).unwrap_or_else(|| panic!("no {name} in {info:?}")).1.clone()
    };
    (redis::from_redis_value(&get("owner")).expect("owner"), int(&get("token")))
}

/// Waits until the lock `key`, granted with `lease_ms` by a command sent at
/// `sent`, is gone, and checks that it did not go before its lease ended.
fn wait_lease_end(c: &mut Connection, key: &[u8], sent: Instant, lease_ms: u64) {
    let lease = Duration::from_millis(lease_ms);
    wait_gone(c, key, sent + lease, lease + 5 * SECOND);
}

#[test]
fn lease_expiry_of_a_binary_key_ends_the_lock_then_hands_it_to_its_waiter() {
    let mut s = Server::start();
    let mut c = s.conn();
    let sent = Instant::now();
    let first = acquire(&mut c, KEY, "a", 100).unwrap().expect("granted");
    wait_lease_end(&mut c, KEY, sent, 100);

    // Again with a waiter: the timer hands the lock on at the deadline.
    let sent = Instant::now();
    let second = acquire(&mut c, KEY, "a", 150).unwrap().expect("granted");
    assert!(second > first);
    let w = spawn_waiter(&s, KEY, "b", 100, 10_000);
    let third = granted(w, "b (on a's lease expiry)");
    assert!(sent.elapsed() >= Duration::from_millis(148), "b was granted before a's lease ended");
    assert!(third > second);
    wait_lease_end(&mut c, KEY, sent, 150 + 100);
    assert_eq!(s.stat("lease_expiries"), 3);
    s.assert_alive("after lease expiries on a binary key");
}

#[test]
fn wait_timeout_on_a_binary_key_answers_nil_and_leaves_the_queue() {
    let mut s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, KEY, "a", 60_000).unwrap().expect("granted");
    let reply = acquire_wait(&mut s.conn(), KEY, "b", 1_000, 100).expect("a nil reply");
    assert_eq!(reply, None, "the WAIT ran out");
    assert!(queue_of(&mut c, KEY).is_empty(), "the timed-out waiter left the queue");
    assert_eq!(owner_of(&mut c, KEY).as_deref(), Some("a"));
    assert_eq!(s.stat("wait_timeouts"), 1);
    s.assert_alive("after a WAIT timeout on a binary key");
}

#[test]
fn closing_a_session_connection_releases_its_binary_key_and_hands_it_on() {
    let mut s = Server::start();
    let mut c = s.conn();
    let mut holder = s.conn();
    let cmd = redis::cmd("FLOCK.ACQUIRE").arg(KEY).arg("a").arg(60_000).arg("SESSION").clone();
    cmd.query::<Option<i64>>(&mut holder).unwrap().expect("granted");
    let w = spawn_waiter(&s, KEY, "b", 60_000, 10_000);
    wait_queue(&mut c, KEY, &["b"]);
    drop(holder);
    granted(w, "b (after a's session closed)");
    assert_eq!(owner_of(&mut c, KEY).as_deref(), Some("b"));
    assert_eq!(s.stat("session_releases"), 1);

    // Without waiters the key goes.
    let mut holder = s.conn();
    force_release(&mut c, KEY).unwrap();
    cmd.query::<Option<i64>>(&mut holder).unwrap().expect("granted");
    drop(holder);
    wait_until("the session lock to go when its connection closed", 5 * SECOND, || !exists(&mut c, KEY));
    s.assert_alive("after SESSION closes on a binary key");
}

#[test]
fn release_of_a_binary_key_hands_it_to_the_waiter_with_a_larger_token() {
    let mut s = Server::start();
    let mut c = s.conn();
    let t1 = acquire(&mut c, KEY, "a", 60_000).unwrap().expect("granted");
    let w = spawn_waiter(&s, KEY, "b", 60_000, 10_000);
    wait_queue(&mut c, KEY, &["b"]);
    assert_eq!(release(&mut c, KEY, "a").unwrap(), 0);
    let t2 = granted(w, "b");
    assert!(t2 > t1, "token {t2} after {t1}");
    assert_eq!(owner_of(&mut c, KEY).as_deref(), Some("b"));
    assert_eq!(token_of(&mut c, KEY), t2);
    assert_eq!(release(&mut c, KEY, "b").unwrap(), 0);
    assert!(!exists(&mut c, KEY));
    s.assert_alive("after a hand-off on a binary key");
}

#[test]
fn renamed_and_moved_binary_keys_keep_their_lock_and_the_lease_ends_on_time() {
    let mut s = Server::start();
    let mut c = s.conn();
    // Each lock held long until the packet that cuts its lease to 1000 ms
    // also renames (moves) it and reads where it went: a loaded machine
    // cannot let the lease run out before it is read.
    let t = acquire(&mut c, KEY, "a", 60_000).unwrap().expect("granted");
    let sent = Instant::now();
    let (renewed, (), key_left, other): (i64, (), bool, Value) = renew_to(KEY, "a", 1_000)
        .cmd("RENAME")
        .arg(KEY)
        .arg(OTHER)
        .cmd("EXISTS")
        .arg(KEY)
        .cmd("FLOCK.INFO")
        .arg(OTHER)
        .query(&mut c)
        .unwrap();
    assert_eq!(renewed, t);
    assert!(!key_left);
    assert_eq!(owner_and_token(&other), ("a".to_string(), t));
    wait_lease_end(&mut c, OTHER, sent, 1_000);

    let t = acquire(&mut c, KEY, "a", 60_000).unwrap().expect("granted");
    let mut c1 = s.conn_db(1);
    let sent = Instant::now();
    let (renewed, moved, key_left, _, moved_lock, _): (i64, i64, bool, (), Value, ()) = renew_to(KEY, "a", 1_000)
        .cmd("MOVE")
        .arg(KEY)
        .arg(1)
        .cmd("EXISTS")
        .arg(KEY)
        .cmd("SELECT")
        .arg(1)
        .cmd("FLOCK.INFO")
        .arg(KEY)
        .cmd("SELECT")
        .arg(0)
        .query(&mut c)
        .unwrap();
    assert_eq!((renewed, moved), (t, 1));
    assert!(!key_left);
    assert_eq!(owner_and_token(&moved_lock), ("a".to_string(), t));
    wait_lease_end(&mut c1, KEY, sent, 1_000);
    assert_eq!(s.stat("locks"), 0);
    s.assert_alive("after RENAME and MOVE of binary keys");
}

#[test]
fn flushdb_answers_the_waiters_of_a_binary_key_lockdeleted() {
    let mut s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, KEY, "a", 60_000).unwrap().expect("granted");
    let mut waiters = Vec::new();
    for queue in [&["b"][..], &["b", "c"]] {
        waiters.push(spawn_waiter(&s, KEY, queue[queue.len() - 1], 60_000, 10_000));
        wait_queue(&mut c, KEY, queue);
    }
    let _: () = redis::cmd("FLUSHDB").query(&mut c).unwrap();
    for w in waiters {
        let e = w.join().expect("waiter thread").expect_err("LOCKDELETED");
        assert_eq!(error_code(&e), "LOCKDELETED", "{e}");
    }
    assert!(!exists(&mut c, KEY));
    assert_eq!((s.stat("waiters"), s.blocked_clients()), (0, 0));
    s.assert_alive("after FLUSHDB of a binary key");
}

#[test]
fn debug_reload_keeps_a_binary_key_and_its_lease_still_ends() {
    let mut s = Server::start();
    let mut c = s.conn();
    let sent = Instant::now();
    let t = acquire(&mut c, KEY, "a", 2_000).unwrap().expect("granted");
    acquire(&mut c, KEY, "a", 2_000).unwrap().expect("reentered");
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).expect("DEBUG RELOAD");
    assert_eq!(owner_of(&mut c, KEY).as_deref(), Some("a"));
    assert_eq!((token_of(&mut c, KEY), int_field(&mut c, KEY, "holds")), (t, 2));
    wait_lease_end(&mut c, KEY, sent, 2_000);
    s.assert_alive("after DEBUG RELOAD of a binary key");
}

/// Locks on binary keys written before and after a BGREWRITEAOF come back
/// from the AOF after kill -9, and the short lease still ends.
fn binary_keys_survive_aof_restart(preamble: &str) {
    let how = format!("aof-use-rdb-preamble {preamble}");
    let mut s = Server::start_aof(preamble);
    let mut c = s.conn();
    let t_long = acquire(&mut c, KEY, "a", 60_000).unwrap().expect("granted");
    let _: Value = redis::cmd("BGREWRITEAOF").query(&mut c).expect("BGREWRITEAOF");
    s.wait_aof_rewrite();
    let sent = Instant::now();
    let t_short = acquire(&mut c, OTHER, "b", 3_000).unwrap().expect("granted");
    drop(c);
    s.restart(Stop::Kill);
    let mut c = s.conn();
    assert_eq!(owner_of(&mut c, KEY).as_deref(), Some("a"), "{how}: lock from the rewritten AOF");
    assert_eq!(token_of(&mut c, KEY), t_long, "{how}");
    assert_eq!(owner_of(&mut c, OTHER).as_deref(), Some("b"), "{how}: lock from the incremental AOF");
    assert_eq!(token_of(&mut c, OTHER), t_short, "{how}");
    wait_lease_end(&mut c, OTHER, sent, 3_000);
    assert_eq!(owner_of(&mut c, KEY).as_deref(), Some("a"), "{how}: the long lease runs on");
    s.assert_alive(&format!("{how}: after an AOF restart with binary keys"));
}

#[test]
fn aof_restart_with_rdb_preamble_restores_binary_keys_and_their_leases_end() {
    binary_keys_survive_aof_restart("yes");
}

#[test]
fn aof_restart_without_rdb_preamble_restores_binary_keys_and_their_leases_end() {
    binary_keys_survive_aof_restart("no");
}

#[test]
fn replica_sees_binary_keys_and_ends_their_lease_once_promoted() {
    let mut m = Server::start();
    let mut r = Server::replica_of(&m);
    let (mut mc, mut rc) = (m.conn(), r.conn());
    // Grant and lease expiry on the master reach the replica (FLOCK.STATE).
    // Held long until read back on the replica (slow on a loaded machine),
    // then its lease cut short.
    let t = acquire(&mut mc, OTHER, "x", 60_000).unwrap().expect("granted");
    wait_replica_applied(&mut mc, &mut rc);
    assert_eq!(token_of(&mut rc, OTHER), t);
    assert_eq!(renew(&mut mc, OTHER, "x", 200).unwrap(), t);
    wait_until("the master to end x's lease", 5 * SECOND, || !exists(&mut mc, OTHER));
    wait_replica_applied(&mut mc, &mut rc);
    assert!(!exists(&mut rc, OTHER), "the expiry reached the replica");

    let t = acquire(&mut mc, KEY, "a", 60_000).unwrap().expect("granted");
    wait_replica_applied(&mut mc, &mut rc);
    assert_eq!(owner_of(&mut rc, KEY).as_deref(), Some("a"));
    assert_eq!(token_of(&mut rc, KEY), t);
    // Held long until read back on the replica, then cut to 1500 ms, the
    // cut on the replica before the master goes. Should the lease end on
    // the master first (a stall), its end is replicated or the promoted
    // replica ends it: gone, never before its end, either way.
    let sent = Instant::now();
    assert_eq!(renew(&mut mc, KEY, "a", 1_500).unwrap(), t);
    wait_replica_applied(&mut mc, &mut rc);

    m.stop(Stop::Kill);
    let ok: String = redis::cmd("REPLICAOF").arg("NO").arg("ONE").query(&mut rc).expect("REPLICAOF NO ONE");
    assert_eq!(ok, "OK");
    wait_lease_end(&mut rc, KEY, sent, 1_500);
    let t2 = acquire(&mut rc, KEY, "b", 1_000).unwrap().expect("granted on the promoted replica");
    assert!(t2 > t, "token {t2} after promotion, {t} before");
    r.assert_alive("the promoted replica, after binary keys");
}

#[test]
fn cluster_routes_a_binary_key_by_its_hash_tag_and_ends_its_lease() {
    let key: &[u8] = b"{t}\0x\xff";
    let cl = Cluster::start();
    let mut cc = cl.client();
    let home = cl.owner_of_key("{t}");
    let slot: u16 = redis::cmd("CLUSTER").arg("KEYSLOT").arg(key).query(&mut cl.conn(0)).expect("KEYSLOT");
    assert_eq!(slot, cl.keyslot("{t}"), "the hash tag decides the slot");

    // Held long until read on its node (a connection, slow on a loaded
    // machine), then its lease cut to 1000 ms through the cluster client.
    let t: Option<i64> = redis::cmd("FLOCK.ACQUIRE").arg(key).arg("a").arg(60_000).query(&mut cc).expect("ACQUIRE");
    let t = t.expect("granted");
    let mut hc = cl.conn(home);
    assert_eq!(token_of(&mut hc, key), t, "the lock lives on the master of slot {slot}");
    let sent = Instant::now();
    let renewed: i64 = redis::cmd("FLOCK.RENEW").arg(key).arg("a").arg(1_000).query(&mut cc).expect("RENEW");
    assert_eq!(renewed, t);
    let waiter: Option<i64> =
        redis::cmd("FLOCK.ACQUIRE").arg(key).arg("b").arg(300).arg("WAIT").arg(5_000).query(&mut cc).expect("WAIT");
    let t2 = waiter.expect("b granted when a's lease ended");
    assert!(t2 > t && sent.elapsed() >= Duration::from_millis(998), "b got the lock on time");
    wait_lease_end(&mut hc, key, sent, 1_000 + 300);
    for i in 0..cl.nodes.len() {
        let pong: String = redis::cmd("PING").query(&mut cl.conn(i)).expect("every node answers PING");
        assert_eq!(pong, "PONG", "node {i}");
    }
}
