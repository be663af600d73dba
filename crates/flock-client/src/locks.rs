//! The kinds of lock, [`Lock`], [`RwLock`] and [`Semaphore`], each over a
//! [`Target`], with the setters every kind has; and [`Route`], where they
//! acquire through.

use std::sync::Arc;
use std::time::Duration;

use redis::{Client, ConnectionLike, RedisResult};

use crate::cancel::CancelToken;
use crate::cluster::{Cluster, Routed, Via};
use crate::guard::Guard;
use crate::request::Mode;
use crate::sentinel::SentinelMaster;
use crate::session;
use crate::shared::SharedConnection;
use crate::target::Target;

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

        /// A fixed lease: every grant (through a session too) gets `lease`
        /// of its own, is never renewed, and is lost ([`LeaseLost::Expired`](crate::LeaseLost::Expired))
        /// at its deadline: the send time of the acquire (or of the
        /// `FLOCK.INBOX` read that brought the grant, plus the lease the
        /// server said was left) + `lease` − the drift margin. Without it, a
        /// lock acquired through a session takes session grants (`lease-ms`
        /// 0): no lease of their own and no renewal traffic, held until
        /// released or their session ends, their deadline the session's.
        pub fn lease(mut self, lease: Duration) -> Self {
            self.target.fixed = Some(lease);
            self
        }

        /// The timeout T of the session this lock waits through (the
        /// process's session with its server for that timeout:
        /// `FLOCK.SESSION TIMEOUT ms WITHTIMEOUT`), 100 ms to 1 h. Without
        /// it, the server's `flock.session-timeout-ms` (10 s by default). A
        /// process cut off from the server (or paused) for T loses its
        /// session grants (and knows it first: its deadline is T − the
        /// drift margin after the last heartbeat sent and answered); the
        /// heartbeat comes every T/4.
        pub fn session_timeout(mut self, timeout: Duration) -> Self {
            self.target.session_timeout = Some(timeout);
            self
        }

        /// Each grant's lock-delay (`LOCKDELAY`, up to a minute): when it
        /// ends without being released (its lease ran out, its session
        /// ended), the server grants the lock to nobody for that long: time
        /// for a holder that lost it unawares to stop. Without it, the
        /// server's `flock.lock-delay-ms` (docs/commands.md, "Lock-delay").
        pub fn lock_delay(mut self, delay: Duration) -> Self {
            self.target.lock_delay = Some(delay);
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
            let server = session::server(client);
            // The same server `with_client` would find, looked up once.
            target.via = Some(Via::Server(Arc::clone(&server)));
            (target, SharedConnection::of(server))
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
    ///
    /// [`FOREVER`]: crate::FOREVER
    /// [`WAIT_MARGIN`]: crate::WAIT_MARGIN
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
