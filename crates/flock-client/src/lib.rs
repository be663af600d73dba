//! A small blocking Rust client for FLOCK on the `redis` crate.
//!
//! ```no_run
//! use std::time::Duration;
//! use flock_client::Lock;
//!
//! # fn main() -> redis::RedisResult<()> {
//! let client = redis::Client::open("redis://127.0.0.1:6379/")?;
//! let lock = Lock::new("orders:42", Duration::from_secs(10));
//! // Queue for up to 5 s through the process's session; `None` would only try.
//! if let Some(mut guard) = lock.acquire_on(&client, Some(Duration::from_secs(5)))? {
//!     let lost = guard.watchdog(&client)?; // renews every lease / 3
//!     // ... work, handing guard.token() to the protected resource;
//!     // stop when guard.lost() is true or `lost` receives a message ...
//!     guard.release()?; // or let it drop
//! }
//! # Ok(())
//! # }
//! ```
//!
//! **Sessions.** A lock that knows its server's `redis::Client`
//! ([`Lock::acquire_on`], or [`Lock::with_client`] and then
//! [`Lock::acquire`] on a connection of yours) waits through the process's
//! session with that server: one connection per server and process, opened
//! on its first acquire, whose thread loops `FLOCK.INBOX`. A wait is one
//! `FLOCK.ACQUIRE ... WAIT t INBOX session-id ID request-id`, answered
//! `WAITING` at once; the session's thread hands the outcome to the waiting
//! thread. So any number of threads wait without a connection (or a blocked
//! server client) each: `acquire_on` sends over the process's
//! [`SharedConnection`] to that server. Every grant made so is watched: when
//! the server ends it (lease run out, `FLOCK.FORCERELEASE`, key deleted,
//! demotion) the guard is marked lost at once ([`Guard::lost`],
//! [`Guard::lost_reason`], [`Guard::lost_channel`]), watchdog or not. If the
//! session's connection breaks, a new session is opened and the pending
//! waits are sent again (same request IDs, the time they have left; they
//! queue again at the tail); while the server cannot be reached they retry
//! until their own time is up, then return `None` (a timeout). The grants
//! the old session watched are checked again and watched by the new one: a
//! `FLOCK.RENEW` ([`LeaseLost::NotOwner`] if it is gone), then a reentrant
//! `FLOCK.ACQUIRE ... INBOX new-session-id` (the watchdog's lease, or what
//! is left of a fixed lease, never more; none left: [`LeaseLost::Expired`])
//! and a `FLOCK.RELEASE` of that extra hold, serialized with the guard's own
//! release: the holds stay as they were and later losses are still pushed.
//! A lock without a client, or with [`Lock::blocking`], waits as before:
//! `FLOCK.ACQUIRE ... WAIT t` blocks the connection given to acquire.
//!
//! **Cluster and Sentinel.** [`Lock::acquire_in`] (and [`RwLock::read_in`],
//! [`RwLock::write_in`], [`Semaphore::acquire_in`]) acquire through a
//! [`Cluster`] or a [`SentinelMaster`]; the guard's connection is a
//! [`Routed`], which sends each command (release, renew) to the process's
//! shared connection of the right server, and [`Guard::start_watchdog`]
//! renews there.
//!
//! ```no_run
//! use std::time::Duration;
//! use flock_client::{Cluster, Lock, SentinelMaster};
//!
//! # fn main() -> redis::RedisResult<()> {
//! let cluster = Cluster::new(vec!["redis://127.0.0.1:7000/", "redis://127.0.0.1:7001/"])?;
//! // Hash tags put related locks on one node: {order:42}:a, {order:42}:b.
//! if let Some(mut guard) = Lock::new("{order:42}:a", Duration::from_secs(10))
//!     .acquire_in(&cluster, Some(Duration::from_secs(5)))?
//! {
//!     let _lost = guard.start_watchdog()?; // renews on the key's node
//!     guard.release()?;
//! }
//!
//! let master = SentinelMaster::new(vec!["redis://127.0.0.1:26379/"], "mymaster", None)?;
//! let lock = Lock::new("orders:42", Duration::from_secs(10));
//! if let Some(guard) = lock.acquire_in(&master, Some(Duration::from_secs(5)))? {
//!     guard.release()?;
//! }
//! # Ok(())
//! # }
//! ```
//!
//! On a cluster a wait goes through the session of its key's node (one
//! session per node the process waits on), sent on that node's own shared
//! connection with that node's session ID. A `MOVED` reads the slot map
//! again (`CLUSTER SLOTS`) and sends it to the new node with the same
//! request ID; an `ASK` (the slot is being migrated and the key is on the
//! importing node already) sends it once to the node it names, after
//! `ASKING` on the same connection (a wait then queues on that node's
//! session). A slot move (`MIGRATE`) keeps a held grant on the new node (owner,
//! holds, token, lease): the old node's session hears `moved`, not a loss,
//! and stops watching it; release and renewals follow the key, but a later
//! loss there is found by the watchdog, not pushed. A waiter queued on the
//! old node gets `LOCKDELETED` there; if that node now redirects the key,
//! the wait queues again on the new node, at the tail, as a new request with
//! what is left of its time. A wait whose node a failover made a replica
//! (`UNBLOCKED`, or its session closed and the wait sent again there met
//! `MOVED`) is sent again, same request ID, to the key's master now, until
//! its own deadline. The watchdog of a cluster lock renews over the
//! nodes' shared connections, which have no read timeout.
//!
//! A [`SentinelMaster`] asks the sentinels for the master before every new
//! connection (the session's, the shared one, the watchdog's). After a
//! failover the old master's connections close (Sentinel demotes it, `CLIENT
//! KILL`), answer `READONLY` or `UNBLOCKED`: the command goes again to the
//! new master and the session reopens there, sends its waits again and
//! re-watches the grants: one replicated before the failover stays held,
//! one that was not is lost (`NotOwner`). Until the old master is demoted
//! (Sentinel does it some seconds after the promotion) it still answers,
//! and what is written there in that window is lost with it.
//!
//! **Durable grants.** [`Lock::durable`] (also on [`RwLock`] and
//! [`Semaphore`]) makes every grant count only once the number of replicas
//! you name have it: after the grant, `FLOCK.RENEW` and `WAIT replicas
//! timeout` in one round trip on a connection to the key's node; fewer in
//! time, and the hold is given back and the acquire fails with an error of
//! code `NOTDURABLE` (see docs/client-protocol.md, "Durable grants", and
//! docs/durability.md for what each setting survived in a failover).
//!
//! [`RwLock`] (`read` and `write`) and [`Semaphore`] (`acquire` of n
//! permits) hand out the same [`Guard`], with the same watchdog, request IDs
//! and release on drop: every holder has its own lease, token and holds.
//! The server's refusals come back as errors whose [`redis::RedisError::code`]
//! is `WRONGMODE` (a lock used as a semaphore, another limit, ...), `UPGRADE`
//! (writing while reading), `DEADLOCK` (the wait would never end: the
//! thread would wait for itself through other owners; nothing was queued)
//! or `NOTOWNER` (its text says why: the lease ended, force-released,
//! deleted).
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
//! open (or reconnects by itself, as a `redis::Client` or a
//! [`SharedConnection`] does), otherwise over a new one from the client given
//! to [`Lock::with_client`] or [`Guard::watchdog`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use redis::{Client, Cmd, ConnectionLike, FromRedisValue, RedisError, RedisResult, Value};

mod cluster;
mod link;
mod loss;
mod multi;
mod mutex;
mod owner;
mod request;
mod sentinel;
mod session;
mod times;
mod watchdog;
use cluster::Via;
pub use cluster::{key_slot, Cluster, Routed};
use link::Link;
pub use link::RESENDS;
pub use loss::LeaseLost;
use loss::Loss;
pub use multi::{MultiGuard, MultiLock};
use mutex::lock;
use owner::{is_notowner, thread_owner};
use request::Acquire;
pub use request::Mode;
pub use sentinel::SentinelMaster;
pub use session::close_session;
use session::Outcome;
use times::{millis, wait_ms};
pub use times::{FOREVER, WAIT_MARGIN};

/// What every kind of lock keeps: the key, the lease each grant gets, the
/// owner it acquires as, where a new connection (and the session) comes
/// from, and how it waits.
#[derive(Clone, Debug)]
struct Target {
    key: String,
    lease: Duration,
    owner: Option<String>,
    client: Option<Client>,
    /// Set by `acquire_in`: the session and node come from there.
    via: Option<Via>,
    blocking: bool,
    cancel: Option<CancelToken>,
    /// Set by `durable`: (replicas, timeout) each grant waits for.
    durable: Option<(usize, Duration)>,
}

/// Where [`Lock::acquire_in`] and its kin acquire: a [`Cluster`] (the node
/// of the lock's key), a [`SentinelMaster`] (the master its sentinels name)
/// or one server's `redis::Client`.
#[derive(Clone, Debug)]
pub struct Route(Via);

impl From<&Cluster> for Route {
    fn from(cluster: &Cluster) -> Route {
        Route(Via::Cluster(cluster.clone()))
    }
}

impl From<&SentinelMaster> for Route {
    fn from(master: &SentinelMaster) -> Route {
        Route(Via::Server(Arc::clone(&master.server)))
    }
}

impl From<&Client> for Route {
    fn from(client: &Client) -> Route {
        Route(Via::Server(session::server(client)))
    }
}

/// What sending a session wait came to.
enum Queued {
    /// A try that found the lock busy.
    Busy,
    Granted(u64, Arc<session::Server>, Arc<Loss>),
    /// Queued on `server`: the outcome comes on the receiver.
    Waiting(Arc<session::Server>, Arc<Loss>, Sender<Outcome>, Receiver<Outcome>),
}

/// The error a cancelled wait returns: code `CANCELLED`.
fn cancelled() -> RedisError {
    redis::make_extension_error("CANCELLED".into(), Some("the wait was cancelled".into()))
}

impl Target {
    fn new(key: impl Into<String>, lease: Duration) -> Target {
        Target {
            key: key.into(),
            lease,
            owner: None,
            client: None,
            via: None,
            blocking: false,
            cancel: None,
            durable: None,
        }
    }

    fn owner(&self) -> String {
        self.owner.clone().unwrap_or_else(thread_owner)
    }

    /// `FLOCK.ACQUIRE` in `mode`; see [`Lock::acquire`] for `wait`. A
    /// durable lock confirms each grant (see [`Lock::durable`]).
    fn acquire<C: ConnectionLike>(&self, conn: C, wait: Option<Duration>, mode: Mode) -> RedisResult<Option<Guard<C>>> {
        let mut guard = self.grant(conn, wait, mode)?;
        if let Some(guard) = &mut guard {
            guard.reclaim();
        }
        match (guard, self.durable) {
            (Some(guard), Some((replicas, timeout))) => self.confirm(guard, replicas, timeout).map(Some),
            (guard, _) => Ok(guard),
        }
    }

    /// Where the key's node is reached apart from the connection given to
    /// acquire: the route, or the client's server; `None` for a bare
    /// connection.
    fn via(&self) -> Option<Via> {
        self.via.clone().or_else(|| self.client.as_ref().map(|c| Via::Server(session::server(c))))
    }

    /// Durable grants: `FLOCK.RENEW key owner lease-ms ID <uuid>` and `WAIT
    /// replicas timeout-ms` in one round trip on one connection to the
    /// key's node (a connection of its own from the process's pool for that
    /// node, or the connection given to acquire when there is no client or
    /// route). The RENEW is this connection's write, after the grant in the
    /// replication stream, so the WAIT's count covers the grant even when
    /// the grant was another connection's write (pushed to the session,
    /// handed over by a release). Fewer than `replicas`, or `NOTOWNER`: the
    /// hold is given back (one hold: a reentry keeps the ones before) and
    /// the acquire fails with `NOTDURABLE`. Any other error (the node could
    /// not be reached after [`RESENDS`] tries, each a fresh RENEW) also
    /// gives the hold back, and is returned as it is.
    fn confirm<C: ConnectionLike>(
        &self,
        mut guard: Guard<C>,
        replicas: usize,
        timeout: Duration,
    ) -> RedisResult<Guard<C>> {
        let (key, owner, lease_ms) = (guard.key.clone(), guard.owner.clone(), guard.lease_ms);
        let timeout_ms = millis(timeout);
        let checked = match self.via() {
            Some(via) => durable_via(&via, &key, &owner, lease_ms, replicas, timeout_ms),
            None => {
                let mut tries = 0;
                loop {
                    let result = guard
                        .link
                        .current()
                        .and_then(|c| durable_on(c, &key, &owner, lease_ms, replicas, timeout_ms))
                        .map(|d| (d, None));
                    match result {
                        Err(e) if e.is_io_error() && tries < RESENDS => tries += 1,
                        result => break result,
                    }
                }
            }
        };
        match checked {
            Ok((Durable::Acked(n), node)) if n >= replicas as i64 => {
                guard.node = node;
                Ok(guard)
            }
            Ok((short, _)) => {
                let _ = guard.release_once();
                Err(short.error(&key, replicas, timeout_ms))
            }
            Err(e) => {
                let _ = guard.release_once();
                Err(e)
            }
        }
    }

    /// The grant itself: `FLOCK.ACQUIRE` in `mode`.
    fn grant<C: ConnectionLike>(&self, conn: C, wait: Option<Duration>, mode: Mode) -> RedisResult<Option<Guard<C>>> {
        if self.cancel.as_ref().is_some_and(CancelToken::is_cancelled) {
            return Err(cancelled());
        }
        let acquire = Acquire {
            key: self.key.clone(),
            owner: self.owner(),
            lease_ms: millis(self.lease),
            mode,
            rid: uuid::Uuid::new_v4().to_string(),
            wait_ms: wait_ms(wait),
            started: Instant::now(),
        };
        let mut link = Link { conn, client: self.client.clone(), spare: None };
        match self.via().filter(|_| !self.blocking) {
            Some(via) => self.acquire_in_session(link, acquire, via),
            None => {
                let Some(token) = link.send::<Option<u64>>(&acquire.cmd(None))? else {
                    return match &self.cancel {
                        Some(cancel) if cancel.is_cancelled() => Err(cancelled()),
                        _ => Ok(None),
                    };
                };
                Ok(Some(Guard::new(link, acquire, token, Arc::default(), None)))
            }
        }
    }

    /// Sends `acquire` as one `ACQUIRE ... INBOX session-id` to the
    /// session's server (the key's node of a cluster: a `MOVED` reads the
    /// slot map again and resends with the same request ID, an `ASK` sends
    /// it to the node it names, after `ASKING`, with that node's session;
    /// a `NOSESSION` opens a new session and resends).
    fn queue<C: ConnectionLike>(&self, link: &mut Link<C>, acquire: &Acquire, via: &Via) -> RedisResult<Queued> {
        let loss = Arc::new(Loss::default());
        let (tx, rx) = mpsc::channel();
        let waits = acquire.wait_ms.is_some();
        let (mut nosession, mut redirects) = (0, 0);
        let mut asked: Option<Arc<session::Server>> = None;
        loop {
            let asking = asked.is_some();
            let server = match asked.take() {
                Some(server) => server,
                None => via.server(&acquire.key)?,
            };
            let sid = server.session_id()?;
            // Registered before it is sent: the event can beat the reply.
            let registered = waits && server.register(acquire, tx.clone(), &loss);
            let reply = match via {
                // The node importing the key's slot, which an ASK named.
                Via::Cluster(_) if asking => server.with_conn(|c| {
                    cluster::asking(c)?;
                    acquire.cmd(Some(&sid)).query::<Value>(c)
                }),
                // To that node itself: a redirection followed elsewhere
                // would name a session the other node does not know.
                Via::Cluster(_) => server.command::<Value>(&acquire.cmd(Some(&sid))),
                // A link that cannot reach the server any more hands over
                // to the session's own connection, which reconnects.
                Via::Server(_) => match link.send::<Value>(&acquire.cmd(Some(&sid))) {
                    Err(e) if e.is_io_error() => server.command::<Value>(&acquire.cmd(Some(&sid))),
                    reply => reply,
                },
            };
            // Every resend's reply was lost: the wait may be queued, and the
            // session's reader, whose connection breaks too, resends it (same
            // request ID) until it is answered or its time is over.
            let unreachable =
                registered && matches!(via, Via::Server(_)) && matches!(&reply, Err(e) if e.is_io_error());
            if registered && !unreachable && !matches!(&reply, Ok(Value::SimpleString(s)) if s == "WAITING") {
                server.unregister(&acquire.key, &acquire.owner);
            }
            match reply {
                Ok(Value::SimpleString(s)) if s == "WAITING" && registered => {
                    return Ok(Queued::Waiting(server, loss, tx, rx))
                }
                Err(_) if unreachable => return Ok(Queued::Waiting(server, loss, tx, rx)),
                Ok(Value::Nil) => return Ok(Queued::Busy),
                Ok(Value::Int(token)) => {
                    let token = token as u64;
                    server.watch(acquire, token, &loss);
                    return Ok(Queued::Granted(token, server, loss));
                }
                Err(e) if e.code() == Some("NOSESSION") && nosession < RESENDS => {
                    server.forget(&sid);
                    nosession += 1;
                }
                Err(e) if redirects < cluster::REDIRECTS => {
                    asked = via.asked(&e);
                    if asked.is_none() && !via.redirected(&e) {
                        return Err(e);
                    }
                    redirects += 1;
                }
                Err(e) => return Err(e),
                Ok(other) => {
                    return Err(RedisError::from((
                        redis::ErrorKind::TypeError,
                        "unexpected reply to FLOCK.ACQUIRE",
                        format!("{other:?}"),
                    )))
                }
            }
        }
    }

    /// The wait goes out as one `ACQUIRE ... INBOX session-id` and its
    /// outcome comes from the session's reader. On a cluster, a wait whose
    /// key a slot move took to another node (`LOCKDELETED` where the old
    /// node now redirects it) queues again there, as a new request with
    /// what is left of its time.
    fn acquire_in_session<C: ConnectionLike>(
        &self,
        mut link: Link<C>,
        mut acquire: Acquire,
        via: Via,
    ) -> RedisResult<Option<Guard<C>>> {
        let mut failing_since: Option<Instant> = None;
        loop {
            let queued = match self.queue(&mut link, &acquire, &via) {
                Err(e) if self.again_after_failover(&acquire, &via, &e, &mut failing_since)? => continue,
                queued => queued?,
            };
            let (server, loss, tx, rx) = match queued {
                Queued::Busy => return Ok(None),
                Queued::Granted(token, server, loss) => {
                    return Ok(Some(Guard::new(link, acquire, token, loss, Some(server))))
                }
                Queued::Waiting(server, loss, tx, rx) => (server, loss, tx, rx),
            };
            failing_since = None;
            match self.await_outcome(&acquire, &server, tx, rx) {
                (Some(Outcome::Error(e)), false)
                    if e.code() == Some("LOCKDELETED")
                        && acquire.left_ms().is_some()
                        && matches!(&via, Via::Cluster(c) if c.moved_away(&server, &acquire.key)) =>
                {
                    acquire.rid = uuid::Uuid::new_v4().to_string();
                }
                (Some(Outcome::Error(e)), false)
                    if self.again_after_failover(&acquire, &via, &e, &mut failing_since)? => {}
                (outcome, by_user) => return Self::conclude(link, acquire, loss, server, outcome, by_user),
            }
        }
    }

    /// Whether a cluster wait that ended with `e` (its node was demoted by a
    /// failover, the key is redirected, the node cannot be reached) is sent
    /// again, with the same request ID, to the key's master now, after a
    /// pause: while the wait has time left (a wait without a limit: for
    /// [`cluster::FAILOVER_WINDOW`] of such errors in a row). A try is not.
    /// A cancelled lock's wait ends with `CANCELLED` instead.
    fn again_after_failover(
        &self,
        acquire: &Acquire,
        via: &Via,
        e: &RedisError,
        failing_since: &mut Option<Instant>,
    ) -> RedisResult<bool> {
        let since = *failing_since.get_or_insert_with(Instant::now);
        let time_left = match acquire.wait_ms {
            None => false,
            Some(0) => since.elapsed() < cluster::FAILOVER_WINDOW,
            Some(_) => acquire.left_ms().is_some(),
        };
        if !time_left || !via.failed_over(e) {
            return Ok(false);
        }
        if self.cancel.as_ref().is_some_and(CancelToken::is_cancelled) {
            return Err(cancelled());
        }
        std::thread::sleep(cluster::FAILOVER_PAUSE);
        Ok(true)
    }

    /// The outcome of a queued wait (`None`: none came in time), and
    /// whether its cancel token ended it.
    fn await_outcome(
        &self,
        acquire: &Acquire,
        server: &session::Server,
        tx: Sender<Outcome>,
        rx: Receiver<Outcome>,
    ) -> (Option<Outcome>, bool) {
        let attached = self.cancel.as_ref().map(|cancel| (cancel, cancel.attach(tx.clone())));
        drop(tx);
        let mut deadline = match acquire.wait_ms {
            None | Some(0) => None,
            Some(ms) => Some(acquire.started + Duration::from_millis(ms) + WAIT_MARGIN),
        };
        let mut cancelling = false;
        let mut by_user = false;
        let outcome = loop {
            let next = match deadline {
                None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
                Some(at) => rx.recv_timeout(at.saturating_duration_since(Instant::now())),
            };
            let cancel_now = match next {
                Ok(Outcome::CancelRequested) => {
                    by_user = true;
                    true
                }
                Ok(outcome) => break Some(outcome),
                Err(RecvTimeoutError::Timeout) => true,
                Err(RecvTimeoutError::Disconnected) => break None,
            };
            if cancel_now {
                if cancelling {
                    if deadline.is_some_and(|at| at <= Instant::now()) {
                        break None;
                    }
                    continue;
                }
                cancelling = true;
                let _: RedisResult<i64> =
                    server.command(redis::cmd("FLOCK.CANCEL").arg(&acquire.key).arg(&acquire.owner));
                deadline = Some(Instant::now() + WAIT_MARGIN);
            }
        };
        if let Some((cancel, id)) = attached {
            cancel.detach(id);
        }
        let outcome = match outcome {
            Some(outcome) => Some(outcome),
            None => {
                // Gave up: whatever comes later is released by the reader.
                server.unregister(&acquire.key, &acquire.owner);
                rx.try_iter().find(|o| matches!(o, Outcome::Granted(_)))
            }
        };
        (outcome, by_user)
    }

    fn conclude<C: ConnectionLike>(
        link: Link<C>,
        acquire: Acquire,
        loss: Arc<Loss>,
        server: Arc<session::Server>,
        outcome: Option<Outcome>,
        by_user: bool,
    ) -> RedisResult<Option<Guard<C>>> {
        match outcome {
            Some(Outcome::Granted(token)) => {
                let guard = Guard::new(link, acquire, token, loss, Some(server));
                if by_user {
                    drop(guard);
                    return Err(cancelled());
                }
                Ok(Some(guard))
            }
            Some(Outcome::Error(e)) => Err(e),
            _ if by_user => Err(cancelled()),
            _ => Ok(None),
        }
    }
}

/// Cancels waits from another thread: give it to a lock with
/// [`Lock::cancel_with`]; [`CancelToken::cancel`] ends every session wait
/// of that lock (`FLOCK.CANCEL`), now and later, which then returns an error
/// with code `CANCELLED` (a grant that won the race is released first).
#[derive(Clone, Default)]
pub struct CancelToken {
    inner: Arc<CancelInner>,
}

#[derive(Default)]
struct CancelInner {
    cancelled: AtomicBool,
    next: AtomicU64,
    waiters: Mutex<Vec<(u64, Sender<Outcome>)>>,
}

impl CancelToken {
    pub fn new() -> CancelToken {
        CancelToken::default()
    }

    /// Cancels the waits of the locks given this token.
    pub fn cancel(&self) {
        self.inner.cancelled.store(true, Ordering::SeqCst);
        for (_, waiter) in lock(&self.inner.waiters).iter() {
            let _ = waiter.send(Outcome::CancelRequested);
        }
    }

    pub fn is_cancelled(&self) -> bool {
        self.inner.cancelled.load(Ordering::SeqCst)
    }

    fn attach(&self, waiter: Sender<Outcome>) -> u64 {
        let id = self.inner.next.fetch_add(1, Ordering::SeqCst);
        let mut waiters = lock(&self.inner.waiters);
        if self.is_cancelled() {
            let _ = waiter.send(Outcome::CancelRequested);
        }
        waiters.push((id, waiter));
        id
    }

    fn detach(&self, id: u64) {
        lock(&self.inner.waiters).retain(|(i, _)| *i != id);
    }
}

impl std::fmt::Debug for CancelToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CancelToken").field("cancelled", &self.is_cancelled()).finish()
    }
}

/// The process's shared command connection to the server of a
/// `redis::Client` (one per server, whatever the number of handles): a
/// [`ConnectionLike`] for short commands from any thread, which reconnects
/// by itself. [`Lock::acquire_on`] and its kin acquire over it, so that
/// any number of threads wait without a connection each.
#[derive(Clone)]
pub struct SharedConnection {
    server: Arc<session::Server>,
}

impl SharedConnection {
    pub fn new(client: &Client) -> SharedConnection {
        SharedConnection { server: session::server(client) }
    }
}

impl std::fmt::Debug for SharedConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedConnection").field("server", &self.server.client().get_connection_info().addr).finish()
    }
}

impl ConnectionLike for SharedConnection {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        self.server.with_conn(|c| c.req_packed_command(cmd))
    }

    fn req_packed_commands(&mut self, cmd: &[u8], offset: usize, count: usize) -> RedisResult<Vec<Value>> {
        self.server.with_conn(|c| c.req_packed_commands(cmd, offset, count))
    }

    fn get_db(&self) -> i64 {
        self.server.client().get_connection_info().redis.db
    }

    fn check_connection(&mut self) -> bool {
        self.server.with_conn(|c| Ok(c.check_connection())).unwrap_or(false)
    }

    fn is_open(&self) -> bool {
        true
    }
}

/// The setters and getters every kind of lock has, over its `target`.
macro_rules! target_methods {
    () => {
        /// The server's client: waits go through this process's session
        /// with that server (one `FLOCK.ACQUIRE ... WAIT t INBOX session-id`
        /// each, the outcome read by the session's thread), every grant is
        /// watched (a loss is pushed: [`Guard::lost`] at once), and a
        /// command whose reply was lost is resent over a new connection from
        /// it when the one given to acquire broke.
        pub fn with_client(mut self, client: &Client) -> Self {
            self.target.client = Some(client.clone());
            self
        }

        /// The same as [`Lock::with_client`] (its older name).
        pub fn reconnect_with(self, client: &Client) -> Self {
            self.with_client(client)
        }

        /// Waits block the connection given to acquire (`FLOCK.ACQUIRE ...
        /// WAIT t` without a session) even with a client; grants are not
        /// watched (only a watchdog or a renewal finds a loss).
        pub fn blocking(mut self) -> Self {
            self.target.blocking = true;
            self
        }

        /// Waits of this lock end with an error of code `CANCELLED` once
        /// `token` is cancelled (`FLOCK.CANCEL` on the server; session waits).
        pub fn cancel_with(mut self, token: &CancelToken) -> Self {
            self.target.cancel = Some(token.clone());
            self
        }

        /// Durable grants: each grant counts only once `replicas` replicas
        /// have acknowledged it, waiting up to `timeout` (after the grant,
        /// `FLOCK.RENEW` and `WAIT replicas timeout` in one round trip on a
        /// connection to the key's node: the master a sentinel names, a
        /// cluster key's node). When fewer acknowledge it in time (or the
        /// grant is already gone) the hold is given back (`FLOCK.RELEASE`:
        /// a reentry gives back only its own hold) and the acquire fails
        /// with an error of code `NOTDURABLE` naming the key and both
        /// counts. Name every replica of the deployment: in a graceful
        /// failover the old master keeps serving with fewer replicas, and
        /// an acknowledgement from a replica that goes with it is lost with
        /// it (docs/durability.md has what each setting survived). Off by
        /// default; `replicas` 0 turns it off.
        pub fn durable(mut self, replicas: usize, timeout: Duration) -> Self {
            self.target.durable = (replicas > 0).then_some((replicas, timeout));
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

        /// This lock acquiring through `route`, and the connection that
        /// follows its key there.
        fn routed(&self, route: impl Into<Route>) -> (Target, Routed) {
            let mut target = self.target.clone();
            let via = route.into().0;
            target.via = Some(via.clone());
            (target, Routed { via, key: self.target.key.clone() })
        }

        /// This lock with `client` (see `with_client`) and the process's
        /// shared connection to it.
        fn on(&self, client: &Client) -> (Target, SharedConnection) {
            let mut target = self.target.clone();
            target.client = Some(client.clone());
            (target, SharedConnection::new(client))
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
    /// when the lock is busy or the wait timed out.
    ///
    /// With a client ([`Lock::with_client`]) the command goes out on `conn`
    /// with `INBOX session-id`, `conn` is free again at once and the calling
    /// thread waits for the session's event; if neither the server's
    /// `timeout` nor a grant came by `wait` + [`WAIT_MARGIN`], it sends
    /// `FLOCK.CANCEL` and returns `None` (a grant that raced the cancel is
    /// released). Without a client (or with [`Lock::blocking`]) `conn`
    /// blocks for the wait: keep any read timeout of it longer than `wait`.
    pub fn acquire<C: ConnectionLike>(&self, conn: C, wait: Option<Duration>) -> RedisResult<Option<Guard<C>>> {
        self.target.acquire(conn, wait, Mode::Exclusive)
    }

    /// [`Lock::acquire`] through this process's session with `client`'s
    /// server, over its shared connection: no connection of the caller's,
    /// none per waiting thread.
    pub fn acquire_on(&self, client: &Client, wait: Option<Duration>) -> RedisResult<Option<Guard<SharedConnection>>> {
        let (target, conn) = self.on(client);
        target.acquire(conn, wait, Mode::Exclusive)
    }

    /// [`Lock::acquire`] through `route`: a [`Cluster`] (the session of the
    /// key's node; commands follow the key to its node), a
    /// [`SentinelMaster`] (the master its sentinels name, again after a
    /// failover) or a `redis::Client`. No connection per waiting thread.
    pub fn acquire_in(&self, route: impl Into<Route>, wait: Option<Duration>) -> RedisResult<Option<Guard<Routed>>> {
        let (target, conn) = self.routed(route);
        target.acquire(conn, wait, Mode::Exclusive)
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

    /// [`RwLock::read`] over the session and shared connection of `client`
    /// (see [`Lock::acquire_on`]).
    pub fn read_on(&self, client: &Client, wait: Option<Duration>) -> RedisResult<Option<ReadGuard<SharedConnection>>> {
        let (target, conn) = self.on(client);
        target.acquire(conn, wait, Mode::Shared)
    }

    /// [`RwLock::write`] over the session and shared connection of `client`.
    pub fn write_on(
        &self,
        client: &Client,
        wait: Option<Duration>,
    ) -> RedisResult<Option<WriteGuard<SharedConnection>>> {
        let (target, conn) = self.on(client);
        target.acquire(conn, wait, Mode::Exclusive)
    }

    /// [`RwLock::read`] through `route` (see [`Lock::acquire_in`]).
    pub fn read_in(&self, route: impl Into<Route>, wait: Option<Duration>) -> RedisResult<Option<ReadGuard<Routed>>> {
        let (target, conn) = self.routed(route);
        target.acquire(conn, wait, Mode::Shared)
    }

    /// [`RwLock::write`] through `route` (see [`Lock::acquire_in`]).
    pub fn write_in(&self, route: impl Into<Route>, wait: Option<Duration>) -> RedisResult<Option<WriteGuard<Routed>>> {
        let (target, conn) = self.routed(route);
        target.acquire(conn, wait, Mode::Exclusive)
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

    /// [`Semaphore::acquire`] over the session and shared connection of
    /// `client` (see [`Lock::acquire_on`]).
    pub fn acquire_on(
        &self,
        client: &Client,
        permits: u32,
        wait: Option<Duration>,
    ) -> RedisResult<Option<SemaphoreGuard<SharedConnection>>> {
        let (target, conn) = self.on(client);
        target.acquire(conn, wait, Mode::Permits { permits, limit: self.limit })
    }

    /// [`Semaphore::acquire`] through `route` (see [`Lock::acquire_in`]).
    pub fn acquire_in(
        &self,
        route: impl Into<Route>,
        permits: u32,
        wait: Option<Duration>,
    ) -> RedisResult<Option<SemaphoreGuard<Routed>>> {
        let (target, conn) = self.routed(route);
        target.acquire(conn, wait, Mode::Permits { permits, limit: self.limit })
    }
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
    loss: Arc<Loss>,
    /// The session watching this grant.
    session: Option<Arc<session::Server>>,
    /// The process's renewer of this grant's server, and its entry there.
    watchdog: Option<(Arc<watchdog::Renewer>, u64)>,
    released: bool,
    /// Of a durable grant: the address of the node that confirmed it.
    node: Option<String>,
}

impl<C: ConnectionLike> Guard<C> {
    /// A grant of the token of an abandoned hold of this owner (see
    /// `abandoned`) reentered it: that hold is released now, so this guard's
    /// is the only one. Kept abandoned if the server refuses again.
    fn reclaim(&mut self) {
        let entry = (self.key.clone(), self.owner.clone(), self.token);
        if !lock(abandoned()).remove(&entry) {
            return;
        }
        let released: RedisResult<u64> = self.link.query(redis::cmd("FLOCK.RELEASE").arg(&self.key).arg(&self.owner));
        if let Err(e) = released {
            if !is_notowner(&e) && !e.is_io_error() {
                abandon(&self.key, &self.owner, self.token);
            }
        }
    }

    fn new(
        link: Link<C>,
        acquire: Acquire,
        token: u64,
        loss: Arc<Loss>,
        session: Option<Arc<session::Server>>,
    ) -> Self {
        Guard {
            link,
            key: acquire.key,
            owner: acquire.owner,
            mode: acquire.mode,
            token,
            lease_ms: acquire.lease_ms,
            loss,
            session,
            watchdog: None,
            released: false,
            node: None,
        }
    }

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

    /// Of a durable grant ([`Lock::durable`]) acquired with a client or a
    /// route: the address (`host:port`) of the node where its `RENEW` and
    /// `WAIT` were answered, the node that held it with its replicas. `None`
    /// otherwise.
    pub fn node(&self) -> Option<&str> {
        self.node.as_deref()
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The connection the lock was acquired on, for work in between.
    pub fn conn(&mut self) -> &mut C {
        &mut self.link.conn
    }

    /// True once the lock is known lost: the session pushed the loss (a
    /// lock with a client), or a renewal (the watchdog's or
    /// [`Guard::renew`]) found it. Stop acting on the protected resource.
    pub fn lost(&self) -> bool {
        self.loss.is_lost()
    }

    /// Why it was lost, once it is.
    pub fn lost_reason(&self) -> Option<LeaseLost> {
        self.loss.reason()
    }

    /// A receiver that gets one [`LeaseLost`] when the lock is lost (at
    /// once if it already is), and disconnects without a message when the
    /// guard is released. With a session (a lock with a client) the loss is
    /// pushed by the server, watchdog or not.
    pub fn lost_channel(&self) -> Receiver<LeaseLost> {
        self.loss.subscribe()
    }

    /// `FLOCK.RENEW` by hand: a fresh lease from now. A `NOTOWNER` error
    /// also marks the guard lost.
    pub fn renew(&mut self) -> RedisResult<u64> {
        let sent = Instant::now();
        let renewed = self.link.query(&renew_cmd(&self.key, &self.owner, self.lease_ms)).inspect_err(|e| {
            if is_notowner(e) {
                self.loss.mark(LeaseLost::NotOwner);
            }
        });
        if renewed.is_ok() {
            self.loss.renewed(sent);
        }
        renewed
    }

    /// Starts a thread that renews the lease every third of it on its own
    /// connection from `client`, until the guard is released or dropped or
    /// the lock is lost. The receiver (as [`Guard::lost_channel`]) gets one
    /// [`LeaseLost`] if the lock is lost; it disconnects without a message
    /// when the guard is released. A watchdog already running is replaced.
    /// Unless the lock was given another, `client` also replaces the
    /// guard's connection if it breaks.
    pub fn watchdog(&mut self, client: &Client) -> RedisResult<Receiver<LeaseLost>> {
        self.link.client.get_or_insert_with(|| client.clone());
        self.start_renewer(&Via::Server(session::server(client)))
    }

    fn start_renewer(&mut self, via: &Via) -> RedisResult<Receiver<LeaseLost>> {
        self.stop_watchdog();
        let renewer = watchdog::renewer(via)?;
        let lost = self.loss.subscribe();
        let cmd = renew_cmd(&self.key, &self.owner, self.lease_ms);
        let id = renewer.start(&self.key, cmd, Duration::from_millis(self.lease_ms), Arc::clone(&self.loss));
        self.watchdog = Some((renewer, id));
        self.loss.set_watchdog(true);
        Ok(lost)
    }

    /// Releases this hold; returns the holds left (`0`: the lock is free
    /// or handed to the next waiter). `NOTOWNER` if it was lost meanwhile
    /// (its text says why: the lease ended, force-released, deleted).
    pub fn release(mut self) -> RedisResult<u64> {
        self.release_once()
    }

    fn stop_watchdog(&mut self) {
        if let Some((renewer, id)) = self.watchdog.take() {
            renewer.stop(id);
        }
    }

    fn release_once(&mut self) -> RedisResult<u64> {
        self.stop_watchdog();
        self.released = true;
        // Not while a re-watch on a new session holds its extra hold.
        let hold = self.session.as_ref().and_then(|s| s.hold_lock(&self.key, &self.owner, self.token));
        let _hold = hold.as_ref().map(|h| lock(h));
        if let Some(session) = &self.session {
            session.unwatch(&self.key, &self.owner, self.token, &self.loss);
        }
        self.loss.close();
        let released = self.link.query(redis::cmd("FLOCK.RELEASE").arg(&self.key).arg(&self.owner));
        if let Err(e) = &released {
            if !is_notowner(e) && !e.is_io_error() {
                abandon(&self.key, &self.owner, self.token);
            }
        }
        released
    }
}

/// Holds whose release the server refused (`NOREPLICAS`, `READONLY`,
/// `NOPERM`, ...: an error reply other than `NOTOWNER`), as (key, owner,
/// token): the server still has them. Left alone, the same owner's next
/// acquire would reenter such a hold (same token, one more hold) and every
/// release would leave it behind, its lease renewed by each reentry: seen in
/// the failover test, a thread whose give-back was refused during a
/// failover held the lock for good and starved every other. A grant with
/// the token of an abandoned hold releases that hold first.
fn abandoned() -> &'static Mutex<std::collections::HashSet<(String, String, u64)>> {
    static ABANDONED: OnceLock<Mutex<std::collections::HashSet<(String, String, u64)>>> = OnceLock::new();
    ABANDONED.get_or_init(Default::default)
}

fn abandon(key: &str, owner: &str, token: u64) {
    lock(abandoned()).insert((key.to_string(), owner.to_string(), token));
}

impl Guard<Routed> {
    /// [`Guard::watchdog`] through where the lock was acquired: the
    /// renewals follow the key to its node (a cluster) or go to the master
    /// the sentinels name now; one renewal thread per cluster or server.
    pub fn start_watchdog(&mut self) -> RedisResult<Receiver<LeaseLost>> {
        let via = self.link.conn.via.clone();
        self.start_renewer(&via)
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

/// What the check of a durable grant found.
enum Durable {
    /// `RENEW` held; `WAIT` answered this many replicas.
    Acked(i64),
    /// `RENEW` answered `NOTOWNER` (its text): the grant was gone.
    NotOwner(String, i64),
}

impl Durable {
    /// The `NOTDURABLE` error of a check that fell short.
    fn error(&self, key: &str, replicas: usize, timeout_ms: u64) -> RedisError {
        let text = match self {
            Durable::Acked(n) => format!(
                "{key}: {n} of {replicas} replicas acknowledged the grant within {timeout_ms} ms; the hold was given back"
            ),
            Durable::NotOwner(why, n) => format!(
                "{key}: the grant was gone before {replicas} replicas acknowledged it ({n} did): {why}"
            ),
        };
        redis::make_extension_error("NOTDURABLE".into(), Some(text))
    }
}

/// The durable check (see `Target::confirm`) on the key's node of `via`:
/// again (a fresh RENEW each time) after an I/O error or `READONLY` (the
/// server was demoted: a sentinel's master is asked for again) and, on a
/// cluster, on the node a `MOVED` or `ASK` names.
fn durable_via(
    via: &Via,
    key: &str,
    owner: &str,
    lease_ms: u64,
    replicas: usize,
    timeout_ms: u64,
) -> RedisResult<(Durable, Option<String>)> {
    let (mut tries, mut redirects) = (0, 0);
    let mut asked: Option<Arc<session::Server>> = None;
    loop {
        let asking = asked.is_some();
        let server = match asked.take() {
            Some(server) => Ok(server),
            None => via.server(key),
        };
        let result = server.and_then(|server| {
            server.with_spare(|addr, conn| {
                conn.set_read_timeout(Some(Duration::from_millis(timeout_ms) + WAIT_MARGIN))?;
                if asking {
                    cluster::asking(conn)?;
                }
                Ok((durable_on(conn, key, owner, lease_ms, replicas, timeout_ms)?, Some(addr.to_string())))
            })
        });
        match result {
            Err(e) if (e.is_io_error() || e.kind() == redis::ErrorKind::ReadOnly) && tries < RESENDS => {
                tries += 1;
                if !e.is_io_error() {
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            Err(e) if redirects < cluster::REDIRECTS && !e.is_io_error() => {
                asked = via.asked(&e);
                if asked.is_none() && !via.redirected(&e) {
                    return Err(e);
                }
                redirects += 1;
            }
            result => return result,
        }
    }
}

/// `FLOCK.RENEW key owner lease-ms ID <uuid>` then `WAIT replicas
/// timeout-ms`, in one round trip on `conn`.
fn durable_on(
    conn: &mut dyn ConnectionLike,
    key: &str,
    owner: &str,
    lease_ms: u64,
    replicas: usize,
    timeout_ms: u64,
) -> RedisResult<Durable> {
    let mut pipe = redis::pipe();
    pipe.add_command(renew_cmd(key, owner, lease_ms).arg("ID").arg(uuid::Uuid::new_v4().to_string()).clone());
    pipe.cmd("WAIT").arg(replicas).arg(timeout_ms);
    let replies = conn.req_packed_commands(&pipe.get_packed_pipeline(), 0, 2)?;
    let [renewed, acked] = <[Value; 2]>::try_from(replies).map_err(|r| {
        RedisError::from((redis::ErrorKind::TypeError, "unexpected replies to FLOCK.RENEW and WAIT", format!("{r:?}")))
    })?;
    let renewed = match renewed {
        Value::ServerError(e) => Err(RedisError::from(e)),
        other => Ok(other),
    };
    match renewed {
        Err(e) if is_notowner(&e) => Ok(Durable::NotOwner(
            e.detail().unwrap_or_default().to_string(),
            i64::from_redis_value(&acked).unwrap_or(0),
        )),
        Err(e) => Err(e),
        Ok(_) => match acked {
            Value::ServerError(e) => Err(RedisError::from(e)),
            acked => Ok(Durable::Acked(i64::from_redis_value(&acked)?)),
        },
    }
}

fn renew_cmd(key: &str, owner: &str, lease_ms: u64) -> Cmd {
    let mut cmd = redis::cmd("FLOCK.RENEW");
    cmd.arg(key).arg(owner).arg(lease_ms);
    cmd
}
