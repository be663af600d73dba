//! Sessions (docs/commands.md, "Sessions"): waits sent from any connection
//! with `INBOX session-id` and answered in the session's inbox; pushed
//! losses; FLOCK.CANCEL; the end of a session with its connection; NOTOWNER
//! that says why; RESP2 and RESP3; MULTI, Lua, ACL, demotion and Cluster.
use crate::common::cluster::Cluster;
use crate::common::*;

use std::time::{Duration, Instant};

/// One inbox event: kind, key, owner, token, detail.
type Event = (String, String, String, i64, String);

fn open_session(c: &mut Connection) -> String {
    redis::cmd("FLOCK.SESSION").query(c).expect("FLOCK.SESSION")
}

/// `FLOCK.INBOX timeout-ms`: the events, empty when it timed out (nil).
/// A `granted` event's detail, the lease left (session_leases.rs checks
/// it), is blanked so that events compare whatever time has passed.
fn read_inbox(c: &mut Connection, timeout_ms: u64) -> Vec<Event> {
    let v: Value = redis::cmd("FLOCK.INBOX").arg(timeout_ms).query(c).expect("FLOCK.INBOX");
    let mut events: Vec<Event> = match v {
        Value::Nil => Vec::new(),
        v => redis::from_redis_value(&v).unwrap_or_else(|e| panic!("events: {e}: {v:?}")),
    };
    for event in events.iter_mut().filter(|e| e.0 == "granted") {
        assert!(event.4.parse::<u64>().is_ok(), "a granted event's lease left: {event:?}");
        event.4.clear();
    }
    events
}

/// Reads until `n` events came, each read waiting at most until `within`.
fn read_events(c: &mut Connection, n: usize, within: Duration) -> Vec<Event> {
    let deadline = Instant::now() + within;
    let mut events = Vec::new();
    while events.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "timed out waiting for {n} events, got {events:?}");
        events.extend(read_inbox(c, left.as_millis().max(1) as u64));
    }
    events
}

/// `ACQUIRE key owner lease WAIT wait INBOX sid [more...]`.
fn session_cmd(key: &str, owner: &str, lease: u64, wait: u64, sid: &str, more: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd("FLOCK.ACQUIRE");
    cmd.arg(key).arg(owner).arg(lease).arg("WAIT").arg(wait).arg("INBOX").arg(sid).arg(more);
    cmd
}

/// `session_cmd`, as its reply.
fn session_acquire(
    c: &mut Connection,
    key: &str,
    owner: &str,
    lease: u64,
    wait: u64,
    sid: &str,
    more: &[&str],
) -> Value {
    session_cmd(key, owner, lease, wait, sid, more)
        .query(c)
        .unwrap_or_else(|e| panic!("ACQUIRE {key} {owner} INBOX: {e}"))
}

fn is_waiting(v: &Value) -> bool {
    matches!(v, Value::SimpleString(s) if s == "WAITING")
}

fn ev(kind: &str, key: &str, owner: &str, token: i64, detail: &str) -> Event {
    (kind.into(), key.into(), owner.into(), token, detail.into())
}

fn resp3(s: &Server) -> Connection {
    redis::Client::open(format!("{}?protocol=resp3", s.url())).unwrap().get_connection().expect("RESP3")
}

/// Waits through a session, in the order they were queued, on RESP2 and
/// RESP3 alike; the pooled connection that sent them is free at once.
#[test]
fn waits_sent_from_one_connection_are_granted_in_the_session_inbox_in_fifo_order() {
    let s = Server::start();
    for (protocol, mut inbox, mut pool) in [("RESP2", s.conn(), s.conn()), ("RESP3", resp3(&s), resp3(&s))] {
        let key = format!("orders-{protocol}");
        let sid = open_session(&mut inbox);
        assert_eq!(sid.len(), 32, "{protocol}: 32 hex digits");
        assert_eq!(open_session(&mut inbox), sid, "{protocol}: the same session on the same connection");
        acquire(&mut pool, &key, "holder", 60_000).unwrap().expect("free");
        let owners = ["w1", "w2", "w3", "w4"];
        for owner in owners {
            let reply = session_acquire(&mut pool, &key, owner, 60_000, 0, &sid, &[]);
            assert!(is_waiting(&reply), "{protocol}: a queued session wait answers WAITING at once, got {reply:?}");
        }
        assert_eq!(queue_of(&mut pool, &key), owners, "{protocol}");
        assert!(read_inbox(&mut inbox, 50).is_empty(), "{protocol}: nothing granted yet (nil after the timeout)");
        let mut previous = "holder";
        let mut tokens = Vec::new();
        for owner in owners {
            assert_eq!(release(&mut pool, &key, previous).unwrap(), 0);
            let events = read_events(&mut inbox, 1, Duration::from_secs(10));
            let token = token_of(&mut pool, &key);
            assert_eq!(events, [ev("granted", &key, owner, token, "")], "{protocol}: FIFO");
            assert_eq!(owner_of(&mut pool, &key).as_deref(), Some(owner));
            tokens.push(token);
            previous = owner;
        }
        assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{protocol}: rising tokens {tokens:?}");
        assert_eq!(release(&mut pool, &key, previous).unwrap(), 0);
        assert!(read_inbox(&mut inbox, 50).is_empty(), "{protocol}: RELEASE by the holder tells its session nothing");
    }
}

/// A session wait's timeout and FLOCK.CANCEL are answered in the inbox;
/// CANCEL also ends a blocked wait (nil) and answers 0 for a non-waiter.
#[test]
fn a_session_wait_times_out_or_is_cancelled_in_its_inbox_and_cancel_ends_blocked_waits_too() {
    let s = Server::start();
    let (mut inbox, mut c) = (s.conn(), s.conn());
    let sid = open_session(&mut inbox);
    acquire(&mut c, "L", "holder", 60_000).unwrap().expect("free");
    // One packet, so that slow's 100 ms cannot run out before quitter is
    // queued and cancelled, however slow the machine: the order of the
    // events is checked.
    let (slow, quitter, cancelled): (Value, Value, i64) = redis::pipe()
        .add_command(session_cmd("L", "slow", 60_000, 100, &sid, &[]))
        .add_command(session_cmd("L", "quitter", 60_000, 0, &sid, &[]))
        .cmd("FLOCK.CANCEL")
        .arg("L")
        .arg("quitter")
        .query(&mut c)
        .unwrap();
    assert!(is_waiting(&slow) && is_waiting(&quitter), "{slow:?}, {quitter:?}");
    assert_eq!(cancelled, 1);
    assert_eq!(redis::cmd("FLOCK.CANCEL").arg("L").arg("quitter").query::<i64>(&mut c).unwrap(), 0, "once");
    assert_eq!(redis::cmd("FLOCK.CANCEL").arg("L").arg("holder").query::<i64>(&mut c).unwrap(), 0, "not a waiter");
    assert_eq!(redis::cmd("FLOCK.CANCEL").arg("nokey").arg("x").query::<i64>(&mut c).unwrap(), 0);
    let events = read_events(&mut inbox, 2, Duration::from_secs(10));
    assert_eq!(events, [ev("cancelled", "L", "quitter", 0, ""), ev("timeout", "L", "slow", 0, "")]);

    let blocked = spawn_waiter(&s, "L", "blocked", 60_000, 0);
    wait_queue(&mut c, "L", &["blocked"]);
    assert_eq!(redis::cmd("FLOCK.CANCEL").arg("L").arg("blocked").query::<i64>(&mut c).unwrap(), 1);
    assert_eq!(blocked.join().unwrap().unwrap(), None, "a blocked wait cancelled answers nil");
    let stats = flock_stats(&mut c);
    assert_eq!((stats["wait_cancels"], stats["wait_timeouts"], stats["waiters"]), (2, 1, 0));
    for bad in [vec!["FLOCK.CANCEL", "L"], vec!["FLOCK.CANCEL", "L", "a", "b"], vec!["FLOCK.CANCEL", "L", ""]] {
        expect_err(redis::cmd(bad[0]).arg(&bad[1..]).query::<Value>(&mut c), "bad CANCEL");
    }
}

/// The server ends a grant a session watches: lease end, FORCERELEASE, DEL,
/// FLUSHALL; the session hears it with the reason, at once. The grant was
/// made at once or to a waiter; reentry moves the watch.
#[test]
fn a_session_hears_at_once_when_the_server_ends_a_grant_it_watches() {
    let s = Server::start();
    let (mut inbox, mut c) = (s.conn(), s.conn());
    let sid = open_session(&mut inbox);

    let t = session_acquire(&mut c, "lease", "a", 200, 0, &sid, &[]);
    let t = int(&t);
    let since = Instant::now();
    let events = read_events(&mut inbox, 1, Duration::from_secs(10));
    assert_eq!(events, [ev("lost", "lease", "a", t, "expired")]);
    eprintln!("lease of 200 ms: lost heard after {:?}", since.elapsed());

    let t = int(&session_acquire(&mut c, "forced", "a", 60_000, 0, &sid, &[]));
    assert_eq!(force_release(&mut c, "forced").unwrap(), 1);
    assert_eq!(read_events(&mut inbox, 1, Duration::from_secs(5)), [ev("lost", "forced", "a", t, "forcereleased")]);

    // Granted to a waiter, then deleted.
    acquire(&mut c, "deleted", "first", 60_000).unwrap().expect("free");
    assert!(is_waiting(&session_acquire(&mut c, "deleted", "second", 60_000, 0, &sid, &[])));
    assert_eq!(release(&mut c, "deleted", "first").unwrap(), 0);
    let granted = read_events(&mut inbox, 1, Duration::from_secs(5));
    let t = granted[0].3;
    assert_eq!(granted, [ev("granted", "deleted", "second", t, "")]);
    let _: i64 = redis::cmd("DEL").arg("deleted").query(&mut c).unwrap();
    assert_eq!(read_events(&mut inbox, 1, Duration::from_secs(5)), [ev("lost", "deleted", "second", t, "deleted")]);

    let t = int(&session_acquire(&mut c, "flushed", "a", 60_000, 0, &sid, &[]));
    let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
    assert_eq!(read_events(&mut inbox, 1, Duration::from_secs(5)), [ev("lost", "flushed", "a", t, "deleted")]);

    // Reentered by another session: the newer one watches it.
    let mut other = s.conn();
    let sid2 = open_session(&mut other);
    let t = int(&session_acquire(&mut c, "moved", "a", 60_000, 0, &sid, &[]));
    assert_eq!(int(&session_acquire(&mut c, "moved", "a", 60_000, 0, &sid2, &[])), t);
    assert_eq!(force_release(&mut c, "moved").unwrap(), 1);
    assert_eq!(read_events(&mut other, 1, Duration::from_secs(5)), [ev("lost", "moved", "a", t, "forcereleased")]);
    assert!(read_inbox(&mut inbox, 100).is_empty(), "the first session no longer watches it");
}

/// MIGRATE (a Cluster slot move sends the same) takes a lock whole to
/// another server: the holder's session hears `moved`, not a loss, and the
/// grant goes on there; NOTOWNER here says where it went. With COPY both
/// servers keep it and nothing is heard.
#[test]
fn a_migrated_lock_is_moved_for_its_session_not_lost() {
    let (s, target) = (Server::start(), Server::start());
    let (mut inbox, mut c, mut far) = (s.conn(), s.conn(), target.conn());
    let sid = open_session(&mut inbox);
    let migrate = |c: &mut Connection, key: &str, more: &[&str]| {
        let ok: String = redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(target.port)
            .arg(key)
            .arg(0)
            .arg(5_000)
            .arg(more)
            .query(c)
            .unwrap_or_else(|e| panic!("MIGRATE {key} {more:?}: {e}"));
        assert_eq!(ok, "OK");
    };

    let t = int(&session_acquire(&mut c, "one", "a", 60_000, 0, &sid, &[]));
    migrate(&mut c, "one", &[]);
    assert_eq!(read_events(&mut inbox, 1, Duration::from_secs(5)), [ev("moved", "one", "a", t, "")]);
    assert_eq!(
        (owner_of(&mut far, "one").as_deref(), token_of(&mut far, "one")),
        (Some("a"), t),
        "the grant goes on there"
    );
    let e = release(&mut c, "one", "a").expect_err("NOTOWNER here");
    assert!(e.to_string().contains("another server"), "{e}");
    assert_eq!(s.stat("deletions"), 0, "a move is not a deletion");

    // The KEYS form, as a slot move sends it; another key of the same
    // command stays a loss only if it is deleted another way.
    let t2 = int(&session_acquire(&mut c, "{s}two", "a", 60_000, 0, &sid, &[]));
    let t3 = int(&session_acquire(&mut c, "{s}three", "b", 60_000, 0, &sid, &[]));
    migrate(&mut c, "", &["KEYS", "{s}two", "{s}three"]);
    let mut events = read_events(&mut inbox, 2, Duration::from_secs(5));
    events.sort();
    assert_eq!(events, [ev("moved", "{s}three", "b", t3, ""), ev("moved", "{s}two", "a", t2, "")]);
    let _: i64 = redis::cmd("DEL").arg("{s}two").query(&mut far).unwrap();
    assert!(read_inbox(&mut inbox, 100).is_empty(), "the target's deletion is the target's sessions' to hear");

    let t4 = int(&session_acquire(&mut c, "copied", "a", 60_000, 0, &sid, &[]));
    migrate(&mut c, "copied", &["COPY"]);
    assert!(read_inbox(&mut inbox, 100).is_empty(), "COPY leaves the grant here too");
    assert_eq!(token_of(&mut c, "copied"), t4);
    let _: i64 = redis::cmd("DEL").arg("copied").query(&mut c).unwrap();
    assert_eq!(read_events(&mut inbox, 1, Duration::from_secs(5)), [ev("lost", "copied", "a", t4, "deleted")]);
}

/// RELEASE and RENEW after the server ended the grant say how it ended;
/// a new grant to that owner forgets it.
#[test]
fn notowner_says_why_the_grant_ended() {
    let s = Server::start();
    let mut c = s.conn();
    let text = |r: RedisResult<i64>| {
        let e = r.expect_err("NOTOWNER");
        assert_eq!(e.code(), Some("NOTOWNER"), "{e}");
        e.to_string()
    };
    acquire(&mut c, "L", "a", 50).unwrap().expect("free");
    wait_gone(&mut c, "L", Instant::now(), Duration::from_secs(5));
    assert!(text(release(&mut c, "L", "a")).contains("lease of this owner ended"), "after the key is gone too");
    acquire(&mut c, "L", "a", 60_000).unwrap().expect("free");
    force_release(&mut c, "L").unwrap();
    assert!(text(renew(&mut c, "L", "a", 1_000)).contains("force-released"));
    acquire(&mut c, "L", "a", 60_000).unwrap().expect("free");
    let _: i64 = redis::cmd("DEL").arg("L").query(&mut c).unwrap();
    assert!(text(release(&mut c, "L", "a")).contains("deleted"));
    acquire(&mut c, "L", "a", 60_000).unwrap().expect("free");
    assert_eq!(release(&mut c, "L", "a").unwrap(), 0);
    let general = text(release(&mut c, "L", "a"));
    assert!(general.contains("never acquired, released, or its lease expired"), "{general}");
    assert!(text(release(&mut c, "L", "never")).contains("never acquired"));
}

/// The session's connection closes: its waiters leave, a grant it never
/// read passes on, its SESSION grants end, other grants stay.
#[test]
fn a_closed_session_connection_takes_its_waits_and_unread_grants_with_it() {
    let s = Server::start();
    let mut c = s.conn();
    let mut inbox = s.conn();
    let sid = open_session(&mut inbox);
    let inbox_id: i64 = redis::cmd("CLIENT").arg("ID").query(&mut inbox).unwrap();
    acquire(&mut c, "L", "holder", 60_000).unwrap().expect("free");
    for owner in ["s1", "s2"] {
        assert!(is_waiting(&session_acquire(&mut c, "L", owner, 60_000, 0, &sid, &[])));
    }
    let blocked = spawn_waiter(&s, "L", "b3", 60_000, 0);
    wait_queue(&mut c, "L", &["s1", "s2", "b3"]);
    assert_eq!(release(&mut c, "L", "holder").unwrap(), 0, "s1 is granted; its event waits unread");
    int(&session_acquire(&mut c, "bound", "x", 60_000, 0, &sid, &["SESSION"]));
    int(&session_acquire(&mut c, "kept", "y", 60_000, 0, &sid, &[]));
    let _: i64 = redis::cmd("CLIENT").arg("KILL").arg("ID").arg(inbox_id).query(&mut c).unwrap();
    let t = granted(blocked, "b3");
    assert_eq!(token_of(&mut c, "L"), t, "s1's unread grant passed on past s2, which left, to b3");
    wait_until("the SESSION grant ends", Duration::from_secs(5), || !exists(&mut c, "bound"));
    assert_eq!(owner_of(&mut c, "kept").as_deref(), Some("y"), "a grant without SESSION stays");
    let stats = flock_stats(&mut c);
    assert_eq!(
        (stats["sessions"], stats["undelivered_grants"], stats["wait_disconnects"], stats["session_releases"]),
        (0, 1, 1, 1)
    );
    let e = expect_err(
        redis::cmd("FLOCK.ACQUIRE").arg(&["L", "z", "1000", "WAIT", "0", "INBOX", &sid]).query::<Value>(&mut c),
        "a closed session",
    );
    assert_eq!(e.code(), Some("NOSESSION"), "{e}");
}

/// Bad input changes nothing; INBOX needs a session; MULTI does not block;
/// scripts may not open or read sessions; a resend through the session
/// gets one event.
#[test]
fn session_edges_bad_input_multi_scripts_and_resends() {
    let s = Server::start();
    let mut c = s.conn();
    let e = expect_err(redis::cmd("FLOCK.INBOX").arg(0).query::<Value>(&mut c), "no session");
    assert_eq!(e.code(), Some("NOSESSION"));
    let sid = open_session(&mut c);
    for (args, what) in [
        (vec!["FLOCK.INBOX"], "arity"),
        (vec!["FLOCK.INBOX", "-1"], "timeout"),
        (vec!["FLOCK.SESSION", "x"], "arity"),
        (vec!["FLOCK.ACQUIRE", "L", "a", "100", "INBOX", "ABCDEF0123456789ABCDEF0123456789"], "upper case"),
        (vec!["FLOCK.ACQUIRE", "L", "a", "100", "INBOX"], "no value"),
        (vec!["FLOCK.ACQUIRE", "L", "a", "100", "INBOX", &sid, "INBOX", &sid], "twice"),
    ] {
        expect_err(redis::cmd(args[0]).arg(&args[1..]).query::<Value>(&mut c), what);
    }
    assert_eq!(dbsize(&mut c), 0, "nothing was created");
    let in_multi: Vec<Value> =
        redis::pipe().atomic().cmd("FLOCK.INBOX").arg(0).query(&mut c).expect("INBOX in MULTI does not block");
    assert_eq!(in_multi, [Value::Nil]);
    for script in ["return redis.call('FLOCK.SESSION')", "return redis.call('FLOCK.INBOX', 0)"] {
        expect_err(redis::cmd("EVAL").arg(script).arg(0).query::<Value>(&mut c), script);
    }

    let mut pool = s.conn();
    acquire(&mut pool, "R", "holder", 60_000).unwrap().expect("free");
    let id = ["ID", "req-1"];
    assert!(is_waiting(&session_acquire(&mut pool, "R", "w", 60_000, 0, &sid, &id)));
    assert!(is_waiting(&session_acquire(&mut pool, "R", "w", 60_000, 0, &sid, &id)), "the resend takes its place");
    assert_eq!(queue_of(&mut pool, "R"), ["w"]);
    assert_eq!(release(&mut pool, "R", "holder").unwrap(), 0);
    let t = token_of(&mut pool, "R");
    assert_eq!(read_events(&mut c, 1, Duration::from_secs(5)), [ev("granted", "R", "w", t, "")]);
    assert!(read_inbox(&mut c, 100).is_empty(), "one event for the wait and its resend");
}

/// A resend of a session wait (same request ID) whose grant waits unread in
/// an inbox is answered its token (docs/commands.md, "Request IDs"): that
/// reply tells of the grant, so no read tells of it again, and it lives with
/// the resend's session: the end of the first one neither passes it on as
/// never delivered nor ends it.
#[test]
fn a_grant_told_to_a_resend_of_its_wait_is_not_told_again_and_lives_with_the_resends_session() {
    let s = Server::start();
    let mut c = s.conn();
    let (mut first, mut second) = (s.conn(), s.conn());
    let (sid1, sid2) = (open_session(&mut first), open_session(&mut second));
    let first_id = client_id(&mut first);
    // Each key: a wait through the first session, granted and not read yet.
    let granted_unread = |c: &mut Connection, key: &str, lease: u64, id: &[&str]| {
        acquire(c, key, "holder", 60_000).unwrap().expect("free");
        assert!(is_waiting(&session_acquire(c, key, "w", lease, 0, &sid1, id)));
        assert_eq!(release(c, key, "holder").unwrap(), 0);
        token_of(c, key)
    };

    let t = granted_unread(&mut c, "S", 60_000, &["ID", "req-s"]);
    assert_eq!(int(&session_acquire(&mut c, "S", "w", 60_000, 0, &sid1, &["ID", "req-s"])), t);
    assert!(read_inbox(&mut first, 100).is_empty(), "the reply told of the grant: no event tells it again");

    let t = granted_unread(&mut c, "L", 0, &["ID", "req-l"]);
    assert_eq!(int(&session_acquire(&mut c, "L", "w", 0, 0, &sid2, &["ID", "req-l"])), t);
    let next = spawn_waiter(&s, "L", "next", 60_000, 0);
    wait_queue(&mut c, "L", &["next"]);
    let _: i64 = redis::cmd("CLIENT").arg("KILL").arg("ID").arg(first_id).query(&mut c).unwrap();
    wait_until("the first session ends", Duration::from_secs(5), || flock_stats(&mut c)["sessions"] == 1);
    assert_eq!((owner_of(&mut c, "L").as_deref(), token_of(&mut c, "L")), (Some("w"), t), "still w's grant");
    assert_eq!(queue_of(&mut c, "L"), ["next"]);
    assert!(read_inbox(&mut second, 100).is_empty(), "told by the reply");
    drop(second);
    assert!(granted(next, "next") > t, "the grant ended with the resend's session");
    assert_eq!(flock_stats(&mut c)["undelivered_grants"], 0);
}

/// ACL key patterns apply to the ACQUIRE that names a session, as to any.
#[test]
fn acl_key_patterns_apply_to_session_waits() {
    let s = Server::start();
    let mut admin = s.conn();
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "worker", "on", ">pw", "resetkeys", "~lock:*", "+@all"][..])
        .query(&mut admin)
        .unwrap();
    let mut c = redis::Client::open(format!("redis://worker:pw@127.0.0.1:{}/", s.port))
        .unwrap()
        .get_connection()
        .expect("AUTH as worker");
    let sid = open_session(&mut c);
    let e = expect_err(
        redis::cmd("FLOCK.ACQUIRE").arg(&["other:a", "w", "1000", "WAIT", "0", "INBOX", &sid]).query::<Value>(&mut c),
        "key outside the pattern",
    );
    assert_eq!(e.code(), Some("NOPERM"), "{e}");
    assert!(int(&session_acquire(&mut c, "lock:a", "w", 1_000, 0, &sid, &[])) > 0);
}

/// Demotion: the session's waiters get UNBLOCKED events, its grants `lost
/// demoted`. A session whose read is blocked then is, on Redis 7.0 and 8.2,
/// answered UNBLOCKED and closed by the server itself: the session ends
/// (its waits leave), as the reference says.
#[test]
fn a_demoted_master_tells_sessions_their_waits_and_grants_are_over() {
    let m = Server::start();
    let n = Server::replica_of(&m);
    let (mut c, mut idle, mut reading) = (m.conn(), m.conn(), m.conn());
    let (sid, read_sid) = (open_session(&mut idle), open_session(&mut reading));
    let t = int(&session_acquire(&mut c, "held", "a", 60_000, 0, &sid, &[]));
    acquire(&mut c, "busy", "other", 60_000).unwrap().expect("free");
    assert!(is_waiting(&session_acquire(&mut c, "busy", "w", 60_000, 0, &sid, &[])));
    assert!(is_waiting(&session_acquire(&mut c, "busy", "r", 60_000, 0, &read_sid, &[])));
    let reader = std::thread::spawn(move || redis::cmd("FLOCK.INBOX").arg(0).query::<Value>(&mut reading));
    wait_until("the read blocks", Duration::from_secs(5), || m.blocked_clients() == 1);
    let mut nc = n.conn();
    wait_until("the replica has both locks", Duration::from_secs(10), || dbsize(&mut nc) == 2);
    let ok: String = redis::cmd("REPLICAOF").arg("NO").arg("ONE").query(&mut nc).unwrap();
    assert_eq!(ok, "OK");
    let ok: String = redis::cmd("REPLICAOF").arg("127.0.0.1").arg(n.port).query(&mut c).unwrap();
    assert_eq!(ok, "OK");

    let mut events = read_events(&mut idle, 2, Duration::from_secs(10));
    events.sort();
    assert_eq!(events[0].0, "error");
    assert!(events[0].4.starts_with("UNBLOCKED"), "{:?}", events[0]);
    assert_eq!(events[1], ev("lost", "held", "a", t, "demoted"));
    match reader.join().unwrap() {
        Ok(Value::Array(events)) => {
            let events: Vec<Event> = redis::from_redis_value(&Value::Array(events)).unwrap();
            assert_eq!((events[0].0.as_str(), events[0].2.as_str()), ("error", "r"), "{events:?}");
        }
        Err(e) => {
            assert_eq!(e.code(), Some("UNBLOCKED"), "{e}");
            wait_until("the server closed the blocked session", Duration::from_secs(5), || {
                flock_stats(&mut c)["sessions"] == 1
            });
        }
        Ok(other) => panic!("the blocked read got {other:?}"),
    }
}

/// In Cluster a session is per node: a wait names the session of its key's
/// node, and another node's session is NOSESSION there.
#[test]
fn in_cluster_each_node_has_its_own_sessions() {
    let cl = Cluster::start();
    let (ka, kb) = ("{a}lock", "{b}lock");
    let (na, nb) = (cl.owner_of_key(ka), cl.owner_of_key(kb));
    assert_ne!(na, nb, "the two keys live on two nodes");
    let (mut ca, mut cb) = (cl.conn(na), cl.conn(nb));
    let (mut ia, mut ib) = (cl.conn(na), cl.conn(nb));
    let (sa, sb) = (open_session(&mut ia), open_session(&mut ib));
    for (c, key, sid, inbox) in [(&mut ca, ka, &sa, &mut ia), (&mut cb, kb, &sb, &mut ib)] {
        acquire(c, key, "holder", 60_000).unwrap().expect("free");
        assert!(is_waiting(&session_acquire(c, key, "w", 60_000, 0, sid, &[])));
        assert_eq!(release(c, key, "holder").unwrap(), 0);
        let t = token_of(c, key);
        assert_eq!(read_events(inbox, 1, Duration::from_secs(5)), [ev("granted", key, "w", t, "")]);
    }
    let e = expect_err(
        redis::cmd("FLOCK.ACQUIRE").arg(&[ka, "x", "1000", "WAIT", "0", "INBOX", &sb]).query::<Value>(&mut ca),
        "another node's session",
    );
    assert_eq!(e.code(), Some("NOSESSION"), "{e}");
}

/// A process that waits through a session and is killed (SIGKILL, no goodbye):
/// once the server sees its connections close, none of its waiters is left
/// and the lock is served on.
#[test]
fn a_killed_process_leaves_no_waiter_behind() {
    require_redis_py();
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "L", "holder", 60_000).unwrap().expect("free");
    let script = r#"
import sys, time, redis
port = int(sys.argv[1])
inbox, pool = redis.Redis(port=port), redis.Redis(port=port)
sid = inbox.execute_command("FLOCK.SESSION")
for i in range(3):
    pool.execute_command("FLOCK.ACQUIRE", "L", f"child-{i}", 60000, "WAIT", 0, "INBOX", sid)
inbox.execute_command("FLOCK.INBOX", 0)
"#;
    let mut child =
        std::process::Command::new("python3").args(["-c", script, &s.port.to_string()]).spawn().expect("python3");
    wait_until("the child's three waits queue", Duration::from_secs(10), || queue_of(&mut c, "L").len() == 3);
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    wait_until("its waiters leave", Duration::from_secs(10), || queue_of(&mut c, "L").is_empty());
    assert_eq!(flock_stats(&mut c)["sessions"], 0);
    assert_eq!(release(&mut c, "L", "holder").unwrap(), 0);
    assert!(!exists(&mut c, "L"), "nobody was left to hand the lock to");
}
