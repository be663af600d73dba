//! The process's sessions: one per server, each a dedicated connection that
//! loops `FLOCK.INBOX` on a reader thread and hands every event to the
//! thread that waits for it (a channel per wait) or to the guards of a grant
//! the server ended (their [`Loss`]). Waits are sent from any connection as
//! `FLOCK.ACQUIRE ... WAIT t INBOX session-id ID request-id`.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use redis::{Client, Cmd, Connection, ConnectionLike, RedisError, RedisResult, Value};

use crate::{LeaseLost, Mode, RESENDS};

/// How long one `FLOCK.INBOX` blocks (ms); its connection's read timeout is
/// this plus [`INBOX_SLACK`], so a server that went silent is noticed.
const INBOX_MS: u64 = 1000;
const INBOX_SLACK: Duration = Duration::from_secs(5);
/// Between two attempts to open a session while waits are pending.
const REOPEN_PAUSE: Duration = Duration::from_millis(100);
/// Losses of grants whose guard is not watching yet (the event can beat
/// the reply of the ACQUIRE that made the grant), kept this many.
const EARLY_LOSSES: usize = 1024;

type WaitKey = (String, String);
type GrantKey = (String, String, u64);

/// What a waiting thread hears.
pub(crate) enum Outcome {
    Granted(u64),
    Timeout,
    Cancelled,
    Error(RedisError),
    /// Its [`crate::CancelToken`] was cancelled: send `FLOCK.CANCEL`.
    CancelRequested,
}

/// One grant's loss, shared by its guard, its watchdog and its session.
#[derive(Default)]
pub(crate) struct Loss {
    reason: Mutex<Option<LeaseLost>>,
    flag: AtomicBool,
    subscribers: Mutex<Vec<Sender<LeaseLost>>>,
}

impl Loss {
    /// Marks the grant lost (the first reason wins) and tells every subscriber.
    pub(crate) fn mark(&self, why: LeaseLost) -> bool {
        let mut reason = lock(&self.reason);
        if reason.is_some() {
            return false;
        }
        *reason = Some(why);
        self.flag.store(true, Ordering::SeqCst);
        for subscriber in lock(&self.subscribers).drain(..) {
            let _ = subscriber.send(why);
        }
        true
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    pub(crate) fn reason(&self) -> Option<LeaseLost> {
        *lock(&self.reason)
    }

    /// A receiver that gets the reason once (at once if already lost) and
    /// disconnects when the guard is released.
    pub(crate) fn subscribe(&self) -> Receiver<LeaseLost> {
        let (tx, rx) = mpsc::channel();
        let reason = lock(&self.reason);
        match *reason {
            Some(why) => {
                let _ = tx.send(why);
            }
            None => lock(&self.subscribers).push(tx),
        }
        rx
    }

    /// The guard is gone: its receivers disconnect.
    pub(crate) fn close(&self) {
        let _reason = lock(&self.reason);
        lock(&self.subscribers).clear();
    }
}

/// What it takes to send a wait again on a new session.
#[derive(Clone)]
pub(crate) struct Acquire {
    pub key: String,
    pub owner: String,
    pub lease_ms: u64,
    pub mode: Mode,
    pub rid: String,
    /// `WAIT` ms (0: no limit); `None` for a try.
    pub wait_ms: Option<u64>,
    pub started: Instant,
}

impl Acquire {
    /// The command, on session `sid` if given; a wait resent later asks
    /// for what is left of its time.
    pub(crate) fn cmd(&self, sid: Option<&str>) -> Cmd {
        let mut cmd = redis::cmd("FLOCK.ACQUIRE");
        cmd.arg(&self.key).arg(&self.owner).arg(self.lease_ms);
        if self.wait_ms.is_some() {
            cmd.arg("WAIT").arg(self.left_ms().unwrap_or(1));
        }
        if let Some(sid) = sid {
            cmd.arg("INBOX").arg(sid);
        }
        cmd.arg("ID").arg(&self.rid);
        match self.mode {
            Mode::Exclusive => {}
            Mode::Shared => {
                cmd.arg("SHARED");
            }
            Mode::Permits { permits, limit } => {
                cmd.arg("PERMITS").arg(permits).arg("LIMIT").arg(limit);
            }
        }
        cmd
    }

    /// What is left of a bounded wait (`Some(0)`: no limit; `None`: over).
    pub(crate) fn left_ms(&self) -> Option<u64> {
        match self.wait_ms {
            None | Some(0) => Some(0),
            Some(ms) => {
                let spent = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
                ms.checked_sub(spent).filter(|left| *left > 0)
            }
        }
    }
}

struct Pending {
    /// The order waits were registered in, which a resend keeps.
    seq: u64,
    tx: Sender<Outcome>,
    acquire: Acquire,
    loss: Arc<Loss>,
}

#[derive(Default)]
struct State {
    sid: Option<String>,
    /// The `CLIENT ID` of the session's connection (to close it).
    reader_id: Option<i64>,
    closed: bool,
    next_seq: u64,
    waits: HashMap<WaitKey, Pending>,
    watches: HashMap<GrantKey, Vec<Weak<Loss>>>,
    early_losses: VecDeque<(GrantKey, LeaseLost)>,
}

/// One server's session and the shared command connection of the process.
pub(crate) struct Server {
    client: Client,
    state: Mutex<State>,
    /// Held while a session is being opened, so that only one is.
    opening: Mutex<()>,
    commands: Mutex<Option<Connection>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The process's [`Server`] for `client`'s address, database and user.
pub(crate) fn server(client: &Client) -> Arc<Server> {
    static SERVERS: OnceLock<Mutex<HashMap<String, Arc<Server>>>> = OnceLock::new();
    let key = format!("{:?}", client.get_connection_info());
    let mut servers = lock(SERVERS.get_or_init(Default::default));
    Arc::clone(servers.entry(key).or_insert_with(|| {
        Arc::new(Server {
            client: client.clone(),
            state: Mutex::default(),
            opening: Mutex::new(()),
            commands: Mutex::new(None),
        })
    }))
}

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        _ => String::new(),
    }
}

/// The error a `detail` line stands for, with its code.
pub(crate) fn error_from_line(line: &str) -> RedisError {
    match redis::parse_redis_value(format!("-{line}\r\n").as_bytes()).and_then(Value::extract_error) {
        Err(e) => e,
        Ok(_) => redis::make_extension_error("ERR".into(), Some(line.into())),
    }
}

fn loss_reason(detail: &str) -> LeaseLost {
    match detail {
        "expired" => LeaseLost::Expired,
        "forcereleased" => LeaseLost::ForceReleased,
        "deleted" => LeaseLost::Deleted,
        "demoted" => LeaseLost::Demoted,
        _ => LeaseLost::NotOwner,
    }
}

impl Server {
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// Runs `f` on the shared command connection, opening it if needed; an
    /// I/O error drops it so the next use opens another.
    pub(crate) fn with_conn<T>(&self, f: impl FnOnce(&mut Connection) -> RedisResult<T>) -> RedisResult<T> {
        let mut slot = lock(&self.commands);
        let conn = match slot.take().filter(ConnectionLike::is_open) {
            Some(conn) => slot.insert(conn),
            None => slot.insert(self.client.get_connection()?),
        };
        let result = f(conn);
        if matches!(&result, Err(e) if e.is_io_error()) || !conn.is_open() {
            *slot = None;
        }
        result
    }

    /// Sends `cmd` on the shared connection, again (same arguments) while
    /// its reply is lost.
    pub(crate) fn command<T: redis::FromRedisValue>(&self, cmd: &Cmd) -> RedisResult<T> {
        let mut resends = 0;
        loop {
            match self.with_conn(|c| cmd.query(c)) {
                Err(e) if e.is_io_error() && resends < RESENDS => resends += 1,
                result => return result,
            }
        }
    }

    /// The open session's ID, opening one (and its reader) if there is none.
    pub(crate) fn session_id(self: &Arc<Self>) -> RedisResult<String> {
        if let Some(sid) = lock(&self.state).sid.clone() {
            return Ok(sid);
        }
        let _opening = lock(&self.opening);
        if let Some(sid) = lock(&self.state).sid.clone() {
            return Ok(sid);
        }
        let mut conn = self.client.get_connection()?;
        conn.set_read_timeout(Some(Duration::from_millis(INBOX_MS) + INBOX_SLACK))?;
        let sid: String = redis::cmd("FLOCK.SESSION").query(&mut conn)?;
        let id: i64 = redis::cmd("CLIENT").arg("ID").query(&mut conn)?;
        {
            let mut state = lock(&self.state);
            state.sid = Some(sid.clone());
            state.reader_id = Some(id);
            state.closed = false;
        }
        let server = Arc::clone(self);
        let reader_sid = sid.clone();
        std::thread::Builder::new()
            .name("flock-session".into())
            .spawn(move || server.read(conn, reader_sid))
            .map_err(|e| RedisError::from(std::io::Error::other(e)))?;
        Ok(sid)
    }

    /// A reply `NOSESSION` named `sid`: forget it so the next wait opens another.
    pub(crate) fn forget(&self, sid: &str) {
        let mut state = lock(&self.state);
        if state.sid.as_deref() == Some(sid) {
            state.sid = None;
        }
    }

    /// Registers a wait before it is sent; false if this owner already
    /// waits for this key in this process (the server will refuse it).
    pub(crate) fn register(&self, acquire: &Acquire, tx: Sender<Outcome>, loss: &Arc<Loss>) -> bool {
        let mut state = lock(&self.state);
        let key = (acquire.key.clone(), acquire.owner.clone());
        if state.waits.contains_key(&key) {
            return false;
        }
        let seq = state.next_seq;
        state.next_seq += 1;
        state.waits.insert(key, Pending { seq, tx, acquire: acquire.clone(), loss: Arc::clone(loss) });
        true
    }

    /// Drops a wait's registration (it ended or was never queued).
    pub(crate) fn unregister(&self, key: &str, owner: &str) {
        lock(&self.state).waits.remove(&(key.to_string(), owner.to_string()));
    }

    /// Watches grant `token` for `loss` (a loss that came first counts).
    pub(crate) fn watch(&self, key: &str, owner: &str, token: u64, loss: &Arc<Loss>) {
        let mut state = lock(&self.state);
        watch_locked(&mut state, (key.to_string(), owner.to_string(), token), loss);
    }

    pub(crate) fn unwatch(&self, key: &str, owner: &str, token: u64, loss: &Arc<Loss>) {
        let mut state = lock(&self.state);
        let grant = (key.to_string(), owner.to_string(), token);
        if let Some(watchers) = state.watches.get_mut(&grant) {
            watchers.retain(|w| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), Arc::as_ptr(loss)));
            if watchers.is_empty() {
                state.watches.remove(&grant);
            }
        }
    }

    /// Closes the session's connection (its waits end on the server) and
    /// lets the reader end.
    pub(crate) fn close(&self) -> RedisResult<()> {
        let id = {
            let mut state = lock(&self.state);
            state.closed = true;
            state.sid = None;
            state.reader_id.take()
        };
        if let Some(id) = id {
            let _: RedisResult<i64> = self.command(redis::cmd("CLIENT").arg("KILL").arg("ID").arg(id));
        }
        *lock(&self.commands) = None;
        Ok(())
    }

    /// The reader thread: hands out events until the connection breaks,
    /// then opens a new session and resends the pending waits.
    fn read(self: Arc<Self>, mut conn: Connection, sid: String) {
        loop {
            match redis::cmd("FLOCK.INBOX").arg(INBOX_MS).query::<Value>(&mut conn) {
                Ok(Value::Array(events)) => self.dispatch(events),
                Ok(_) => {}
                Err(e) if !e.is_io_error() && e.code() == Some("UNBLOCKED") => {}
                Err(_) => break,
            }
            if lock(&self.state).sid.as_deref() != Some(sid.as_str()) {
                break;
            }
        }
        drop(conn);
        self.reopen(&sid);
    }

    fn reopen(self: &Arc<Self>, old: &str) {
        loop {
            {
                let mut state = lock(&self.state);
                if state.sid.as_deref() == Some(old) {
                    state.sid = None;
                    state.reader_id = None;
                }
                if state.closed || state.waits.is_empty() {
                    return;
                }
            }
            match self.session_id() {
                Ok(sid) => return self.resend(&sid),
                Err(_) => std::thread::sleep(REOPEN_PAUSE),
            }
        }
    }

    /// Sends every pending wait again on session `sid`, same request IDs.
    fn resend(&self, sid: &str) {
        let mut pending: Vec<(u64, Acquire)> =
            lock(&self.state).waits.values().map(|p| (p.seq, p.acquire.clone())).collect();
        pending.sort_by_key(|(seq, _)| *seq);
        for (_, acquire) in pending {
            let outcome = match acquire.left_ms() {
                None => Some(Outcome::Timeout),
                Some(_) => match self.command::<Value>(&acquire.cmd(Some(sid))) {
                    Ok(Value::Int(token)) => Some(Outcome::Granted(token as u64)),
                    Ok(Value::Nil) => Some(Outcome::Timeout),
                    Ok(_) => None,
                    // The new session broke too: its reader resends again.
                    Err(e) if e.is_io_error() || e.code() == Some("NOSESSION") => None,
                    Err(e) => Some(Outcome::Error(e)),
                },
            };
            if let Some(outcome) = outcome {
                let orphan = self.deliver(&acquire.key, &acquire.owner, outcome);
                self.release_orphans(orphan.into_iter().collect());
            }
        }
    }

    fn dispatch(&self, events: Vec<Value>) {
        let mut orphans = Vec::new();
        for event in events {
            let Value::Array(fields) = event else { continue };
            if fields.len() < 5 {
                continue;
            }
            let (kind, key, owner, detail) = (text(&fields[0]), text(&fields[1]), text(&fields[2]), text(&fields[4]));
            let token = match &fields[3] {
                Value::Int(t) => *t as u64,
                other => text(other).parse().unwrap_or(0),
            };
            let outcome = match kind.as_str() {
                "lost" => {
                    self.lost((key, owner, token), loss_reason(&detail));
                    continue;
                }
                "granted" => Outcome::Granted(token),
                "timeout" => Outcome::Timeout,
                "cancelled" => Outcome::Cancelled,
                "error" => Outcome::Error(error_from_line(&detail)),
                _ => continue,
            };
            orphans.extend(self.deliver(&key, &owner, outcome));
        }
        self.release_orphans(orphans);
    }

    fn lost(&self, grant: GrantKey, why: LeaseLost) {
        let mut state = lock(&self.state);
        match state.watches.remove(&grant) {
            Some(watchers) => {
                for loss in watchers.iter().filter_map(Weak::upgrade) {
                    loss.mark(why);
                }
            }
            None => {
                if state.early_losses.len() >= EARLY_LOSSES {
                    state.early_losses.pop_front();
                }
                state.early_losses.push_back((grant, why));
            }
        }
    }

    /// Hands `outcome` to the wait of (`key`, `owner`); a grant nobody
    /// waits for any more is returned, to be released.
    fn deliver(&self, key: &str, owner: &str, outcome: Outcome) -> Option<(String, String)> {
        let mut state = lock(&self.state);
        let pending = state.waits.remove(&(key.to_string(), owner.to_string()));
        let granted = match outcome {
            Outcome::Granted(token) => Some(token),
            _ => None,
        };
        match pending {
            Some(pending) => {
                if let Some(token) = granted {
                    watch_locked(&mut state, (key.to_string(), owner.to_string(), token), &pending.loss);
                }
                match pending.tx.send(outcome) {
                    Ok(()) => None,
                    Err(_) => granted.map(|_| (key.to_string(), owner.to_string())),
                }
            }
            None => granted.map(|_| (key.to_string(), owner.to_string())),
        }
    }

    fn release_orphans(&self, orphans: Vec<(String, String)>) {
        for (key, owner) in orphans {
            let mut cmd = redis::cmd("FLOCK.RELEASE");
            cmd.arg(&key).arg(&owner).arg("ID").arg(uuid::Uuid::new_v4().to_string());
            let _: RedisResult<Value> = self.command(&cmd);
        }
    }
}

fn watch_locked(state: &mut State, grant: GrantKey, loss: &Arc<Loss>) {
    if let Some(i) = state.early_losses.iter().position(|(g, _)| *g == grant) {
        let (_, why) = state.early_losses.remove(i).expect("found");
        loss.mark(why);
        return;
    }
    let watchers = state.watches.entry(grant).or_default();
    watchers.retain(|w| w.strong_count() > 0);
    watchers.push(Arc::downgrade(loss));
}

/// Closes this process's session with the server of `client` (its waits
/// end); the next wait opens a new one.
pub fn close_session(client: &Client) -> RedisResult<()> {
    server(client).close()
}
