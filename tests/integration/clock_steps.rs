//! Wall-clock steps (issue 31): leases, WAIT timeouts and session timeouts
//! run on the monotonic clock, so a step of the server's wall clock by an
//! hour either way ends no lease early and keeps none longer; a lease that
//! travels (RDB, AOF, replication) arrives with no more than it had left.
//!
//! The server runs under libfaketime (Debian's `faketime`), its wall clock
//! offset by what a file says and its monotonic clock left real: what an
//! NTP step or `date -s` does to a process. Never the machine's clock.
//! Debian's redis-server 7.0 links jemalloc as a shared library, whose
//! start-up reads the clock before libfaketime is ready, and hangs: these
//! tests need a server without it (Redis 8.2, Valkey 9.1: `make test
//! SERVER=...`), and say so on the others.
use crate::common::*;

use std::path::PathBuf;
use std::process::Command;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const HOUR_MS: i64 = 3_600_000;

/// A server whose wall clock is offset by what `offset_file` says.
struct Faked {
    server: Server,
    offset_file: PathBuf,
}

impl Faked {
    /// `None` (and why, printed) where libfaketime cannot run the server.
    fn start(offset: &str, extra: &[&str]) -> Option<Faked> {
        let program = server_program();
        let ldd = Command::new("ldd").arg(which(&program)).output().expect("ldd");
        if String::from_utf8_lossy(&ldd.stdout).contains("libjemalloc") {
            eprintln!("skipped: {program} links jemalloc as a shared library and hangs under libfaketime");
            return None;
        }
        let libfaketime = libfaketime();
        let dir = temp_dir("clock");
        let offset_file = dir.path().join("offset");
        std::fs::write(&offset_file, offset).unwrap();
        let env = [
            ("LD_PRELOAD", libfaketime.as_str()),
            ("FAKETIME_TIMESTAMP_FILE", offset_file.to_str().unwrap()),
            ("FAKETIME_NO_CACHE", "1"),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ];
        let server = Server::start_env(&env, extra);
        // The file lives as long as the server: keep its directory.
        std::mem::forget(dir);
        Some(Faked { server, offset_file })
    }

    /// Steps the server's wall clock to `offset_ms` from the real one, and
    /// waits until the server reads it.
    fn step_to(&self, offset_ms: i64) {
        std::fs::write(&self.offset_file, format!("{:+}", offset_ms / 1000)).unwrap();
        let mut c = self.server.conn();
        wait_until("the server to read its stepped clock", 5 * SECOND, || {
            let (secs, _): (i64, i64) = redis::cmd("TIME").query(&mut c).unwrap();
            let real = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
            (secs - real - offset_ms / 1000).abs() <= 2
        });
    }
}

/// `FLOCK.ACQUIRE ... WAIT wait_ms` in a thread, on a connection that
/// gives up 10 s after the WAIT should have ended: a timer an hour late
/// fails the test instead of hanging it.
fn bounded_waiter(s: &Server, key: &str, owner: &str, wait_ms: u64) -> JoinHandle<RedisResult<Option<i64>>> {
    let mut c = s.conn();
    c.set_read_timeout(Some(Duration::from_millis(wait_ms) + 10 * SECOND)).unwrap();
    let (key, owner) = (key.to_string(), owner.to_string());
    std::thread::spawn(move || acquire_wait(&mut c, &key, &owner, 1000, wait_ms))
}

/// Debian's libfaketime, in the directory of the machine's architecture.
fn libfaketime() -> String {
    let found = std::fs::read_dir("/usr/lib").into_iter().flatten().flatten().find_map(|arch| {
        let lib = arch.path().join("faketime/libfaketime.so.1");
        lib.exists().then(|| lib.to_string_lossy().into_owned())
    });
    found.expect("libfaketime is missing: `make deps` installs faketime")
}

fn which(program: &str) -> String {
    if program.contains('/') {
        return program.to_string();
    }
    let out = Command::new("sh").arg("-c").arg(format!("command -v {program}")).output().expect("sh");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Locks held with leases of `leases` ms, a waiter queued on each; the
/// clock steps to `offset_ms`; each waiter is granted no earlier than its
/// holder's lease ends, and soon after, with a larger token.
fn leases_across_a_step(offset_ms: i64) {
    let Some(f) = Faked::start("+0", &[]) else { return };
    let mut c = f.server.conn();
    let leases: Vec<u64> = (0..8).map(|i| 700 + 150 * i).collect();
    // Held long while the waiters start and queue, which a loaded machine
    // may take longer than a lease to do; the leases under test begin at
    // the RENEWs, all sent together just before the step.
    let mut held = Vec::new();
    for (i, &lease) in leases.iter().enumerate() {
        let key = format!("lock:{i}");
        let token = acquire(&mut c, &key, "holder", 60_000).unwrap().expect("granted");
        held.push((key.clone(), lease, token, bounded_waiter(&f.server, &key, "next", 10_000)));
        wait_queue(&mut c, &key, &["next"]);
    }
    let mut renews = redis::pipe();
    for (key, lease, _, _) in &held {
        renews.cmd("FLOCK.RENEW").arg(key).arg("holder").arg(*lease);
    }
    let steps = flock_stats(&mut c)["clock_steps"];
    let sent = Instant::now();
    let _: Vec<i64> = renews.query(&mut c).unwrap();
    f.step_to(offset_ms);
    for (key, lease, _, _) in &held {
        let ttl = ttl_ms(&mut c, key);
        assert!(ttl > 0 && ttl <= *lease as i64, "{key}: {ttl} ms left of a {lease} ms lease after the step");
    }
    let mut last = 0;
    for (key, lease, token, next) in held {
        let next_token = granted(next, "next");
        let waited = sent.elapsed();
        assert!(
            waited >= Duration::from_millis(lease - SERVER_CLOCK_GRAIN_MS),
            "{key}: the next holder was granted {waited:?} after a {lease} ms lease began"
        );
        assert!(waited < Duration::from_millis(lease) + 5 * SECOND, "{key}: granted only after {waited:?}");
        assert!(next_token > token && next_token > last, "{key}: tokens rise across the step");
        last = next_token;
    }
    assert_eq!(flock_stats(&mut c)["clock_steps"], steps + 1, "the step is counted once");
    let after = acquire(&mut c, "after", "a", 1000).unwrap().expect("granted");
    assert!(after > last, "a grant after the step has a larger token");
}

#[test]
fn a_step_forward_of_an_hour_ends_no_lease_early() {
    leases_across_a_step(HOUR_MS);
}

#[test]
fn a_step_back_of_an_hour_keeps_no_lease_longer() {
    leases_across_a_step(-HOUR_MS);
}

#[test]
fn wait_and_session_timeouts_outlast_no_step_back() {
    let Some(f) = Faked::start("+0", &[]) else { return };
    let mut c = f.server.conn();
    acquire(&mut c, "held", "holder", 60_000).unwrap().expect("granted");
    // A session's grant, on the default timeout while the waiters start
    // and queue (a loaded machine may take longer than 600 ms to do that).
    let mut silent = f.server.conn();
    let sid: String = redis::cmd("FLOCK.SESSION").query(&mut silent).unwrap();
    let bound: Option<i64> =
        redis::cmd("FLOCK.ACQUIRE").arg(&["bound", "s", "0", "INBOX", &sid][..]).query(&mut silent).unwrap();
    assert!(bound.is_some());
    let next = bounded_waiter(&f.server, "bound", "next", 10_000);
    wait_queue(&mut c, "bound", &["next"]);
    let start = Instant::now();
    let timed = bounded_waiter(&f.server, "held", "w", 800);
    wait_queue(&mut c, "held", &["w"]);
    // Its connection silent from now on.
    redis::cmd("FLOCK.SESSION").arg("TIMEOUT").arg(600).query::<String>(&mut silent).unwrap();
    f.step_to(-HOUR_MS);
    assert_eq!(timed.join().unwrap().unwrap(), None, "the WAIT timed out");
    let waited = start.elapsed();
    assert!(waited >= Duration::from_millis(800) && waited < 5 * SECOND, "a WAIT of 800 ms ended after {waited:?}");
    granted(next, "next");
    let waited = start.elapsed();
    assert!(waited < 5 * SECOND, "the silent session of 600 ms expired only after {waited:?}");
    assert_eq!(flock_stats(&mut c)["session_expiries"], 1);
}

#[test]
fn a_lease_persisted_before_a_step_back_loads_with_no_more_than_it_had_left() {
    let Some(f) = Faked::start("+0", &["--appendonly", "yes"]) else { return };
    let mut c = f.server.conn();
    acquire(&mut c, "rdb", "a", 8000).unwrap().expect("granted");
    f.step_to(-HOUR_MS);
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    let ttl = ttl_ms(&mut c, "rdb");
    assert!(ttl > 0 && ttl <= 8000, "{ttl} ms left after a reload of an 8000 ms lease");
    acquire(&mut c, "aof", "a", 8000).unwrap().expect("granted");
    f.step_to(0);
    let _: () = redis::cmd("BGREWRITEAOF").query(&mut c).map(|_: String| ()).unwrap();
    f.server.wait_aof_rewrite();
    let _: () = redis::cmd("DEBUG").arg("LOADAOF").query(&mut c).unwrap();
    for (key, lease) in [("rdb", 8000), ("aof", 8000)] {
        let ttl = ttl_ms(&mut c, key);
        assert!(ttl > 0 && ttl <= lease, "{key}: {ttl} ms left after the AOF of a {lease} ms lease is loaded");
    }
}

#[test]
fn a_replica_whose_wall_clock_is_an_hour_behind_gets_no_longer_lease() {
    let Some(master) = Faked::start("+0", &[]) else { return };
    let Some(replica) = Faked::start("-3600", &["--replicaof", "127.0.0.1", &master.server.port.to_string()]) else {
        return;
    };
    replica.server.wait_master_link();
    let (mut m, mut r) = (master.server.conn(), replica.server.conn());
    acquire(&mut m, "lock", "a", 5000).unwrap().expect("granted");
    wait_replica_applied(&mut m, &mut r);
    let ttl = ttl_ms(&mut r, "lock");
    assert!(ttl > 0 && ttl <= 5000, "the replica has {ttl} ms left of a 5000 ms lease");
}
