//! A small blocking Rust client for FLOCK on the `redis` crate.
//!
//! ```no_run
//! use std::time::Duration;
//! use flock_client::Lock;
//!
//! # fn main() -> redis::RedisResult<()> {
//! let client = redis::Client::open("redis://127.0.0.1:6379/")?;
//! let mut conn = client.get_connection()?;
//! let lock = Lock::new("orders:42", Duration::from_secs(10));
//! // Queue for up to 5 s; `None` would only try.
//! if let Some(mut guard) = lock.acquire(&mut conn, Some(Duration::from_secs(5)))? {
//!     let lost = guard.watchdog(&client)?; // renews every lease / 3 on its own connection
//!     // ... work, handing guard.token() to the protected resource;
//!     // stop when guard.lost() is true or `lost` receives a message ...
//!     guard.release()?; // or let it drop
//! }
//! # Ok(())
//! # }
//! ```
//!
//! [`RwLock`] (`read` and `write`) and [`Semaphore`] (`acquire` of n
//! permits) hand out the same [`Guard`], with the same watchdog, request IDs
//! and release on drop: every holder has its own lease, token and holds.
//! The server's refusals come back as errors whose [`redis::RedisError::code`]
//! is `WRONGMODE` (a lock used as a semaphore, another limit, ...), `UPGRADE`
//! (writing while reading) or `NOTOWNER`.
//!
//! The owner is `<process id>:<thread id>`, the process id a random UUID made
//! once per process: the same thread acquiring the same lock again reenters
//! it (one more hold, same token), another thread or process queues.
//!
//! Every acquire, release and renewal is sent with a fresh request ID
//! (`ID <uuid v4>`). When its reply is lost (an I/O error: the connection
//! broke or timed out, not an error reply), it is sent again with the same
//! ID, up to [`RESENDS`] times: the server answers a resend of a command it
//! already applied with its first reply, so a lost reply never releases or
//! acquires twice. The resend goes over the same connection if it is still
//! open (or reconnects by itself, as a `redis::Client` does), otherwise over
//! a new one from the client given to [`Lock::reconnect_with`] or
//! [`Guard::watchdog`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use redis::{Client, Cmd, Connection, ConnectionLike, FromRedisValue, RedisResult};

use flock_core::limits::MAX_MS;

/// As `wait`: queue without a time limit (`WAIT 0` on the server).
pub const FOREVER: Duration = Duration::MAX;

/// How many times a command whose reply was lost is sent again, with the
/// same request ID.
pub const RESENDS: usize = 3;

/// How a grant holds its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// [`Lock`], or the write side of an [`RwLock`]: the only holder.
    Exclusive,
    /// The read side of an [`RwLock`] (`SHARED`): with any other readers.
    Shared,
    /// `permits` of the `limit` of a [`Semaphore`] (`PERMITS n LIMIT m`).
    Permits { permits: u32, limit: u32 },
}

/// What every kind of lock keeps: the key, the lease each grant gets, the
/// owner it acquires as and where a new connection comes from.
#[derive(Clone, Debug)]
struct Target {
    key: String,
    lease: Duration,
    owner: Option<String>,
    client: Option<Client>,
}

impl Target {
    fn new(key: impl Into<String>, lease: Duration) -> Target {
        Target { key: key.into(), lease, owner: None, client: None }
    }

    fn owner(&self) -> String {
        self.owner.clone().unwrap_or_else(thread_owner)
    }

    /// `FLOCK.ACQUIRE` in `mode`; see [`Lock::acquire`] for `wait`.
    fn acquire<C: ConnectionLike>(&self, conn: C, wait: Option<Duration>, mode: Mode) -> RedisResult<Option<Guard<C>>> {
        let owner = self.owner();
        let lease_ms = millis(self.lease);
        let mut cmd = redis::cmd("FLOCK.ACQUIRE");
        cmd.arg(&self.key).arg(&owner).arg(lease_ms);
        if let Some(wait) = wait.filter(|w| !w.is_zero()) {
            let ms = millis(wait);
            cmd.arg("WAIT").arg(if ms > MAX_MS { 0 } else { ms });
        }
        match mode {
            Mode::Exclusive => {}
            Mode::Shared => {
                cmd.arg("SHARED");
            }
            Mode::Permits { permits, limit } => {
                cmd.arg("PERMITS").arg(permits).arg("LIMIT").arg(limit);
            }
        }
        let mut link = Link { conn, client: self.client.clone(), spare: None, timeout: None };
        let Some(token) = link.query::<Option<u64>>(&cmd)? else { return Ok(None) };
        Ok(Some(Guard {
            link,
            key: self.key.clone(),
            owner,
            mode,
            token,
            lease_ms,
            lost: Arc::new(AtomicBool::new(false)),
            watchdog: None,
            released: false,
        }))
    }
}

/// The setters and getters every kind of lock has, over its `target`.
macro_rules! target_methods {
    () => {
        /// Where a new connection comes from when the one given to acquire
        /// breaks: a command whose reply was lost is resent over it, and the
        /// guard's later commands go over it too.
        pub fn reconnect_with(mut self, client: &Client) -> Self {
            self.target.client = Some(client.clone());
            self
        }

        /// Acquires as `owner` instead of `<process id>:<thread id>`.
        pub fn with_owner(mut self, owner: impl Into<String>) -> Self {
            self.target.owner = Some(owner.into());
            self
        }

        pub fn key(&self) -> &str {
            &self.target.key
        }

        /// The owner name the calling thread acquires as.
        pub fn owner(&self) -> String {
            self.target.owner()
        }
    };
}

/// A named lock and the lease each grant gets.
#[derive(Clone, Debug)]
pub struct Lock {
    target: Target,
}

impl Lock {
    /// The lock under `key`; each grant lasts `lease` (at least 1 ms) unless
    /// renewed.
    pub fn new(key: impl Into<String>, lease: Duration) -> Lock {
        Lock { target: Target::new(key, lease) }
    }

    target_methods!();

    /// `FLOCK.ACQUIRE`. `wait`: `None` (or zero) tries once and never queues;
    /// `Some(d)` queues and blocks up to `d` (rounded up to whole
    /// milliseconds; [`FOREVER`] or more than 2^40 ms has no limit). `None`
    /// when the lock is busy or the wait timed out. Keep any read timeout of
    /// `conn` longer than `wait`.
    pub fn acquire<C: ConnectionLike>(&self, conn: C, wait: Option<Duration>) -> RedisResult<Option<Guard<C>>> {
        self.target.acquire(conn, wait, Mode::Exclusive)
    }
}

/// A read hold of an [`RwLock`].
pub type ReadGuard<C> = Guard<C>;
/// The write hold of an [`RwLock`].
pub type WriteGuard<C> = Guard<C>;
/// Permits of a [`Semaphore`].
pub type SemaphoreGuard<C> = Guard<C>;

/// A fair read-write lock: any number of readers or one writer, granted in
/// the order they queued (a reader never overtakes a queued writer). Each
/// holder has its own lease, token, hold count and watchdog.
#[derive(Clone, Debug)]
pub struct RwLock {
    target: Target,
}

impl RwLock {
    /// The read-write lock under `key`; each grant lasts `lease` unless renewed.
    pub fn new(key: impl Into<String>, lease: Duration) -> RwLock {
        RwLock { target: Target::new(key, lease) }
    }

    target_methods!();

    /// The read side (`SHARED`); `wait` as for [`Lock::acquire`]. Reading
    /// again while holding either side adds a hold.
    pub fn read<C: ConnectionLike>(&self, conn: C, wait: Option<Duration>) -> RedisResult<Option<ReadGuard<C>>> {
        self.target.acquire(conn, wait, Mode::Shared)
    }

    /// The write side; `wait` as for [`Lock::acquire`]. An owner that holds
    /// the read side gets an error with code `UPGRADE`.
    pub fn write<C: ConnectionLike>(&self, conn: C, wait: Option<Duration>) -> RedisResult<Option<WriteGuard<C>>> {
        self.target.acquire(conn, wait, Mode::Exclusive)
    }
}

/// A fair counting semaphore of `limit` permits: a request is granted when
/// its permits are free and no one queued before it.
#[derive(Clone, Debug)]
pub struct Semaphore {
    target: Target,
    limit: u32,
}

impl Semaphore {
    /// The semaphore under `key` with `limit` permits (every client of the
    /// key must give the same); each grant lasts `lease` unless renewed.
    pub fn new(key: impl Into<String>, limit: u32, lease: Duration) -> Semaphore {
        Semaphore { target: Target::new(key, lease), limit }
    }

    target_methods!();

    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// `permits` (1 to the limit) of the semaphore; `wait` as for
    /// [`Lock::acquire`]. The server answers `WRONGMODE` if the key is a lock
    /// or has another limit.
    pub fn acquire<C: ConnectionLike>(
        &self,
        conn: C,
        permits: u32,
        wait: Option<Duration>,
    ) -> RedisResult<Option<SemaphoreGuard<C>>> {
        self.target.acquire(conn, wait, Mode::Permits { permits, limit: self.limit })
    }
}

/// Why a watchdog gave up a lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseLost {
    /// `FLOCK.RENEW` answered `NOTOWNER`: the lease ran out or an
    /// administrator force-released the lock; another owner may hold it now.
    NotOwner,
    /// No renewal got through for a whole lease (server unreachable): the
    /// lock must be presumed lost.
    Unconfirmed,
}

/// One hold of a lock, of either side of a read-write lock or of permits of
/// a semaphore: released (one hold) when dropped. Errors on drop are
/// ignored; call [`Guard::release`] to see them.
pub struct Guard<C: ConnectionLike> {
    link: Link<C>,
    key: String,
    owner: String,
    mode: Mode,
    token: u64,
    lease_ms: u64,
    lost: Arc<AtomicBool>,
    watchdog: Option<Watchdog>,
    released: bool,
}

impl<C: ConnectionLike> Guard<C> {
    /// The fencing token of this grant: give it to the resource you protect.
    pub fn token(&self) -> u64 {
        self.token
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn owner(&self) -> &str {
        &self.owner
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The connection the lock was acquired on, for work in between.
    pub fn conn(&mut self) -> &mut C {
        &mut self.link.conn
    }

    /// True once a renewal (the watchdog's or [`Guard::renew`]) found the
    /// lock lost: stop acting on the protected resource.
    pub fn lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// `FLOCK.RENEW` by hand: a fresh lease from now. A `NOTOWNER` error
    /// also marks the guard lost.
    pub fn renew(&mut self) -> RedisResult<u64> {
        self.link.query(&renew_cmd(&self.key, &self.owner, self.lease_ms)).inspect_err(|e| {
            if is_notowner(e) {
                self.lost.store(true, Ordering::SeqCst);
            }
        })
    }

    /// Starts a thread that renews the lease every third of it on its own
    /// connection from `client`, until the guard is released or dropped.
    /// The receiver gets one [`LeaseLost`] if the lock is lost (then the
    /// watchdog stops); it disconnects without a message when the guard is
    /// released. A watchdog already running is replaced. Unless
    /// [`Lock::reconnect_with`] gave another, `client` also replaces the
    /// guard's connection if it breaks.
    pub fn watchdog(&mut self, client: &Client) -> RedisResult<Receiver<LeaseLost>> {
        self.stop_watchdog();
        self.link.client.get_or_insert_with(|| client.clone());
        let period = Duration::from_millis((self.lease_ms / 3).max(1));
        let io_timeout = period.max(Duration::from_millis(50));
        let conn = connect(client, io_timeout)?;
        let (stop, stopped) = mpsc::channel();
        let (report, lost_rx) = mpsc::channel();
        let renewal = Renewal {
            link: Link { conn, client: Some(client.clone()), spare: None, timeout: Some(io_timeout) },
            cmd: renew_cmd(&self.key, &self.owner, self.lease_ms),
            period,
            lease: Duration::from_millis(self.lease_ms),
            lost: Arc::clone(&self.lost),
        };
        let thread = std::thread::Builder::new()
            .name(format!("flock-watchdog {}", self.key))
            .spawn(move || renewal.run(&stopped, &report))?;
        self.watchdog = Some(Watchdog { stop, thread });
        Ok(lost_rx)
    }

    /// Releases this hold; returns the holds left (`0`: the lock is free
    /// or handed to the next waiter). `NOTOWNER` if it was lost meanwhile.
    pub fn release(mut self) -> RedisResult<u64> {
        self.release_once()
    }

    fn stop_watchdog(&mut self) {
        if let Some(watchdog) = self.watchdog.take() {
            // Dropping the sender wakes the thread, which then ends.
            drop(watchdog.stop);
            let _ = watchdog.thread.join();
        }
    }

    fn release_once(&mut self) -> RedisResult<u64> {
        self.stop_watchdog();
        self.released = true;
        self.link.query(redis::cmd("FLOCK.RELEASE").arg(&self.key).arg(&self.owner))
    }
}

impl<C: ConnectionLike> Drop for Guard<C> {
    fn drop(&mut self) {
        if !self.released {
            let _ = self.release_once();
        }
    }
}

impl<C: ConnectionLike> std::fmt::Debug for Guard<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("key", &self.key)
            .field("owner", &self.owner)
            .field("mode", &self.mode)
            .field("token", &self.token)
            .field("lost", &self.lost())
            .finish()
    }
}

struct Watchdog {
    /// Dropped to stop the thread.
    stop: Sender<()>,
    thread: JoinHandle<()>,
}

/// The watchdog thread's state.
struct Renewal {
    link: Link<Connection>,
    cmd: Cmd,
    period: Duration,
    lease: Duration,
    lost: Arc<AtomicBool>,
}

impl Renewal {
    fn run(mut self, stopped: &Receiver<()>, report: &Sender<LeaseLost>) {
        let mut confirmed = Instant::now();
        while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(self.period) {
            let sent = Instant::now();
            let reason = match self.link.query::<u64>(&self.cmd) {
                Ok(_) => {
                    confirmed = sent;
                    continue;
                }
                Err(e) if is_notowner(&e) => LeaseLost::NotOwner,
                Err(_) if confirmed.elapsed() >= self.lease => LeaseLost::Unconfirmed,
                Err(_) => continue,
            };
            self.lost.store(true, Ordering::SeqCst);
            let _ = report.send(reason);
            return;
        }
    }
}

/// The connection a lock's commands go over, and where another comes from
/// when it breaks.
struct Link<C> {
    conn: C,
    client: Option<Client>,
    /// From `client`, once `conn` broke.
    spare: Option<Connection>,
    /// The I/O timeout of `spare`.
    timeout: Option<Duration>,
}

impl<C: ConnectionLike> Link<C> {
    /// Sends `cmd` with a fresh request ID, and again with the same ID (up
    /// to [`RESENDS`] times) while its reply is lost.
    fn query<T: FromRedisValue>(&mut self, cmd: &Cmd) -> RedisResult<T> {
        let mut cmd = cmd.clone();
        cmd.arg("ID").arg(uuid::Uuid::new_v4().to_string());
        let mut resends = 0;
        loop {
            match self.current().and_then(|conn| cmd.query(conn)) {
                Err(e) if e.is_io_error() && resends < RESENDS => resends += 1,
                result => return result,
            }
        }
    }

    /// `conn`, or a connection from `client` while `conn` is broken and
    /// there is a client to reconnect with.
    fn current(&mut self) -> RedisResult<&mut dyn ConnectionLike> {
        let Some(client) = self.client.as_ref().filter(|_| !self.conn.is_open()) else { return Ok(&mut self.conn) };
        let spare = match self.spare.take().filter(ConnectionLike::is_open) {
            Some(spare) => spare,
            None => match self.timeout {
                Some(timeout) => connect(client, timeout)?,
                None => client.get_connection()?,
            },
        };
        Ok(self.spare.insert(spare))
    }
}

/// A connection whose every step gives up after `timeout`, so that a hung
/// server cannot hold the watchdog past its stop.
fn connect(client: &Client, timeout: Duration) -> RedisResult<Connection> {
    let conn = client.get_connection_with_timeout(timeout)?;
    conn.set_read_timeout(Some(timeout))?;
    conn.set_write_timeout(Some(timeout))?;
    Ok(conn)
}

fn renew_cmd(key: &str, owner: &str, lease_ms: u64) -> Cmd {
    let mut cmd = redis::cmd("FLOCK.RENEW");
    cmd.arg(key).arg(owner).arg(lease_ms);
    cmd
}

fn is_notowner(e: &redis::RedisError) -> bool {
    e.code() == Some("NOTOWNER")
}

/// Whole milliseconds, rounded up, at least 1.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX).max(1)
}

/// `<random UUID of this process>:<thread id>`.
fn thread_owner() -> String {
    static PROCESS: OnceLock<String> = OnceLock::new();
    let process = PROCESS.get_or_init(|| uuid::Uuid::new_v4().to_string());
    let thread = format!("{:?}", std::thread::current().id());
    let thread = thread.trim_start_matches("ThreadId(").trim_end_matches(')');
    format!("{process}:{thread}")
}
