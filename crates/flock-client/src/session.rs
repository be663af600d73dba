//! The process's sessions: one per server (and session timeout), each a
//! dedicated connection that loops `FLOCK.INBOX` on a reader thread and
//! hands every event to the thread that waits for it (a channel per wait)
//! or to the guards of a grant the server ended (their [`Loss`]). Waits are
//! sent from any connection as `FLOCK.ACQUIRE ... WAIT t INBOX session-id ID
//! request-id`.
//!
//! The session's timeout T is the one `FLOCK.SESSION [TIMEOUT ms]
//! WITHTIMEOUT` answers. Each `FLOCK.INBOX` waits at most T/4 (the server
//! answers nil by then: the heartbeat) and gives up at the session's
//! deadline ([`SessionClock`]: the send time of the last read answered, + T
//! − the drift margin), when the timer has marked its session grants lost
//! (`Unconfirmed`). When the session breaks, its session grants are lost
//! (`SessionEnded`), and its reader opens another, resends the pending
//! waits and re-watches the held grants with a lease of their own (RENEW,
//! reentrant ACQUIRE ... INBOX, RELEASE).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use redis::{
    Client, Cmd, Connection, ConnectionAddr, ConnectionInfo, ConnectionLike, ProtocolVersion, RedisError, RedisResult,
    Value,
};

use crate::link::RESENDS;
use crate::loss::{LeaseLost, Loss, SessionClock, Term};
use crate::mutex::lock;
use crate::owner::is_notowner;
use crate::reader_connection::ReaderConnection;
use crate::request::{Acquire, Mode};
use crate::timer::{self, Due};
use crate::times::{millis, DEFAULT_SESSION_TIMEOUT, HEARTBEAT_FRACTION};

/// Between two attempts to open a session while waits are pending.
const REOPEN_PAUSE: Duration = Duration::from_millis(100);
/// Losses of grants whose guard is not watching yet (the event can beat
/// the reply of the ACQUIRE that made the grant), kept this many.
const EARLY_LOSSES: usize = 1024;
/// Grants handed to their waits, kept this many at least (see `State::told`).
const TOLD: usize = 1024;

type WaitKey = (String, String);
type GrantKey = (String, String, u64);

/// A grant as the session heard of it: its token, when the command or read
/// that brought it was sent, the lease left then if the server said
/// (a `granted` event of a grant with a lease), and the session.
pub(crate) struct Granted {
    pub(crate) token: u64,
    sent: Instant,
    left_ms: Option<u64>,
    clock: Arc<SessionClock>,
}

/// What a waiting thread hears.
pub(crate) enum Outcome {
    Granted(Granted),
    Timeout,
    Cancelled,
    Error(RedisError),
    /// Its [`crate::CancelToken`] was cancelled: send `FLOCK.CANCEL`.
    CancelRequested,
}

struct Pending {
    /// The order waits were registered in, which a resend keeps.
    seq: u64,
    /// The session it was last sent through: only that session's end
    /// sends it again.
    sid: String,
    tx: Sender<Outcome>,
    acquire: Acquire,
    loss: Arc<Loss>,
}

/// A held grant the session watches: its guards' losses, its mode, and the
/// lock that serializes a re-watch with its guards' releases.
struct Watch {
    mode: Mode,
    losses: Vec<Weak<Loss>>,
    hold: Arc<Mutex<()>>,
}

/// The lease a re-watch asks for.
enum Left {
    /// No guard holds it any more (or it is already known lost, or it is a
    /// session grant, which ends with its session).
    Gone,
    /// A fixed lease that ran out while the session was down.
    Expired,
    Ms(u64),
}

impl Watch {
    /// The watchdog's lease if one renews it; else the time left of the
    /// fixed lease that ends last (never more).
    fn left(&self) -> Left {
        let now = Instant::now();
        let longest = self
            .losses
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|loss| !loss.is_lost())
            .map(|loss| loss.view())
            .filter(|lease| !lease.session)
            .map(|lease| {
                if lease.watchdog {
                    return lease.ms;
                }
                let ends = lease.own.unwrap_or(now);
                u64::try_from(ends.saturating_duration_since(now).as_millis()).unwrap_or(u64::MAX)
            })
            .max();
        match longest {
            None => Left::Gone,
            Some(0) => Left::Expired,
            Some(ms) => Left::Ms(ms),
        }
    }
}

/// One open session: its ID, its deadline, its connection's `CLIENT ID`.
pub(crate) struct Session {
    pub(crate) sid: String,
    pub(crate) clock: Arc<SessionClock>,
    reader_id: i64,
    server: Weak<Server>,
}

impl Due for Session {
    /// At the session's deadline, unless a heartbeat moved it: its session
    /// grants are lost (`Unconfirmed`).
    fn due(&self, now: Instant) -> Option<Instant> {
        match self.clock.verdict(now) {
            None => Some(self.clock.deadline()),
            Some((why, _)) => {
                if let Some(server) = self.server.upgrade() {
                    server.session_over(&self.clock, why);
                }
                None
            }
        }
    }
}

#[derive(Default)]
struct State {
    session: Option<Arc<Session>>,
    /// The session timeout the server answered last.
    timeout: Option<Duration>,
    closed: bool,
    next_seq: u64,
    waits: HashMap<WaitKey, Pending>,
    watches: HashMap<GrantKey, Watch>,
    early_losses: VecDeque<(GrantKey, LeaseLost)>,
    /// The newest grants handed to their waits. A grant can come twice:
    /// the reply to a resend of its wait (the server's record of the
    /// request ID) and its `granted` event, read before that resend
    /// reached the server. The second finds no wait; it is the same grant,
    /// held by its guard (or released by now, the owner holding another
    /// grant since), and must not be given back as a grant nobody waits for.
    /// In two generations, so that forgetting the oldest costs nothing per
    /// grant: when the newer is full it becomes the older.
    told: [HashSet<GrantKey>; 2],
}

/// Finds a server's current address again (a sentinel's master).
pub(crate) type Resolver = Arc<dyn Fn() -> RedisResult<Client> + Send + Sync>;

/// One server's session and the shared command connection of the process.
pub(crate) struct Server {
    /// Its key among the process's servers (and watchdogs).
    name: String,
    /// The server's key without the session timeout.
    base: String,
    /// The session timeout asked for (`None`: the server's).
    timeout: Option<Duration>,
    /// Where the last connection went.
    client: Mutex<Client>,
    /// If set, asked for the address before every new connection, so that
    /// after a failover the session reopens on the new master.
    resolve: Option<Resolver>,
    /// How many times the resolver named another address than the one
    /// before. A kept connection made before the last change goes to a
    /// master a failover deposed, which may still answer until the
    /// sentinels demote it: there a session opened on the new master is
    /// unknown (`NOSESSION`) and a renewal renews what the new master never
    /// sees. Each connection is kept with the count it was made at, and
    /// dropped once the count moved on.
    epoch: AtomicU64,
    state: Mutex<State>,
    /// Held while a session is being opened, so that only one is.
    opening: Mutex<()>,
    /// The command connections every thread shares.
    commands: Mutex<Pool>,
    /// A command connection came back to the pool (or closed).
    returned: Condvar,
    /// Connections of their own for commands that block for a while (the
    /// `WAIT` of a durable grant), kept so that they do not hold up the
    /// shared one.
    spares: Mutex<Vec<(u64, String, Connection)>>,
}

/// How many idle [`Server::with_spare`] connections a server keeps.
const SPARES: usize = 8;

/// How many command connections a server's threads share at most: a
/// command waits for one to be free beyond that, so any number of threads
/// costs no more connections, and a few threads do not queue behind each
/// other's round trips.
pub(crate) const COMMAND_CONNECTIONS: usize = 4;

/// A connection, with the resolver's [`Server::epoch`] it was made at.
pub(crate) type Kept = (u64, Connection);

/// The command connections: idle ones (the last used on top), and how many
/// are open in all.
#[derive(Default)]
struct Pool {
    idle: Vec<Kept>,
    open: usize,
    /// Threads waiting for one to be free.
    waiting: usize,
}

/// The process's [`Server`] for `client`'s address, database and user.
pub(crate) fn server(client: &Client) -> Arc<Server> {
    server_named(server_key(client.get_connection_info()), client.clone(), None, None)
}

/// The name of the server at `info` (looked up at every acquire, so made
/// without the derived `Debug`, which costs a few microseconds).
fn server_key(info: &ConnectionInfo) -> String {
    let redis = &info.redis;
    let mut key = match &info.addr {
        ConnectionAddr::Tcp(host, port) => format!("tcp {host}:{port}"),
        other => format!("{other:?}"),
    };
    key.push_str(" db ");
    key.push_str(&redis.db.to_string());
    key.push(' ');
    key.push_str(redis.username.as_deref().unwrap_or("-"));
    // The password tells servers apart, unseen in the name.
    if let Some(password) = &redis.password {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        password.hash(&mut hasher);
        key.push_str(&format!(" pass {:x}", hasher.finish()));
    }
    key.push_str(if redis.protocol == ProtocolVersion::RESP2 { " resp2" } else { " resp3" });
    key
}

/// Every [`Server`] of the process, by name.
fn servers() -> &'static Mutex<HashMap<String, Arc<Server>>> {
    static SERVERS: OnceLock<Mutex<HashMap<String, Arc<Server>>>> = OnceLock::new();
    SERVERS.get_or_init(Default::default)
}

/// The process's [`Server`] named `name` with session timeout `timeout`,
/// made from `client` and `resolve` the first time.
pub(crate) fn server_named(
    name: String,
    client: Client,
    resolve: Option<Resolver>,
    timeout: Option<Duration>,
) -> Arc<Server> {
    let key = match timeout {
        None => name.clone(),
        Some(t) => format!("{name} session-timeout {}", millis(t)),
    };
    let mut servers = lock(servers());
    if let Some(server) = servers.get(&key) {
        return Arc::clone(server);
    }
    let server = Arc::new(Server {
        name: key.clone(),
        base: name,
        timeout,
        client: Mutex::new(client),
        resolve,
        epoch: AtomicU64::new(0),
        state: Mutex::default(),
        opening: Mutex::new(()),
        commands: Mutex::default(),
        returned: Condvar::new(),
        spares: Mutex::default(),
    });
    servers.insert(key, Arc::clone(&server));
    server
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
    pub(crate) fn client(&self) -> Client {
        lock(&self.client).clone()
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// This server's sibling with session timeout `timeout` (`None`: the
    /// server's): the same address, a session (and connections) of its own.
    pub(crate) fn with_timeout(self: &Arc<Self>, timeout: Option<Duration>) -> Arc<Server> {
        if timeout == self.timeout {
            return Arc::clone(self);
        }
        server_named(self.base.clone(), self.client(), self.resolve.clone(), timeout)
    }

    /// The session timeout T: the one the server answered last, else the
    /// one asked for, else the server's default.
    pub(crate) fn session_timeout(&self) -> Duration {
        lock(&self.state).timeout.or(self.timeout).unwrap_or(DEFAULT_SESSION_TIMEOUT)
    }

    /// How long a command the client sends for itself waits for its
    /// reply, when no deadline says otherwise: T/4.
    pub(crate) fn command_timeout(&self) -> Duration {
        (self.session_timeout() / HEARTBEAT_FRACTION).max(Duration::from_millis(1))
    }

    /// A new connection (`timeout` to connect), to the address the resolver
    /// names now if there is one, with the epoch it is made at.
    pub(crate) fn connect(&self, timeout: Option<Duration>) -> RedisResult<Kept> {
        let (epoch, client) = self.current()?;
        let conn = match timeout {
            Some(timeout) => client.get_connection_with_timeout(timeout),
            None => client.get_connection(),
        }?;
        Ok((epoch, conn))
    }

    /// A new connection whose every step (connect, each command's send
    /// and reply) gives up after `timeout`.
    fn connect_within(&self, timeout: Duration) -> RedisResult<Kept> {
        let (epoch, conn) = self.connect(Some(timeout))?;
        conn.set_read_timeout(Some(timeout))?;
        conn.set_write_timeout(Some(timeout))?;
        Ok((epoch, conn))
    }

    /// The client of the address the resolver names now (kept as the last
    /// one), or of the server's one address, and the epoch that address
    /// belongs to.
    fn current(&self) -> RedisResult<(u64, Client)> {
        Ok(match &self.resolve {
            Some(resolve) => {
                let client = resolve()?;
                let mut last = lock(&self.client);
                if last.get_connection_info().addr != client.get_connection_info().addr {
                    self.epoch.fetch_add(1, Ordering::SeqCst);
                }
                *last = client.clone();
                (self.epoch.load(Ordering::SeqCst), client)
            }
            None => (0, self.client()),
        })
    }

    /// Whether a connection made at `epoch` still goes where the resolver
    /// last named.
    fn current_epoch(&self, epoch: u64) -> bool {
        self.epoch.load(Ordering::SeqCst) == epoch
    }

    /// Whether a kept connection may serve again: open, and made since the
    /// resolver last named another master.
    pub(crate) fn usable(&self, epoch: u64, conn: &Connection) -> bool {
        conn.is_open() && self.current_epoch(epoch)
    }

    /// Whether `result` of a command on a connection made at `epoch` is a
    /// `NOSESSION` from a master the resolver no longer names: not the
    /// session's server, whose answer it is not.
    fn stale_nosession<T>(&self, epoch: u64, result: &RedisResult<T>) -> bool {
        matches!(result, Err(e) if e.code() == Some("NOSESSION")) && !self.current_epoch(epoch)
    }

    /// Runs `f` on a shared command connection (the last one used that is
    /// free, or a new one up to [`COMMAND_CONNECTIONS`]; each of its
    /// commands gives up after [`Server::command_timeout`]); an I/O error
    /// closes it. A server found by a resolver that answers `READONLY` was
    /// demoted, and one that answers `NOSESSION` on a connection made
    /// before the resolver named another master is not the session's: `f`
    /// runs again (it was not applied) on a connection to the master named
    /// now.
    pub(crate) fn with_conn<T>(&self, mut f: impl FnMut(&mut Connection) -> RedisResult<T>) -> RedisResult<T> {
        let mut tries = 0;
        loop {
            let (epoch, mut conn) = self.checkout()?;
            let result = f(&mut conn);
            let readonly = matches!(&result, Err(e) if e.kind() == redis::ErrorKind::ReadOnly);
            let elsewhere = readonly || self.stale_nosession(epoch, &result);
            let broken = matches!(&result, Err(e) if e.is_io_error()) || !conn.is_open() || elsewhere;
            self.checkin((!broken).then_some((epoch, conn)));
            if !(elsewhere && self.resolve.is_some() && tries < RESENDS) {
                return result;
            }
            tries += 1;
            if readonly {
                std::thread::sleep(REOPEN_PAUSE);
            }
        }
    }

    /// A command connection of the pool for this thread alone, until
    /// [`Server::checkin`]: none made before the resolver named another
    /// master.
    fn checkout(&self) -> RedisResult<Kept> {
        let mut pool = lock(&self.commands);
        loop {
            while let Some((epoch, conn)) = pool.idle.pop() {
                if self.usable(epoch, &conn) {
                    return Ok((epoch, conn));
                }
                pool.open -= 1;
            }
            if pool.open < COMMAND_CONNECTIONS {
                pool.open += 1;
                drop(pool);
                return self.connect_within(self.command_timeout()).inspect_err(|_| self.checkin(None));
            }
            pool.waiting += 1;
            pool = self.returned.wait(pool).unwrap_or_else(|e| e.into_inner());
            pool.waiting -= 1;
        }
    }

    /// A connection back to the pool, or `None` for one that closed.
    fn checkin(&self, conn: Option<Kept>) {
        let mut pool = lock(&self.commands);
        match conn {
            Some(conn) => pool.idle.push(conn),
            None => pool.open -= 1,
        }
        // Not a wake-up call for nobody: each costs a system call.
        if pool.waiting > 0 {
            self.returned.notify_one();
        }
    }

    /// Runs `f` once on a connection of its own (an idle one kept from
    /// before, or a new one to the address the resolver names now), given
    /// with the address it goes to; the connection is kept for later unless
    /// it broke or the server answered `READONLY` (demoted: the next one
    /// asks the resolver again).
    pub(crate) fn with_spare<T>(&self, f: impl FnOnce(&str, &mut Connection) -> RedisResult<T>) -> RedisResult<T> {
        let idle = lock(&self.spares).pop().filter(|(epoch, _, conn)| self.usable(*epoch, conn));
        let (epoch, addr, mut conn) = match idle {
            Some(spare) => spare,
            None => {
                let (epoch, client) = self.current()?;
                let conn = client.get_connection_with_timeout(self.command_timeout())?;
                conn.set_write_timeout(Some(self.command_timeout()))?;
                (epoch, client.get_connection_info().addr.to_string(), conn)
            }
        };
        let result = f(&addr, &mut conn);
        let broken = match &result {
            Err(e) => e.is_io_error() || e.kind() == redis::ErrorKind::ReadOnly || self.stale_nosession(epoch, &result),
            Ok(_) => false,
        };
        if !broken && conn.is_open() {
            let mut spares = lock(&self.spares);
            if spares.len() < SPARES {
                spares.push((epoch, addr, conn));
            }
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

    /// The open session, opening one (and its reader) if there is none.
    pub(crate) fn session(self: &Arc<Self>) -> RedisResult<Arc<Session>> {
        if let Some(session) = lock(&self.state).session.clone() {
            return Ok(session);
        }
        let _opening = lock(&self.opening);
        if let Some(session) = lock(&self.state).session.clone() {
            return Ok(session);
        }
        let mut conn = ReaderConnection::open(self.current()?.1.get_connection_info(), self.command_timeout())?;
        let mut open = redis::cmd("FLOCK.SESSION");
        if let Some(timeout) = self.timeout {
            open.arg("TIMEOUT").arg(millis(timeout));
        }
        open.arg("WITHTIMEOUT");
        let sent = Instant::now();
        let ((sid, timeout_ms), id): ((String, u64), i64) =
            redis::pipe().add_command(open).cmd("CLIENT").arg("ID").query(&mut conn)?;
        let timeout = Duration::from_millis(timeout_ms);
        let session = Arc::new(Session {
            sid,
            clock: SessionClock::new(sent, timeout),
            reader_id: id,
            server: Arc::downgrade(self),
        });
        let due: Weak<dyn Due> = Arc::downgrade(&session) as Weak<dyn Due>;
        timer::at(session.clock.deadline(), due);
        {
            let mut state = lock(&self.state);
            state.session = Some(Arc::clone(&session));
            state.timeout = Some(timeout);
            state.closed = false;
        }
        let server = Arc::clone(self);
        let reader = Arc::clone(&session);
        std::thread::Builder::new()
            .name("flock-session".into())
            .spawn(move || server.read(conn, reader))
            .map_err(|e| RedisError::from(std::io::Error::other(e)))?;
        Ok(session)
    }

    /// A reply `NOSESSION` named `session`: the server ended it. Its
    /// session grants are lost, and the next wait opens another.
    pub(crate) fn forget(&self, session: &Session) {
        {
            let mut state = lock(&self.state);
            if state.session.as_ref().is_some_and(|s| s.sid == session.sid) {
                state.session = None;
            }
        }
        self.session_over(&session.clock, LeaseLost::SessionEnded);
    }

    /// The session of `clock` is over (its deadline passed, its connection
    /// broke or closed, the server forgot it): each of its session grants
    /// is lost, as `why` unless its deadline passed first, and no longer
    /// watched; it is never taken again quietly.
    fn session_over(&self, clock: &Arc<SessionClock>, why: LeaseLost) {
        let verdict = clock.end(why);
        let mut state = lock(&self.state);
        state.watches.retain(|_, watch| {
            watch.losses.retain(|weak| match weak.upgrade() {
                Some(loss) if loss.clock().is_some_and(|c| Arc::ptr_eq(&c, clock)) => {
                    loss.mark_at(verdict);
                    false
                }
                Some(_) => true,
                None => false,
            });
            !watch.losses.is_empty()
        });
    }

    /// Registers a wait before it is sent through session `sid`; false if
    /// this owner already waits for this key in this process (the server
    /// will refuse it).
    pub(crate) fn register(&self, acquire: &Acquire, sid: &str, tx: Sender<Outcome>, loss: &Arc<Loss>) -> bool {
        let mut state = lock(&self.state);
        let key = (acquire.key.clone(), acquire.owner.clone());
        if state.waits.contains_key(&key) {
            return false;
        }
        let seq = state.next_seq;
        state.next_seq += 1;
        state
            .waits
            .insert(key, Pending { seq, sid: sid.to_string(), tx, acquire: acquire.clone(), loss: Arc::clone(loss) });
        true
    }

    /// Drops a wait's registration (it ended or was never queued);
    /// `granted`: the token its send's reply answered, told from now on
    /// (the event of an earlier send of it may come yet).
    pub(crate) fn unregister(&self, key: &str, owner: &str, granted: Option<u64>) {
        let mut state = lock(&self.state);
        state.waits.remove(&(key.to_string(), owner.to_string()));
        if let Some(token) = granted {
            tell(&mut state, (key.to_string(), owner.to_string(), token));
        }
    }

    /// Watches grant `token` of `acquire`, sent at `sent` on `session`, for
    /// `loss` (a loss that came first counts).
    pub(crate) fn watch(&self, acquire: &Acquire, token: u64, loss: &Arc<Loss>, sent: Instant, session: &Session) {
        let term = Term::of(acquire.lease_ms, sent, None, Some(&session.clock));
        let mut state = lock(&self.state);
        watch_locked(&mut state, acquire, token, loss, term);
    }

    /// Stops watching grant `token` for `loss` (its guard releases), and
    /// returns the lock that guard holds while it releases, so that a
    /// re-watch (its extra hold) is not in between: one the re-watch took
    /// first ends before, one it takes later no longer counts this guard.
    pub(crate) fn unwatch(&self, key: &str, owner: &str, token: u64, loss: &Arc<Loss>) -> Option<Arc<Mutex<()>>> {
        let mut state = lock(&self.state);
        let grant = (key.to_string(), owner.to_string(), token);
        let watch = state.watches.get_mut(&grant)?;
        let hold = Arc::clone(&watch.hold);
        watch.losses.retain(|w| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), Arc::as_ptr(loss)));
        if watch.losses.is_empty() {
            state.watches.remove(&grant);
        }
        Some(hold)
    }

    /// Closes the session's connection (its waits end on the server, its
    /// session grants too: they are lost, `SessionEnded`) and lets the
    /// reader end.
    pub(crate) fn close(&self) -> RedisResult<()> {
        let session = {
            let mut state = lock(&self.state);
            state.closed = true;
            state.session.take()
        };
        if let Some(session) = session {
            self.session_over(&session.clock, LeaseLost::SessionEnded);
            let _: RedisResult<i64> = self.command(redis::cmd("CLIENT").arg("KILL").arg("ID").arg(session.reader_id));
        }
        let mut pool = lock(&self.commands);
        let idle = std::mem::take(&mut pool.idle);
        pool.open -= idle.len();
        Ok(())
    }

    /// The reader thread: hands out events until the connection breaks or
    /// the session's deadline passes, each read waiting at most T/4 and
    /// giving up at the deadline; then the session's grants are lost and a
    /// new session is opened for the pending waits and the other grants.
    /// A read waits less than T/4 when the deadline is nearer than twice
    /// that (a pause or a slow reply held up its send), so that its answer
    /// comes back well before the deadline.
    fn read(self: Arc<Self>, mut conn: ReaderConnection, session: Arc<Session>) {
        let beat = session.clock.timeout / HEARTBEAT_FRACTION;
        loop {
            let sent = Instant::now();
            let deadline = session.clock.deadline();
            let left = deadline.saturating_duration_since(sent);
            if left.is_zero() {
                break;
            }
            conn.read_until(deadline);
            let beat_ms = millis(beat.min(left / 2));
            match redis::cmd("FLOCK.INBOX").arg(beat_ms).query::<Value>(&mut conn) {
                Ok(reply) => {
                    let alive = session.clock.confirm(sent);
                    // Handed out even when the answer came after the
                    // deadline: the server counts its grants as delivered
                    // (the session's own are lost with it).
                    if let Value::Array(events) = reply {
                        self.dispatch(events, sent, &session);
                    }
                    if !alive {
                        break;
                    }
                }
                // A demoted server unblocks its blocked clients; one found
                // by a resolver is left for the new master.
                Err(e) if !e.is_io_error() && e.code() == Some("UNBLOCKED") && self.resolve.is_none() => {
                    session.clock.confirm(sent);
                }
                Err(_) => break,
            }
            if !lock(&self.state).session.as_ref().is_some_and(|s| Arc::ptr_eq(s, &session)) {
                break;
            }
        }
        // Its grants are marked lost before the connection closes: the
        // close can reach the server, which then passes them on at once.
        self.session_over(&session.clock, LeaseLost::SessionEnded);
        drop(conn);
        self.reopen(&session);
    }

    /// Opens a new session (again and again while the server cannot be
    /// reached) for the pending waits and the held grants with a lease of
    /// their own: a wait whose time runs out meanwhile ends as a timeout, a
    /// fixed lease that runs out as a loss (`Expired`).
    fn reopen(self: &Arc<Self>, old: &Arc<Session>) {
        loop {
            let (over, expired) = {
                let mut state = lock(&self.state);
                if state.session.as_ref().is_some_and(|s| Arc::ptr_eq(s, old)) {
                    state.session = None;
                }
                if state.closed {
                    return;
                }
                let over: Vec<WaitKey> =
                    state.waits.iter().filter(|(_, p)| p.acquire.left_ms().is_none()).map(|(k, _)| k.clone()).collect();
                let mut expired = Vec::new();
                let mut held = false;
                for (grant, watch) in &state.watches {
                    match watch.left() {
                        Left::Gone => {}
                        Left::Expired => expired.push(grant.clone()),
                        Left::Ms(_) => held = true,
                    }
                }
                if state.waits.len() == over.len() && !held {
                    drop(state);
                    self.end(over, expired);
                    return;
                }
                (over, expired)
            };
            self.end(over, expired);
            match self.session() {
                Ok(session) => {
                    self.resend(&old.sid, &session);
                    return self.rewatch(&session);
                }
                Err(_) => std::thread::sleep(REOPEN_PAUSE),
            }
        }
    }

    /// Waits whose time is over end as timeouts; grants whose fixed lease
    /// ran out are lost.
    fn end(&self, over: Vec<WaitKey>, expired: Vec<GrantKey>) {
        for (key, owner) in over {
            let orphan = self.deliver(&key, &owner, Outcome::Timeout);
            self.release_orphans(orphan.into_iter().collect());
        }
        for grant in expired {
            self.lost(grant, LeaseLost::Expired);
        }
    }

    /// Checks every held grant with a lease of its own that the broken
    /// session watched and moves its watch to `session`: a `FLOCK.RENEW`
    /// (`NOTOWNER`: lost), then a reentrant `FLOCK.ACQUIRE ... INBOX sid`
    /// (the lease a renewal would give: the watchdog's, or what is left of
    /// a fixed lease) and a `FLOCK.RELEASE` of that extra hold, while no
    /// guard of it releases.
    fn rewatch(&self, session: &Session) {
        let grants: Vec<(GrantKey, Mode, Arc<Mutex<()>>)> = lock(&self.state)
            .watches
            .iter()
            .map(|(grant, watch)| (grant.clone(), watch.mode, Arc::clone(&watch.hold)))
            .collect();
        for (grant, mode, hold) in grants {
            let _hold = lock(&hold);
            let (left, watchdogs) = match lock(&self.state).watches.get(&grant) {
                Some(watch) if Arc::ptr_eq(&watch.hold, &hold) => {
                    let watchdogs: Vec<Arc<Loss>> =
                        watch.losses.iter().filter_map(Weak::upgrade).filter(|loss| loss.view().watchdog).collect();
                    (watch.left(), watchdogs)
                }
                _ => (Left::Gone, Vec::new()),
            };
            let lease_ms = match left {
                Left::Gone => continue,
                Left::Expired => {
                    // Its push went with the old session.
                    self.lost(grant, LeaseLost::Expired);
                    continue;
                }
                Left::Ms(ms) => ms,
            };
            let (key, owner, token) = &grant;
            let mut renew = redis::cmd("FLOCK.RENEW");
            renew.arg(key).arg(owner).arg(lease_ms).arg("ID").arg(uuid::Uuid::new_v4().to_string());
            let sent = Instant::now();
            match self.command::<Value>(&renew) {
                Ok(_) => {
                    for loss in &watchdogs {
                        loss.renewed(sent);
                    }
                }
                Err(e) if is_notowner(&e) => {
                    self.lost(grant, LeaseLost::NotOwner);
                    continue;
                }
                // The server went away again: the next session re-watches.
                Err(_) => continue,
            }
            let acquire = Acquire {
                key: key.clone(),
                owner: owner.clone(),
                lease_ms,
                renew_ms: lease_ms,
                mode,
                rid: uuid::Uuid::new_v4().to_string(),
                wait_ms: None,
                lock_delay_ms: None,
                started: Instant::now(),
            };
            match self.command::<Value>(&acquire.cmd(Some(&session.sid))) {
                Ok(Value::Int(again)) => {
                    let mut release = redis::cmd("FLOCK.RELEASE");
                    release.arg(key).arg(owner).arg("ID").arg(uuid::Uuid::new_v4().to_string());
                    // If it fails, the extra hold stays until the lease ends it.
                    let _: RedisResult<Value> = self.command(&release);
                    if again as u64 != *token {
                        // The grant ended in between (and that new one is given back).
                        self.lost(grant, LeaseLost::NotOwner);
                    }
                }
                Ok(Value::Nil) => self.lost(grant, LeaseLost::NotOwner),
                // NOSESSION: that session's end re-watches again.
                _ => {}
            }
        }
    }

    /// Sends every pending wait of the broken session `old` again on
    /// `session`, same request IDs. The waits sent through a later session
    /// are queued there: sent again, one could be answered with its grant
    /// (the server's record of its request ID) while its event was on its
    /// way too.
    fn resend(&self, old: &str, session: &Session) {
        let mut pending: Vec<(u64, Acquire)> = lock(&self.state)
            .waits
            .values_mut()
            .filter(|p| p.sid == old)
            .map(|p| {
                p.sid = session.sid.clone();
                (p.seq, p.acquire.clone())
            })
            .collect();
        pending.sort_by_key(|(seq, _)| *seq);
        for (_, acquire) in pending {
            let sent = Instant::now();
            let outcome = match acquire.left_ms() {
                None => Some(Outcome::Timeout),
                Some(_) => match self.command::<Value>(&acquire.cmd(Some(&session.sid))) {
                    Ok(Value::Int(token)) => Some(Outcome::Granted(Granted {
                        token: token as u64,
                        sent,
                        left_ms: None,
                        clock: Arc::clone(&session.clock),
                    })),
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

    /// Hands out the events of a read sent at `sent` on `session`.
    fn dispatch(&self, events: Vec<Value>, sent: Instant, session: &Session) {
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
                // Held on the key's new node: no longer watched here (a
                // re-watch here would find it gone and call it lost).
                "moved" => {
                    lock(&self.state).watches.remove(&(key, owner, token));
                    continue;
                }
                "granted" => Outcome::Granted(Granted {
                    token,
                    sent,
                    left_ms: detail.parse().ok(),
                    clock: Arc::clone(&session.clock),
                }),
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
            Some(watch) => {
                for loss in watch.losses.iter().filter_map(Weak::upgrade) {
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
    /// waits for any more is returned, to be released. A grant handed to
    /// its wait already (see `State::told`) is neither handed to the
    /// owner's next wait nor released.
    fn deliver(&self, key: &str, owner: &str, outcome: Outcome) -> Option<(String, String)> {
        let mut state = lock(&self.state);
        let grant = match &outcome {
            Outcome::Granted(grant) => Some((key.to_string(), owner.to_string(), grant.token)),
            _ => None,
        };
        if grant.as_ref().is_some_and(|grant| state.told.iter().any(|told| told.contains(grant))) {
            return None;
        }
        let pending = state.waits.remove(&(key.to_string(), owner.to_string()));
        let orphan = match pending {
            Some(pending) => {
                if let Outcome::Granted(grant) = &outcome {
                    let term = Term::of(pending.acquire.lease_ms, grant.sent, grant.left_ms, Some(&grant.clock));
                    watch_locked(&mut state, &pending.acquire, grant.token, &pending.loss, term);
                }
                let handed = pending.tx.send(outcome).is_ok();
                match (handed, grant) {
                    (true, Some(grant)) => {
                        tell(&mut state, grant);
                        None
                    }
                    (_, grant) => grant,
                }
            }
            None => grant,
        };
        orphan.map(|(key, owner, _)| (key, owner))
    }

    fn release_orphans(&self, orphans: Vec<(String, String)>) {
        for (key, owner) in orphans {
            let mut cmd = redis::cmd("FLOCK.RELEASE");
            cmd.arg(&key).arg(&owner).arg("ID").arg(uuid::Uuid::new_v4().to_string());
            let _: RedisResult<Value> = self.command(&cmd);
        }
    }
}

/// `grant` was handed to its wait (see `State::told`).
fn tell(state: &mut State, grant: GrantKey) {
    if state.told[0].len() >= TOLD {
        state.told[1] = std::mem::take(&mut state.told[0]);
    }
    state.told[0].insert(grant);
}

fn watch_locked(state: &mut State, acquire: &Acquire, token: u64, loss: &Arc<Loss>, term: Term) {
    let own = match &term {
        Term::Own { at, .. } => Some(*at),
        _ => None,
    };
    loss.granted(acquire.lease_ms, term);
    let grant = (acquire.key.clone(), acquire.owner.clone(), token);
    if let Some(i) = state.early_losses.iter().position(|(g, _)| *g == grant) {
        let (_, why) = state.early_losses.remove(i).expect("found");
        loss.mark(why);
        return;
    }
    let watch = state.watches.entry(grant).or_insert_with(|| Watch {
        mode: acquire.mode,
        losses: Vec::new(),
        hold: Arc::default(),
    });
    watch.losses.retain(|w| w.strong_count() > 0);
    // A reentry with a lease of its own: the grant ends no later than that
    // for every hold of it.
    if let Some(at) = own {
        for other in watch.losses.iter().filter_map(Weak::upgrade) {
            other.tighten(at);
        }
    }
    watch.losses.push(Arc::downgrade(loss));
}

/// Closes this process's session with the server of `client` (its waits
/// end, its session grants are lost: `SessionEnded`); the next wait opens a
/// new one.
pub fn close_session(client: &Client) -> RedisResult<()> {
    let base = server(client).base.clone();
    let all: Vec<Arc<Server>> = lock(servers()).values().filter(|s| s.base == base).cloned().collect();
    all.iter().try_for_each(|server| server.close())
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::{self, Receiver};

    use super::*;

    fn granted(token: u64) -> Outcome {
        let clock = SessionClock::new(Instant::now(), Duration::from_secs(10));
        Outcome::Granted(Granted { token, sent: Instant::now(), left_ms: None, clock })
    }

    /// A wait of owner `o` for `key`, registered as sent through session `s1`.
    fn wait(server: &Server, key: &str) -> Receiver<Outcome> {
        let acquire = Acquire {
            key: key.into(),
            owner: "o".into(),
            lease_ms: 0,
            renew_ms: 0,
            mode: Mode::Exclusive,
            rid: "r".into(),
            wait_ms: Some(1000),
            lock_delay_ms: None,
            started: Instant::now(),
        };
        let (tx, rx) = mpsc::channel();
        assert!(server.register(&acquire, "s1", tx, &Arc::new(Loss::default())));
        rx
    }

    fn token(outcome: Result<Outcome, mpsc::TryRecvError>) -> Option<u64> {
        match outcome {
            Ok(Outcome::Granted(grant)) => Some(grant.token),
            _ => None,
        }
    }

    #[test]
    fn a_grant_told_twice_is_neither_given_back_nor_handed_to_the_owners_next_wait() {
        let server = server_named("unit told".into(), Client::open("redis://127.0.0.1:1/").unwrap(), None, None);
        let first = wait(&server, "k");
        assert!(server.deliver("k", "o", granted(7)).is_none());
        assert_eq!(token(first.try_recv()), Some(7));
        // The grant again (its event, after a resend's reply told it): no
        // wait, yet not a grant nobody waits for.
        assert!(server.deliver("k", "o", granted(7)).is_none());
        let next = wait(&server, "k");
        assert!(server.deliver("k", "o", granted(7)).is_none());
        assert!(next.try_recv().is_err(), "the grant told before is not the next wait's");
        assert!(server.deliver("k", "o", granted(8)).is_none());
        assert_eq!(token(next.try_recv()), Some(8));
        // A grant whose wait gave up, never told: given back.
        assert_eq!(server.deliver("k", "o", granted(9)), Some(("k".to_string(), "o".to_string())));
        // A grant the reply to a resend of its wait told, before its event.
        let _replied = wait(&server, "k");
        server.unregister("k", "o", Some(10));
        assert!(server.deliver("k", "o", granted(10)).is_none());
    }
}
