//! Lifecycle rules of the spec against a real server: deleted, renamed,
//! moved, swapped and copied lock keys; waiters that leave by CLIENT UNBLOCK
//! or by their WAIT timeout, also in the same event-loop turn as a hand-off;
//! WAIT inside MULTI, Lua and functions; WRONGTYPE; fencing tokens; and a
//! passed TTL on a lock key that the module itself is first to notice.
use crate::common::*;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// A raw RESP connection: replies are read one by one with a deadline, so a
// test can tell "no reply", "one reply" and "two replies" apart (the redis
// crate skips a late reply after a read timeout). Only for commands whose
// replies are single lines: integers, nil, status and errors.
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
enum Reply {
    Int(i64),
    Nil,
    Status(String),
    Error(String),
}

impl Reply {
    fn token(&self) -> i64 {
        match self {
            Reply::Int(t) => *t,
            other => panic!("expected a token, got {other:?}"),
        }
    }

    fn is_lockdeleted(&self) -> bool {
        matches!(self, Reply::Error(e) if e.starts_with("LOCKDELETED"))
    }
}

struct Raw {
    stream: TcpStream,
    pending: Vec<u8>,
}

fn parse_line(line: &[u8]) -> Reply {
    let text = String::from_utf8_lossy(line).into_owned();
    match line.first() {
        Some(b':') => Reply::Int(text[1..].parse().expect("integer reply")),
        Some(b'+') => Reply::Status(text[1..].to_string()),
        Some(b'-') => Reply::Error(text[1..].to_string()),
        Some(b'_') => Reply::Nil,
        _ if text == "$-1" || text == "*-1" => Reply::Nil,
        _ => panic!("unexpected multi-line reply on a raw connection: {text:?}"),
    }
}

impl Raw {
    fn connect(s: &Server, db: i64) -> Raw {
        let stream = TcpStream::connect(("127.0.0.1", s.port)).expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        let mut raw = Raw { stream, pending: Vec::new() };
        if db != 0 {
            assert_eq!(raw.call(redis::cmd("SELECT").arg(db)), Reply::Status("OK".into()));
        }
        raw
    }

    fn send(&mut self, cmd: &redis::Cmd) {
        self.stream.write_all(&cmd.get_packed_command()).expect("send");
    }

    /// The next reply, or `None` if none arrives within `timeout`.
    fn reply_within(&mut self, timeout: Duration) -> Option<Reply> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(pos) = self.pending.windows(2).position(|w| w == b"\r\n") {
                let line: Vec<u8> = self.pending.drain(..pos + 2).collect();
                return Some(parse_line(&line[..pos]));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            self.stream.set_read_timeout(Some(left)).expect("read timeout");
            let mut buf = [0u8; 4096];
            match self.stream.read(&mut buf) {
                Ok(0) => panic!("server closed the connection"),
                Ok(n) => self.pending.extend_from_slice(&buf[..n]),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(e) => panic!("read: {e}"),
            }
        }
    }

    fn reply(&mut self) -> Reply {
        self.reply_within(10 * SECOND).expect("a reply within 10 s")
    }

    fn call(&mut self, cmd: &redis::Cmd) -> Reply {
        self.send(cmd);
        self.reply()
    }

    fn client_id(&mut self) -> i64 {
        self.call(redis::cmd("CLIENT").arg("ID")).token()
    }

    /// Proves that no reply beyond the ones already read is pending or
    /// arrives later: the next reply on the connection is our PING's.
    fn assert_no_extra_reply(&mut self) {
        assert_eq!(self.call(&redis::cmd("PING")), Reply::Status("PONG".into()), "an extra reply was pending");
    }
}

fn acquire_cmd(key: &str, owner: &str, lease_ms: u64, wait_ms: Option<u64>) -> redis::Cmd {
    let mut cmd = redis::cmd("FLOCK.ACQUIRE");
    cmd.arg(key).arg(owner).arg(lease_ms);
    if let Some(w) = wait_ms {
        cmd.arg("WAIT").arg(w);
    }
    cmd
}

/// A waiter on its own raw connection (in `db`): sends `ACQUIRE ... WAIT`
/// without reading the reply.
fn raw_waiter(s: &Server, db: i64, key: &str, owner: &str, lease_ms: u64, wait_ms: u64) -> Raw {
    let mut raw = Raw::connect(s, db);
    raw.send(&acquire_cmd(key, owner, lease_ms, Some(wait_ms)));
    raw
}

fn key_type(c: &mut Connection, key: &str) -> String {
    redis::cmd("TYPE").arg(key).query(c).expect("TYPE")
}

/// No client is left blocked, neither for Redis nor for the module.
fn wait_no_waiters(s: &Server) {
    wait_until("blocked_clients 0 and flock_waiters 0", 5 * SECOND, || {
        s.blocked_clients() == 0 && s.stat("waiters") == 0
    });
}

/// Waits until `owner`, sent with a short WAIT, is queued on `key`, or has
/// left by its timeout already (`wait_timeouts` above `timeouts`): a loaded
/// machine can stall a poll past a short wait, but not past a counter.
fn wait_queued_or_timed_out(c: &mut Connection, key: &str, owner: &str, timeouts: i64) {
    wait_until(&format!("{owner} queued on {key} or timed out"), 5 * SECOND, || {
        queue_of(c, key).iter().any(|o| o == owner) || flock_stats(c)["wait_timeouts"] > timeouts
    });
}

// ---------------------------------------------------------------------------
// 1. Deleted key
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Deletion {
    Del,
    Unlink,
    FlushDb,
    FlushDbAsync,
    FlushAll,
    FlushAllAsync,
    SetOverwrite,
    PexpireTtl,
}

impl Deletion {
    fn run(self, c: &mut Connection, key: &str) {
        let ok = |r: RedisResult<String>| assert_eq!(r.expect("command").as_str(), "OK");
        match self {
            Deletion::Del => assert_eq!(redis::cmd("DEL").arg(key).query::<i64>(c).unwrap(), 1),
            Deletion::Unlink => assert_eq!(redis::cmd("UNLINK").arg(key).query::<i64>(c).unwrap(), 1),
            Deletion::FlushDb => ok(redis::cmd("FLUSHDB").query(c)),
            Deletion::FlushDbAsync => ok(redis::cmd("FLUSHDB").arg("ASYNC").query(c)),
            Deletion::FlushAll => ok(redis::cmd("FLUSHALL").query(c)),
            Deletion::FlushAllAsync => ok(redis::cmd("FLUSHALL").arg("ASYNC").query(c)),
            Deletion::SetOverwrite => ok(redis::cmd("SET").arg(key).arg("plain").query(c)),
            Deletion::PexpireTtl => assert_eq!(redis::cmd("PEXPIRE").arg(key).arg(50).query::<i64>(c).unwrap(), 1),
        }
    }
}

#[test]
fn deleting_a_lock_key_answers_each_blocked_waiter_lockdeleted() {
    let s = Server::start();
    let mut c = s.conn();
    let cases = [
        Deletion::Del,
        Deletion::Unlink,
        Deletion::FlushDb,
        Deletion::FlushDbAsync,
        Deletion::FlushAll,
        Deletion::FlushAllAsync,
        Deletion::SetOverwrite,
        Deletion::PexpireTtl,
    ];
    for case in cases {
        let key = format!("L:{case:?}");
        let t1 = acquire(&mut c, &key, "a", 60_000).unwrap().expect("granted");
        let mut b = raw_waiter(&s, 0, &key, "b", 60_000, 0);
        wait_queue(&mut c, &key, &["b"]);
        let mut d = raw_waiter(&s, 0, &key, "d", 60_000, 0);
        wait_queue(&mut c, &key, &["b", "d"]);
        let deleted_before = s.stat("waiters_deleted");

        case.run(&mut c, &key);

        for (name, w) in [("b", &mut b), ("d", &mut d)] {
            let reply = w.reply_within(5 * SECOND).unwrap_or_else(|| panic!("{case:?}: waiter {name} got no reply"));
            assert!(reply.is_lockdeleted(), "{case:?}: waiter {name} got {reply:?}, expected LOCKDELETED");
            w.assert_no_extra_reply();
        }
        wait_no_waiters(&s);
        assert_eq!(s.stat("waiters_deleted"), deleted_before + 2, "{case:?}");

        match case {
            Deletion::SetOverwrite => {
                let v: String = c.get(&key).unwrap();
                assert_eq!(v, "plain", "{case:?}");
                c.del::<_, i64>(&key).unwrap();
            }
            _ => assert!(!exists(&mut c, &key), "{case:?}: the key survived"),
        }
        // The old holder lost the lock; the name is free for a new lock.
        let e = release(&mut c, &key, "a").unwrap_err();
        assert_eq!(error_code(&e), "NOTOWNER", "{case:?}");
        let t2 = acquire(&mut c, &key, "e", 60_000).unwrap().expect("a fresh lock is granted at once");
        assert!(t2 > t1, "{case:?}: token {t2} after {t1}");
        assert!(queue_of(&mut c, &key).is_empty());
        assert_eq!(release(&mut c, &key, "e").unwrap(), 0);
        wait_until("no live locks", 5 * SECOND, || s.stat("locks") == 0);
    }
}

#[test]
fn flushdb_leaves_locks_and_waiters_of_other_databases_alone() {
    let s = Server::start();
    let mut c0 = s.conn();
    let mut c1 = s.conn_db(1);
    acquire(&mut c0, "L", "a", 60_000).unwrap().expect("granted");
    acquire(&mut c1, "L", "a1", 60_000).unwrap().expect("granted");
    let mut w0 = raw_waiter(&s, 0, "L", "b", 60_000, 0);
    let mut w1 = raw_waiter(&s, 1, "L", "b1", 60_000, 0);
    wait_queue(&mut c0, "L", &["b"]);
    wait_queue(&mut c1, "L", &["b1"]);

    let _: String = redis::cmd("FLUSHDB").query(&mut c0).unwrap();
    assert!(w0.reply().is_lockdeleted());
    assert_eq!(w1.reply_within(Duration::from_millis(200)), None, "the db 1 waiter must keep waiting");
    assert_eq!(owner_of(&mut c1, "L").as_deref(), Some("a1"));
    assert_eq!(queue_of(&mut c1, "L"), ["b1"]);
    assert_eq!(s.stat("waiters"), 1);

    assert_eq!(release(&mut c1, "L", "a1").unwrap(), 0);
    assert!(w1.reply().token() > 0);
    assert_eq!(owner_of(&mut c1, "L").as_deref(), Some("b1"));
    wait_no_waiters(&s);
}

// ---------------------------------------------------------------------------
// 2. RENAME and MOVE
// ---------------------------------------------------------------------------

#[test]
fn rename_carries_owner_holds_token_and_lease_and_ends_old_waiters() {
    let s = Server::start();
    let mut c = s.conn();
    let lease = Duration::from_millis(1500);
    let token = acquire(&mut c, "L", "a", 60_000).unwrap().expect("granted");
    assert_eq!(acquire(&mut c, "L", "a", 60_000).unwrap(), Some(token), "reentrant");
    let mut b = raw_waiter(&s, 0, "L", "b", 10_000, 0);
    wait_queue(&mut c, "L", &["b"]);
    let mut d = raw_waiter(&s, 0, "L", "d", 10_000, 0);
    wait_queue(&mut c, "L", &["b", "d"]);
    let expiries = s.stat("lease_expiries");

    // Held long while the waiters queue (slow on a loaded machine): the
    // lease is cut short in the packet that renames the key.
    let t0 = Instant::now();
    let (renewed, _): (i64, String) = renew_to("L", "a", 1500).cmd("RENAME").arg("L").arg("L2").query(&mut c).unwrap();
    assert_eq!(renewed, token);

    for w in [&mut b, &mut d] {
        let reply = w.reply();
        assert!(reply.is_lockdeleted(), "waiter under the old name got {reply:?}");
        w.assert_no_extra_reply();
    }
    wait_no_waiters(&s);
    assert!(!exists(&mut c, "L"));
    assert_eq!(key_type(&mut c, "L2"), "flocklock");
    assert_eq!(owner_of(&mut c, "L2").as_deref(), Some("a"));
    assert_eq!(int_field(&mut c, "L2", "holds"), 2);
    assert_eq!(int_field(&mut c, "L2", "token"), token);
    let ttl = int_field(&mut c, "L2", "ttl-ms");
    assert!(ttl > 0 && ttl <= 1500, "ttl-ms {ttl}");
    assert_eq!(int_field(&mut c, "L2", "waiters"), 0);

    // Nobody touches L2 from here: the lease timer must follow the key.
    wait_gone(&mut c, "L2", t0 + lease, lease + 3 * SECOND);
    assert_eq!(s.stat("lease_expiries"), expiries + 1);
    let e = release(&mut c, "L2", "a").unwrap_err();
    assert_eq!(error_code(&e), "NOTOWNER");
    assert_eq!(s.stat("locks"), 0);
}

#[test]
fn renamed_lock_still_hands_off_to_new_waiters_at_its_new_name() {
    let s = Server::start();
    let mut c = s.conn();
    let t1 = acquire(&mut c, "L", "a", 60_000).unwrap().unwrap();
    let _: String = redis::cmd("RENAME").arg("L").arg("L2").query(&mut c).unwrap();
    let mut b = raw_waiter(&s, 0, "L2", "b", 60_000, 0);
    wait_queue(&mut c, "L2", &["b"]);
    assert_eq!(release(&mut c, "L2", "a").unwrap(), 0);
    assert!(b.reply().token() > t1);
    assert_eq!(owner_of(&mut c, "L2").as_deref(), Some("b"));
}

#[test]
fn rename_over_another_lock_ends_the_destination_lock_and_its_waiters() {
    let s = Server::start();
    let mut c = s.conn();
    let src = acquire(&mut c, "S", "a", 60_000).unwrap().unwrap();
    acquire(&mut c, "D", "x", 60_000).unwrap().unwrap();
    let mut w = raw_waiter(&s, 0, "D", "y", 60_000, 0);
    wait_queue(&mut c, "D", &["y"]);
    let _: String = redis::cmd("RENAME").arg("S").arg("D").query(&mut c).unwrap();
    assert!(w.reply().is_lockdeleted());
    wait_no_waiters(&s);
    assert_eq!(owner_of(&mut c, "D").as_deref(), Some("a"));
    assert_eq!(int_field(&mut c, "D", "token"), src);
    assert_eq!(error_code(&release(&mut c, "D", "x").unwrap_err()), "NOTOWNER");
    assert_eq!(s.stat("locks"), 1);
}

#[test]
fn move_carries_the_lock_and_its_lease_to_the_other_database() {
    let s = Server::start();
    let mut c0 = s.conn();
    let mut c1 = s.conn_db(1);
    let lease = Duration::from_millis(1500);
    let token = acquire(&mut c0, "L", "a", 60_000).unwrap().expect("granted");
    acquire(&mut c0, "L", "a", 60_000).unwrap();
    let mut b = raw_waiter(&s, 0, "L", "b", 10_000, 0);
    wait_queue(&mut c0, "L", &["b"]);
    let expiries = s.stat("lease_expiries");

    // Held long while the waiter queues: the lease is cut short in the
    // packet that moves the key.
    let t0 = Instant::now();
    let (renewed, moved): (i64, i64) = renew_to("L", "a", 1500).cmd("MOVE").arg("L").arg(1).query(&mut c0).unwrap();
    assert_eq!((renewed, moved), (token, 1));

    let reply = b.reply();
    assert!(reply.is_lockdeleted(), "waiter in db 0 got {reply:?}");
    b.assert_no_extra_reply();
    wait_no_waiters(&s);
    assert!(!exists(&mut c0, "L"));
    assert_eq!(key_type(&mut c1, "L"), "flocklock");
    assert_eq!(owner_of(&mut c1, "L").as_deref(), Some("a"));
    assert_eq!(int_field(&mut c1, "L", "holds"), 2);
    assert_eq!(int_field(&mut c1, "L", "token"), token);
    let ttl = int_field(&mut c1, "L", "ttl-ms");
    assert!(ttl > 0 && ttl <= 1500, "ttl-ms {ttl}");

    wait_gone(&mut c1, "L", t0 + lease, lease + 3 * SECOND);
    assert_eq!(s.stat("lease_expiries"), expiries + 1);
    assert!(!exists(&mut c0, "L"));
    assert_eq!(error_code(&release(&mut c1, "L", "a").unwrap_err()), "NOTOWNER");
}

#[test]
fn moved_lock_is_released_and_handed_off_in_its_new_database() {
    let s = Server::start();
    let mut c0 = s.conn();
    let mut c1 = s.conn_db(1);
    let t1 = acquire(&mut c0, "L", "a", 60_000).unwrap().unwrap();
    assert_eq!(redis::cmd("MOVE").arg("L").arg(1).query::<i64>(&mut c0).unwrap(), 1);
    let mut b = raw_waiter(&s, 1, "L", "b", 60_000, 0);
    wait_queue(&mut c1, "L", &["b"]);
    assert_eq!(release(&mut c1, "L", "a").unwrap(), 0);
    assert!(b.reply().token() > t1);
    assert_eq!(owner_of(&mut c1, "L").as_deref(), Some("b"));
    assert_eq!(release(&mut c1, "L", "b").unwrap(), 0);
    assert!(!exists(&mut c1, "L"));
}

#[test]
fn renamed_and_moved_session_locks_stay_bound_to_their_connection() {
    let s = Server::start();
    let mut c0 = s.conn();
    let mut c1 = s.conn_db(1);
    let mut holder = s.conn();
    let session = |c: &mut Connection, key: &str| -> i64 {
        redis::cmd("FLOCK.ACQUIRE")
            .arg(key)
            .arg("a")
            .arg(60_000)
            .arg("SESSION")
            .query::<Option<i64>>(c)
            .unwrap()
            .expect("granted")
    };
    session(&mut holder, "L");
    session(&mut holder, "M");
    let _: String = redis::cmd("RENAME").arg("L").arg("L2").query(&mut c0).unwrap();
    assert_eq!(redis::cmd("MOVE").arg("M").arg(1).query::<i64>(&mut c0).unwrap(), 1);
    assert_eq!(int_field(&mut c0, "L2", "session"), 1);
    assert_eq!(int_field(&mut c1, "M", "session"), 1);
    let mut w = raw_waiter(&s, 0, "L2", "w", 60_000, 0);
    wait_queue(&mut c0, "L2", &["w"]);
    let releases = s.stat("session_releases");

    drop(holder);

    let tw = w.reply_within(5 * SECOND).expect("the session release hands L2 to the waiter").token();
    assert!(tw > 0);
    assert_eq!(owner_of(&mut c0, "L2").as_deref(), Some("w"));
    wait_until("M released in db 1", 5 * SECOND, || !exists(&mut c1, "M"));
    assert_eq!(s.stat("session_releases"), releases + 2);
}

// ---------------------------------------------------------------------------
// 3. SWAPDB
// ---------------------------------------------------------------------------

#[test]
fn swapdb_strands_no_waiter_and_swapped_leases_still_expire() {
    let s = Server::start();
    let mut c0 = s.conn();
    let mut c1 = s.conn_db(1);
    let t1 = acquire(&mut c0, "L", "a", 60_000).unwrap().expect("granted");
    let mut b = raw_waiter(&s, 0, "L", "b", 800, 0);
    wait_queue(&mut c0, "L", &["b"]);
    // A second lock whose lease timer was armed before the swap: held long
    // until then, its lease cut to 700 ms in the packet that swaps.
    acquire(&mut c0, "M", "m", 60_000).unwrap().expect("granted");
    let expiries = s.stat("lease_expiries");
    // w's 300 ms WAIT must outlast only its queueing being seen: everything
    // slow (connecting, the other lock) is done before it is sent.
    let timeouts = flock_stats(&mut c0)["wait_timeouts"];
    let mut w = raw_waiter(&s, 0, "L", "w", 800, 300);
    wait_queued_or_timed_out(&mut c0, "L", "w", timeouts);

    let t_m = Instant::now();
    let _: (i64, String) = renew_to("M", "m", 700).cmd("SWAPDB").arg(0).arg(1).query(&mut c0).unwrap();

    assert!(!exists(&mut c0, "L"));
    assert_eq!(owner_of(&mut c1, "L").as_deref(), Some("a"));
    // The WAIT 300 waiter times out in the swapped database and leaves it.
    assert_eq!(w.reply(), Reply::Nil);
    w.assert_no_extra_reply();
    wait_queue(&mut c1, "L", &["b"]);

    // Releasing in db 1 grants the waiter that queued in db 0.
    assert_eq!(release(&mut c1, "L", "a").unwrap(), 0);
    let tb = b.reply_within(5 * SECOND).expect("the waiter queued before SWAPDB is granted").token();
    assert!(tb > t1);
    b.assert_no_extra_reply();
    assert_eq!(owner_of(&mut c1, "L").as_deref(), Some("b"));
    wait_no_waiters(&s);

    // Both leases end in db 1 without any command on the keys.
    wait_gone(&mut c1, "M", t_m + Duration::from_millis(700), 4 * SECOND);
    wait_until("L removed by b's lease", 4 * SECOND, || !exists(&mut c1, "L"));
    assert_eq!(s.stat("lease_expiries"), expiries + 2);
    assert!(!exists(&mut c0, "L") && !exists(&mut c0, "M"));
    assert_eq!(s.stat("locks"), 0);
}

// ---------------------------------------------------------------------------
// 4. COPY
// ---------------------------------------------------------------------------

#[test]
fn copy_of_a_lock_key_is_refused_and_changes_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    let mut c1 = s.conn_db(1);
    let token = acquire(&mut c, "L", "a", 60_000).unwrap().unwrap();
    let _: String = c.set("K", "keep").unwrap();
    let before = info_still(&mut c, "L").unwrap();

    let attempts: [&[&str]; 3] = [&["L", "L2"], &["L", "K", "REPLACE"], &["L", "L", "DB", "1"]];
    for args in attempts {
        let r: RedisResult<Value> = redis::cmd("COPY").arg(args).query(&mut c);
        assert!(r.is_err(), "COPY {args:?} answered {r:?}");
    }
    assert!(!exists(&mut c, "L2"));
    let k: String = c.get("K").unwrap();
    assert_eq!(k, "keep");
    assert!(!exists(&mut c1, "L"));
    assert_eq!(info_still(&mut c, "L").unwrap(), before);
    assert_eq!(int_field(&mut c, "L", "token"), token);
    assert_eq!(s.stat("locks"), 1);
}

// ---------------------------------------------------------------------------
// 5. CLIENT UNBLOCK, 6. WAIT timeout
// ---------------------------------------------------------------------------

#[test]
fn client_unblock_answers_the_waiter_nil_and_the_others_keep_their_order() {
    let s = Server::start();
    let mut c = s.conn();
    let t1 = acquire(&mut c, "L", "a", 60_000).unwrap().unwrap();
    let mut b = raw_waiter(&s, 0, "L", "b", 60_000, 0);
    wait_queue(&mut c, "L", &["b"]);
    let mut w = Raw::connect(&s, 0);
    let w_id = w.client_id();
    w.send(&acquire_cmd("L", "w", 60_000, Some(0)));
    wait_queue(&mut c, "L", &["b", "w"]);
    let mut d = raw_waiter(&s, 0, "L", "d", 60_000, 0);
    wait_queue(&mut c, "L", &["b", "w", "d"]);

    let n: i64 = redis::cmd("CLIENT").arg("UNBLOCK").arg(w_id).query(&mut c).unwrap();
    assert_eq!(n, 1);
    assert_eq!(w.reply(), Reply::Nil);
    w.assert_no_extra_reply();
    wait_queue(&mut c, "L", &["b", "d"]);
    assert_eq!(s.blocked_clients(), 2);
    assert_eq!(s.stat("waiters"), 2);

    assert_eq!(release(&mut c, "L", "a").unwrap(), 0);
    let tb = b.reply().token();
    assert!(tb > t1);
    assert_eq!(owner_of(&mut c, "L").as_deref(), Some("b"));
    assert_eq!(queue_of(&mut c, "L"), ["d"]);
    let mut cb = s.conn();
    assert_eq!(release(&mut cb, "L", "b").unwrap(), 0);
    assert!(d.reply().token() > tb);
    assert_eq!(owner_of(&mut c, "L").as_deref(), Some("d"));
    wait_no_waiters(&s);
}

#[test]
fn client_unblock_error_answers_the_error_and_removes_the_waiter() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "L", "a", 60_000).unwrap().unwrap();
    let mut w = Raw::connect(&s, 0);
    let w_id = w.client_id();
    w.send(&acquire_cmd("L", "w", 60_000, Some(0)));
    wait_queue(&mut c, "L", &["w"]);
    let mut d = raw_waiter(&s, 0, "L", "d", 60_000, 0);
    wait_queue(&mut c, "L", &["w", "d"]);

    let n: i64 = redis::cmd("CLIENT").arg("UNBLOCK").arg(w_id).arg("ERROR").query(&mut c).unwrap();
    assert_eq!(n, 1);
    let reply = w.reply();
    assert!(matches!(&reply, Reply::Error(e) if e.starts_with("UNBLOCKED")), "got {reply:?}");
    w.assert_no_extra_reply();
    wait_queue(&mut c, "L", &["d"]);
    assert_eq!(release(&mut c, "L", "a").unwrap(), 0);
    assert!(d.reply().token() > 0);
    wait_no_waiters(&s);
}

#[test]
fn wait_timeout_answers_nil_and_the_others_keep_their_order() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "L", "a", 60_000).unwrap().unwrap();
    let timeouts = s.stat("wait_timeouts");
    let mut b = raw_waiter(&s, 0, "L", "b", 60_000, 0);
    wait_queue(&mut c, "L", &["b"]);
    // d is connected before w's 100 ms begin, to queue behind w right after.
    let mut d = Raw::connect(&s, 0);
    let started = Instant::now();
    let mut w = raw_waiter(&s, 0, "L", "w", 60_000, 100);
    wait_queued_or_timed_out(&mut c, "L", "w", timeouts);
    d.send(&acquire_cmd("L", "d", 60_000, Some(0)));

    assert_eq!(w.reply(), Reply::Nil);
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(95), "nil after {waited:?}, before the 100 ms timeout");
    w.assert_no_extra_reply();
    wait_queue(&mut c, "L", &["b", "d"]);
    assert_eq!(s.stat("wait_timeouts"), timeouts + 1);
    assert_eq!(s.stat("waiters"), 2);

    assert_eq!(release(&mut c, "L", "a").unwrap(), 0);
    let tb = b.reply().token();
    assert_eq!(queue_of(&mut c, "L"), ["d"]);
    assert_eq!(release(&mut c, "L", "b").unwrap(), 0);
    assert!(d.reply().token() > tb);
    assert_eq!(owner_of(&mut c, "L").as_deref(), Some("d"));
    wait_no_waiters(&s);
    assert_server_healthy(&s);
}

// ---------------------------------------------------------------------------
// 7. Exactly one reply when a hand-off meets a timeout or an unblock in the
//    same event-loop turn (the Redis 7.0 race from the field notes).
// ---------------------------------------------------------------------------

#[test]
fn release_after_debug_sleep_past_the_wait_timeout_gives_the_waiter_one_reply() {
    let s = Server::start();
    let mut holder = s.conn();
    let mut c = s.conn();
    let t1 = acquire(&mut holder, "L", "a", 60_000).unwrap().unwrap();
    let timeouts = flock_stats(&mut c)["wait_timeouts"];
    let sent = Instant::now();
    let mut w = raw_waiter(&s, 0, "L", "w", 60_000, 100);
    // Gone already (a slow machine) is the nil case below.
    wait_queued_or_timed_out(&mut c, "L", "w", timeouts);
    // One packet: the server sleeps past w's 100 ms timeout, then releases
    // in the same turn, before any timer can run.
    let margin = sent.elapsed();
    let (sleep, left): (String, i64) = redis::pipe()
        .cmd("DEBUG")
        .arg("SLEEP")
        .arg("0.3")
        .cmd("FLOCK.RELEASE")
        .arg("L")
        .arg("a")
        .query(&mut holder)
        .unwrap();
    assert_eq!((sleep.as_str(), left), ("OK", 0));

    let reply = w.reply_within(5 * SECOND).expect("the waiter must get a reply");
    w.assert_no_extra_reply();
    eprintln!("waiter reply after DEBUG SLEEP + RELEASE: {reply:?} (pipeline sent {margin:?} after the waiter)");
    match reply {
        Reply::Int(token) => {
            assert!(token > t1);
            assert_eq!(owner_of(&mut c, "L").as_deref(), Some("w"));
            assert_eq!(int_field(&mut c, "L", "token"), token);
            let mut cw = s.conn();
            assert_eq!(release(&mut cw, "L", "w").unwrap(), 0);
        }
        Reply::Nil => {
            // Only possible if the timer fired before the packet arrived.
            assert!(margin >= Duration::from_millis(80), "nil although RELEASE ran before the timeout could fire");
            assert!(!exists(&mut c, "L"), "nobody may hold the lock");
        }
        other => panic!("unexpected reply {other:?}"),
    }
    wait_no_waiters(&s);
    assert!(!exists(&mut c, "L"));
}

/// RELEASE grants `w`, then CLIENT UNBLOCK for `w` runs in the same turn.
/// Returns (w's reply if any within 2 s, the second waiter's raw connection).
fn release_then_unblock_in_one_packet(s: &Server) -> (Option<Reply>, Raw, Raw, i64) {
    let mut holder = s.conn();
    let mut c = s.conn();
    let t1 = acquire(&mut holder, "L", "a", 60_000).unwrap().unwrap();
    let mut w = Raw::connect(s, 0);
    let w_id = w.client_id();
    w.send(&acquire_cmd("L", "w", 60_000, Some(0)));
    wait_queue(&mut c, "L", &["w"]);
    let next = raw_waiter(s, 0, "L", "n", 60_000, 0);
    wait_queue(&mut c, "L", &["w", "n"]);

    let (left, unblocked): (i64, i64) = redis::pipe()
        .cmd("FLOCK.RELEASE")
        .arg("L")
        .arg("a")
        .cmd("CLIENT")
        .arg("UNBLOCK")
        .arg(w_id)
        .query(&mut holder)
        .unwrap();
    assert_eq!(left, 0);
    eprintln!("CLIENT UNBLOCK right after the grant answered {unblocked}");
    let reply = w.reply_within(2 * SECOND);
    eprintln!("waiter reply after RELEASE + CLIENT UNBLOCK: {reply:?}");
    (reply, w, next, t1)
}

#[test]
fn release_and_client_unblock_in_one_packet_never_strand_the_lock() {
    let s = Server::start();
    let mut c = s.conn();
    let (reply, mut w, mut next, t1) = release_then_unblock_in_one_packet(&s);
    match reply {
        Some(Reply::Int(token)) => {
            // w got the grant: it is the owner and n still waits.
            assert!(token > t1);
            w.assert_no_extra_reply();
            assert_eq!(owner_of(&mut c, "L").as_deref(), Some("w"));
            assert_eq!(queue_of(&mut c, "L"), ["n"]);
            assert_eq!(release(&mut c, "L", "w").unwrap(), 0);
            let tn = next.reply_within(2 * SECOND).expect("the next waiter must be granted").token();
            assert!(tn > token);
            assert_eq!(release(&mut c, "L", "n").unwrap(), 0);
        }
        _ => {
            // w got nil or nothing: the lock must not stay with w; it passes
            // on to the next waiter at once.
            if reply.is_none() {
                // The grant's reply is lost, not late: w's connection is
                // usable again and nothing else arrives on it.
                w.assert_no_extra_reply();
                assert_eq!(s.stat("undelivered_grants"), 1);
            }
            let tn = next.reply_within(2 * SECOND).expect("the next waiter must be granted").token();
            assert!(tn > t1);
            next.assert_no_extra_reply();
            assert_eq!(owner_of(&mut c, "L").as_deref(), Some("n"));
            assert_eq!(int_field(&mut c, "L", "token"), tn);
            let mut cn = s.conn();
            assert_eq!(release(&mut cn, "L", "n").unwrap(), 0);
            assert!(!exists(&mut c, "L"));
        }
    }
    wait_no_waiters(&s);
}

/// Redis 7.0 alone would give the waiter no reply here (CLIENT UNBLOCK of a
/// handle the module already unblocked skips both callbacks); the module's
/// command filter makes the grant win and CLIENT UNBLOCK answer 0.
#[test]
fn release_and_client_unblock_in_one_packet_answer_the_waiter_exactly_once() {
    let s = Server::start();
    let (reply, mut w, _next, _) = release_then_unblock_in_one_packet(&s);
    let reply = reply.expect("the unblocked waiter must get a reply (token or nil)");
    assert!(matches!(reply, Reply::Int(_) | Reply::Nil), "got {reply:?}");
    w.assert_no_extra_reply();
}

// ---------------------------------------------------------------------------
// 8. WAIT where blocking is not allowed
// ---------------------------------------------------------------------------

#[test]
fn wait_inside_multi_eval_and_fcall_acts_as_a_try_and_queues_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    let token = acquire(&mut c, "L", "a", 60_000).unwrap().unwrap();
    let lib = "#!lua name=t\n\
               redis.register_function('try_wait', function(keys, args) \
                 return redis.call('FLOCK.ACQUIRE', keys[1], args[1], 1000, 'WAIT', args[2]) end)";
    let _: String = redis::cmd("FUNCTION").arg("LOAD").arg(lib).query(&mut c).unwrap();
    let script = "return redis.call('FLOCK.ACQUIRE', KEYS[1], ARGV[1], 1000, 'WAIT', ARGV[2])";

    for wait in [0u64, 5000] {
        let started = Instant::now();
        let (r,): (Option<i64>,) = redis::pipe()
            .atomic()
            .cmd("FLOCK.ACQUIRE")
            .arg("L")
            .arg("m")
            .arg(1000)
            .arg("WAIT")
            .arg(wait)
            .query(&mut c)
            .unwrap();
        assert_eq!(r, None, "MULTI WAIT {wait}");
        let r: Option<i64> = redis::cmd("EVAL").arg(script).arg(1).arg("L").arg("e").arg(wait).query(&mut c).unwrap();
        assert_eq!(r, None, "EVAL WAIT {wait}");
        let r: Option<i64> =
            redis::cmd("FCALL").arg("try_wait").arg(1).arg("L").arg("f").arg(wait).query(&mut c).unwrap();
        assert_eq!(r, None, "FCALL WAIT {wait}");
        assert!(started.elapsed() < SECOND, "took {:?}: something blocked", started.elapsed());
        assert!(queue_of(&mut c, "L").is_empty());
        assert_eq!(s.stat("waiters"), 0);
        assert_eq!(s.blocked_clients(), 0);
    }
    assert_eq!(owner_of(&mut c, "L").as_deref(), Some("a"));
    assert_eq!(int_field(&mut c, "L", "token"), token);

    // Where nothing is held, the same calls are granted at once.
    assert_eq!(release(&mut c, "L", "a").unwrap(), 0);
    let r: Option<i64> = redis::cmd("FCALL").arg("try_wait").arg(1).arg("L").arg("f").arg(0).query(&mut c).unwrap();
    assert!(r.is_some(), "granted");
    assert_eq!(owner_of(&mut c, "L").as_deref(), Some("f"));
    // Through Lua a token is a double, rounded to a multiple of 256 (docs/commands.md,
    // "Fencing tokens"): a grant in the same millisecond, token + 1, comes back equal.
    // The exact token is FLOCK.INFO's.
    assert!(int_field(&mut c, "L", "token") > token);
}

// ---------------------------------------------------------------------------
// 9. WRONGTYPE
// ---------------------------------------------------------------------------

#[test]
fn flock_commands_on_other_types_and_other_commands_on_locks_answer_wrongtype() {
    let s = Server::start();
    let mut c = s.conn();
    let _: String = c.set("S", "v").unwrap();
    let attempts: Vec<redis::Cmd> = vec![
        acquire_cmd("S", "a", 1000, None),
        acquire_cmd("S", "a", 1000, Some(0)),
        redis::cmd("FLOCK.RELEASE").arg("S").arg("a").clone(),
        redis::cmd("FLOCK.RENEW").arg("S").arg("a").arg(1000).clone(),
        redis::cmd("FLOCK.FORCERELEASE").arg("S").clone(),
        redis::cmd("FLOCK.INFO").arg("S").clone(),
    ];
    for cmd in &attempts {
        let r: RedisResult<Value> = cmd.query(&mut c);
        let e = r.expect_err("a FLOCK command on a string key must fail");
        assert_eq!(error_code(&e), "WRONGTYPE", "{e}");
    }
    let v: String = c.get("S").unwrap();
    assert_eq!(v, "v");
    assert_eq!(key_type(&mut c, "S"), "string");
    assert_eq!(redis::cmd("PTTL").arg("S").query::<i64>(&mut c).unwrap(), -1);
    assert_eq!(s.stat("locks"), 0);
    assert_eq!(s.blocked_clients(), 0);

    let token = acquire(&mut c, "L", "a", 60_000).unwrap().unwrap();
    let attempts: Vec<redis::Cmd> = vec![
        redis::cmd("GET").arg("L").clone(),
        redis::cmd("LPUSH").arg("L").arg("x").clone(),
        redis::cmd("APPEND").arg("L").arg("x").clone(),
    ];
    for cmd in &attempts {
        let r: RedisResult<Value> = cmd.query(&mut c);
        let e = r.expect_err("another type's command on a lock key must fail");
        assert_eq!(error_code(&e), "WRONGTYPE", "{e}");
    }
    assert_eq!(key_type(&mut c, "L"), "flocklock");
    assert_eq!(owner_of(&mut c, "L").as_deref(), Some("a"));
    assert_eq!(int_field(&mut c, "L", "token"), token);
    assert_eq!(int_field(&mut c, "L", "holds"), 1);
}

// ---------------------------------------------------------------------------
// 10. Fencing tokens
// ---------------------------------------------------------------------------

#[test]
fn fencing_tokens_strictly_increase_across_release_deletion_and_recreation() {
    let s = Server::start();
    let mut c = s.conn();
    let mut seen = Vec::new();

    let t = acquire(&mut c, "L", "a", 60_000).unwrap().unwrap();
    seen.push(t);
    assert_eq!(acquire(&mut c, "L", "a", 60_000).unwrap(), Some(t), "reentrant acquire keeps the token");
    assert_eq!(renew(&mut c, "L", "a", 60_000).unwrap(), t, "RENEW keeps the token");
    assert_eq!(release(&mut c, "L", "a").unwrap(), 1);
    assert_eq!(release(&mut c, "L", "a").unwrap(), 0);
    assert!(!exists(&mut c, "L"));

    // Re-created after release.
    seen.push(acquire(&mut c, "L", "b", 60_000).unwrap().unwrap());
    // Deleted while held, then re-created.
    let _: i64 = c.del("L").unwrap();
    seen.push(acquire(&mut c, "L", "c", 60_000).unwrap().unwrap());
    // Hand-off to a waiter.
    let mut w = raw_waiter(&s, 0, "L", "w", 60_000, 0);
    wait_queue(&mut c, "L", &["w"]);
    assert_eq!(release(&mut c, "L", "c").unwrap(), 0);
    seen.push(w.reply().token());
    // Forced release, then a new holder.
    assert_eq!(force_release(&mut c, "L").unwrap(), 1);
    seen.push(acquire(&mut c, "L", "d", 60_000).unwrap().unwrap());
    // UNLINK, then FLUSHALL, each followed by re-creation.
    let _: i64 = redis::cmd("UNLINK").arg("L").query(&mut c).unwrap();
    seen.push(acquire(&mut c, "L", "e", 60_000).unwrap().unwrap());
    let _: String = redis::cmd("FLUSHALL").query(&mut c).unwrap();
    seen.push(acquire(&mut c, "L", "f", 60_000).unwrap().unwrap());
    // Lease expiry, then re-creation.
    let _: i64 = c.del("L").unwrap();
    let expiries = s.stat("lease_expiries");
    seen.push(acquire(&mut c, "L", "g", 50).unwrap().unwrap());
    wait_until("g's lease ends", 5 * SECOND, || s.stat("lease_expiries") == expiries + 1);
    seen.push(acquire(&mut c, "L", "h", 60_000).unwrap().unwrap());

    assert!(seen.iter().all(|&t| t > 0));
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "tokens not strictly increasing: {seen:?}");
}

// ---------------------------------------------------------------------------
// 1 (continued). A TTL on a lock key that has passed but that Redis has not
// yet expired (active expiry is slow and sampled; `DEBUG SET-ACTIVE-EXPIRE 0`
// makes that window deterministic) is noticed lazily, by whatever opens the
// key next. When that is the module itself, from a waiter's WAIT timer, a
// CLIENT UNBLOCK, a disconnect or the lease timer, the lock must still end
// with exactly one reply per waiter and the server must stay healthy.
// ---------------------------------------------------------------------------

/// Many fresh connections with pipelined commands, then a lock round trip:
/// heap corruption from a double free tends to surface here.
fn assert_server_healthy(s: &Server) {
    for i in 0..30 {
        let mut r = Raw::connect(s, 0);
        let mut packet = Vec::new();
        packet.extend(redis::cmd("CLIENT").arg("SETINFO").arg("LIB-NAME").arg("probe").get_packed_command());
        packet.extend(redis::cmd("PING").get_packed_command());
        packet.extend(redis::cmd("INCR").arg("health").get_packed_command());
        r.stream.write_all(&packet).expect("send");
        let replies: Vec<Option<Reply>> = (0..3).map(|_| r.reply_within(5 * SECOND)).collect();
        assert!(replies.iter().all(Option::is_some), "round {i}: server stopped answering (crashed?): {replies:?}");
        assert_eq!(replies[1], Some(Reply::Status("PONG".into())), "round {i}");
        assert_eq!(replies[2], Some(Reply::Int(i + 1)), "round {i}");
    }
    let mut c = s.conn();
    let t = acquire(&mut c, "health-lock", "h", 60_000).unwrap().expect("granted");
    assert!(t > 0);
    assert_eq!(release(&mut c, "health-lock", "h").unwrap(), 0);
}

fn server_clock_us(c: &mut Connection) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(c).expect("TIME");
    secs * 1_000_000 + micros
}

/// Waits until the server's clock (TIME) has advanced by `by`.
fn wait_server_clock(c: &mut Connection, by: Duration) {
    let start = server_clock_us(c);
    wait_until("the server clock to advance", 5 * SECOND, || server_clock_us(c) >= start + by.as_micros() as i64);
}

/// Waiters that left the queue, each way counted once.
fn waiters_left(s: &Server) -> i64 {
    let st = s.stats();
    st["waiters_deleted"] + st["wait_timeouts"] + st["wait_disconnects"] + st["waiters_demoted"]
}

/// `a` holds `L` (lease `lease_ms`); active expiry is off; `waiters` queue
/// in order; then `PEXPIRE L ttl_ms`. Nothing touches L afterwards.
fn lock_with_passed_ttl(
    s: &Server,
    c: &mut Connection,
    lease_ms: u64,
    waiters: &[(&str, u64)],
    ttl_ms: u64,
) -> Vec<(Raw, i64)> {
    let _: String = redis::cmd("DEBUG").arg("SET-ACTIVE-EXPIRE").arg(0).query(c).unwrap();
    // Held long while the waiters queue, and each connected before the
    // first is sent: a short lease or WAIT must outlast only the queueing
    // and the PEXPIRE, not connections made on a loaded machine. The lease
    // is cut to `lease_ms` in the packet that sets the TTL.
    acquire(c, "L", "a", 60_000).unwrap().expect("granted");
    let mut out: Vec<(Raw, i64)> = waiters
        .iter()
        .map(|_| {
            let mut w = Raw::connect(s, 0);
            let id = w.client_id();
            (w, id)
        })
        .collect();
    let mut names = Vec::new();
    for (&(owner, wait_ms), (w, _)) in waiters.iter().zip(out.iter_mut()) {
        w.send(&acquire_cmd("L", owner, 60_000, Some(wait_ms)));
        names.push(owner);
        wait_queue(c, "L", &names);
    }
    let (_, set): (i64, i64) = renew_to("L", "a", lease_ms).cmd("PEXPIRE").arg("L").arg(ttl_ms).query(c).unwrap();
    assert_eq!(set, 1);
    out
}

/// Every waiter of the expired lock `L` got exactly one reply: LOCKDELETED,
/// or nil for the one (index 1) that left by itself in the same moment; each
/// left the queue once, and the server is fine.
fn assert_each_answered_once(s: &Server, c: &mut Connection, ws: &mut [(Raw, i64)], left: i64) {
    for (i, (w, _)) in ws.iter_mut().enumerate() {
        let reply = w.reply_within(5 * SECOND).unwrap_or_else(|| panic!("waiter {i} got no reply"));
        if i == 1 {
            assert!(reply.is_lockdeleted() || reply == Reply::Nil, "the leaving waiter got {reply:?}");
        } else {
            assert!(reply.is_lockdeleted(), "waiter {i} got {reply:?}");
        }
        w.assert_no_extra_reply();
    }
    wait_no_waiters(s);
    let n = ws.len() as i64;
    assert_eq!(waiters_left(s), left + n, "each waiter must leave the queue exactly once (INFO flock counters)");
    assert!(!exists(c, "L"));
    assert_server_healthy(s);
}

#[test]
fn ttl_expiry_noticed_by_a_waiters_wait_timeout_answers_each_waiter_once() {
    let s = Server::start();
    let mut c = s.conn();
    let left = waiters_left(&s);
    let mut ws = lock_with_passed_ttl(&s, &mut c, 60_000, &[("b", 0), ("w", 1000), ("d", 0)], 50);
    // w's WAIT timer (1 s) fires long after the TTL (50 ms) passed.
    assert_each_answered_once(&s, &mut c, &mut ws, left);
}

#[test]
fn ttl_expiry_noticed_by_client_unblock_answers_each_waiter_once() {
    let s = Server::start();
    let mut c = s.conn();
    let left = waiters_left(&s);
    let mut ws = lock_with_passed_ttl(&s, &mut c, 60_000, &[("b", 0), ("w", 0)], 1);
    // L must not be touched (that would expire it the ordinary way): watch
    // the server's own clock pass the 1 ms TTL instead.
    wait_server_clock(&mut c, Duration::from_millis(20));
    let w_id = ws[1].1;
    let n: i64 = redis::cmd("CLIENT").arg("UNBLOCK").arg(w_id).query(&mut c).unwrap();
    assert_eq!(n, 1);
    assert_each_answered_once(&s, &mut c, &mut ws, left);
}

#[test]
fn ttl_expiry_noticed_when_a_waiter_disconnects_answers_the_others_lockdeleted() {
    let s = Server::start();
    let mut c = s.conn();
    let left = waiters_left(&s);
    let mut ws = lock_with_passed_ttl(&s, &mut c, 60_000, &[("b", 0), ("w", 0), ("d", 0)], 1);
    // L must not be touched (that would expire it the ordinary way): watch
    // the server's own clock pass the 1 ms TTL instead.
    wait_server_clock(&mut c, Duration::from_millis(20));
    let (gone, _) = ws.remove(1);
    drop(gone);
    for (i, (w, _)) in ws.iter_mut().enumerate() {
        let reply = w.reply_within(5 * SECOND).unwrap_or_else(|| panic!("waiter {i} got no reply"));
        assert!(reply.is_lockdeleted(), "waiter {i} got {reply:?}");
        w.assert_no_extra_reply();
    }
    wait_no_waiters(&s);
    assert_eq!(waiters_left(&s), left + 3, "each waiter must leave the queue exactly once (INFO flock counters)");
    assert!(!exists(&mut c, "L"));
    assert_server_healthy(&s);
}

#[test]
fn ttl_expiry_noticed_by_the_lease_timer_ends_the_lock_and_answers_waiters() {
    let s = Server::start();
    let mut c = s.conn();
    let left = waiters_left(&s);
    let deleted = s.stat("waiters_deleted");
    // The TTL (50 ms) passes before the lease (1 s); the lease timer is
    // the first to open the key.
    let mut ws = lock_with_passed_ttl(&s, &mut c, 1000, &[("b", 0), ("d", 0)], 50);
    for (i, (w, _)) in ws.iter_mut().enumerate() {
        let reply = w.reply_within(5 * SECOND).unwrap_or_else(|| panic!("waiter {i} got no reply"));
        assert!(reply.is_lockdeleted(), "waiter {i} got {reply:?}");
        w.assert_no_extra_reply();
    }
    wait_no_waiters(&s);
    assert_eq!(waiters_left(&s), left + 2, "each waiter must leave the queue exactly once (INFO flock counters)");
    assert_eq!(s.stat("waiters_deleted"), deleted + 2);
    assert!(!exists(&mut c, "L"));
    assert_server_healthy(&s);
}

// ---------------------------------------------------------------------------
// Many leases at once: one timer wakes up for all of them.
// ---------------------------------------------------------------------------

#[test]
fn many_leases_each_end_on_time_whatever_the_others_do() {
    let s = Server::start();
    let mut c = s.conn();
    // Leases from 20 ms to ~2.5 s, in scrambled order; later a third are
    // renewed to end later and a sixth are released, from the middle of
    // the server's deadline order.
    let n = 120;
    let key = |i: usize| format!("lease:{i}");
    let lease_ms = |i: usize| 20 + (i as u64 * 7919) % 2500;
    // (not before, expected by): a lease ends after its deadline as measured
    // from the request, and shortly after it as measured from the reply.
    let mut window: Vec<Option<(Instant, Instant)>> = Vec::new();
    for i in 0..n {
        let sent = Instant::now();
        acquire(&mut c, &key(i), "o", lease_ms(i)).unwrap().expect("granted");
        let lease = Duration::from_millis(lease_ms(i));
        window.push(Some((sent + lease, Instant::now() + lease)));
    }
    for i in (0..n).step_by(3) {
        let sent = Instant::now();
        let lease = Duration::from_millis(lease_ms(i) + 300);
        if renew(&mut c, &key(i), "o", lease.as_millis() as u64).is_ok() {
            window[i] = Some((sent + lease, Instant::now() + lease));
        }
    }
    let mut released = 0;
    for i in (1..n).step_by(6) {
        if release(&mut c, &key(i), "o").is_ok() {
            window[i] = None;
            released += 1;
        }
    }
    // The server's clock has whole milliseconds; a busy machine runs late.
    let (early, late) = (Duration::from_millis(2), Duration::from_secs(2));
    let mut left: Vec<usize> = (0..n).filter(|&i| window[i].is_some()).collect();
    while !left.is_empty() {
        let mut pipe = redis::pipe();
        for &i in &left {
            pipe.exists(key(i));
        }
        let polled = Instant::now();
        let exist: Vec<bool> = pipe.query(&mut c).unwrap();
        let answered = Instant::now();
        let mut still = Vec::new();
        for (&i, exists) in left.iter().zip(exist) {
            let (not_before, by) = window[i].unwrap();
            if exists {
                assert!(
                    polled < by + late,
                    "lease {i} ({} ms) still held {:?} after it should have ended",
                    lease_ms(i),
                    polled - by
                );
                still.push(i);
            } else {
                assert!(answered + early >= not_before, "lease {i} ended {:?} early", not_before - answered);
            }
        }
        left = still;
        std::thread::sleep(Duration::from_millis(5));
    }
    let st = s.stats();
    assert_eq!((st["lease_expiries"], st["locks"]), ((n - released) as i64, 0));
}

// ---------------------------------------------------------------------------
// 11. A key that only a queue keeps. A wait for several keys (ACQUIREALL)
// queues at a free key too, so the master keeps that key without a holder;
// it replicates holders, not waiters, so its replica has no such key. Redis
// itself may then carry the key on (RENAME, MOVE, DUMP and RESTORE, DEBUG
// RELOAD) with its queue left behind: the lock that arrives holds nothing.
// It must not stay on either server, and the replica, whose RENAME or MOVE
// of a key it lacks fails, must end up with what the master has.
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Carry {
    /// RENAME onto a key that a lock holds: on the master that lock is
    /// overwritten; on the replica the RENAME fails and it stays.
    RenameOverHeld,
    MoveToDb1,
    /// DUMP of the key, RESTORE of it under another name (on both servers).
    DumpRestore,
    /// The reload's flush answers the wait, whose other places then take
    /// the reloaded key out too.
    DebugReload,
}

/// The keys of databases 0 and 1, as (database, name), sorted.
fn lock_keys_of(s: &Server) -> Vec<(i64, Vec<u8>)> {
    let mut keys = Vec::new();
    for db in 0..2 {
        let names: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(&mut s.conn_db(db)).expect("KEYS");
        keys.extend(names.into_iter().map(|k| (db, k)));
    }
    keys.sort();
    keys
}

fn a_key_only_a_queue_keeps(carry: Carry) {
    let s = Server::start();
    let r = Server::replica_of(&s);
    let (mut c, mut rc) = (s.conn(), r.conn());
    acquire(&mut c, "busy", "x", 60_000).unwrap().expect("x holds busy");
    acquire(&mut c, "held", "o1", 60_000).unwrap().expect("o1 holds held");
    let mut w = Raw::connect(&s, 0);
    w.send(
        redis::cmd("FLOCK.ACQUIREALL").arg(2).arg("queued").arg("busy").arg("w").arg(60_000).arg("WAIT").arg(60_000),
    );
    wait_queue(&mut c, "queued", &["w"]);
    assert_eq!(owner_of(&mut c, "queued"), None, "queued: no holder, only w's place");
    wait_replica_applied(&mut c, &mut rc);
    assert!(!exists(&mut rc, "queued"), "{carry:?}: the replica has no key for a queue alone");

    let (db, carried) = match carry {
        Carry::RenameOverHeld => {
            let _: String = redis::cmd("RENAME").arg("queued").arg("held").query(&mut c).unwrap();
            (0, "held")
        }
        Carry::MoveToDb1 => {
            assert_eq!(redis::cmd("MOVE").arg("queued").arg(1).query::<i64>(&mut c).unwrap(), 1);
            (1, "queued")
        }
        Carry::DumpRestore => {
            let payload: Vec<u8> = redis::cmd("DUMP").arg("queued").query(&mut c).unwrap();
            let _: String = redis::cmd("RESTORE").arg("copy").arg(0).arg(payload).query(&mut c).unwrap();
            (0, "copy")
        }
        Carry::DebugReload => {
            let _: String = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
            (0, "queued")
        }
    };
    if !matches!(carry, Carry::DumpRestore) {
        assert!(w.reply().is_lockdeleted(), "{carry:?}: w's place went with the key");
    }
    let mut cdb = s.conn_db(db);
    wait_until(&format!("{carry:?}: the master to drop the lock that holds nothing"), 5 * SECOND, || {
        !exists(&mut cdb, carried)
    });
    wait_replica_applied(&mut c, &mut rc);
    assert!(!exists(&mut r.conn_db(db), carried), "{carry:?}: the replica still has {carried} in db {db}");
    // The replica holds what the master holds: no grant the master ended.
    let master_keys = lock_keys_of(&s);
    let replica_keys = lock_keys_of(&r);
    let queue_only = (0, b"queued".to_vec());
    let expected: Vec<_> = master_keys.iter().filter(|k| **k != queue_only).cloned().collect();
    assert_eq!(replica_keys, expected, "{carry:?}: the replica's keys beside the master's");
    assert_eq!(r.stat("locks"), replica_keys.len() as i64, "{carry:?}: the replica's flock_locks");
    assert_eq!(s.stat("locks"), master_keys.len() as i64, "{carry:?}: the master's flock_locks");
    for (db, key) in &master_keys {
        let mut k = s.conn_db(*db);
        assert!(
            (*db, key.clone()) == queue_only || owner_of(&mut k, key).is_some(),
            "{carry:?}: {key:?} holds nothing"
        );
    }
}

#[test]
fn rename_of_a_key_only_a_queue_keeps_over_a_held_lock_strands_nothing_on_master_or_replica() {
    a_key_only_a_queue_keeps(Carry::RenameOverHeld);
}

#[test]
fn move_of_a_key_only_a_queue_keeps_strands_nothing_on_master_or_replica() {
    a_key_only_a_queue_keeps(Carry::MoveToDb1);
}

#[test]
fn restore_of_a_dumped_key_only_a_queue_keeps_strands_nothing_on_master_or_replica() {
    a_key_only_a_queue_keeps(Carry::DumpRestore);
}

#[test]
fn debug_reload_of_a_key_only_a_queue_keeps_strands_nothing_on_master_or_replica() {
    a_key_only_a_queue_keeps(Carry::DebugReload);
}
