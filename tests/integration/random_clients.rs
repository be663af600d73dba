//! Many clients doing random FLOCK operations on a handful of keys at once,
//! for a while (issue 5). Online it checks that no two clients are ever
//! inside one lock's critical section and that fencing tokens rise in the
//! order the section is entered; at the end, that every lock key, waiter
//! and blocked client is gone and that `INFO flock` adds up.
//!
//! Environment: `FLOCK_SEED` (the run's seed, random if unset; printed, and
//! part of every failure message), `FLOCK_RANDOM_SECS` (default 5; in `make
//! soak` FLOCK_SOAK_SECS, default 15),
//! `FLOCK_RANDOM_CLIENTS` (default 60). The seed fixes every client's
//! choices; the interleaving is up to the machine.
//!
//! Three kinds of clients share the keys:
//! - checkers take `CHECKED` keys with a long lease, enter the critical
//!   section (a shared record per key), reenter, renew, look at FLOCK.INFO,
//!   leave, and release (or close a SESSION connection);
//! - expirers take the same keys with short leases and never release, so
//!   leases run out under the checkers' waits;
//! - chaos clients force-release, delete, hold and drop `CHAOS` keys, and
//!   try to release or renew the checked keys they never hold.
//!
//! Any client may close its connection while it waits.
use crate::common::*;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const CHECKED: [&str; 4] = ["rc:a", "rc:b", "rc:c", "rc:d"];
const CHAOS: [&str; 2] = ["rc:x", "rc:y"];
/// Checkers' lease: far longer than a critical section, so that it cannot
/// run out inside one unless a client stalls for seconds.
const CHECK_LEASE_MS: u64 = 5_000;
/// A client-side bound on every reply; a WAIT 0 that passes it counts as a
/// dropped connection, any other command as a failure.
const REPLY_LIMIT: Duration = Duration::from_secs(30);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Who is inside one checked lock's critical section, by the clients' own
/// account, and the last token with which someone entered.
#[derive(Default)]
struct Section {
    inside: Vec<Inside>,
    last_token: i64,
}

struct Inside {
    who: String,
    token: i64,
    /// When its lease may have run out, by the client's clock (measured
    /// from before its ACQUIRE or RENEW was sent).
    until: Instant,
}

struct Shared {
    stop: AtomicBool,
    sections: Vec<Mutex<Section>>,
    failures: Mutex<Vec<String>>,
    /// Overlaps after a client-side lease end (never expected in practice).
    excused: Mutex<u64>,
}

impl Shared {
    fn fail(&self, what: String) {
        let mut f = self.failures.lock().unwrap();
        if f.len() < 50 {
            f.push(what);
        }
    }

    fn enter(&self, key: usize, who: &str, token: i64, until: Instant) {
        let mut s = self.sections[key].lock().unwrap();
        let now = Instant::now();
        let before = s.inside.len();
        s.inside.retain(|i| i.until > now);
        *self.excused.lock().unwrap() += (before - s.inside.len()) as u64;
        if !s.inside.is_empty() {
            let others: Vec<_> = s.inside.iter().map(|i| format!("{} (token {})", i.who, i.token)).collect();
            self.fail(format!("{who} entered {} (token {token}) while {others:?} inside", CHECKED[key]));
        }
        if token <= s.last_token {
            self.fail(format!(
                "{who} entered {} with token {token}, not above the previous {}",
                CHECKED[key], s.last_token
            ));
        }
        s.last_token = token;
        s.inside.push(Inside { who: who.to_string(), token, until });
    }

    fn extend(&self, key: usize, who: &str, until: Instant) {
        let mut s = self.sections[key].lock().unwrap();
        if let Some(i) = s.inside.iter_mut().find(|i| i.who == who) {
            i.until = until;
        }
    }

    fn leave(&self, key: usize, who: &str) {
        // Absent if another client's entry excused it (lease over).
        self.sections[key].lock().unwrap().inside.retain(|i| i.who != who);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Checker,
    Expirer,
    Chaos,
}

/// What an ACQUIRE came back with.
enum Acq {
    Granted(i64),
    Reentered(i64),
    Nil,
    /// The connection was closed while waiting.
    Dropped,
    Err(redis::RedisError),
}

struct Client {
    name: String,
    kind: Kind,
    epoch: u32,
    url: String,
    conn: Connection,
    rng: StdRng,
    shared: Arc<Shared>,
    /// The last token this owner got per key (tokens are unique per grant,
    /// so the same token again means a reentry).
    tokens: HashMap<&'static str, i64>,
    tally: HashMap<&'static str, u64>,
}

fn connect(url: &str) -> Connection {
    let c = redis::Client::open(url).expect("client").get_connection().expect("connect");
    c.set_read_timeout(Some(REPLY_LIMIT)).expect("read timeout");
    c
}

impl Client {
    fn owner(&self) -> String {
        format!("{}.{}", self.name, self.epoch)
    }

    fn bump(&mut self, what: &'static str) {
        *self.tally.entry(what).or_default() += 1;
    }

    fn fail(&self, what: String) {
        self.shared.fail(format!("{} ({:?}): {what}", self.owner(), self.kind));
    }

    /// Closes the connection and opens a new one under a new owner name.
    fn reconnect(&mut self) {
        self.conn = connect(&self.url);
        self.epoch += 1;
        self.tokens.clear();
        self.bump("connection drops");
    }

    fn query(&mut self, cmd: &redis::Cmd) -> RedisResult<Value> {
        let r = cmd.query(&mut self.conn);
        if let Err(e) = &r {
            if e.is_timeout() || e.is_io_error() {
                self.fail(format!("no reply to {:?}: {e}", String::from_utf8_lossy(&cmd.get_packed_command())));
                self.conn = connect(&self.url);
            }
        }
        r
    }

    /// FLOCK.ACQUIRE; with `drop_after`, the connection is closed if no
    /// reply came by then.
    fn acquire(
        &mut self,
        key: &'static str,
        lease: u64,
        wait: Option<u64>,
        session: bool,
        drop_after: Option<Duration>,
    ) -> Acq {
        let mut cmd = redis::cmd("FLOCK.ACQUIRE");
        cmd.arg(key).arg(self.owner()).arg(lease);
        if let Some(w) = wait {
            cmd.arg("WAIT").arg(w);
        }
        if session {
            cmd.arg("SESSION");
        }
        let limit = drop_after.unwrap_or(REPLY_LIMIT);
        self.conn.set_read_timeout(Some(limit)).expect("read timeout");
        let r: RedisResult<Value> = cmd.query(&mut self.conn);
        let _ = self.conn.set_read_timeout(Some(REPLY_LIMIT));
        match r {
            Ok(Value::Int(t)) if self.tokens.get(key) == Some(&t) => {
                self.bump("reentries seen");
                Acq::Reentered(t)
            }
            Ok(Value::Int(t)) => {
                if let Some(&last) = self.tokens.get(key).filter(|&&last| t <= last) {
                    self.fail(format!("{key}: granted token {t} after this owner's {last}"));
                }
                self.tokens.insert(key, t);
                self.bump("grants seen");
                Acq::Granted(t)
            }
            Ok(Value::Nil) => {
                self.bump(if wait.is_some() { "wait nils seen" } else { "busy tries" });
                Acq::Nil
            }
            Ok(other) => {
                self.fail(format!("ACQUIRE {key} replied {other:?}"));
                Acq::Nil
            }
            Err(e) if e.is_timeout() && (drop_after.is_some() || wait == Some(0)) => {
                // Closed while waiting (on purpose, or a WAIT 0 past the limit);
                // a bounded WAIT always has its answer long before the limit.
                self.bump(if drop_after.is_some() { "waiter drops" } else { "long waits dropped" });
                self.reconnect();
                Acq::Dropped
            }
            Err(e) if e.is_timeout() || e.is_io_error() => {
                self.fail(format!("no reply to ACQUIRE {key}: {e}"));
                self.reconnect();
                Acq::Dropped
            }
            // Expirers and chaos clients keep locks while they ask for others,
            // so they deadlock each other (before deadlock detection, until a
            // lease ran out); a checker holds one lock at a time and never can.
            Err(e) if error_code(&e) == "DEADLOCK" && wait.is_some() && self.kind != Kind::Checker => {
                self.bump("deadlocks answered");
                Acq::Nil
            }
            Err(e) => {
                if error_code(&e) == "LOCKDELETED" {
                    self.bump("lockdeleted seen");
                }
                Acq::Err(e)
            }
        }
    }

    fn release(&mut self, key: &str) -> RedisResult<Value> {
        let owner = self.owner();
        self.query(redis::cmd("FLOCK.RELEASE").arg(key).arg(owner))
    }

    fn renew(&mut self, key: &str, lease: u64) -> RedisResult<Value> {
        let owner = self.owner();
        self.query(redis::cmd("FLOCK.RENEW").arg(key).arg(owner).arg(lease))
    }

    /// A random WAIT: none (a try), a bounded timeout, or without limit.
    fn random_wait(&mut self, max_ms: u64) -> Option<u64> {
        match self.rng.gen_range(0..10) {
            0..=2 => None,
            3 => Some(0),
            _ => Some(self.rng.gen_range(1..max_ms)),
        }
    }

    /// Sometimes a waiter gives up and closes its connection.
    fn random_drop(&mut self, wait: Option<u64>, p: f64) -> Option<Duration> {
        (wait.is_some() && self.rng.gen_bool(p)).then(|| ms(self.rng.gen_range(1..300)))
    }

    fn pause(&mut self, max_ms: u64) {
        std::thread::sleep(ms(self.rng.gen_range(0..max_ms)));
    }

    fn step(&mut self) {
        self.bump("steps");
        match self.kind {
            Kind::Checker => self.checker_step(),
            Kind::Expirer => self.expirer_step(),
            Kind::Chaos => self.chaos_step(),
        }
    }

    fn checker_step(&mut self) {
        let k = self.rng.gen_range(0..CHECKED.len());
        let session = self.rng.gen_bool(0.4);
        let wait = self.random_wait(1_500);
        let drop_after = self.random_drop(wait, 0.08);
        let sent = Instant::now();
        match self.acquire(CHECKED[k], CHECK_LEASE_MS, wait, session, drop_after) {
            Acq::Granted(token) => self.critical_section(k, token, sent, session),
            Acq::Reentered(t) => {
                self.fail(format!("reentered {} (token {t}) outside its critical section", CHECKED[k]))
            }
            Acq::Nil | Acq::Dropped => {}
            Acq::Err(e) => self.fail(format!("ACQUIRE {}: {e}", CHECKED[k])),
        }
        self.pause(5);
    }

    fn lease_end(sent: Instant) -> Instant {
        // A margin for the server's millisecond clock.
        sent + ms(CHECK_LEASE_MS - 5)
    }

    fn critical_section(&mut self, k: usize, token: i64, sent: Instant, session: bool) {
        let key = CHECKED[k];
        let owner = self.owner();
        let mut until = Self::lease_end(sent);
        self.shared.enter(k, &owner, token, until);
        self.bump("sections entered");
        let mut holds = 1;
        for _ in 0..self.rng.gen_range(0..4) {
            let (what, session) = (self.rng.gen_range(0..3), self.rng.gen_bool(0.3));
            let sent = Instant::now();
            match what {
                0 => match self.acquire(key, CHECK_LEASE_MS, None, session, None) {
                    Acq::Reentered(t) if t == token => {
                        holds += 1;
                        until = Self::lease_end(sent);
                    }
                    Acq::Granted(t) | Acq::Reentered(t) => {
                        self.expired_or_fail(until, format!("reentry gave token {t}, not {token}"))
                    }
                    _ => self.expired_or_fail(until, "reentry refused".into()),
                },
                1 => match self.renew(key, CHECK_LEASE_MS) {
                    Ok(Value::Int(t)) if t == token => until = Self::lease_end(sent),
                    other => self.expired_or_fail(until, format!("RENEW: {other:?}")),
                },
                _ => {
                    let seen = (owner_of(&mut self.conn, key), info_field(&mut self.conn, key, "holds"));
                    if seen != (Some(owner.clone()), Some(Value::Int(holds))) {
                        self.expired_or_fail(until, format!("FLOCK.INFO {key} shows {seen:?} for {holds} holds"));
                    }
                }
            }
            self.shared.extend(k, &owner, until);
        }
        self.pause(10);
        self.shared.leave(k, &owner);
        if session && self.rng.gen_bool(0.25) {
            self.bump("session drops");
            return self.reconnect();
        }
        for left in (0..holds).rev() {
            match self.release(key) {
                Ok(Value::Int(n)) if n == left => {}
                other => return self.expired_or_fail(until, format!("RELEASE with {} holds: {other:?}", left + 1)),
            }
        }
    }

    /// A checker's lease can only have run out if it stalled for seconds.
    fn expired_or_fail(&mut self, until: Instant, what: String) {
        if Instant::now() >= until {
            self.bump("lease ran out inside");
        } else {
            self.fail(what);
        }
    }

    fn expirer_step(&mut self) {
        let keys: &[&'static str] = if self.rng.gen_bool(0.8) { &CHECKED } else { &CHAOS };
        let key = keys[self.rng.gen_range(0..keys.len())];
        let lease = self.rng.gen_range(5..300);
        let wait = self.random_wait(800).filter(|&w| w > 0);
        let drop_after = self.random_drop(wait, 0.1);
        let session = self.rng.gen_bool(0.2);
        match self.acquire(key, lease, wait, session, drop_after) {
            Acq::Granted(_) | Acq::Reentered(_) => {
                if self.rng.gen_bool(0.3) {
                    let lease = self.rng.gen_range(5..300);
                    match self.renew(key, lease) {
                        Ok(_) => {}
                        Err(e) if error_code(&e) == "NOTOWNER" => self.bump("notowner after expiry"),
                        Err(e) => self.fail(format!("RENEW {key}: {e}")),
                    }
                }
            }
            Acq::Nil | Acq::Dropped => {}
            Acq::Err(e) if error_code(&e) == "LOCKDELETED" && CHAOS.contains(&key) => {}
            Acq::Err(e) => self.fail(format!("ACQUIRE {key}: {e}")),
        }
        if self.rng.gen_bool(0.05) {
            self.reconnect();
        }
        self.pause(30);
    }

    fn chaos_step(&mut self) {
        let key = CHAOS[self.rng.gen_range(0..CHAOS.len())];
        let checked = CHECKED[self.rng.gen_range(0..CHECKED.len())];
        match self.rng.gen_range(0..100) {
            0..=34 => {
                let lease = self.rng.gen_range(10..3_000);
                let wait = self.random_wait(1_500);
                let drop_after = self.random_drop(wait, 0.1);
                let session = self.rng.gen_bool(0.4);
                match self.acquire(key, lease, wait, session, drop_after) {
                    Acq::Granted(_) | Acq::Reentered(_) if self.rng.gen_bool(0.5) => {
                        self.allow_notowner(key, |c| c.release(key))
                    }
                    Acq::Err(e) if error_code(&e) != "LOCKDELETED" => self.fail(format!("ACQUIRE {key}: {e}")),
                    _ => {}
                }
            }
            35..=49 => self.allow_notowner(key, |c| c.release(key)),
            50..=59 => {
                let lease = self.rng.gen_range(10..3_000);
                self.allow_notowner(key, |c| c.renew(key, lease));
            }
            60..=74 => match self.query(redis::cmd("FLOCK.FORCERELEASE").arg(key)) {
                Ok(Value::Int(0 | 1)) => self.bump("force releases sent"),
                other => self.fail(format!("FORCERELEASE {key}: {other:?}")),
            },
            75..=76 => {
                let _ = self.query(redis::cmd("DEL").arg(key));
            }
            77..=86 => {
                // This owner never holds a checked key.
                let lease = self.rng.gen_range(1..1_000);
                for r in [self.release(checked), self.renew(checked, lease)] {
                    match r {
                        Err(e) if error_code(&e) == "NOTOWNER" => {}
                        other => self.fail(format!("RELEASE/RENEW {checked} by a non-holder: {other:?}")),
                    }
                }
            }
            87..=94 => {
                let k = if self.rng.gen_bool(0.5) { key } else { checked };
                match self.query(redis::cmd("FLOCK.INFO").arg(k)) {
                    Ok(Value::Nil | Value::Array(_)) => {}
                    other => self.fail(format!("FLOCK.INFO {k}: {other:?}")),
                }
            }
            _ => self.reconnect(),
        }
        self.pause(20);
    }

    /// RELEASE or RENEW of a chaos key: the lease may be over or the key
    /// deleted or force-released, so NOTOWNER is a fine answer.
    fn allow_notowner(&mut self, key: &str, f: impl FnOnce(&mut Self) -> RedisResult<Value>) {
        match f(self) {
            Ok(Value::Int(_)) => {}
            Err(e) if error_code(&e) == "NOTOWNER" => self.bump("notowner (chaos)"),
            other => self.fail(format!("RELEASE/RENEW {key}: {other:?}")),
        }
    }
}

fn kind_of(i: usize, clients: usize) -> Kind {
    // About 3/4 checkers, then expirers, then a few chaos clients.
    let expirers = (clients / 6).max(1);
    let chaos = (clients / 10).max(1);
    if i < clients - expirers - chaos {
        Kind::Checker
    } else if i < clients - chaos {
        Kind::Expirer
    } else {
        Kind::Chaos
    }
}

fn sum(tallies: &[HashMap<&'static str, u64>]) -> std::collections::BTreeMap<&'static str, u64> {
    let mut total = std::collections::BTreeMap::new();
    for t in tallies {
        for (k, v) in t {
            *total.entry(*k).or_default() += v;
        }
    }
    total
}

/// About 7 s: the 5 s run (FLOCK_RANDOM_SECS), then its leases running out.
#[test]
fn random_clients_never_share_a_lock_and_leave_nothing_behind() {
    let seed = std::env::var("FLOCK_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random::<u64>);
    let secs = run_secs("FLOCK_RANDOM_SECS", 5, 15);
    let clients = env_num("FLOCK_RANDOM_CLIENTS").unwrap_or(60).max(3) as usize;
    eprintln!("random_clients: FLOCK_SEED={seed} FLOCK_RANDOM_SECS={secs} FLOCK_RANDOM_CLIENTS={clients}");
    let mut s = Server::start();
    let shared = Arc::new(Shared {
        stop: AtomicBool::new(false),
        sections: CHECKED.iter().map(|_| Mutex::default()).collect(),
        failures: Mutex::default(),
        excused: Mutex::default(),
    });
    let fail = |what: String| -> ! { panic!("FLOCK_SEED={seed} (FLOCK_RANDOM_SECS={secs}): {what}") };

    let started = Instant::now();
    let threads: Vec<_> = (0..clients)
        .map(|i| {
            let kind = kind_of(i, clients);
            let mut client = Client {
                name: format!("{}{i}", format!("{kind:?}").to_lowercase()),
                kind,
                epoch: 0,
                url: s.url(),
                conn: connect(&s.url()),
                rng: StdRng::seed_from_u64(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
                shared: Arc::clone(&shared),
                tokens: HashMap::new(),
                tally: HashMap::new(),
            };
            std::thread::spawn(move || {
                while !client.shared.stop.load(Ordering::Relaxed) {
                    client.step();
                }
                client.tally
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(secs));
    shared.stop.store(true, Ordering::Relaxed);
    let tallies: Vec<_> =
        threads.into_iter().map(|t| t.join().unwrap_or_else(|_| fail("a client thread panicked".into()))).collect();
    let ran = started.elapsed();
    let failures = shared.failures.lock().unwrap().clone();
    if !failures.is_empty() {
        fail(format!("{} violations:\n{}", failures.len(), failures.join("\n")));
    }

    // Every client is gone: leases (5 s at most) run out, nothing waits.
    let mut admin = s.conn();
    let settled = Instant::now() + Duration::from_secs(60);
    loop {
        let keys: i64 = redis::cmd("DBSIZE").query(&mut admin).expect("DBSIZE");
        let st = s.stats();
        if keys == 0 && st["locks"] == 0 && st["waiters"] == 0 && s.blocked_clients() == 0 {
            break;
        }
        if Instant::now() > settled {
            fail(format!(
                "after all clients left: DBSIZE {keys}, blocked_clients {}, INFO flock {st:?}",
                s.blocked_clients()
            ));
        }
        std::thread::sleep(ms(50));
    }
    let st = s.stats();
    let total = sum(&tallies);
    let excused = *shared.excused.lock().unwrap();
    eprintln!("random_clients: seed {seed}, {clients} clients for {ran:.1?}; clients saw {total:?}; excused overlaps {excused}");
    eprintln!("random_clients: INFO flock {st:?}");

    let ended: i64 =
        ["releases", "lease_expiries", "force_releases", "session_releases", "deletions", "undelivered_grants"]
            .iter()
            .map(|k| st[*k])
            .sum();
    if st["grants"] != ended {
        fail(format!(
            "grants {} != releases + expiries + force + session + deletions + undelivered = {ended}: {st:?}",
            st["grants"]
        ));
    }
    if st["grants"] != st["immediate_grants"] + st["handoffs"] {
        fail(format!("grants {} != immediate_grants + handoffs: {st:?}", st["grants"]));
    }
    // What the clients saw is what the server counted, up to the replies
    // that connections closed while waiting never read.
    let seen = |k: &str| total.get(k).copied().unwrap_or(0) as i64;
    let unread = seen("waiter drops") + seen("long waits dropped");
    let pairs = [
        ("grants", "grants seen"),
        ("reentrant_acquires", "reentries seen"),
        ("wait_timeouts", "wait nils seen"),
        ("waiters_deleted", "lockdeleted seen"),
    ];
    for (server, client) in pairs {
        let (n, c) = (st[server], seen(client));
        if n < c || n > c + unread {
            fail(format!("INFO flock {server} {n}, but clients saw {c} ({unread} waits dropped): {st:?}"));
        }
    }
    if seen("sections entered") < 10 * CHECKED.len() as i64 {
        fail(format!("too little happened: {total:?}"));
    }
    // Let a valgrind-wrapped server write its report (make leakcheck).
    s.stop(Stop::ShutdownNoSave);
}
