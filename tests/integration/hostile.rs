//! Bad input and hostile use beyond the table in tests/integration/commands.rs (issue 5):
//! FLOCK on a replica, inside MULTI/EXEC and inside scripts, binary owners
//! and keys, the waiter limit, a thousand waiters that vanish at once, and
//! ACL users. Each case checks the error class and that nothing changed.
//! Every test ends its servers with SHUTDOWN, so that under `make
//! leakcheck` valgrind writes a leak report for each.
use crate::common::*;

use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// Helpers.

/// What FLOCK.INFO shows of `key` (its error class for a key of another type).
fn lock_state(c: &mut Connection, key: &[u8]) -> String {
    match redis::cmd("FLOCK.INFO").arg(key).query::<Value>(c) {
        Ok(_) => format!("{:?}", info_still(c, key)),
        Err(e) => error_code(&e),
    }
}

/// What an observer can see of the server: keys, the given locks, waiters,
/// blocked clients and the grant counters.
#[derive(Debug, PartialEq)]
struct Snapshot {
    keys: i64,
    locks: Vec<String>,
    stats: Vec<(&'static str, i64)>,
    blocked: i64,
}

fn snapshot(s: &Server, c: &mut Connection, keys: &[&[u8]]) -> Snapshot {
    let st = s.stats();
    let stats = ["locks", "waiters", "grants", "releases", "force_releases", "reentrant_acquires"].map(|k| (k, st[k]));
    Snapshot {
        keys: dbsize(c),
        locks: keys.iter().map(|k| lock_state(c, k)).collect(),
        stats: stats.to_vec(),
        blocked: s.blocked_clients(),
    }
}

/// The class of a reply: an error code, or the kind of value.
fn class(r: &RedisResult<Value>) -> String {
    match r {
        Err(e) => error_code(e),
        Ok(Value::ServerError(e)) => e.code().to_string(),
        Ok(Value::Nil) => "nil".into(),
        Ok(Value::Int(_)) => "int".into(),
        Ok(Value::Array(_)) => "array".into(),
        Ok(Value::Okay) | Ok(Value::SimpleString(_)) => "ok".into(),
        Ok(other) => format!("{other:?}"),
    }
}

fn cmd<A: redis::ToRedisArgs>(args: &[A]) -> redis::Cmd {
    let mut c = redis::Cmd::new();
    for a in args {
        c.arg(a);
    }
    c
}

/// Sends `cmds` in one write and reads one reply each, errors included.
fn exchange(c: &mut Connection, cmds: &[redis::Cmd]) -> Vec<RedisResult<Value>> {
    let packed: Vec<u8> = cmds.iter().flat_map(|c| c.get_packed_command()).collect();
    c.send_packed_command(&packed).expect("send");
    cmds.iter().map(|_| c.recv_response()).collect()
}

/// Queues `cmds` between MULTI and EXEC; the replies to each queued
/// command, then EXEC's.
fn multi_exec(c: &mut Connection, cmds: &[redis::Cmd]) -> (Vec<String>, RedisResult<Value>) {
    let mut all = vec![cmd(&["MULTI"])];
    all.extend(cmds.iter().cloned());
    all.push(cmd(&["EXEC"]));
    let mut replies = exchange(c, &all);
    let exec = replies.pop().expect("EXEC reply");
    (replies[1..].iter().map(class).collect(), exec)
}

/// Opens a connection that sends `FLOCK.ACQUIRE key owner lease WAIT wait`
/// without reading the reply (it blocks in the server).
fn queue_raw(s: &Server, key: &[u8], owner: &[u8], wait_ms: u64) -> Connection {
    send_wait(s.conn(), key, owner, wait_ms)
}

fn send_wait(mut c: Connection, key: &[u8], owner: &[u8], wait_ms: u64) -> Connection {
    let cmd = redis::cmd("FLOCK.ACQUIRE").arg(key).arg(owner).arg(60_000).arg("WAIT").arg(wait_ms).get_packed_command();
    c.send_packed_command(&cmd).expect("send");
    c
}

fn wait_for_waiters(s: &Server, n: i64) {
    wait_until(&format!("{n} waiters"), 20 * SECOND, || s.stat("waiters") == n && s.blocked_clients() == n);
}

/// The token a raw-queued waiter was granted.
fn granted_raw(c: &mut Connection, who: &str) -> i64 {
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    match c.recv_response() {
        Ok(Value::Int(t)) => t,
        other => panic!("{who}: expected a grant, got {other:?}"),
    }
}

fn eval(c: &mut Connection, script: &str, keys: &[&str]) -> RedisResult<Value> {
    redis::cmd("EVAL").arg(script).arg(keys.len()).arg(keys).query(c)
}

/// The server most tests start from: `L` held twice by `a` with a long
/// lease (`token`), `w` queued behind it on a raw connection, and a string
/// key `S`.
struct Fixture {
    s: Server,
    c: Connection,
    w: Connection,
    token: i64,
}

impl Fixture {
    fn start() -> Fixture {
        let s = Server::start();
        let mut c = s.conn();
        let token = acquire(&mut c, "L", "a", 1_000_000).unwrap().expect("granted");
        acquire(&mut c, "L", "a", 1_000_000).unwrap().expect("reentered");
        let w = queue_raw(&s, b"L", b"w", 60_000);
        wait_queue(&mut c, "L", &["w"]);
        let _: () = redis::cmd("SET").arg("S").arg("string").query(&mut c).unwrap();
        Fixture { s, c, w, token }
    }

    /// `w` is still served; then the server shuts down.
    fn finish(mut self) {
        force_release(&mut self.c, "L").unwrap();
        granted_raw(&mut self.w, "w");
        self.s.stop(Stop::ShutdownNoSave);
    }
}

const FIXTURE_KEYS: [&[u8]; 3] = [b"L", b"S", b"M"];

// ---------------------------------------------------------------------------
// Replica.

#[test]
fn replica_refuses_writes_with_readonly_and_serves_flock_info() {
    let Fixture { s: m, c: mut mc, w, token } = Fixture::start();
    let mut r = Server::replica_of(&m);
    let mut rc = r.conn();
    wait_until("the lock reached the replica", 10 * SECOND, || owner_of(&mut rc, "L").as_deref() == Some("a"));
    let replica_before = snapshot(&r, &mut rc, &FIXTURE_KEYS);
    let master_before = snapshot(&m, &mut mc, &FIXTURE_KEYS);

    let writes: Vec<Vec<&str>> = vec![
        vec!["FLOCK.ACQUIRE", "L", "b", "1000"],
        vec!["FLOCK.ACQUIRE", "L", "a", "1000"],
        vec!["FLOCK.ACQUIRE", "L", "b", "1000", "WAIT", "0"],
        vec!["FLOCK.ACQUIRE", "M", "b", "1000", "WAIT", "1000", "SESSION"],
        vec!["FLOCK.RELEASE", "L", "a"],
        vec!["FLOCK.RENEW", "L", "a", "1000"],
        vec!["FLOCK.FORCERELEASE", "L"],
        vec!["FLOCK.FORCERELEASE", "M"],
    ];
    let started = Instant::now();
    for args in &writes {
        let r = cmd(args).query::<Value>(&mut rc);
        assert_eq!(class(&r), "READONLY", "{args:?} on the replica: {r:?}");
    }
    assert!(started.elapsed() < 5 * SECOND, "a refused WAIT blocked: {:?}", started.elapsed());
    // A script and a transaction are refused the same way.
    let e = eval(&mut rc, "return redis.call('FLOCK.ACQUIRE', KEYS[1], 'b', 1000)", &["M"]);
    assert_eq!(class(&e), "READONLY", "EVAL on the replica: {e:?}");
    let (queued, exec) = multi_exec(&mut rc, &[cmd(&["FLOCK.RELEASE", "L", "a"])]);
    assert!(queued == ["READONLY"] && class(&exec) == "EXECABORT", "MULTI on the replica: {queued:?}, {exec:?}");

    // Reads work and show the master's holder (waiters are connection
    // state, not replicated).
    let info = info_still(&mut rc, b"L");
    let holder = |i: &Option<Vec<(String, Value)>>| ["owner", "holds", "token", "session"].map(|f| field(i, f));
    assert_eq!(holder(&info), holder(&info_still(&mut mc, b"L")));
    assert_eq!(int(&field(&info, "token")), token);
    assert_eq!(info_still(&mut rc, b"M"), None);
    let ro =
        redis::cmd("EVAL_RO").arg("return redis.call('FLOCK.INFO', KEYS[1])").arg(1).arg("L").query::<Value>(&mut rc);
    assert_eq!(class(&ro), "array", "EVAL_RO FLOCK.INFO on the replica: {ro:?}");

    assert_eq!(snapshot(&r, &mut rc, &FIXTURE_KEYS), replica_before, "the replica changed");
    assert_eq!(snapshot(&m, &mut mc, &FIXTURE_KEYS), master_before, "the master changed");
    r.stop(Stop::ShutdownNoSave);
    Fixture { s: m, c: mc, w, token }.finish();
}

fn field(info: &Option<Vec<(String, Value)>>, name: &str) -> Value {
    info.as_ref().and_then(|i| i.iter().find(|(k, _)| k == name)).map(|(_, v)| v.clone()).unwrap_or(Value::Nil)
}

// ---------------------------------------------------------------------------
// MULTI/EXEC.

#[test]
fn multi_with_a_malformed_flock_command_is_aborted_and_changes_nothing() {
    let Fixture { s, mut c, w, token } = Fixture::start();
    let before = snapshot(&s, &mut c, &FIXTURE_KEYS);
    // Arity is checked when the command is queued, as for built-in commands;
    // an unknown command name is refused there too.
    let malformed: Vec<Vec<&str>> = vec![
        vec!["FLOCK.ACQUIRE", "M"],
        vec!["FLOCK.ACQUIRE", "M", "b"],
        vec!["FLOCK.RELEASE", "L"],
        vec!["FLOCK.RENEW", "L", "a"],
        vec!["FLOCK.FORCERELEASE"],
        vec!["FLOCK.INFO"],
        vec!["FLOCK.ACQUIR", "M", "b", "1000"],
        vec!["FLOCK.FORCERELEASES", "L"],
    ];
    for bad in &malformed {
        // A valid write before and after the bad one: neither may run.
        let cmds = [cmd(&["FLOCK.ACQUIRE", "M", "b", "1000"]), cmd(bad), cmd(&["FLOCK.FORCERELEASE", "L"])];
        let (queued, exec) = multi_exec(&mut c, &cmds);
        assert_eq!(queued[0], "ok", "{bad:?}: {queued:?}");
        assert_eq!(queued[1], "ERR", "{bad:?} must be refused when queued: {queued:?}");
        assert_eq!(class(&exec), "EXECABORT", "{bad:?}: EXEC gave {exec:?}");
        assert_eq!(snapshot(&s, &mut c, &FIXTURE_KEYS), before, "{bad:?} in MULTI changed the server");
    }
    Fixture { s, c, w, token }.finish();
}

#[test]
fn runtime_errors_inside_exec_fail_alone_and_the_rest_runs() {
    let Fixture { s, mut c, w, token } = Fixture::start();
    let l_before = info_still(&mut c, b"L");
    let cmds: Vec<redis::Cmd> = [
        &["FLOCK.RELEASE", "L", "zz"][..],
        &["FLOCK.RENEW", "L", "zz", "1000"],
        &["FLOCK.ACQUIRE", "L", "b", "0"],
        &["FLOCK.ACQUIRE", "L", "b", "1000", "WAIT", "-1"],
        &["FLOCK.RENEW", "L", "a", "1.5"],
        &["FLOCK.ACQUIRE", "L", "b", "1000", "NX"],
        &["FLOCK.ACQUIRE", "L", "w", "1000"],
        &["FLOCK.ACQUIRE", "S", "b", "1000"],
        &["FLOCK.INFO", "S"],
        // A WAIT inside MULTI is a try: nil, nothing queued.
        &["FLOCK.ACQUIRE", "L", "b", "1000", "WAIT", "0"],
        &["FLOCK.ACQUIRE", "K", "k", "1000000"],
        &["FLOCK.INFO", "L"],
    ]
    .iter()
    .map(|a| cmd(a))
    .collect();
    let (queued, exec) = multi_exec(&mut c, &cmds);
    assert!(queued.iter().all(|q| q == "ok"), "every command is queued: {queued:?}");
    let Ok(Value::Array(replies)) = exec else { panic!("EXEC: {exec:?}") };
    let classes: Vec<String> = replies.into_iter().map(|v| class(&Ok(v))).collect();
    let want =
        ["NOTOWNER", "NOTOWNER", "ERR", "ERR", "ERR", "ERR", "QUEUED", "WRONGTYPE", "WRONGTYPE", "nil", "int", "array"];
    assert_eq!(classes, want);
    // Only the valid ACQUIRE of K changed anything.
    assert_eq!(info_still(&mut c, b"L"), l_before);
    assert_eq!(owner_of(&mut c, "K").as_deref(), Some("k"));
    assert_eq!(dbsize(&mut c), 3);
    assert_eq!((s.stat("waiters"), s.blocked_clients()), (1, 1));
    Fixture { s, c, w, token }.finish();
}

// ---------------------------------------------------------------------------
// Scripts.

#[test]
fn errors_inside_scripts_propagate_with_their_class() {
    let Fixture { s, mut c, w, token } = Fixture::start();
    let before = snapshot(&s, &mut c, &FIXTURE_KEYS);
    let cases = [
        ("return redis.call('FLOCK.RELEASE', KEYS[1], 'zz')", "NOTOWNER"),
        ("return redis.call('FLOCK.RENEW', KEYS[1], 'zz', 1000)", "NOTOWNER"),
        // pcall hands the error to the script, which returns it.
        ("return redis.pcall('FLOCK.RELEASE', KEYS[1], 'zz')", "NOTOWNER"),
        ("return redis.call('FLOCK.ACQUIRE', KEYS[1])", "ERR"),
        ("return redis.call('FLOCK.ACQUIRE', KEYS[1], 'b', 0)", "ERR"),
        ("return redis.call('FLOCK.ACQUIRE', KEYS[1], 'b', '1e3')", "ERR"),
        ("return redis.call('FLOCK.ACQUIRE', KEYS[1], 'b', 1000, 'WAIT')", "ERR"),
        ("return redis.call('FLOCK.ACQUIRE', KEYS[1], '', 1000)", "ERR"),
        ("return redis.call('FLOCK.ACQUIRE', KEYS[1], 'w', 1000)", "QUEUED"),
        ("return redis.call('FLOCK.ACQUIRE', 'S', 'b', 1000)", "WRONGTYPE"),
        ("return redis.call('FLOCK.INFO', 'S')", "WRONGTYPE"),
        ("return redis.call('FLOCK.FORCERELEASE')", "ERR"),
        // Where blocking is not allowed, WAIT is a try.
        ("return redis.call('FLOCK.ACQUIRE', KEYS[1], 'b', 1000, 'WAIT', 0)", "nil"),
    ];
    for (script, want) in cases {
        let r = eval(&mut c, script, &["L"]);
        assert_eq!(class(&r), want, "{script}: {r:?}");
        if let Err(e) = &r {
            let pcall = script.contains("pcall");
            assert!(
                pcall || e.detail().is_some_and(|d| d.contains("script")),
                "{script}: a script error names the script: {e}"
            );
        }
        assert_eq!(snapshot(&s, &mut c, &FIXTURE_KEYS), before, "{script} changed the server");
    }
    // Read-only scripts may read a lock but not take one.
    let r = redis::cmd("EVAL_RO")
        .arg("return redis.call('FLOCK.ACQUIRE', KEYS[1], 'b', 1000)")
        .arg(1)
        .arg("M")
        .query::<Value>(&mut c);
    assert_eq!(class(&r), "ERR", "EVAL_RO FLOCK.ACQUIRE: {r:?}");
    let r =
        redis::cmd("EVAL_RO").arg("return redis.call('FLOCK.INFO', KEYS[1])").arg(1).arg("L").query::<Value>(&mut c);
    assert_eq!(class(&r), "array", "EVAL_RO FLOCK.INFO: {r:?}");
    assert_eq!(snapshot(&s, &mut c, &FIXTURE_KEYS), before);

    // As for any command, what a script did before its error stays done.
    let script =
        "redis.call('FLOCK.ACQUIRE', KEYS[2], 'a', 1000000); return redis.call('FLOCK.RELEASE', KEYS[1], 'zz')";
    let r = eval(&mut c, script, &["L", "M"]);
    assert_eq!(class(&r), "NOTOWNER");
    assert_eq!(owner_of(&mut c, "M").as_deref(), Some("a"));
    Fixture { s, c, w, token }.finish();
}

// ---------------------------------------------------------------------------
// Binary owners and keys.

#[test]
fn binary_owners_and_keys_are_exact_bytes_everywhere() {
    let mut s = Server::start();
    let mut c = s.conn();
    config_set(&mut c, &[("notify-keyspace-events", "KEA")]);
    let key: &[u8] = b"k\0e\ny %s%n";
    let owners: [&[u8]; 6] =
        [b"a\0b", b"a\0c", b"line\nbreak\r\n", b"%s%n%d%x%p", b"*3\r\n$4\r\nPING\r\n", b"\xff\0\xfe"];
    let acquire_bytes = |c: &mut Connection, owner: &[u8], extra: &[&str]| -> RedisResult<Option<i64>> {
        redis::cmd("FLOCK.ACQUIRE").arg(key).arg(owner).arg(1_000_000).arg(extra).query(c)
    };
    let t0 = acquire_bytes(&mut c, owners[0], &["SESSION"]).unwrap().expect("granted");
    // An owner that differs after a NUL byte, or is a prefix, is someone else.
    assert_eq!(acquire_bytes(&mut c, owners[1], &[]).unwrap(), None);
    for other in [&b"a"[..], b"a\0", b"a\0b\0"] {
        let e = redis::cmd("FLOCK.RENEW").arg(key).arg(other).arg(1000).query::<i64>(&mut c).unwrap_err();
        assert_eq!(error_code(&e), "NOTOWNER", "{other:?}");
    }
    assert_eq!(redis::cmd("FLOCK.RENEW").arg(key).arg(owners[0]).arg(1_000_000).query::<i64>(&mut c).unwrap(), t0);

    // The others queue in order and FLOCK.INFO lists their exact bytes.
    let mut waiters: Vec<Connection> = Vec::new();
    for (i, owner) in owners[1..].iter().enumerate() {
        waiters.push(queue_raw(&s, key, owner, 60_000));
        wait_for_waiters(&s, i as i64 + 1);
    }
    let queue = field(&info_still(&mut c, key), "queue");
    let want: Vec<Value> = owners[1..].iter().map(|o| Value::BulkString(o.to_vec())).collect();
    assert_eq!(queue, Value::Array(want));
    // The same bytes on another connection are the same (queued) owner.
    let e = acquire_bytes(&mut s.conn(), owners[2], &[]).unwrap_err();
    assert_eq!(error_code(&e), "QUEUED");

    // Release by each holder in turn hands the lock down the queue.
    let mut last = t0;
    for (i, owner) in owners.iter().enumerate() {
        if i > 0 {
            let t = granted_raw(&mut waiters[i - 1], &format!("{owner:?}"));
            assert!(t > last);
            last = t;
        }
        assert_eq!(field(&info_still(&mut c, key), "owner"), Value::BulkString(owner.to_vec()));
        let left: i64 = redis::cmd("FLOCK.RELEASE").arg(key).arg(owner).query(&mut c).unwrap();
        assert_eq!(left, 0);
    }
    assert_eq!(dbsize(&mut c), 0);
    let pong: String = redis::cmd("PING").query(&mut c).unwrap();
    assert_eq!(pong, "PONG");
    s.stop(Stop::ShutdownNoSave);
}

// ---------------------------------------------------------------------------
// The waiter limit.

#[test]
fn max_waiters_refuses_the_next_waiter_and_changes_nothing() {
    const LIMIT: usize = 5;
    let mut s = Server::start();
    let mut c = s.conn();
    config_set(&mut c, &[("flock.max-waiters", &LIMIT.to_string())]);
    acquire(&mut c, "L", "h", 1_000_000).unwrap().expect("granted");
    let mut waiters: Vec<Connection> =
        (0..LIMIT).map(|i| queue_raw(&s, b"L", format!("w{i}").as_bytes(), 60_000)).collect();
    wait_for_waiters(&s, LIMIT as i64);
    let names: Vec<String> = (0..LIMIT).map(|i| format!("w{i}")).collect();
    let before = snapshot(&s, &mut c, &[b"L"]);

    let mut extra = s.conn();
    let started = Instant::now();
    for args in [&["WAIT", "0"][..], &["WAIT", "100000"], &["WAIT", "10", "SESSION"]] {
        let r = redis::cmd("FLOCK.ACQUIRE").arg("L").arg("x").arg(1000).arg(args).query::<Value>(&mut extra);
        assert_eq!(class(&r), "MAXWAITERS", "{args:?}: {r:?}");
        assert_eq!(snapshot(&s, &mut c, &[b"L"]), before, "a refused waiter changed the server");
    }
    assert!(started.elapsed() < 5 * SECOND, "a refused waiter was blocked");
    // The refused connection is free; a try and the holder's reentry are
    // not waiters; another lock has its own limit.
    assert_eq!(acquire(&mut extra, "L", "x", 1000).unwrap(), None);
    assert!(acquire(&mut c, "L", "h", 1_000_000).unwrap().is_some());
    assert_eq!(release(&mut c, "L", "h").unwrap(), 1);
    acquire(&mut c, "M", "h", 1_000_000).unwrap().expect("granted");
    let mut other: Vec<Connection> =
        (0..LIMIT).map(|i| queue_raw(&s, b"M", format!("m{i}").as_bytes(), 60_000)).collect();
    wait_for_waiters(&s, 2 * LIMIT as i64);
    assert_eq!(queue_of(&mut c, "L"), names);

    // Every queued waiter is still served, in order.
    for (key, conns) in [("L", &mut waiters), ("M", &mut other)] {
        for (i, w) in conns.iter_mut().enumerate() {
            force_release(&mut c, key).unwrap();
            granted_raw(w, &format!("{key} waiter {i}"));
        }
    }
    assert_eq!((s.stat("waiters"), s.blocked_clients()), (0, 0));
    s.stop(Stop::ShutdownNoSave);
}

// ---------------------------------------------------------------------------
// A thousand waiters vanish at once.

/// `Max open files` of this process: each connection costs a descriptor
/// here and one in the server, which inherits the limit.
fn open_files_limit() -> usize {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|n| n.parse().ok())
        .unwrap_or(1024)
}

#[test]
fn a_thousand_dropped_waiters_free_everything() {
    // Leave room for the other test running alongside.
    let n = 1_000.min(open_files_limit().saturating_sub(400) / 2);
    assert!(n >= 100, "open files limit {} is too low", open_files_limit());
    if n < 1_000 {
        eprintln!("hostile: only {n} waiters: `ulimit -n` is {}", open_files_limit());
    }
    let mut s = Server::start();
    let mut c = s.conn();
    let baseline = s.purged_memory();
    let key = |i: usize| {
        if i.is_multiple_of(4) {
            "q:shared".to_string()
        } else {
            format!("q:{i}")
        }
    };
    let held: Vec<usize> = (0..n).filter(|&i| !i.is_multiple_of(4)).chain([0]).collect();
    let mut p = redis::pipe();
    for &i in &held {
        p.cmd("FLOCK.ACQUIRE").arg(key(i)).arg("holder").arg(1_000_000).ignore();
    }
    let _: () = p.query(&mut c).unwrap();
    let locks = held.len() as i64;
    assert_eq!(s.stat("locks"), locks);
    // Three in four wait on a lock of their own, the rest share one; half
    // ask for SESSION, half have a timeout they never reach.
    let waiters: Vec<Connection> = (0..n)
        .map(|i| {
            let mut w = s.conn();
            let mut cmd = redis::cmd("FLOCK.ACQUIRE");
            cmd.arg(key(i)).arg(format!("w{i}")).arg(60_000).arg("WAIT").arg(if i % 3 == 0 { 0 } else { 600_000 });
            if i % 2 == 0 {
                cmd.arg("SESSION");
            }
            w.send_packed_command(&cmd.get_packed_command()).unwrap();
            w
        })
        .collect();
    wait_for_waiters(&s, n as i64);
    assert_eq!(queue_of(&mut c, "q:shared").len(), n.div_ceil(4));
    drop(waiters);
    wait_until("every waiter left", 30 * SECOND, || s.stat("waiters") == 0 && s.blocked_clients() == 0);
    assert_eq!(s.stat("wait_disconnects"), n as i64);
    assert_eq!(s.stat("grants"), locks, "nobody was granted");
    assert_eq!(s.stat("locks"), locks);
    for i in [0, 1, n - 1] {
        assert!(queue_of(&mut c, &key(i)).is_empty(), "{} still has a queue", key(i));
        assert_eq!(owner_of(&mut c, &key(i)).as_deref(), Some("holder"));
    }

    let mut p = redis::pipe();
    for &i in &held {
        p.cmd("FLOCK.RELEASE").arg(key(i)).arg("holder").ignore();
    }
    let _: () = p.query(&mut c).unwrap();
    assert_eq!((s.stat("locks"), dbsize(&mut c)), (0, 0));
    // Redis frees the blocked clients' pooled reply clients in its cron,
    // seconds later: most of this test's 5 s.
    let mut used = s.purged_memory();
    let deadline = Instant::now() + 30 * SECOND;
    while used - baseline > 1 << 20 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
        used = s.purged_memory();
    }
    eprintln!("hostile: {n} dropped waiters: used_memory {baseline} -> {used}");
    assert!(
        used - baseline <= 1 << 20,
        "used_memory {used} stays {} bytes above the baseline {baseline}",
        used - baseline
    );
    s.stop(Stop::ShutdownNoSave);
}

// ---------------------------------------------------------------------------
// ACL.

/// A connection as the ACL user `user` (password `pw`).
fn user_conn(s: &Server) -> Connection {
    redis::Client::open(format!("redis://user:pw@127.0.0.1:{}/", s.port)).unwrap().get_connection().expect("AUTH")
}

/// A server, an admin connection, and one as the user `user` with `rules`.
fn acl_server(rules: &[&str]) -> (Server, Connection, Connection) {
    let s = Server::start();
    let mut admin = s.conn();
    let setuser = redis::cmd("ACL").arg("SETUSER").arg("user").arg(&["reset", "on", ">pw"][..]).arg(rules).clone();
    let _: () = setuser.query(&mut admin).expect("ACL SETUSER");
    let user = user_conn(&s);
    (s, admin, user)
}

/// Every FLOCK command on `key` except FLOCK.INFO, as `owner`.
fn writes(key: &str, owner: &str) -> Vec<Vec<String>> {
    let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    vec![
        v(&["FLOCK.ACQUIRE", key, owner, "1000"]),
        v(&["FLOCK.ACQUIRE", key, owner, "1000", "WAIT", "0"]),
        v(&["FLOCK.ACQUIRE", key, owner, "1000", "WAIT", "100", "SESSION"]),
        v(&["FLOCK.RENEW", key, owner, "1000"]),
        v(&["FLOCK.RELEASE", key, owner]),
        v(&["FLOCK.FORCERELEASE", key]),
        v(&["FLOCK.CANCEL", key, owner]),
        v(&["FLOCK.ACQUIREALL", "1", key, owner, "1000", "WAIT", "0"]),
        v(&["FLOCK.RELEASEALL", "1", key, owner]),
    ]
}

/// Each of `cmds` from `user` is refused with NOPERM and changes nothing
/// that `admin` can see of `keys`.
fn assert_refused(
    s: &Server,
    admin: &mut Connection,
    user: &mut Connection,
    keys: &[&str],
    cmds: &[Vec<String>],
    what: &str,
) {
    let keys: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
    let before = snapshot(s, admin, &keys);
    for args in cmds {
        let r = cmd(args).query::<Value>(user);
        assert_eq!(class(&r), "NOPERM", "{what}: {args:?} gave {r:?}");
    }
    assert_eq!(snapshot(s, admin, &keys), before, "{what}: refused commands changed something");
}

fn info_cmd(key: &str) -> Vec<String> {
    vec!["FLOCK.INFO".to_string(), key.to_string()]
}

#[test]
fn acl_key_pattern_user_can_lock_app_keys_only() {
    let (mut s, mut admin, mut app) = acl_server(&["~app:*", "+@all"]);
    acquire(&mut admin, "other:x", "admin", 1_000_000).unwrap().expect("granted");
    let keys = ["other:x", "other:y"];
    let cmds: Vec<_> = keys.iter().flat_map(|k| writes(k, "admin").into_iter().chain([info_cmd(k)])).collect();
    assert_refused(&s, &mut admin, &mut app, &keys, &cmds, "~app:* on another key");

    let t = acquire(&mut app, "app:x", "me", 60_000).unwrap().expect("granted");
    assert_eq!(acquire(&mut app, "app:x", "me", 60_000).unwrap(), Some(t));
    assert_eq!(renew(&mut app, "app:x", "me", 60_000).unwrap(), t);
    assert_eq!(owner_of(&mut app, "app:x").as_deref(), Some("me"));
    assert_eq!(release(&mut app, "app:x", "me").unwrap(), 1);
    // A waiter of this user is handed the lock like any other.
    let mut w = send_wait(user_conn(&s), b"app:x", b"you", 0);
    wait_for_waiters(&s, 1);
    assert_eq!(force_release(&mut app, "app:x").unwrap(), 1);
    assert!(granted_raw(&mut w, "you") > t);
    assert_eq!(release(&mut w, "app:x", "you").unwrap(), 0);
    assert_eq!(dbsize(&mut admin), 1);
    s.stop(Stop::ShutdownNoSave);
}

#[test]
fn acl_read_only_key_permission_allows_only_flock_info() {
    let (mut s, mut admin, mut reader) = acl_server(&["%R~app:*", "+@all"]);
    acquire(&mut admin, "app:x", "admin", 1_000_000).unwrap().expect("granted");
    let keys = ["app:x", "app:new"];
    let cmds: Vec<_> = keys.iter().flat_map(|k| writes(k, "admin")).collect();
    assert_refused(&s, &mut admin, &mut reader, &keys, &cmds, "%R~app:*");
    assert_eq!(owner_of(&mut reader, "app:x").as_deref(), Some("admin"), "%R~app:* may read the lock");
    assert_eq!(info(&mut reader, "app:new"), None);
    s.stop(Stop::ShutdownNoSave);
}

#[test]
fn acl_write_only_key_permission_allows_all_but_flock_info() {
    // The write commands' key specs are RW without ACCESS: Redis asks for
    // write permission only. FLOCK.INFO (RO ACCESS) needs read permission.
    let (mut s, mut admin, mut writer) = acl_server(&["%W~app:*", "+@all"]);
    let t = acquire(&mut writer, "app:x", "me", 60_000).unwrap().expect("granted");
    assert_eq!(renew(&mut writer, "app:x", "me", 60_000).unwrap(), t);
    assert_refused(&s, &mut admin, &mut writer, &["app:x"], &[info_cmd("app:x")], "%W~app:*");
    assert_eq!(release(&mut writer, "app:x", "me").unwrap(), 0);
    acquire(&mut admin, "app:y", "admin", 60_000).unwrap().expect("granted");
    assert_eq!(force_release(&mut writer, "app:y").unwrap(), 1);
    assert_eq!(dbsize(&mut admin), 0);
    s.stop(Stop::ShutdownNoSave);
}

#[test]
fn acl_rule_minus_flock_forcerelease_denies_only_forcerelease() {
    let (mut s, mut admin, mut user) = acl_server(&["~app:*", "+@all", "-flock.forcerelease"]);
    acquire(&mut admin, "app:held", "admin", 1_000_000).unwrap().expect("granted");
    let keys = ["app:held", "app:none"];
    let cmds: Vec<_> = keys.iter().map(|k| vec!["FLOCK.FORCERELEASE".to_string(), k.to_string()]).collect();
    assert_refused(&s, &mut admin, &mut user, &keys, &cmds, "-flock.forcerelease");
    let before = snapshot(&s, &mut admin, &[b"app:held"]);
    // From a script the rule holds too. The error's wording is the server's
    // (Redis 7.0: "can't run this command", 8.2 and Valkey: "ACL failure in
    // script"); what every server shares is the refusal, logged in ACL LOG.
    let _: () = redis::cmd("ACL").arg("LOG").arg("RESET").query(&mut admin).unwrap();
    let r = eval(&mut user, "return redis.call('FLOCK.FORCERELEASE', KEYS[1])", &["app:held"]);
    assert!(r.is_err(), "FORCERELEASE from a script: {r:?}");
    let log: Vec<std::collections::HashMap<String, Value>> = redis::cmd("ACL").arg("LOG").query(&mut admin).unwrap();
    let entry = |e: &std::collections::HashMap<String, Value>, k: &str| {
        e.get(k).and_then(|v| redis::from_redis_value::<String>(v).ok()).unwrap_or_default()
    };
    assert!(
        log.iter().any(|e| entry(e, "reason") == "command"
            && entry(e, "context") == "lua"
            && entry(e, "object") == "flock.forcerelease"),
        "the script's FORCERELEASE refused by ACL: {r:?}, ACL LOG {log:?}"
    );
    assert_eq!(snapshot(&s, &mut admin, &[b"app:held"]), before);

    // Everything else works for this user.
    let t = acquire(&mut user, "app:x", "me", 60_000).unwrap().expect("granted");
    assert_eq!(renew(&mut user, "app:x", "me", 60_000).unwrap(), t);
    assert_eq!(owner_of(&mut user, "app:x").as_deref(), Some("me"));
    assert_eq!(acquire_wait(&mut user, "app:held", "me", 1000, 50).unwrap(), None, "a WAIT that times out");
    assert_eq!(release(&mut user, "app:x", "me").unwrap(), 0);
    s.stop(Stop::ShutdownNoSave);
}

/// Redis 7.2+ lets a module put its commands into ACL categories and Redis
/// 8.0+ (and Valkey 9) lets it add its own: there `-@write` denies FLOCK's
/// writes, `+@read` allows FLOCK.INFO and `-@flock` denies all of FLOCK.
/// Redis 7.0 has neither: FLOCK's commands are in no category, so rules must
/// name them (`-flock.acquire`); the test checks that gap too, as documented.
#[test]
fn acl_categories_write_read_flock_on_redis_8_and_valkey_9_but_none_on_redis_7_0() {
    let (mut s, mut admin, mut user) = acl_server(&["~*", "+@all", "-@write"]);
    let (family, major, minor) = server_version(&mut admin);
    let categories = family == "valkey" || (major, minor) >= (8, 0);
    let listed: Vec<String> = redis::cmd("ACL").arg("CAT").query(&mut admin).unwrap();
    assert_eq!(listed.iter().any(|c| c == "flock"), categories, "{family} {major}.{minor}: ACL CAT {listed:?}");
    acquire(&mut admin, "k", "admin", 1_000_000).unwrap().expect("granted");
    if !categories {
        // Redis 7.0: `-@write` does not reach module commands.
        assert_eq!(acquire(&mut user, "free", "me", 60_000).unwrap().map(|_| "granted"), Some("granted"));
        assert_eq!(owner_of(&mut user, "k").as_deref(), Some("admin"));
        s.stop(Stop::ShutdownNoSave);
        return;
    }
    let mut flock: Vec<String> = redis::cmd("ACL").arg("CAT").arg("flock").query(&mut admin).unwrap();
    flock.sort();
    // Sorted; the internal FLOCK.FREE, FLOCK.HOLDER, FLOCK.ID and FLOCK.STATE are in it too.
    let all = [
        "flock.acquire",
        "flock.acquireall",
        "flock.cancel",
        "flock.fenced",
        "flock.forcerelease",
        "flock.free",
        "flock.holder",
        "flock.id",
        "flock.inbox",
        "flock.info",
        "flock.longlog",
        "flock.owner",
        "flock.release",
        "flock.releaseall",
        "flock.renew",
        "flock.session",
        "flock.state",
        "flock.top",
    ];
    assert_eq!(flock, all, "ACL CAT flock");
    // A session's commands are connection state, as CLIENT's are: not @write.
    let mut connection: Vec<String> = redis::cmd("ACL").arg("CAT").arg("connection").query(&mut admin).unwrap();
    connection.retain(|c| c.starts_with("flock."));
    connection.sort();
    assert_eq!(connection, ["flock.inbox", "flock.session"], "ACL CAT connection");

    // -@write: every write refused, FLOCK.INFO allowed.
    assert_refused(&s, &mut admin, &mut user, &["k", "free"], &writes("k", "me"), "-@write");
    assert_refused(&s, &mut admin, &mut user, &["free"], &writes("free", "me"), "-@write");
    assert_eq!(owner_of(&mut user, "k").as_deref(), Some("admin"), "FLOCK.INFO is @read");

    // -@flock: FLOCK.INFO refused too, other commands still allowed.
    let rules = ["reset", "on", ">pw", "~*", "+@all", "-@flock"];
    let _: () = redis::cmd("ACL").arg("SETUSER").arg("user").arg(&rules[..]).query(&mut admin).unwrap();
    let mut user = user_conn(&s);
    let mut cmds = writes("k", "me");
    cmds.push(info_cmd("k"));
    assert_refused(&s, &mut admin, &mut user, &["k"], &cmds, "-@flock");
    let _: () = user.set("plain", 1).expect("SET is not @flock");

    // +@read only: FLOCK.INFO allowed, writes refused.
    let rules = ["reset", "on", ">pw", "~*", "+@read"];
    let _: () = redis::cmd("ACL").arg("SETUSER").arg("user").arg(&rules[..]).query(&mut admin).unwrap();
    let mut user = user_conn(&s);
    assert_eq!(owner_of(&mut user, "k").as_deref(), Some("admin"));
    assert_refused(&s, &mut admin, &mut user, &["k"], &writes("k", "me"), "+@read");
    s.stop(Stop::ShutdownNoSave);
}
