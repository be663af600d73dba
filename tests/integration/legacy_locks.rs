//! Locks of other clients on the same names (`flock.legacy-locks`): a
//! string set with `SET key token NX PX` is held by a foreign owner. A try
//! finds it busy, waits queue in FIFO and are granted when the string is
//! deleted or expires; other types stay WRONGTYPE.
use crate::common::*;

use redis::{Connection, Value};
use std::io::{Read, Write};
use std::time::Instant;

/// `SET key token NX PX ms`, as redis-py's `Lock` and `SET NX PX` code take
/// a lock: true if taken.
fn legacy_acquire(c: &mut Connection, key: &str, token: &str, ms: u64) -> bool {
    let set: Option<String> = redis::cmd("SET").arg(key).arg(token).arg("NX").arg("PX").arg(ms).query(c).unwrap();
    set.is_some()
}

/// redis-py's `Lock.release`: deletes the key if it still holds `token`.
fn legacy_release(c: &mut Connection, key: &str, token: &str) -> i64 {
    const SCRIPT: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0";
    redis::cmd("EVAL").arg(SCRIPT).arg(1).arg(key).arg(token).query(c).unwrap()
}

fn info_str(c: &mut Connection, key: &str, field: &str) -> String {
    match info_field(c, key, field) {
        Some(Value::BulkString(b)) => String::from_utf8(b).unwrap(),
        Some(Value::SimpleString(s)) => s,
        other => panic!("{field} of {key}: {other:?}"),
    }
}

#[test]
fn a_try_on_a_set_nx_px_lock_answers_nil_and_info_shows_the_foreign_holder() {
    let s = Server::start();
    let mut c = s.conn();
    assert!(legacy_acquire(&mut c, "L", "tok-1", 30_000));
    assert_eq!(acquire(&mut c, "L", "a", 10_000).unwrap(), None, "busy, not WRONGTYPE");
    assert_eq!(info_str(&mut c, "L", "owner"), "tok-1");
    assert_eq!(info_str(&mut c, "L", "mode"), "foreign");
    assert_eq!(int_field(&mut c, "L", "token"), 0);
    let ttl = int_field(&mut c, "L", "ttl-ms");
    assert!((1..=30_000).contains(&ttl), "the TTL as the lease: {ttl}");
    assert_eq!(int_field(&mut c, "L", "waiters"), 0);
    let value: String = redis::cmd("GET").arg("L").query(&mut c).unwrap();
    assert_eq!(value, "tok-1", "the legacy lock is untouched");
    assert_eq!(s.stat("locks"), 0, "a try leaves nothing behind");
    assert_eq!(error_code(&release(&mut c, "L", "a").unwrap_err()), "NOTOWNER");
    assert_eq!(force_release(&mut c, "L").unwrap(), 0, "FORCERELEASE ends FLOCK holders only");
    assert!(exists(&mut c, "L"));
}

#[test]
fn which_keys_count_follows_flock_legacy_locks() {
    let s = Server::start();
    let mut c = s.conn();
    let _: () = redis::cmd("SET").arg("plain").arg("v").query(&mut c).unwrap();
    let _: () = redis::cmd("HSET").arg("hash").arg("f").arg("v").query(&mut c).unwrap();
    assert!(legacy_acquire(&mut c, "ttl", "t", 30_000));
    let wrongtype = |c: &mut Connection, key: &str| error_code(&acquire(c, key, "a", 1000).unwrap_err()) == "WRONGTYPE";
    // ttl (the default): strings with a TTL only.
    assert!(wrongtype(&mut c, "plain") && wrongtype(&mut c, "hash"));
    assert_eq!(acquire(&mut c, "ttl", "a", 1000).unwrap(), None);
    config_set(&mut c, &[("flock.legacy-locks", "all")]);
    assert_eq!(acquire(&mut c, "plain", "a", 1000).unwrap(), None, "any string with all");
    assert!(wrongtype(&mut c, "hash"), "other types never");
    config_set(&mut c, &[("flock.legacy-locks", "no")]);
    assert!(wrongtype(&mut c, "ttl") && wrongtype(&mut c, "plain"));
    assert!(redis::cmd("FLOCK.INFO").arg("ttl").query::<Value>(&mut c).is_err(), "INFO: WRONGTYPE too");
    let bad = try_config_set(&mut c, "flock.legacy-locks", "some").unwrap_err();
    assert!(bad.to_string().contains("legacy-locks"), "{bad}");
    let now: Vec<String> = redis::cmd("CONFIG").arg("GET").arg("flock.legacy-locks").query(&mut c).unwrap();
    assert_eq!(now, ["flock.legacy-locks", "no"], "a bad value changes nothing");
    let loaded = Server::start_with(&["--flock.legacy-locks", "all"]);
    let mut lc = loaded.conn();
    let _: () = redis::cmd("SET").arg("plain").arg("v").query(&mut lc).unwrap();
    assert_eq!(acquire(&mut lc, "plain", "a", 1000).unwrap(), None, "set at load");
}

#[test]
fn waiters_queue_in_fifo_and_the_first_is_granted_when_the_legacy_holder_releases() {
    let s = Server::start();
    let mut c = s.conn();
    assert!(legacy_acquire(&mut c, "L", "tok", 30_000));
    let w1 = waiter(&s, "L", "w1", 10_000);
    wait_queue(&mut c, "L", &["w1"]);
    let w2 = waiter(&s, "L", "w2", 10_000);
    wait_queue(&mut c, "L", &["w1", "w2"]);
    assert_eq!(acquire(&mut c, "L", "try", 10_000).unwrap(), None, "a try never cuts in");
    assert_eq!(legacy_release(&mut c, "L", "tok"), 1);
    let t1 = granted(w1, "w1");
    assert_eq!(owner_of(&mut c, "L").as_deref(), Some("w1"));
    assert_eq!(queue_of(&mut c, "L"), ["w2"]);
    assert!(!legacy_acquire(&mut c, "L", "late", 30_000), "an old client now finds the FLOCK lock busy");
    assert_eq!(release(&mut c, "L", "w1").unwrap(), 0);
    let t2 = granted(w2, "w2");
    assert!(t2 > t1, "tokens rise");
    assert_eq!(release(&mut c, "L", "w2").unwrap(), 0);
    assert!(!exists(&mut c, "L"), "free means gone");
    assert!(legacy_acquire(&mut c, "L", "again", 30_000), "and the old client takes it at once");
}

#[test]
fn a_waiter_is_granted_when_the_legacy_lock_expires_with_no_command_sent() {
    let s = Server::start();
    let mut c = s.conn();
    let set = Instant::now();
    assert!(legacy_acquire(&mut c, "L", "tok", 300));
    let w = waiter(&s, "L", "w", 10_000);
    let token = granted(w, "w");
    assert!(set.elapsed() >= std::time::Duration::from_millis(290), "not before the TTL ended");
    assert_eq!(token_of(&mut c, "L"), token);
}

#[test]
fn a_waiter_on_a_legacy_lock_leaves_on_timeout_cancel_or_disconnect_and_nothing_is_left() {
    let s = Server::start();
    let mut c = s.conn();
    assert!(legacy_acquire(&mut c, "L", "tok", 30_000));
    assert_eq!(acquire_wait(&mut c, "L", "t", 10_000, 50).unwrap(), None, "timed out: nil");
    let w = waiter(&s, "L", "cancelled", 10_000);
    wait_queue(&mut c, "L", &["cancelled"]);
    let n: i64 = redis::cmd("FLOCK.CANCEL").arg("L").arg("cancelled").query(&mut c).unwrap();
    assert_eq!(n, 1);
    assert_eq!(w.join().unwrap().unwrap(), None);
    let mut d = s.conn();
    let id: i64 = redis::cmd("CLIENT").arg("ID").query(&mut d).unwrap();
    let mut pipe = redis::pipe();
    pipe.cmd("FLOCK.ACQUIRE").arg("L").arg("dropped").arg(10_000).arg("WAIT").arg(10_000);
    d.send_packed_command(&pipe.get_packed_pipeline()).unwrap();
    wait_queue(&mut c, "L", &["dropped"]);
    let _: () = redis::cmd("CLIENT").arg("KILL").arg("ID").arg(id).query(&mut c).unwrap();
    wait_until("the disconnected waiter to leave", 5 * SECOND, || s.stat("waiters") == 0);
    assert_eq!(s.stat("locks"), 0, "no shadow left");
    assert_eq!(s.blocked_clients(), 0);
    assert_eq!(legacy_release(&mut c, "L", "tok"), 1);
    assert!(!exists(&mut c, "L"), "nothing was granted to a waiter that left");
}

#[test]
fn a_name_taken_by_another_type_ends_the_waits_with_lockdeleted() {
    let s = Server::start();
    let mut c = s.conn();
    assert!(legacy_acquire(&mut c, "L", "tok", 30_000));
    let w = waiter(&s, "L", "w", 10_000);
    wait_queue(&mut c, "L", &["w"]);
    let _: () = redis::cmd("HSET").arg("H").arg("f").arg("v").query(&mut c).unwrap();
    let _: () = redis::cmd("RENAME").arg("H").arg("L").query(&mut c).unwrap();
    let e = w.join().unwrap().unwrap_err();
    assert_eq!(error_code(&e), "LOCKDELETED", "{e}");
    assert_eq!(s.stat("locks"), 0);
}

#[test]
fn flushdb_answers_the_waiters_of_legacy_locks() {
    let s = Server::start();
    let mut c = s.conn();
    assert!(legacy_acquire(&mut c, "L", "tok", 30_000));
    let w = waiter(&s, "L", "w", 10_000);
    wait_queue(&mut c, "L", &["w"]);
    let _: () = redis::cmd("FLUSHDB").query(&mut c).unwrap();
    assert_eq!(error_code(&w.join().unwrap().unwrap_err()), "LOCKDELETED");
    assert_eq!(s.stat("locks"), 0);
    assert_eq!(acquire(&mut c, "L", "a", 1000).unwrap().map(|t| t > 0), Some(true), "a fresh lock");
}

#[test]
fn a_grant_after_a_legacy_release_reaches_the_replica() {
    let master = Server::start();
    let replica = Server::replica_of(&master);
    let mut c = master.conn();
    assert!(legacy_acquire(&mut c, "L", "tok", 30_000));
    let w = waiter(&master, "L", "w", 10_000);
    wait_queue(&mut c, "L", &["w"]);
    assert_eq!(legacy_release(&mut c, "L", "tok"), 1);
    let token = granted(w, "w");
    let mut rc = replica.conn();
    wait_replica_applied(&mut c, &mut rc);
    assert_eq!(token_of(&mut rc, "L"), token);
    assert_eq!(owner_of(&mut rc, "L").as_deref(), Some("w"));
}

/// Sends `commands` in one packet on a fresh connection: Redis runs them
/// one after the other in the same event-loop turn. Returns the raw replies.
fn one_packet(s: &Server, commands: &[&[&str]]) -> String {
    let url = s.url();
    let addr = url.trim_start_matches("redis://").trim_end_matches('/');
    let mut socket = std::net::TcpStream::connect(addr).unwrap();
    let packet: String = commands.iter().map(|args| resp(args)).collect();
    socket.write_all(packet.as_bytes()).unwrap();
    socket.set_read_timeout(Some(SECOND)).unwrap();
    let mut replies = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + 5 * SECOND;
    while replies.iter().filter(|&&b| b == b'\n').count() < commands.len() && Instant::now() < deadline {
        if let Ok(n) = socket.read(&mut buf) {
            replies.extend_from_slice(&buf[..n]);
        }
    }
    String::from_utf8_lossy(&replies).into_owned()
}

#[test]
fn on_servers_with_post_notification_jobs_the_waiter_is_granted_in_the_command_that_deletes_the_legacy_key() {
    let s = Server::start();
    let mut c = s.conn();
    let (_, major, minor) = server_version(&mut c);
    assert!(legacy_acquire(&mut c, "L", "tok", 30_000));
    let w = waiter(&s, "L", "w", 10_000);
    wait_queue(&mut c, "L", &["w"]);
    // DEL, then an old client's SET NX in the same event-loop turn.
    let replies = one_packet(&s, &[&["DEL", "L"], &["SET", "L", "late", "NX", "PX", "30000"]]);
    if (major, minor) >= (7, 2) {
        assert_eq!(replies, ":1\r\n$-1\r\n", "the SET NX right after found the FLOCK lock");
        assert!(granted(w, "w") > 0);
    } else {
        // Redis 7.0: the grant comes in the next turn, so the old client may win.
        assert!(replies.starts_with(":1\r\n"), "{replies}");
        if replies.ends_with("+OK\r\n") {
            assert_eq!(legacy_release(&mut c, "L", "late"), 1);
        }
        assert!(granted(w, "w") > 0);
    }
    assert_eq!(owner_of(&mut c, "L").as_deref(), Some("w"));
}
