//! Sessions with a lease (docs/commands.md, "Sessions"): a session lives
//! while it is heard from, `FLOCK.SESSION TIMEOUT ms` and the module's
//! `session-timeout-ms`; a silent one expires with the effects of a close
//! and loses its connection; a grant taken with `lease-ms` 0 lives with its
//! session, and replicas see the session's timeout as its lease.
use crate::common::*;

use std::thread;
use std::time::{Duration, Instant};

/// A session's connection, with a read timeout so that no read can hang
/// the test; its session ID.
fn session(s: &Server, timeout_ms: Option<u64>) -> (Connection, String) {
    let mut c = s.conn();
    c.set_read_timeout(Some(5 * SECOND)).unwrap();
    let mut cmd = redis::cmd("FLOCK.SESSION");
    if let Some(ms) = timeout_ms {
        cmd.arg("TIMEOUT").arg(ms);
    }
    let id: String = cmd.query(&mut c).expect("FLOCK.SESSION");
    (c, id)
}

/// `FLOCK.INBOX timeout-ms` once: the reply.
fn read_inbox(c: &mut Connection, timeout_ms: u64) -> RedisResult<Value> {
    redis::cmd("FLOCK.INBOX").arg(timeout_ms).query(c)
}

/// `ACQUIRE key owner lease [WAIT wait] INBOX sid` from any connection.
fn acquire_for(c: &mut Connection, key: &str, owner: &str, lease: u64, wait: Option<u64>, sid: &str) -> Value {
    let mut cmd = redis::cmd("FLOCK.ACQUIRE");
    cmd.arg(key).arg(owner).arg(lease);
    if let Some(wait) = wait {
        cmd.arg("WAIT").arg(wait);
    }
    cmd.arg("INBOX").arg(sid).query(c).unwrap_or_else(|e| panic!("ACQUIRE {key} {owner} INBOX: {e}"))
}

/// Reads the inbox for `how_long`, as a process's reader loop does, each
/// read waiting without limit: the server answers it within a third of the
/// session's timeout, which is what keeps the session alive.
fn keep_alive(c: &mut Connection, how_long: Duration) -> usize {
    let until = Instant::now() + how_long;
    let mut reads = 0;
    while Instant::now() < until {
        read_inbox(c, 0).expect("a heard-from session's INBOX");
        reads += 1;
    }
    reads
}

#[test]
fn session_timeouts_and_lease_zero_are_checked_like_any_input() {
    let s = Server::start();
    let mut c = s.conn();
    for bad in [&["TIMEOUT", "99"][..], &["TIMEOUT", "3600001"], &["TIMEOUT", "x"], &["TIMEOUT"], &["WAIT", "100"]] {
        let e = expect_err(redis::cmd("FLOCK.SESSION").arg(bad).query::<String>(&mut c), "a bad FLOCK.SESSION");
        assert!(e.to_string().contains("TIMEOUT ms"), "{bad:?}: {e}");
    }
    assert_eq!(s.stat("sessions"), 0, "a refused FLOCK.SESSION opens nothing");
    for bad in ["99", "3600001"] {
        assert!(try_config_set(&mut c, "flock.session-timeout-ms", bad).is_err(), "session-timeout-ms {bad}");
    }
    let e = expect_err(acquire(&mut c, "k", "me", 0), "lease-ms 0 without INBOX");
    assert!(e.to_string().contains("needs INBOX session-id"), "{e}");
    let e = expect_err(
        redis::cmd("FLOCK.ACQUIREALL").arg(1).arg("k").arg("me").arg(0).query::<Value>(&mut c),
        "ACQUIREALL with lease-ms 0",
    );
    assert!(e.to_string().contains("needs INBOX session-id"), "{e}");
    assert!(!exists(&mut c, "k"), "a refused ACQUIRE changes nothing");
    let e = expect_err(renew(&mut c, "k", "me", 0), "RENEW with lease-ms 0");
    assert!(e.to_string().contains("invalid lease-ms"), "{e}");
}

/// The process behind a session goes silent (no FIN: its connection stays
/// open): after its timeout its waits leave, its session grant passes on,
/// its undelivered grant passes on, and its connection is closed.
#[test]
fn a_silent_session_expires_after_its_timeout_with_the_effects_of_a_close() {
    const TIMEOUT_MS: u64 = 300;
    let s = Server::start();
    // On the default timeout while the rest is set up, which a loaded
    // machine may take longer than TIMEOUT_MS to do.
    let (mut session_conn, sid) = session(&s, None);
    let mut pool = s.conn();
    // A grant that lives with the session, with a blocked waiter behind it.
    assert!(matches!(acquire_for(&mut pool, "held", "p:1", 0, None, &sid), Value::Int(_)));
    let mut next = s.conn();
    let next_waiter = thread::spawn(move || acquire_wait(&mut next, "held", "other", 60_000, 0));
    // A wait of the session's, queued behind another process's holder.
    assert!(acquire(&mut pool, "busy", "other", 60_000).unwrap().is_some());
    assert!(matches!(acquire_for(&mut pool, "busy", "p:2", 60_000, Some(0), &sid), Value::SimpleString(_)));
    wait_until("both waiters queued", 5 * SECOND, || queue_of(&mut pool, "held").len() == 1);
    assert_eq!(queue_of(&mut pool, "busy"), ["p:2"]);
    // The last time the session is heard from: nothing is sent on its
    // connection from here on (the ACQUIREs came from another one).
    let silent_since = Instant::now();
    let _: String = redis::cmd("FLOCK.SESSION").arg("TIMEOUT").arg(TIMEOUT_MS).query(&mut session_conn).unwrap();
    let token = granted(next_waiter, "the waiter behind the silent session's grant");
    let after = silent_since.elapsed();
    assert!(after >= Duration::from_millis(TIMEOUT_MS), "granted {after:?} after the last renewal");
    assert!(token > 0);
    assert_eq!(owner_of(&mut pool, "held").as_deref(), Some("other"));
    assert!(queue_of(&mut pool, "busy").is_empty(), "the session's wait left with it");
    let stats = s.stats();
    assert_eq!((stats["session_expiries"], stats["sessions"]), (1, 0));
    assert_eq!((stats["session_releases"], stats["wait_disconnects"]), (1, 1));
    // Its connection is closed: the late reader learns it at once.
    wait_until("the expired session's connection to be closed", 5 * SECOND, || {
        read_inbox(&mut session_conn, 0).is_err()
    });
    let e = expect_err(
        redis::cmd("FLOCK.ACQUIRE").arg("x").arg("p:3").arg(100).arg("INBOX").arg(&sid).query::<Value>(&mut pool),
        "ACQUIRE INBOX of an expired session",
    );
    assert!(e.to_string().starts_with("NOSESSION"), "{e}");
}

/// Reads with no limit are answered within a third of the timeout, and the
/// reads that follow keep the session and its grant alive for as long as
/// they go on, however long past its timeout.
#[test]
fn a_session_heard_from_lives_past_its_timeout_and_its_grant_with_it() {
    // Each read is sent as the last is answered: a loaded machine may take
    // the two thirds of the timeout that leaves to send it, when that is
    // 200 ms (a 300 ms timeout).
    const TIMEOUT_MS: u64 = 1000;
    let s = Server::start();
    // The other connection made first: the session's timeout (the lease
    // of its grant) begins only then.
    let mut pool = s.conn();
    let (mut session_conn, sid) = session(&s, Some(TIMEOUT_MS));
    assert!(matches!(acquire_for(&mut pool, "kept", "p:1", 0, None, &sid), Value::Int(_)));
    let started = Instant::now();
    assert_eq!(read_inbox(&mut session_conn, 0).unwrap(), Value::Nil, "a read with nothing to read");
    assert!(started.elapsed() < Duration::from_millis(TIMEOUT_MS), "INBOX 0 answered nil within the heartbeat");
    let reads = keep_alive(&mut session_conn, Duration::from_millis(2 * TIMEOUT_MS));
    assert!(reads >= 4, "{reads} reads in 2 timeouts");
    assert_eq!(owner_of(&mut pool, "kept").as_deref(), Some("p:1"));
    assert!(ttl_ms(&mut pool, "kept") <= TIMEOUT_MS as i64, "a session grant shows at most the session's timeout");
    assert_eq!(int_field(&mut pool, "kept", "session"), 1);
    let stats = s.stats();
    assert_eq!((stats["session_expiries"], stats["sessions"], stats["lease_expiries"]), (0, 1, 0));
    // Released by its holder like any grant.
    let released: i64 = redis::cmd("FLOCK.RELEASE").arg("kept").arg("p:1").query(&mut pool).unwrap();
    assert_eq!(released, 0);
}

/// Not only its reads: any FLOCK command on the session's connection keeps
/// the session, and a PING does not (Redis 7.0 does not tell a module which
/// connection sent it).
#[test]
fn any_flock_command_on_its_connection_renews_a_session_and_ping_does_not() {
    // Long enough that a loaded machine's stall between two commands (a
    // 30 ms sleep apart) does not outlast it.
    const TIMEOUT_MS: u64 = 1000;
    let s = Server::start();
    let (mut session_conn, _) = session(&s, Some(TIMEOUT_MS));
    let until = Instant::now() + Duration::from_millis(2 * TIMEOUT_MS);
    let mut last_sent = Instant::now();
    while Instant::now() < until {
        assert_eq!(info(&mut session_conn, "nothing"), None);
        last_sent = Instant::now();
        let _: i64 = redis::cmd("FLOCK.CANCEL").arg("nothing").arg("me").query(&mut session_conn).unwrap();
        thread::sleep(Duration::from_millis(30));
    }
    assert_eq!(s.stat("session_expiries"), 0);
    wait_until("a session kept by PINGs alone to expire", 5 * SECOND, || {
        let _: String = redis::cmd("PING").query(&mut session_conn).unwrap_or_default();
        s.stat("session_expiries") == 1
    });
    assert!(last_sent.elapsed() >= Duration::from_millis(TIMEOUT_MS), "expired before its timeout");
}

/// A session without a timeout of its own takes the module's at each
/// renewal; one with `TIMEOUT` keeps its own.
#[test]
fn session_timeout_ms_applies_to_sessions_at_their_next_renewal() {
    let s = Server::start_with(&["--flock.session-timeout-ms", "200"]);
    let (mut own_conn, _) = session(&s, Some(60_000));
    // Opened on the module's 200 ms, the setting raised and the session
    // renewed in one pipeline: separate round trips may take longer than
    // 200 ms on a loaded machine.
    let mut default_conn = s.conn();
    default_conn.set_read_timeout(Some(5 * SECOND)).unwrap();
    let (_, (), read): (String, (), Value) = redis::pipe()
        .cmd("FLOCK.SESSION")
        .cmd("CONFIG")
        .arg("SET")
        .arg("flock.session-timeout-ms")
        .arg(60_000)
        .cmd("FLOCK.INBOX")
        .arg(1)
        .query(&mut default_conn)
        .unwrap();
    // Renewed under the new setting: the default session outlives 200 ms,
    // the one with its own timeout (cut to 200 ms and renewed at once, for
    // the same reason) does not.
    assert_eq!(read, Value::Nil);
    let (_, read): (String, Value) = redis::pipe()
        .cmd("FLOCK.SESSION")
        .arg("TIMEOUT")
        .arg(200)
        .cmd("FLOCK.INBOX")
        .arg(1)
        .query(&mut own_conn)
        .unwrap();
    assert_eq!(read, Value::Nil);
    wait_until("the session with its own 200 ms timeout to expire", 5 * SECOND, || s.stat("session_expiries") == 1);
    assert_eq!(s.stat("sessions"), 1);
    assert_eq!(read_inbox(&mut default_conn, 1).unwrap(), Value::Nil, "the session on the module's timeout lives");
    // `TIMEOUT` on an open session changes its timeout.
    let _: String = redis::cmd("FLOCK.SESSION").arg("TIMEOUT").arg(100).query(&mut default_conn).unwrap();
    wait_until("the session whose timeout was cut to expire", 5 * SECOND, || s.stat("session_expiries") == 2);
}

/// Sessions are not replicated: a session grant reaches the replica with
/// the session's timeout as its lease, moved on a third of that before its
/// end as the session is heard from, so that a replica promoted at any
/// moment still holds it long enough for its holder's client to watch it
/// there, and ends it within the timeout if nobody does.
#[test]
fn a_session_grant_reaches_replicas_with_the_sessions_timeout_as_its_lease() {
    const TIMEOUT_MS: u64 = 900;
    let m = Server::start();
    let r = Server::replica_of(&m);
    let (mut mc, mut rc) = (m.conn(), r.conn());
    let (mut session_conn, sid) = session(&m, Some(TIMEOUT_MS));
    assert!(matches!(acquire_for(&mut mc, "g", "p:1", 0, None, &sid), Value::Int(_)));
    wait_replica_applied(&mut mc, &mut rc);
    // Kept past three timeouts, read on the replica all along: its lease
    // moved with the session and never came near its end (a third of the
    // timeout before it, less what a late timer on a busy machine takes).
    let reader = thread::spawn(move || {
        keep_alive(&mut session_conn, Duration::from_millis(3 * TIMEOUT_MS));
        session_conn
    });
    let mut lowest = i64::MAX;
    while !reader.is_finished() {
        lowest = lowest.min(ttl_ms(&mut rc, "g"));
        thread::sleep(Duration::from_millis(10));
    }
    // Still open: a closed connection would end the session at once.
    let _session_conn = reader.join().unwrap();
    assert!(lowest >= (TIMEOUT_MS / 6) as i64, "the replica's lease came down to {lowest} ms");
    assert_eq!(owner_of(&mut rc, "g").as_deref(), Some("p:1"));
    let ttl = ttl_ms(&mut rc, "g");
    assert!((0..=TIMEOUT_MS as i64).contains(&ttl), "ttl-ms on the replica: {ttl}");
    assert_eq!(int_field(&mut rc, "g", "session"), 1);
    // The master goes; the promoted replica ends the grant in its lease.
    let ok: String = redis::cmd("REPLICAOF").arg("NO").arg("ONE").query(&mut rc).unwrap();
    assert_eq!(ok, "OK");
    wait_until("the promoted replica to end the session grant", 5 * SECOND, || !exists(&mut rc, "g"));
}

/// `FLOCK.SESSION WITHTIMEOUT` answers the timeout the session keeps, and
/// a `granted` event tells the lease left when it is read (nothing for a
/// grant that lives with its session), so that a client can count its
/// grant's deadline from the moment it sent the read.
#[test]
fn withtimeout_names_the_timeout_and_granted_events_tell_the_lease_left() {
    let s = Server::start_with(&["--flock.session-timeout-ms", "5000"]);
    let mut c = s.conn();
    let (id, timeout): (String, u64) = redis::cmd("FLOCK.SESSION").arg("WITHTIMEOUT").query(&mut c).unwrap();
    assert_eq!((id.len(), timeout), (32, 5000));
    config_set(&mut s.conn(), &[("flock.session-timeout-ms", "100")]);
    let again: (String, u64) = redis::cmd("FLOCK.SESSION").arg("WITHTIMEOUT").query(&mut c).unwrap();
    assert_eq!(again, (id.clone(), 5000), "the session keeps the timeout it answered");
    let mut pool = s.conn();
    assert!(acquire(&mut pool, "k", "other", 60_000).unwrap().is_some());
    assert!(matches!(acquire_for(&mut pool, "k", "p:1", 30_000, Some(0), &id), Value::SimpleString(_)));
    assert!(matches!(acquire_for(&mut pool, "k", "p:2", 0, Some(0), &id), Value::SimpleString(_)));
    assert_eq!(release(&mut pool, "k", "other").unwrap(), 0);
    type Event = (String, String, String, i64, String);
    let events: Vec<Event> = redis::from_redis_value(&read_inbox(&mut c, 1000).unwrap()).unwrap();
    let left: u64 = events[0].4.parse().expect("the lease left");
    assert!(left > 0 && left <= 30_000, "{events:?}");
    assert_eq!(release(&mut pool, "k", "p:1").unwrap(), 0);
    let events: Vec<Event> = redis::from_redis_value(&read_inbox(&mut c, 1000).unwrap()).unwrap();
    assert_eq!((events[0].0.as_str(), events[0].4.as_str()), ("granted", ""), "a grant that lives with the session");
}

/// A reentry with a lease, or a RENEW, gives a session grant a lease of its
/// own; a reentry with `lease-ms` 0 makes it live with the session again.
#[test]
fn renew_gives_a_session_grant_its_own_lease_and_a_reentry_with_zero_takes_it_back() {
    // Kept by reads each sent as the last is answered: long enough for a
    // loaded machine to send them in time.
    const TIMEOUT_MS: u64 = 1000;
    let s = Server::start();
    // The other connection made first: the session's timeout (the lease
    // of its grant) begins only then.
    let mut pool = s.conn();
    let (mut session_conn, sid) = session(&s, Some(TIMEOUT_MS));
    assert!(matches!(acquire_for(&mut pool, "r", "p:1", 0, None, &sid), Value::Int(_)));
    renew(&mut pool, "r", "p:1", 100).unwrap();
    // Its own 100 ms lease ends it though the session is heard from.
    let started = Instant::now();
    while exists(&mut pool, "r") {
        assert!(started.elapsed() < 5 * SECOND, "the renewed grant's own lease never ended");
        read_inbox(&mut session_conn, 20).unwrap();
    }
    assert_eq!(s.stat("lease_expiries"), 1);
    // One packet: the 100 ms lease cannot run out before the reentry.
    let (with_lease, reentry): (Value, Value) = redis::pipe()
        .cmd("FLOCK.ACQUIRE")
        .arg("r")
        .arg("p:1")
        .arg(100)
        .arg("INBOX")
        .arg(&sid)
        .cmd("FLOCK.ACQUIRE")
        .arg("r")
        .arg("p:1")
        .arg(0)
        .arg("INBOX")
        .arg(&sid)
        .query(&mut pool)
        .unwrap();
    assert!(matches!(with_lease, Value::Int(_)), "{with_lease:?}");
    assert!(matches!(reentry, Value::Int(_)), "a reentry with 0: {reentry:?}");
    // Past its timeout, and long past the 100 ms lease.
    keep_alive(&mut session_conn, Duration::from_millis(3 * TIMEOUT_MS / 2));
    assert_eq!(holds(&mut pool, "r"), 2, "it lives with the session again");
    assert_eq!(s.stat("lease_expiries"), 1);
}
