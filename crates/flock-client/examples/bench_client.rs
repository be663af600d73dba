//! `make bench-clients` (scripts/bench-clients.sh): what the Rust client
//! costs over the raw FLOCK commands it sends, and whether a holder cut off
//! by a partition knows it lost its locks before the next waiter is granted.
//! Prints Markdown table rows. Run against a fresh server with the module:
//!
//! ```text
//! cargo run --release -p flock-client --example bench_client -- PORT overhead|contended|first
//! ```
//!
//! - `overhead`: one thread, one lock, uncontended acquire + release pairs
//!   through the API (`acquire_on(&client, None)`, a try; and
//!   `acquire_on(&client, Some(FOREVER))`, a wait) against the raw commands
//!   on one connection (`FLOCK.ACQUIRE key owner 0 INBOX sid` with a session
//!   opened on another, and `FLOCK.ACQUIRE key owner 30000`, each with
//!   `FLOCK.RELEASE`), in alternating rounds.
//! - `contended`: 8 threads on one lock, each holding it 100 us (busy), in
//!   alternating runs through the API and with raw blocking `FLOCK.ACQUIRE
//!   ... WAIT 0` on a connection per thread.
//! - `first`: a holder whose connections go through
//!   `scripts/partition-proxy.py` holds K locks, a waiter queues behind
//!   each on a direct connection, the proxy cuts the holder off: per lock,
//!   the next grant's time less the time the holder's lost channel said so
//!   (and that less the guard's `lost_at`, its local deadline).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use flock_client::{close_session, Guard, LeaseLost, Lock, FOREVER};
use redis::{Client, Connection, RedisResult};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const MS: Duration = Duration::from_millis(1);

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(port), Some(section)) = (args.get(1), args.get(2)) else {
        return Err("usage: bench_client PORT overhead|contended|first".into());
    };
    let url = format!("redis://127.0.0.1:{port}/");
    match section.as_str() {
        "overhead" => overhead(&url),
        "contended" => contended(&url),
        "first" => first(&url, port),
        other => Err(format!("unknown section {other}").into()),
    }
}

/// The value at quantile `q` of sorted `v`.
fn pct(v: &[f64], q: f64) -> f64 {
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn ms_between(later: Instant, earlier: Instant) -> f64 {
    if later >= earlier {
        (later - earlier).as_secs_f64() * 1e3
    } else {
        -((earlier - later).as_secs_f64() * 1e3)
    }
}

fn int(conn: &mut Connection, cmd: &redis::Cmd) -> RedisResult<i64> {
    cmd.query(conn)
}

// --- overhead ---

fn overhead(url: &str) -> Res<()> {
    const ROUNDS: usize = 10;
    const PER_ROUND: usize = 500;
    let client = Client::open(url)?;
    let api = Lock::new("o:api", 30 * Duration::from_secs(1));
    let mut session = client.get_connection()?;
    let sid: String = redis::cmd("FLOCK.SESSION").arg("TIMEOUT").arg(3_600_000).query(&mut session)?;
    let mut conn = client.get_connection()?;
    let owner = "bench:1";
    let try_pair = || -> Res<()> {
        let guard = api.acquire_on(&client, None)?.ok_or("busy")?;
        guard.release()?;
        Ok(())
    };
    let api_wait = Lock::new("o:wait", 30 * Duration::from_secs(1));
    let wait_client = client.clone();
    let wait_pair = move || -> Res<()> {
        let guard = api_wait.acquire_on(&wait_client, Some(FOREVER))?.ok_or("busy")?;
        guard.release()?;
        Ok(())
    };
    let raw_session = |conn: &mut Connection| -> Res<()> {
        int(conn, redis::cmd("FLOCK.ACQUIRE").arg("o:raw").arg(owner).arg(0).arg("INBOX").arg(&sid))?;
        int(conn, redis::cmd("FLOCK.RELEASE").arg("o:raw").arg(owner))?;
        Ok(())
    };
    // What the API sends: the same with a fresh `ID <uuid>` each.
    let raw_ids = |conn: &mut Connection| -> Res<()> {
        let (a, r) = (uuid::Uuid::new_v4().to_string(), uuid::Uuid::new_v4().to_string());
        int(conn, redis::cmd("FLOCK.ACQUIRE").arg("o:ids").arg(owner).arg(0).arg("INBOX").arg(&sid).arg("ID").arg(a))?;
        int(conn, redis::cmd("FLOCK.RELEASE").arg("o:ids").arg(owner).arg("ID").arg(r))?;
        Ok(())
    };
    let raw_plain = |conn: &mut Connection| -> Res<()> {
        int(conn, redis::cmd("FLOCK.ACQUIRE").arg("o:plain").arg(owner).arg(30_000))?;
        int(conn, redis::cmd("FLOCK.RELEASE").arg("o:plain").arg(owner))?;
        Ok(())
    };
    // 0: API try, 1: API wait, 2: raw session with IDs, 3: raw session, 4: raw 30000.
    const METHODS: usize = 5;
    let mut times: [Vec<f64>; METHODS] = Default::default();
    for round in 0..=ROUNDS {
        for i in 0..PER_ROUND {
            for k in 0..METHODS {
                // One pair of each in turn, each time in another order, so
                // that the machine's other work weighs on all alike; round 0
                // is the warm-up.
                let method = (k + i) % METHODS;
                let start = Instant::now();
                match method {
                    0 => try_pair()?,
                    1 => wait_pair()?,
                    2 => raw_ids(&mut conn)?,
                    3 => raw_session(&mut conn)?,
                    _ => raw_plain(&mut conn)?,
                }
                if round > 0 {
                    times[method].push(us(start.elapsed()));
                }
            }
        }
    }
    let times = times.map(sorted);
    let cell = |t: &Vec<f64>| format!("{:.1} / {:.1}", pct(t, 0.5), pct(t, 0.99));
    let ratio =
        |a: &Vec<f64>, b: &Vec<f64>| format!("{:.2}x / {:.2}x", pct(a, 0.5) / pct(b, 0.5), pct(a, 0.99) / pct(b, 0.99));
    println!(
        "| Rust | {} | {} | {} | {} | {} | {} | {} | {} |",
        times[0].len(),
        cell(&times[0]),
        cell(&times[1]),
        cell(&times[2]),
        cell(&times[3]),
        cell(&times[4]),
        ratio(&times[0], &times[3]),
        ratio(&times[0], &times[2]),
    );
    Ok(())
}

// --- contended ---

const THREADS: usize = 8;
const HOLD: Duration = Duration::from_micros(100);

fn busy(d: Duration) {
    let start = Instant::now();
    while start.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// One thread's lock: acquire, then release.
trait Worker: Send {
    fn acquire(&mut self) -> Res<()>;
    fn release(&mut self) -> Res<()>;
}

/// Raw blocking waits on a connection of the thread's own.
struct RawWorker {
    conn: Connection,
    owner: String,
}

impl Worker for RawWorker {
    fn acquire(&mut self) -> Res<()> {
        int(&mut self.conn, redis::cmd("FLOCK.ACQUIRE").arg("c:raw").arg(&self.owner).arg(30_000).arg("WAIT").arg(0))?;
        Ok(())
    }

    fn release(&mut self) -> Res<()> {
        int(&mut self.conn, redis::cmd("FLOCK.RELEASE").arg("c:raw").arg(&self.owner))?;
        Ok(())
    }
}

/// The API: `acquire_on(&client, Some(FOREVER))`, `release()`.
struct ApiWorker {
    client: Client,
    lock: Lock,
    guard: Option<Guard<flock_client::SharedConnection>>,
}

impl Worker for ApiWorker {
    fn acquire(&mut self) -> Res<()> {
        self.guard = Some(self.lock.acquire_on(&self.client, Some(FOREVER))?.ok_or("not granted")?);
        Ok(())
    }

    fn release(&mut self) -> Res<()> {
        self.guard.take().ok_or("not held")?.release()?;
        Ok(())
    }
}

/// The session's way with the raw commands the client sends and no client
/// code: a thread reads `FLOCK.INBOX` and hands each grant to its waiting
/// thread (a channel per owner); each thread sends `FLOCK.ACQUIRE key owner
/// 0 WAIT 0 INBOX sid ID <uuid>` and `FLOCK.RELEASE key owner ID <uuid>` on
/// a connection of its own.
struct RawSession {
    sid: String,
    waiting: Arc<std::sync::Mutex<std::collections::HashMap<String, std::sync::mpsc::Sender<()>>>>,
}

impl RawSession {
    fn open(client: &Client) -> Res<RawSession> {
        let mut conn = client.get_connection()?;
        let sid: String = redis::cmd("FLOCK.SESSION").arg("TIMEOUT").arg(3_600_000).query(&mut conn)?;
        let waiting: Arc<std::sync::Mutex<std::collections::HashMap<String, std::sync::mpsc::Sender<()>>>> =
            Arc::default();
        let senders = Arc::clone(&waiting);
        // Runs until the process ends.
        thread::spawn(move || loop {
            let Ok(events) = redis::cmd("FLOCK.INBOX").arg(0).query::<Option<Vec<Vec<redis::Value>>>>(&mut conn) else {
                return;
            };
            for event in events.unwrap_or_default() {
                let text = |v: &redis::Value| match v {
                    redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                    other => format!("{other:?}"),
                };
                if event.len() == 5 && text(&event[0]) == "granted" {
                    if let Some(tx) = senders.lock().expect("waiting").get(&text(&event[2])) {
                        let _ = tx.send(());
                    }
                }
            }
        });
        Ok(RawSession { sid, waiting })
    }

    fn worker(&self, client: &Client, i: usize) -> Res<SessionWorker> {
        let owner = format!("session:{i}");
        let (tx, rx) = std::sync::mpsc::channel();
        self.waiting.lock().expect("waiting").insert(owner.clone(), tx);
        Ok(SessionWorker { conn: client.get_connection()?, owner, sid: self.sid.clone(), granted: rx })
    }
}

struct SessionWorker {
    conn: Connection,
    owner: String,
    sid: String,
    granted: std::sync::mpsc::Receiver<()>,
}

impl Worker for SessionWorker {
    fn acquire(&mut self) -> Res<()> {
        let reply: redis::Value = redis::cmd("FLOCK.ACQUIRE")
            .arg("c:session")
            .arg(&self.owner)
            .arg(0)
            .arg("WAIT")
            .arg(0)
            .arg("INBOX")
            .arg(&self.sid)
            .arg("ID")
            .arg(uuid::Uuid::new_v4().to_string())
            .query(&mut self.conn)?;
        if !matches!(reply, redis::Value::Int(_)) {
            self.granted.recv()?;
        }
        Ok(())
    }

    fn release(&mut self) -> Res<()> {
        let id = uuid::Uuid::new_v4().to_string();
        int(&mut self.conn, redis::cmd("FLOCK.RELEASE").arg("c:session").arg(&self.owner).arg("ID").arg(id))?;
        Ok(())
    }
}

/// A run: grants per second, and per grant the hand-off (from the previous
/// holder's release call to this thread's acquire returning), in us.
struct Run {
    grants_per_second: f64,
    handoffs: Vec<f64>,
}

/// `THREADS` threads, each with a worker made by `make`, for `run`.
fn run_threads(run: Duration, make: impl Fn(usize) -> Res<Box<dyn Worker>>) -> Res<Run> {
    let stop = Arc::new(AtomicBool::new(false));
    let grants = Arc::new(AtomicU64::new(0));
    let start = Arc::new(Barrier::new(THREADS + 1));
    // When the last release call began, as nanoseconds since `epoch`.
    let epoch = Instant::now();
    let release_sent = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for i in 0..THREADS {
        let mut worker = make(i)?;
        let (stop, grants, start, sent) =
            (Arc::clone(&stop), Arc::clone(&grants), Arc::clone(&start), Arc::clone(&release_sent));
        handles.push(thread::spawn(move || -> Res<Vec<f64>> {
            let mut handoffs = Vec::new();
            start.wait();
            while !stop.load(Ordering::Relaxed) {
                worker.acquire()?;
                let got = epoch.elapsed().as_nanos() as u64;
                let last = sent.load(Ordering::Relaxed);
                if last != 0 {
                    handoffs.push(got.saturating_sub(last) as f64 / 1e3);
                }
                grants.fetch_add(1, Ordering::Relaxed);
                busy(HOLD);
                sent.store(epoch.elapsed().as_nanos() as u64, Ordering::Relaxed);
                worker.release()?;
            }
            Ok(handoffs)
        }));
    }
    start.wait();
    let began = Instant::now();
    thread::sleep(run);
    let counted = grants.load(Ordering::Relaxed);
    let elapsed = began.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut handoffs = Vec::new();
    for h in handles {
        handoffs.extend(h.join().map_err(|_| "a thread panicked")??);
    }
    Ok(Run { grants_per_second: counted as f64 / elapsed.as_secs_f64(), handoffs })
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

fn contended(url: &str) -> Res<()> {
    const REPEATS: usize = 3;
    let run = Duration::from_secs(3);
    let client = Client::open(url)?;
    let session = RawSession::open(&client)?;
    let raw_worker = |i: usize| -> Res<Box<dyn Worker>> {
        Ok(Box::new(RawWorker { conn: client.get_connection()?, owner: format!("raw:{i}") }))
    };
    let api_worker = |_: usize| -> Res<Box<dyn Worker>> {
        Ok(Box::new(ApiWorker {
            client: client.clone(),
            lock: Lock::new("c:api", Duration::from_secs(30)),
            guard: None,
        }))
    };
    let session_worker = |i: usize| -> Res<Box<dyn Worker>> { Ok(Box::new(session.worker(&client, i)?)) };
    // A short warm-up of each, uncounted.
    for make in [&raw_worker as &dyn Fn(usize) -> Res<Box<dyn Worker>>, &api_worker, &session_worker] {
        run_threads(Duration::from_secs(1), make)?;
    }
    let (mut api, mut raw, mut sess, mut ratios) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut api_h, mut raw_h, mut sess_h) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..REPEATS {
        let r = run_threads(run, raw_worker)?;
        let a = run_threads(run, api_worker)?;
        let s = run_threads(run, session_worker)?;
        ratios.push(a.grants_per_second / r.grants_per_second);
        raw.push(r.grants_per_second);
        api.push(a.grants_per_second);
        sess.push(s.grants_per_second);
        raw_h.extend(r.handoffs);
        api_h.extend(a.handoffs);
        sess_h.extend(s.handoffs);
    }
    let ratios = sorted(ratios);
    println!(
        "| Rust | {THREADS} | {REPEATS} x {} s | {:.0} | {:.0} | {:.0} | {:.2}x ({:.2}x to {:.2}x) | {:.0} / {:.0} / {:.0} |",
        run.as_secs(),
        pct(&sorted(api), 0.5),
        pct(&sorted(sess), 0.5),
        pct(&sorted(raw), 0.5),
        pct(&ratios, 0.5),
        ratios[0],
        ratios[ratios.len() - 1],
        mean(&api_h),
        mean(&sess_h),
        mean(&raw_h),
    );
    Ok(())
}

// --- who knows first ---

/// scripts/partition-proxy.py in front of the server.
struct Proxy {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    port: u16,
}

impl Proxy {
    fn start(server_port: &str) -> Res<Proxy> {
        // PARTITION_PROXY: another proxy script with the same interface.
        let script = std::env::var("PARTITION_PROXY").unwrap_or_else(|_| "scripts/partition-proxy.py".into());
        let mut child = Command::new("python3")
            .arg(script)
            .arg(format!("127.0.0.1:{server_port}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdin = child.stdin.take().ok_or("stdin")?;
        let mut stdout = BufReader::new(child.stdout.take().ok_or("stdout")?);
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        let port = line.trim().parse()?;
        Ok(Proxy { child, stdin, stdout, port })
    }

    fn say(&mut self, what: &str) -> Res<()> {
        writeln!(self.stdin, "{what}")?;
        self.stdin.flush()?;
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        if line.trim() != "ok" {
            return Err(format!("proxy answered {line:?} to {what}").into());
        }
        Ok(())
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.say("quit");
        let _ = self.child.wait();
    }
}

#[derive(Clone, Copy)]
enum Grant {
    /// Session grants, with this session timeout.
    Session(Duration),
    /// A fixed lease (through a session of 10 s).
    Lease(Duration),
    /// No session: a lease of this length renewed by the watchdog.
    Watchdog(Duration),
}

/// The holder's guards, over a session's shared connection or plain
/// connections.
enum Held {
    Shared(Vec<Guard<flock_client::SharedConnection>>),
    Plain(Vec<Guard<Connection>>),
}

impl Held {
    fn lost_at(&self) -> Vec<Option<Instant>> {
        match self {
            Held::Shared(g) => g.iter().map(|g| g.lost_at()).collect(),
            Held::Plain(g) => g.iter().map(|g| g.lost_at()).collect(),
        }
    }

    fn reasons(&self) -> Vec<Option<LeaseLost>> {
        match self {
            Held::Shared(g) => g.iter().map(|g| g.lost_reason()).collect(),
            Held::Plain(g) => g.iter().map(|g| g.lost_reason()).collect(),
        }
    }

    /// Releases every guard (each fails: lost), on threads, so that the
    /// releases over connections cut off meanwhile do not add up.
    fn release(self) {
        match self {
            Held::Shared(g) => g.into_iter().for_each(|g| drop(g.release())),
            Held::Plain(g) => {
                let handles: Vec<_> = g.into_iter().map(|g| thread::spawn(move || drop(g.release()))).collect();
                handles.into_iter().for_each(|h| drop(h.join()));
            }
        }
    }
}

fn flock_waiters(admin: &mut Connection) -> Res<u64> {
    let info: String = redis::cmd("INFO").arg("flock").query(admin)?;
    let line = info.lines().find_map(|l| l.strip_prefix("flock_waiters:")).ok_or("no flock_waiters in INFO")?;
    Ok(line.trim().parse()?)
}

/// One round's trials: per key, when the holder heard of the loss (`None`:
/// never), its `lost_at`, its reason, and when the waiter was granted.
struct Round {
    lost: Vec<Option<Instant>>,
    lost_at: Vec<Option<Instant>>,
    reasons: Vec<Option<LeaseLost>>,
    granted: Vec<Instant>,
}

/// One round: `keys` locks held behind a new proxy as `grant` says, a
/// waiter each, then the cut, `delay` after the waiters queued.
fn round(server_port: &str, name: &str, n: usize, grant: Grant, keys: usize, delay: Duration) -> Res<Round> {
    let direct = Client::open(format!("redis://127.0.0.1:{server_port}/"))?;
    let mut admin = direct.get_connection()?;
    let mut proxy = Proxy::start(server_port)?;
    let holder = Client::open(format!("redis://127.0.0.1:{}/", proxy.port))?;
    let key = |i: usize| format!("f:{name}:{n}:{i}");
    // The waiters' connections first, so that they queue at once.
    let go = Arc::new(Barrier::new(keys + 1));
    let mut waiters = Vec::new();
    for i in 0..keys {
        let mut conn = direct.get_connection()?;
        let (go, k) = (Arc::clone(&go), key(i));
        waiters.push(thread::spawn(move || -> Res<Instant> {
            go.wait();
            int(&mut conn, redis::cmd("FLOCK.ACQUIRE").arg(&k).arg("w").arg(30_000).arg("WAIT").arg(0))?;
            let granted = Instant::now();
            int(&mut conn, redis::cmd("FLOCK.RELEASE").arg(&k).arg("w"))?;
            Ok(granted)
        }));
    }
    let mut channels = Vec::new();
    let held = match grant {
        Grant::Session(_) | Grant::Lease(_) => {
            let mut guards = Vec::new();
            for i in 0..keys {
                let lock = match grant {
                    Grant::Lease(l) => Lock::new(key(i), l).lease(l).session_timeout(Duration::from_secs(10)),
                    Grant::Session(t) | Grant::Watchdog(t) => Lock::new(key(i), t).session_timeout(t),
                };
                let guard = lock.acquire_on(&holder, None)?.ok_or("the holder was not granted")?;
                channels.push(guard.lost_channel());
                guards.push(guard);
            }
            Held::Shared(guards)
        }
        Grant::Watchdog(lease) => {
            let mut guards = Vec::new();
            for i in 0..keys {
                let conn = holder.get_connection()?;
                let mut guard = Lock::new(key(i), lease).acquire(conn, None)?.ok_or("the holder was not granted")?;
                channels.push(guard.watchdog(&holder)?);
                guards.push(guard);
            }
            // A few renewals first, so that the grants outlive their lease.
            thread::sleep(lease * 2);
            Held::Plain(guards)
        }
    };
    let losses: Vec<_> = channels
        .into_iter()
        .map(|rx| {
            thread::spawn(move || -> Option<Instant> {
                rx.recv().ok()?;
                Some(Instant::now())
            })
        })
        .collect();
    go.wait();
    let queued = Instant::now();
    while flock_waiters(&mut admin)? < keys as u64 {
        if queued.elapsed() > Duration::from_secs(10) {
            return Err("the waiters did not queue".into());
        }
        thread::sleep(MS);
    }
    thread::sleep(delay);
    proxy.say("cut")?;
    let mut granted = Vec::new();
    for w in waiters {
        granted.push(w.join().map_err(|_| "a waiter panicked")??);
    }
    let lost = losses.into_iter().map(|h| h.join().ok().flatten()).collect();
    let (lost_at, reasons) = (held.lost_at(), held.reasons());
    proxy.say("heal")?;
    held.release();
    if let Grant::Session(_) | Grant::Lease(_) = grant {
        let _ = close_session(&holder);
    }
    Ok(Round { lost, lost_at, reasons, granted })
}

/// A random duration in [0, max).
fn random_below(max: Duration) -> Duration {
    let r = (uuid::Uuid::new_v4().as_u128() >> 64) as u64;
    Duration::from_nanos(r % (max.as_nanos() as u64).max(1))
}

/// A configuration: `rounds` rounds of `keys` locks, each cut at a random
/// time up to `max_delay` after its waiters queued (so at any point of the
/// heartbeat or renewal cycle). Prints its row.
fn trial(server_port: &str, name: &str, grant: Grant, rounds: usize, keys: usize, max_delay: Duration) -> Res<()> {
    let (mut gaps, mut late, mut first_grant, mut unheard) = (Vec::new(), Vec::new(), 0, 0);
    let mut why: Vec<String> = Vec::new();
    for n in 0..rounds {
        let r = round(server_port, name, n, grant, keys, random_below(max_delay))?;
        for i in 0..keys {
            why.push(r.reasons[i].map_or("none".into(), |r| r.to_string()));
            let Some(l) = r.lost[i] else {
                unheard += 1;
                continue;
            };
            let gap = ms_between(r.granted[i], l);
            if gap < 0.0 {
                first_grant += 1;
            }
            gaps.push(gap);
            if let Some(at) = r.lost_at[i] {
                late.push(ms_between(l, at));
            }
        }
    }
    why.sort();
    why.dedup();
    let (gaps, late) = (sorted(gaps), sorted(late));
    let never = if unheard > 0 { format!(", {unheard} never heard") } else { String::new() };
    println!(
        "| Rust | {name} | {} ({rounds} x {keys}) | {:.1} | {:.1} | {:.1} | {} | {:.2} | {}{never} |",
        rounds * keys,
        gaps[0],
        pct(&gaps, 0.5),
        pct(&gaps, 0.99),
        first_grant + unheard,
        pct(&late, 0.99),
        why.join(", "),
    );
    Ok(())
}

fn first(_url: &str, port: &str) -> Res<()> {
    // A third of the session timeout is the heartbeat's cycle, a third of
    // the watchdog's lease its renewal's: the cut falls anywhere in them.
    trial(port, "session 200 ms", Grant::Session(200 * MS), 10, 10, 150 * MS)?;
    trial(port, "session 1 s", Grant::Session(1000 * MS), 5, 20, 700 * MS)?;
    trial(port, "session 10 s", Grant::Session(10_000 * MS), 2, 25, 7000 * MS)?;
    trial(port, "lease 500 ms", Grant::Lease(500 * MS), 2, 50, Duration::ZERO)?;
    trial(port, "watchdog 600 ms", Grant::Watchdog(600 * MS), 4, 25, 300 * MS)?;
    Ok(())
}
