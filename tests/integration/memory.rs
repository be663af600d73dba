//! Bounded memory (issue 5): `used_memory` returns to its baseline after
//! 100,000 locks and 100,000 waiters came and went (`make soak`); `make test`
//! runs a quarter of each, which still shows a leak of 42 bytes or more per
//! lock or waiter above the 1 MB margin (and `make leakcheck` any leak).
//!
//! `FLOCK_MEMORY_SCALE` (a percentage of the full counts) sets the scale, as
//! for runs under valgrind (`make leakcheck`).
use crate::common::*;

use std::time::{Duration, Instant};

/// How far above the baseline `used_memory` may settle.
const MARGIN: i64 = 1 << 20;
/// Commands per pipeline when filling the server.
const BATCH: usize = 5_000;
/// Waiting connections (each is one waiter at a time).
const WAITERS: usize = 300;
/// Locks the waiters queue on.
const KEYS: usize = 10;

fn scaled(n: usize) -> usize {
    let pct = env_num("FLOCK_MEMORY_SCALE").unwrap_or(if soak() { 100 } else { 25 }) as usize;
    (n * pct / 100).max(1)
}

/// Waits (the keyspace's hash table shrinks in serverCron) until
/// `used_memory` is within `MARGIN` of `baseline`; the last reading.
fn settled_memory(s: &Server, baseline: i64) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let used = s.purged_memory();
        if used - baseline <= MARGIN || Instant::now() > deadline {
            return used;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn assert_back_to(s: &Server, baseline: i64, what: &str) {
    let used = settled_memory(s, baseline);
    eprintln!("memory: {what}: used_memory {baseline} -> {used} ({:+} bytes)", used - baseline);
    assert!(
        used - baseline <= MARGIN,
        "{what}: used_memory {used} is {} bytes above the baseline {baseline}",
        used - baseline
    );
}

/// Sends `cmds` as pipelines of `BATCH` and checks every reply with `ok`.
fn pipelined(c: &mut Connection, cmds: impl Iterator<Item = redis::Cmd>, ok: impl Fn(&Value) -> bool) {
    let cmds: Vec<_> = cmds.collect();
    for chunk in cmds.chunks(BATCH) {
        let mut p = redis::pipe();
        for cmd in chunk {
            p.add_command(cmd.clone());
        }
        let replies: Vec<Value> = p.query(c).expect("pipeline");
        if let Some(bad) = replies.iter().find(|v| !ok(v)) {
            panic!("unexpected reply {bad:?}");
        }
    }
}

fn acquire_cmd_with_session(key: &str, owner: &str, lease_ms: u64, session: bool) -> redis::Cmd {
    let mut cmd = redis::cmd("FLOCK.ACQUIRE");
    cmd.arg(key).arg(owner).arg(lease_ms);
    if session {
        cmd.arg("SESSION");
    }
    cmd
}

#[test]
fn memory_returns_to_baseline_after_many_locks() {
    let n = scaled(100_000);
    let mut s = Server::start();
    let mut c = s.conn();
    let baseline = s.purged_memory();
    let granted = |v: &Value| matches!(v, Value::Int(t) if *t > 0);

    // Half are released one by one (a quarter of them bound to the
    // connection), a quarter go with the SESSION connection that holds
    // them, a quarter run out their lease.
    let mut session = s.conn();
    let quarter = n / 4;
    pipelined(
        &mut c,
        (0..2 * quarter).map(|i| acquire_cmd_with_session(&format!("mem:{i}"), "owner", 1_000_000, i % 2 == 1)),
        granted,
    );
    pipelined(
        &mut session,
        (2 * quarter..3 * quarter).map(|i| acquire_cmd_with_session(&format!("mem:{i}"), "s", 1_000_000, true)),
        granted,
    );
    assert_eq!(s.stat("locks"), 3 * quarter as i64);
    pipelined(
        &mut c,
        (3 * quarter..4 * quarter).map(|i| acquire_cmd_with_session(&format!("mem:{i}"), "owner", 1_000, false)),
        granted,
    );
    let full = s.used_memory();
    eprintln!("memory: {} locks take {} bytes", 4 * quarter, full - baseline);
    assert!(full - baseline > 40 * 4 * quarter as i64, "the locks should show in used_memory: {baseline} -> {full}");

    let release = |i: usize| redis::cmd("FLOCK.RELEASE").arg(format!("mem:{i}")).arg("owner").clone();
    pipelined(&mut c, (0..2 * quarter).map(release), |v| *v == Value::Int(0));
    drop(session);
    wait_until("every lock is gone", 20 * SECOND, || s.stat("locks") == 0);
    let keys: i64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
    assert_eq!(keys, 0);
    let st = s.stats();
    assert_eq!(
        (st["releases"], st["lease_expiries"], st["session_releases"]),
        (2 * quarter as i64, quarter as i64, quarter as i64)
    );
    drop(c);
    assert_back_to(&s, baseline, &format!("{} locks came and went", 4 * quarter));
    // A valgrind-run server (make leakcheck) writes its leak report.
    s.stop(Stop::ShutdownNoSave);
}

/// One connection that pipelines raw commands and reads replies later, so
/// that hundreds of waiters need no thread each.
struct Waiter {
    conn: Connection,
    owner: String,
}

impl Waiter {
    fn send(&mut self, cmd: &redis::Cmd) {
        self.conn.send_packed_command(&cmd.get_packed_command()).expect("send");
    }

    fn recv(&mut self) -> Value {
        self.conn.recv_response().unwrap_or_else(|e| panic!("{}: {e}", self.owner))
    }
}

#[derive(Clone, Copy, Debug)]
enum Round {
    /// Every waiter queues, then the queue drains server-side: each
    /// waiter's RELEASE is already in its pipeline behind its ACQUIRE.
    HandOff,
    /// Every waiter queues with a short WAIT and times out.
    Timeout,
    /// Every waiter queues, then its connection closes.
    Disconnect,
}

/// Runs one round of `WAITERS` waiters on `KEYS` locks held by `holder`.
fn round(s: &Server, holder: &mut Connection, waiters: &mut [Waiter], kind: Round) {
    let key = |i: usize| format!("wait:{}", i % KEYS);
    pipelined(holder, (0..KEYS).map(|i| acquire_cmd_with_session(&key(i), "holder", 1_000_000, false)), |v| {
        matches!(v, Value::Int(_))
    });
    let wait_ms = if let Round::Timeout = kind { 5 } else { 60_000 };
    for (i, w) in waiters.iter_mut().enumerate() {
        w.send(redis::cmd("FLOCK.ACQUIRE").arg(key(i)).arg(&w.owner).arg(1_000_000).arg("WAIT").arg(wait_ms));
        if let Round::HandOff = kind {
            w.send(redis::cmd("FLOCK.RELEASE").arg(key(i)).arg(&w.owner));
        }
    }
    if !matches!(kind, Round::Timeout) {
        wait_until("every waiter queued", 20 * SECOND, || s.stat("waiters") == waiters.len() as i64);
    }
    match kind {
        Round::HandOff => {}
        Round::Timeout => {
            for w in waiters.iter_mut() {
                let reply = w.recv();
                assert_eq!(reply, Value::Nil, "{}", w.owner);
            }
        }
        Round::Disconnect => {
            for w in waiters.iter_mut() {
                w.conn = s.conn();
            }
            wait_until("the closed waiters left", 20 * SECOND, || s.stat("waiters") == 0);
        }
    }
    let release = |i: usize| redis::cmd("FLOCK.RELEASE").arg(key(i)).arg("holder").clone();
    pipelined(holder, (0..KEYS).map(release), |v| *v == Value::Int(0));
    if let Round::HandOff = kind {
        for w in waiters.iter_mut() {
            let (token, left) = (w.recv(), w.recv());
            assert!(
                matches!(token, Value::Int(t) if t > 0) && left == Value::Int(0),
                "{}: {token:?}, {left:?}",
                w.owner
            );
        }
    }
}

/// Waiter entries that ended, by any way out of a queue.
fn waiters_done(s: &Server) -> i64 {
    let st = s.stats();
    st["handoffs"] + st["wait_timeouts"] + st["wait_disconnects"] + st["waiters_deleted"] + st["waiters_demoted"]
}

#[test]
fn memory_returns_to_baseline_after_many_waiters() {
    let total = scaled(100_000) as i64;
    let mut s = Server::start();
    let mut holder = s.conn();
    let mut waiters: Vec<Waiter> = (0..WAITERS).map(|i| Waiter { conn: s.conn(), owner: format!("w{i}") }).collect();
    // Redis pools the temporary reply clients of blocked clients (about
    // 35 KB each, trimmed later by its module cron): one round of each kind
    // first, so that the baseline includes a full pool.
    let cold = s.purged_memory();
    for kind in [Round::HandOff, Round::Timeout, Round::Disconnect] {
        round(&s, &mut holder, &mut waiters, kind);
    }
    let baseline = s.purged_memory();
    eprintln!("memory: the warm-up rounds left {} bytes in use (Redis's pool of reply clients)", baseline - cold);
    let start = waiters_done(&s);
    let kinds = [Round::HandOff, Round::HandOff, Round::HandOff, Round::Timeout, Round::HandOff, Round::Disconnect];
    let started = Instant::now();
    let mut rounds = 0;
    while waiters_done(&s) - start < total {
        round(&s, &mut holder, &mut waiters, kinds[rounds % kinds.len()]);
        rounds += 1;
    }
    eprintln!("memory: {rounds} rounds of {WAITERS} waiters in {:.1?}", started.elapsed());
    assert_eq!((s.stat("waiters"), s.stat("locks"), s.blocked_clients()), (0, 0, 0));
    assert_back_to(&s, baseline, &format!("{} waiters came and went", waiters_done(&s) - start));
    s.stop(Stop::ShutdownNoSave);
}
