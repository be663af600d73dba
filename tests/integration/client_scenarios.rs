//! The shared client scenarios (`clients/scenarios.json`, explained in
//! `clients/SCENARIOS.md`) played through the Rust client's public API: one
//! test per scenario, named after it.
//!
//! Each scenario gets a server of its own. A process is a `redis::Client`
//! of its own, through a dropping proxy of its own (so it has its own
//! session, and its replies can be dropped or its connections killed); an
//! actor is a thread of its process, so it is one owner (`<process
//! id>:<thread id>`) and acquiring again reenters. `FLOCK.INFO`,
//! `FLOCK.FORCERELEASE` go over a connection of the runner's own. A
//! scenario's `session_timeout_ms` is every lock's `.session_timeout`; a
//! hold without `lease_ms` is the client's default, a session grant; a
//! `partition` cuts the process's proxy off (sockets kept open).

use crate::common::proxy::Proxy;
use crate::common::*;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flock_client::{CancelToken, Guard, Lock, RwLock, Semaphore, SharedConnection, WATCHDOG_LEASE};

/// How long an `await_*` step waits without its own `within_ms`.
const AWAIT: Duration = Duration::from_secs(10);
/// The wait of a `start_acquire` without `wait_ms`.
const START_WAIT_MS: u64 = 20_000;

macro_rules! scenarios {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                play(stringify!($name));
            }
        )*

        /// Every scenario of the file has its test above, and no test
        /// names a scenario the file does not have.
        #[test]
        fn every_scenario_of_the_file_has_a_test() {
            let mut listed = vec![$(stringify!($name)),*];
            listed.sort_unstable();
            let mut in_file: Vec<String> = load().into_iter().map(|s| s.name).collect();
            in_file.sort_unstable();
            assert_eq!(listed, in_file, "the scenarios! list and {}", scenarios_path().display());
        }
    };
}

scenarios!(
    fifo_across_threads,
    reentry,
    resend_after_a_lost_reply,
    loss_pushed_on_forcerelease,
    loss_pushed_on_lease_end,
    cancel_a_wait,
    a_killed_process_waiters_leave,
    wrong_mode_and_upgrade,
    semaphore_limit,
    cut_off_holder_knows_first,
    cut_off_holder_with_a_fixed_lease_knows_first,
    a_session_silent_for_less_than_its_timeout_loses_nothing,
    a_waiting_process_cut_off_at_its_turn_holds_nobody_up_past_its_timeout,
    a_release_a_failover_lost_is_given_back,
    a_refused_release_is_given_back,
);

/// The client's constants are the `protocol` block of the file
/// (docs/client-protocol.md, "The rules every client shares").
#[test]
fn the_clients_constants_are_the_protocol_blocks() {
    use flock_client::*;
    let path = scenarios_path();
    let json = Json::parse(&std::fs::read_to_string(&path).expect("read the scenarios")).expect("parse");
    let protocol = json.get("protocol").expect("a protocol block");
    let num = |field: &str| protocol.num(field).unwrap_or_else(|| panic!("protocol.{field}"));
    assert_eq!(num("heartbeat_fraction"), u64::from(HEARTBEAT_FRACTION));
    assert_eq!(num("drift_margin_ms"), DRIFT_MARGIN_MS);
    assert_eq!(num("drift_margin_percent"), u64::from(DRIFT_MARGIN_PERCENT));
    assert_eq!(num("watchdog_lease_ms"), WATCHDOG_LEASE.as_millis() as u64);
    assert_eq!(num("watchdog_renew_fraction"), u64::from(WATCHDOG_RENEW_FRACTION));
    assert_eq!(num("resends"), RESENDS as u64);
    assert_eq!(num("cancel_grace_ms"), CANCEL_GRACE.as_millis() as u64);
    let Some(Json::Arr(reasons)) = protocol.get("loss_reasons") else { panic!("protocol.loss_reasons") };
    let reasons: Vec<&str> = reasons
        .iter()
        .map(|r| match r {
            Json::Str(s) => s.as_str(),
            other => panic!("a reason {}", other.show()),
        })
        .collect();
    let ours: Vec<&str> = LeaseLost::ALL.iter().map(|r| r.as_str()).collect();
    assert_eq!(ours, reasons, "LeaseLost::ALL and its names");
    for reason in LeaseLost::ALL {
        assert_eq!(reason.to_string(), reason.as_str());
    }
}

// ---------------------------------------------------------------------------
// The file.

struct Scenario {
    name: String,
    session_timeout: Option<Duration>,
    steps: Vec<Json>,
}

/// `clients/scenarios.json`, found from the package's directory upward.
fn scenarios_path() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    root.ancestors()
        .map(|dir| dir.join("clients").join("scenarios.json"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("no clients/scenarios.json in {} or above", root.display()))
}

fn load() -> Vec<Scenario> {
    let path = scenarios_path();
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let json = Json::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let Some(Json::Arr(scenarios)) = json.get("scenarios") else { panic!("{}: no scenarios array", path.display()) };
    scenarios
        .iter()
        .map(|s| Scenario {
            name: s.str("name").expect("a scenario without a name").to_string(),
            session_timeout: s.num("session_timeout_ms").map(Duration::from_millis),
            steps: match s.get("steps") {
                Some(Json::Arr(steps)) => steps.clone(),
                _ => panic!("scenario {:?} without steps", s.str("name")),
            },
        })
        .collect()
}

/// Just enough JSON for the scenarios file.
#[derive(Clone, Debug)]
enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    fn parse(text: &str) -> Result<Json, String> {
        let mut p = Parser { s: text.as_bytes(), i: 0 };
        let v = p.value()?;
        p.ws();
        if p.i != p.s.len() {
            return Err(format!("trailing text at byte {}", p.i));
        }
        Ok(v)
    }

    fn get(&self, field: &str) -> Option<&Json> {
        match self {
            Json::Obj(fields) => fields.iter().find(|(k, _)| k == field).map(|(_, v)| v),
            _ => None,
        }
    }

    fn str(&self, field: &str) -> Option<&str> {
        match self.get(field)? {
            Json::Str(s) => Some(s),
            _ => None,
        }
    }

    fn num(&self, field: &str) -> Option<u64> {
        match self.get(field)? {
            Json::Num(n) if *n >= 0.0 && n.fract() == 0.0 => Some(*n as u64),
            _ => None,
        }
    }

    /// Compact, for messages.
    fn show(&self) -> String {
        match self {
            Json::Null => "null".into(),
            Json::Bool(b) => b.to_string(),
            Json::Num(n) => n.to_string(),
            Json::Str(s) => format!("{s:?}"),
            Json::Arr(items) => format!("[{}]", items.iter().map(Json::show).collect::<Vec<_>>().join(", ")),
            Json::Obj(fields) => format!(
                "{{{}}}",
                fields.iter().map(|(k, v)| format!("{k:?}: {}", v.show())).collect::<Vec<_>>().join(", ")
            ),
        }
    }
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.s.get(self.i).is_some_and(u8::is_ascii_whitespace) {
            self.i += 1;
        }
    }

    fn eat(&mut self, b: u8) -> Result<(), String> {
        self.ws();
        if self.s.get(self.i) == Some(&b) {
            self.i += 1;
            Ok(())
        } else {
            Err(format!("expected {:?} at byte {}", b as char, self.i))
        }
    }

    fn value(&mut self) -> Result<Json, String> {
        self.ws();
        match self.s.get(self.i) {
            Some(b'{') => {
                self.i += 1;
                let mut fields = Vec::new();
                self.ws();
                if self.s.get(self.i) == Some(&b'}') {
                    self.i += 1;
                    return Ok(Json::Obj(fields));
                }
                loop {
                    self.ws();
                    let key = self.string()?;
                    self.eat(b':')?;
                    fields.push((key, self.value()?));
                    self.ws();
                    match self.s.get(self.i) {
                        Some(b',') => self.i += 1,
                        Some(b'}') => {
                            self.i += 1;
                            return Ok(Json::Obj(fields));
                        }
                        _ => return Err(format!("expected ',' or '}}' at byte {}", self.i)),
                    }
                }
            }
            Some(b'[') => {
                self.i += 1;
                let mut items = Vec::new();
                self.ws();
                if self.s.get(self.i) == Some(&b']') {
                    self.i += 1;
                    return Ok(Json::Arr(items));
                }
                loop {
                    items.push(self.value()?);
                    self.ws();
                    match self.s.get(self.i) {
                        Some(b',') => self.i += 1,
                        Some(b']') => {
                            self.i += 1;
                            return Ok(Json::Arr(items));
                        }
                        _ => return Err(format!("expected ',' or ']' at byte {}", self.i)),
                    }
                }
            }
            Some(b'"') => Ok(Json::Str(self.string()?)),
            Some(b't') => self.word("true", Json::Bool(true)),
            Some(b'f') => self.word("false", Json::Bool(false)),
            Some(b'n') => self.word("null", Json::Null),
            Some(_) => {
                let start = self.i;
                while self.s.get(self.i).is_some_and(|b| b"+-.eE0123456789".contains(b)) {
                    self.i += 1;
                }
                std::str::from_utf8(&self.s[start..self.i])
                    .ok()
                    .and_then(|n| n.parse().ok())
                    .map(Json::Num)
                    .ok_or_else(|| format!("bad value at byte {start}"))
            }
            None => Err("unexpected end".into()),
        }
    }

    fn word(&mut self, word: &str, v: Json) -> Result<Json, String> {
        if self.s[self.i..].starts_with(word.as_bytes()) {
            self.i += word.len();
            Ok(v)
        } else {
            Err(format!("bad literal at byte {}", self.i))
        }
    }

    fn string(&mut self) -> Result<String, String> {
        self.eat(b'"')?;
        let mut out = Vec::new();
        loop {
            let b = *self.s.get(self.i).ok_or("unterminated string")?;
            self.i += 1;
            match b {
                b'"' => return String::from_utf8(out).map_err(|e| e.to_string()),
                b'\\' => {
                    let e = *self.s.get(self.i).ok_or("unterminated escape")?;
                    self.i += 1;
                    let c = match e {
                        b'n' => '\n',
                        b't' => '\t',
                        b'r' => '\r',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'u' => {
                            let hex = self.s.get(self.i..self.i + 4).ok_or("short \\u escape")?;
                            self.i += 4;
                            let code = std::str::from_utf8(hex)
                                .ok()
                                .and_then(|h| u32::from_str_radix(h, 16).ok())
                                .ok_or("bad \\u escape")?;
                            char::from_u32(code).unwrap_or('\u{fffd}')
                        }
                        other => other as char,
                    };
                    let mut buf = [0; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
                _ => out.push(b),
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Actors: a thread each, which acquires and releases what the runner asks.

/// How an acquire ended, as the file names it: `granted`, `busy`,
/// `cancelled` or `error:CODE`.
type Outcome = String;

type Held = Arc<Mutex<HashMap<String, Vec<Guard<SharedConnection>>>>>;

/// When an actor's acquire of a key returned granted, by key.
type Times = Arc<Mutex<HashMap<String, Instant>>>;

/// What a step asks of an actor's thread.
enum Job {
    Acquire { key: String, how: How, wait: Option<Duration>, cancel: CancelToken, done: Sender<Outcome> },
    Release { key: String, mode: String, done: Sender<Result<(), String>> },
}

#[derive(Clone)]
struct How {
    mode: String,
    permits: u32,
    limit: u32,
    /// A fixed lease, or `None` for the client's default (a session grant).
    lease: Option<Duration>,
    session_timeout: Option<Duration>,
}

struct Actor {
    process: String,
    owner: String,
    jobs: Option<Sender<Job>>,
    /// Its grants by key, the latest last.
    held: Held,
    granted_at: Times,
    /// The started acquire whose outcome is not read yet, and its cancel handle.
    started: Option<(Receiver<Outcome>, CancelToken)>,
}

impl Actor {
    fn spawn(process: &str, client: &redis::Client) -> Actor {
        let (jobs, inbox) = mpsc::channel::<Job>();
        let (owner_tx, owner_rx) = mpsc::channel();
        let held = Held::default();
        let granted_at = Times::default();
        let (client, mine, times) = (client.clone(), Arc::clone(&held), Arc::clone(&granted_at));
        std::thread::spawn(move || {
            let _ = owner_tx.send(Lock::new("", WATCHDOG_LEASE).owner());
            for job in inbox {
                match job {
                    Job::Acquire { key, how, wait, cancel, done } => {
                        let outcome = acquire(&client, &key, &how, wait, &cancel, &mine, &times);
                        let _ = done.send(outcome);
                    }
                    Job::Release { key, mode, done } => {
                        let _ = done.send(release(&key, &mode, &mine));
                    }
                }
            }
        });
        let owner = owner_rx.recv_timeout(AWAIT).expect("the actor's thread starts");
        Actor { process: process.to_string(), owner, jobs: Some(jobs), held, granted_at, started: None }
    }

    fn send(&self, job: Job) -> Result<(), String> {
        self.jobs
            .as_ref()
            .ok_or("the actor's process was killed")?
            .send(job)
            .map_err(|_| "the actor's thread is gone".into())
    }
}

fn code_of(e: &redis::RedisError) -> String {
    e.code().map(str::to_string).unwrap_or_else(|| format!("{:?} ({e})", e.kind()))
}

/// On the actor's thread: one acquire through the public API.
fn acquire(
    client: &redis::Client,
    key: &str,
    how: &How,
    wait: Option<Duration>,
    cancel: &CancelToken,
    held: &Held,
    granted_at: &Times,
) -> Outcome {
    // The same setters on every kind of lock.
    macro_rules! set {
        ($lock:expr) => {{
            let mut lock = $lock.cancel_with(cancel);
            if let Some(lease) = how.lease {
                lock = lock.lease(lease);
            }
            if let Some(timeout) = how.session_timeout {
                lock = lock.session_timeout(timeout);
            }
            lock
        }};
    }
    let result = match how.mode.as_str() {
        "exclusive" => set!(Lock::new(key, WATCHDOG_LEASE)).acquire_on(client, wait),
        "shared" => set!(RwLock::new(key, WATCHDOG_LEASE)).read_on(client, wait),
        "permits" => set!(Semaphore::new(key, how.limit, WATCHDOG_LEASE)).acquire_on(client, how.permits, wait),
        other => return format!("unknown mode {other:?}"),
    };
    match result {
        Ok(Some(guard)) => {
            granted_at.lock().unwrap().insert(key.to_string(), Instant::now());
            held.lock().unwrap().entry(key.to_string()).or_default().push(guard);
            "granted".into()
        }
        Ok(None) => "busy".into(),
        Err(e) if e.code() == Some("CANCELLED") => "cancelled".into(),
        Err(e) => format!("error:{}", code_of(&e)),
    }
}

/// On the actor's thread: releases its latest hold of `key` in `mode`.
fn release(key: &str, mode: &str, held: &Held) -> Result<(), String> {
    let guard = {
        let mut held = held.lock().unwrap();
        let guards = held.get_mut(key).ok_or("the actor holds nothing of this key")?;
        let i = guards.iter().rposition(|g| mode_name(g) == mode).ok_or("the actor has no hold in this mode")?;
        guards.remove(i)
    };
    guard.release().map(drop).map_err(|e| format!("error:{}", code_of(&e)))
}

fn mode_name(g: &Guard<SharedConnection>) -> &'static str {
    match g.mode() {
        flock_client::Mode::Exclusive => "exclusive",
        flock_client::Mode::Shared => "shared",
        flock_client::Mode::Permits { .. } => "permits",
    }
}

// ---------------------------------------------------------------------------
// The runner.

struct Process {
    proxy: Proxy,
    client: redis::Client,
    /// How many `drop_next_reply` steps named it.
    drops: usize,
}

/// Dropped in field order: the actors (whose threads release what they
/// still hold) and processes before the server.
struct Runner {
    actors: HashMap<String, Actor>,
    processes: HashMap<String, Process>,
    name: String,
    admin: Connection,
    /// What `save_key` kept, by key.
    saved: HashMap<String, Vec<u8>>,
    session_timeout: Option<Duration>,
    server: Server,
}

/// Polls `cond` until it holds, or fails with `what` after `within`.
fn await_until(what: impl Fn() -> String, within: Duration, mut cond: impl FnMut() -> bool) -> Result<(), String> {
    let deadline = Instant::now() + within;
    while !cond() {
        if Instant::now() >= deadline {
            return Err(format!("not within {within:?}: {}", what()));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

fn play(name: &str) {
    let scenario = load().into_iter().find(|s| s.name == name).unwrap_or_else(|| panic!("no scenario {name}"));
    let server = Server::start();
    let admin = server.conn();
    let mut runner = Runner {
        actors: HashMap::new(),
        processes: HashMap::new(),
        name: name.to_string(),
        admin,
        saved: HashMap::new(),
        session_timeout: scenario.session_timeout,
        server,
    };
    for (i, step) in scenario.steps.iter().enumerate() {
        if let Err(e) = runner.step(step) {
            panic!("scenario {name}, step {} {}: {e}", i + 1, step.show());
        }
    }
    // A reply to drop that never came would make the scenario moot.
    for (process, p) in &runner.processes {
        assert_eq!(p.proxy.dropped(), p.drops, "scenario {name}: replies dropped on the way to process {process}");
    }
    runner.server.assert_alive(name);
}

impl Runner {
    fn key(&self, step: &Json) -> Result<String, String> {
        Ok(format!("{}:{}", self.name, step.str("key").ok_or("no key")?))
    }

    fn process(&mut self, name: &str) -> &mut Process {
        let port = self.server.port;
        self.processes.entry(name.to_string()).or_insert_with(|| {
            let proxy = Proxy::start(port);
            let client = redis::Client::open(proxy.url()).expect("client");
            Process { proxy, client, drops: 0 }
        })
    }

    fn actor(&mut self, step: &Json) -> Result<&mut Actor, String> {
        let name = step.str("actor").ok_or("no actor")?.to_string();
        if !self.actors.contains_key(&name) {
            let process = step.str("process").unwrap_or("main").to_string();
            let client = self.process(&process).client.clone();
            self.actors.insert(name.clone(), Actor::spawn(&process, &client));
        }
        Ok(self.actors.get_mut(&name).expect("just made"))
    }

    fn within(step: &Json) -> Duration {
        step.num("within_ms").map_or(AWAIT, Duration::from_millis)
    }

    fn info(&mut self, key: &str) -> Option<Vec<(String, Value)>> {
        info(&mut self.admin, key)
    }

    /// The holds of `owner` in `FLOCK.INFO key` (the owner's, or its entry
    /// among the holders of a shared or semaphore key).
    fn holds_of(&mut self, key: &str, owner: &str) -> i64 {
        let Some(fields) = self.info(key) else { return 0 };
        let field =
            |fields: &[(String, Value)], name: &str| fields.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        let is_owner = |fields: &[(String, Value)]| {
            field(fields, "owner").and_then(|v| redis::from_redis_value::<String>(&v).ok()).as_deref() == Some(owner)
        };
        if is_owner(&fields) {
            return field(&fields, "holds").map_or(0, |v| int(&v));
        }
        if let Some(Value::Array(holders)) = field(&fields, "holders") {
            for holder in holders {
                let holder = fields_of(&holder);
                if is_owner(&holder) {
                    return field(&holder, "holds").map_or(0, |v| int(&v));
                }
            }
        }
        0
    }

    fn step(&mut self, step: &Json) -> Result<(), String> {
        let op = step.str("op").ok_or("no op")?;
        match op {
            "acquire" | "start_acquire" => {
                let key = self.key(step)?;
                let how = How {
                    mode: step.str("mode").unwrap_or("exclusive").to_string(),
                    permits: step.num("permits").unwrap_or(1) as u32,
                    limit: step.num("limit").unwrap_or(1) as u32,
                    lease: step.num("lease_ms").map(Duration::from_millis),
                    session_timeout: self.session_timeout,
                };
                let wait_ms = step.num("wait_ms").unwrap_or(if op == "acquire" { 0 } else { START_WAIT_MS });
                let wait = (wait_ms > 0).then(|| Duration::from_millis(wait_ms));
                let cancel = CancelToken::new();
                let (done, outcome) = mpsc::channel();
                let actor = self.actor(step)?;
                if actor.started.is_some() {
                    return Err("the actor's started acquire was not awaited".into());
                }
                actor.send(Job::Acquire { key, how, wait, cancel: cancel.clone(), done })?;
                if op == "start_acquire" {
                    actor.started = Some((outcome, cancel));
                    return Ok(());
                }
                let outcome = outcome
                    .recv_timeout(wait.unwrap_or_default() + AWAIT)
                    .map_err(|_| "the acquire did not end".to_string())?;
                expect_outcome(step, &outcome)
            }
            "await_result" => {
                let within = Self::within(step);
                let actor = self.actor(step)?;
                let (outcome, _) = actor.started.take().ok_or("the actor has no started acquire")?;
                let outcome = outcome.recv_timeout(within).map_err(|e| match e {
                    RecvTimeoutError::Timeout => format!("no outcome within {within:?}"),
                    RecvTimeoutError::Disconnected => "the actor's thread is gone".into(),
                })?;
                expect_outcome(step, &outcome)
            }
            "expect_pending" => {
                let actor = self.actor(step)?;
                let (outcome, _) = actor.started.as_ref().ok_or("the actor has no started acquire")?;
                match outcome.try_recv() {
                    Err(TryRecvError::Empty) => Ok(()),
                    Ok(outcome) => Err(format!("the started acquire already ended: {outcome}")),
                    Err(TryRecvError::Disconnected) => Err("the actor's thread is gone".into()),
                }
            }
            "cancel" => {
                let actor = self.actor(step)?;
                let (_, cancel) = actor.started.as_ref().ok_or("the actor has no started acquire")?;
                cancel.cancel();
                Ok(())
            }
            "release" => {
                let key = self.key(step)?;
                let mode = step.str("mode").unwrap_or("exclusive").to_string();
                let (done, result) = mpsc::channel();
                let actor = self.actor(step)?;
                actor.send(Job::Release { key, mode, done })?;
                let result = result.recv_timeout(AWAIT).map_err(|_| "the release did not end".to_string())?;
                match (result, step.str("expect")) {
                    (Ok(()), None) => Ok(()),
                    (Err(e), Some(expect)) if e == expect => Ok(()),
                    (Ok(()), Some(expect)) => Err(format!("released, expected {expect}")),
                    (Err(e), _) => Err(format!("release failed: {e}")),
                }
            }
            "expect_holds" => {
                let key = self.key(step)?;
                let want = step.num("holds").ok_or("no holds")? as i64;
                let owner = self.actor(step)?.owner.clone();
                let holds = self.holds_of(&key, &owner);
                if holds == want {
                    Ok(())
                } else {
                    Err(format!("{owner} holds {holds}, expected {want}: {:?}", self.info(&key)))
                }
            }
            "await_waiters" => {
                let key = self.key(step)?;
                let want = step.num("count").ok_or("no count")? as i64;
                let within = Self::within(step);
                let admin = &mut self.admin;
                let seen = std::cell::Cell::new(0);
                await_until(
                    || format!("{want} waiters (last seen {})", seen.get()),
                    within,
                    || {
                        let fields = info(admin, &key);
                        let n = fields
                            .and_then(|f| f.into_iter().find(|(k, _)| k == "waiters"))
                            .map_or(0, |(_, v)| int(&v));
                        seen.set(n);
                        n == want
                    },
                )
            }
            "expect_free" => {
                let key = self.key(step)?;
                match self.info(&key) {
                    None => Ok(()),
                    Some(fields) => Err(format!("FLOCK.INFO is not nil: {fields:?}")),
                }
            }
            "force_release" => {
                let key = self.key(step)?;
                force_release(&mut self.admin, &key).map(drop).map_err(|e| format!("FLOCK.FORCERELEASE: {e}"))
            }
            "await_lost" | "expect_not_lost" => {
                let key = self.key(step)?;
                let within = Self::within(step);
                let reason = step.str("reason").map(str::to_string);
                let held = Arc::clone(&self.actor(step)?.held);
                // Every hold of the key the actor has: (lost, reason).
                let state = || -> Vec<(bool, Option<&'static str>)> {
                    let held = held.lock().unwrap();
                    held.get(&key).map_or_else(Vec::new, |gs| {
                        gs.iter().map(|g| (g.lost(), g.lost_reason().map(|r| r.as_str()))).collect()
                    })
                };
                if state().is_empty() {
                    return Err("the actor holds nothing of this key".into());
                }
                if op == "expect_not_lost" {
                    // Throughout `for_ms`, checked every few ms.
                    let until = Instant::now() + step.num("for_ms").map_or(Duration::ZERO, Duration::from_millis);
                    loop {
                        if let Some((_, why)) = state().iter().find(|(lost, _)| *lost) {
                            return Err(format!("reported lost ({why:?})"));
                        }
                        if Instant::now() >= until {
                            return Ok(());
                        }
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
                await_until(
                    || format!("reported lost: {:?}", state()),
                    within,
                    || state().iter().all(|(lost, _)| *lost),
                )?;
                match reason {
                    Some(want) if state().iter().any(|(_, why)| *why != Some(want.as_str())) => {
                        Err(format!("lost, but not as {want}: {:?}", state()))
                    }
                    _ => Ok(()),
                }
            }
            "drop_next_reply" => {
                let command = step.str("command").ok_or("no command")?;
                let process = step.str("process").unwrap_or("main").to_string();
                let process = self.process(&process);
                process.proxy.drop_reply_to(command, 1);
                process.drops += 1;
                Ok(())
            }
            "partition" => {
                let process = step.str("process").unwrap_or("main").to_string();
                let proxy = &self.process(&process).proxy;
                proxy.partition();
                if let Some(ms) = step.num("for_ms") {
                    // The partition's length under test.
                    std::thread::sleep(Duration::from_millis(ms));
                    proxy.heal();
                }
                Ok(())
            }
            "heal" => {
                let process = step.str("process").unwrap_or("main").to_string();
                self.process(&process).proxy.heal();
                Ok(())
            }
            "expect_lost_before" => {
                let key = self.key(step)?;
                // Since when `lost()` says so (its deadline, or the push).
                let lost = self.actor(step)?.held.lock().unwrap().get(&key).and_then(|gs| gs.last()?.lost_at());
                let other = step.str("granted").ok_or("no granted")?;
                let granted = self
                    .actors
                    .get(other)
                    .ok_or_else(|| format!("no actor {other}"))?
                    .granted_at
                    .lock()
                    .unwrap()
                    .get(&key)
                    .copied();
                match (lost, granted) {
                    (Some(lost), Some(granted)) if lost < granted => Ok(()),
                    (Some(lost), Some(granted)) => {
                        Err(format!("reported lost {:?} after {other} was granted", lost - granted))
                    }
                    (lost, granted) => Err(format!("lost at {lost:?}, {other} granted at {granted:?}")),
                }
            }
            "save_key" => {
                let key = self.key(step)?;
                let dump: Vec<u8> =
                    redis::cmd("DUMP").arg(&key).query(&mut self.admin).map_err(|e| format!("DUMP: {e}"))?;
                self.saved.insert(key, dump);
                Ok(())
            }
            "restore_key" => {
                let key = self.key(step)?;
                let dump = self.saved.get(&key).ok_or("no save_key of this key before")?;
                redis::cmd("RESTORE")
                    .arg(&key)
                    .arg(0)
                    .arg(dump)
                    .arg("REPLACE")
                    .query::<()>(&mut self.admin)
                    .map_err(|e| format!("RESTORE: {e}"))
            }
            // Each scenario has a server of its own: nothing to set back after it.
            "refuse_writes" | "accept_writes" => {
                let replicas = if op == "refuse_writes" { 1 } else { 0 };
                redis::cmd("CONFIG")
                    .arg("SET")
                    .arg("min-replicas-to-write")
                    .arg(replicas)
                    .query::<()>(&mut self.admin)
                    .map_err(|e| format!("CONFIG SET: {e}"))
            }
            "kill_process" => {
                let process = step.str("process").ok_or("no process")?.to_string();
                // Its connections close and it cannot open new ones, as a
                // dead process could not.
                self.process(&process).proxy.kill();
                // Its actors stop: their waits end (the cancel cannot reach
                // the server any more) and they take no more steps.
                for actor in self.actors.values_mut().filter(|a| a.process == process) {
                    if let Some((_, cancel)) = actor.started.take() {
                        cancel.cancel();
                    }
                    actor.jobs = None;
                }
                Ok(())
            }
            other => Err(format!("unknown op {other:?}")),
        }
    }
}

fn expect_outcome(step: &Json, outcome: &str) -> Result<(), String> {
    let expect = step.str("expect").ok_or("no expect")?;
    if outcome == expect {
        Ok(())
    } else {
        Err(format!("the outcome is {outcome}, expected {expect}"))
    }
}
