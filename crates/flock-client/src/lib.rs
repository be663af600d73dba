//! A small blocking Rust client for FLOCK on the `redis` crate.
//!
//! ```no_run
//! use std::time::Duration;
//! use flock_client::Lock;
//!
//! # fn main() -> redis::RedisResult<()> {
//! let client = redis::Client::open("redis://127.0.0.1:6379/")?;
//! // The lease is that of a grant taken without a session (and of a
//! // renewal); through a session the lock takes session grants.
//! let lock = Lock::new("orders:42", Duration::from_secs(10));
//! // Queue for up to 5 s through the process's session; `None` would only try.
//! if let Some(guard) = lock.acquire_on(&client, Some(Duration::from_secs(5)))? {
//!     let lost = guard.lost_channel();
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
//! session with that server: one connection per server (and session
//! timeout) and process, opened on its first acquire with `FLOCK.SESSION
//! [TIMEOUT ms] WITHTIMEOUT` ([`Lock::session_timeout`]; else the server's
//! `flock.session-timeout-ms`), whose thread loops `FLOCK.INBOX`, each read
//! waiting at most a quarter of the session's timeout T (the heartbeat). A
//! wait is one `FLOCK.ACQUIRE ... WAIT t INBOX session-id ID request-id`,
//! answered `WAITING` at once; the session's thread hands the outcome to
//! the waiting thread. So any number of threads wait without a connection
//! (or a blocked server client) each: `acquire_on` sends over the
//! process's [`SharedConnection`] to that server (a pool of at most four).
//!
//! **Session grants and deadlines.** Through a session a lock takes
//! session grants by default (`FLOCK.ACQUIRE key owner 0 ... INBOX
//! session-id`): no lease of their own, no renewal traffic (no watchdog),
//! held until released or until their session ends. Each grant has a
//! deadline on this process's monotonic clock, never later than the
//! server's end of it (by the drift margin m = 10 ms + 1% of the lease or
//! timeout counted): a session grant's is the session's (the send time of
//! the last `FLOCK.INBOX` answered + T − m); a fixed lease's
//! ([`Lock::lease`]) the send time of its acquire (or of the read that
//! brought its `granted` event, plus the lease the server said was left) +
//! the lease − m; a watchdog's ([`Guard::watchdog`], grants without a
//! session) the send time of its last renewal answered + the lease − m. One
//! timer thread of the process marks each grant lost at its deadline,
//! whether or not any I/O fails, and [`Guard::lost`] also compares it with
//! the clock, so that a process paused past it sees the loss at its first
//! check: the holder knows before the server can give the lock to anybody
//! else. Losses ([`LeaseLost`], named as in docs/client-protocol.md):
//! `expired` (a fixed lease's deadline, or pushed), `unconfirmed` (a session
//! or watchdog grant's deadline passed unconfirmed), `sessionended` (its
//! session closed or expired), `forcereleased`, `deleted`, `demoted`
//! (pushed: every grant made through a session is watched, and the server's
//! end of it marks the guard at once), `notowner` (a renewal or check
//! answered `NOTOWNER`). Every command the client sends for itself has a
//! timeout: a heartbeat until the session's deadline, a watchdog's batch of
//! renewals until the earliest deadline it serves (each batch on a thread
//! and connection of its own), the others (releases, cancels, re-watches)
//! a quarter of T.
//!
//! **A broken session.** If the session's connection breaks or its deadline
//! passes, its session grants are lost (`sessionended`, or `unconfirmed` if
//! the deadline passed first) and never taken again quietly. A new session
//! is opened and the pending waits are sent again (same request IDs, the
//! time they have left; they queue again at the tail); while the server
//! cannot be reached they retry until their own time is up, then return
//! `None` (a timeout). The grants with a lease of their own that the old
//! session watched are checked again and watched by the new one: a
//! `FLOCK.RENEW` ([`LeaseLost::NotOwner`] if it is gone), then a reentrant
//! `FLOCK.ACQUIRE ... INBOX new-session-id` (the watchdog's lease, or what
//! is left of a fixed lease, never more; none left: [`LeaseLost::Expired`])
//! and a `FLOCK.RELEASE` of that extra hold, serialized with the guard's own
//! release: the holds stay as they were and later losses are still pushed.
//! A lock without a client, or with [`Lock::blocking`], waits as before:
//! `FLOCK.ACQUIRE ... WAIT t` blocks the connection given to acquire, and
//! its grant has the lock's lease (which [`Guard::watchdog`] renews; the
//! protocol's watchdog lease is [`WATCHDOG_LEASE`]).
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
//! nodes' shared connections.
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
//! **Fencing.** A lease cannot stop a holder that pauses past it from
//! writing late; the write itself must carry the grant's token and be
//! refused once it no longer holds (docs/fencing.md). For data in Redis,
//! [`Guard::fenced`] (and [`MultiGuard::fenced_on`]) sends a command as
//! `FLOCK.FENCED key token command ...`: the server runs it only while the
//! token holds the lock and answers its own reply, else an error of code
//! `STALE` and nothing ran (a [`Guard`] is then lost, [`LeaseLost::NotOwner`]).
//! It takes no request ID, so it is sent once and never again after a lost
//! reply. For data elsewhere, hand [`Guard::token`] to the resource.
//!
//! ```no_run
//! # fn main() -> redis::RedisResult<()> {
//! # let client = redis::Client::open("redis://127.0.0.1:6379/")?;
//! let lock = flock_client::Lock::new("{order:42}:lock", std::time::Duration::from_secs(10));
//! if let Some(mut guard) = lock.acquire(client.get_connection()?, None)? {
//!     let set = guard.fenced::<i64>(redis::cmd("HSET").arg("{order:42}:row").arg("status").arg("paid"));
//!     if matches!(&set, Err(e) if e.code() == Some("STALE")) {
//!         // The grant ended before the write: it did not run.
//!     }
//! }
//! # Ok(())
//! # }
//! ```
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

mod cancel;
mod cluster;
mod durable;
mod guard;
mod link;
mod locks;
mod loss;
mod multi;
mod mutex;
mod owner;
mod reader_connection;
mod request;
mod sentinel;
mod session;
mod shared;
mod stale;
mod target;
mod timer;
mod times;
mod watchdog;

pub use cancel::CancelToken;
pub use cluster::{key_slot, Cluster, Routed};
pub use guard::Guard;
pub use link::RESENDS;
pub use locks::{Lock, ReadGuard, Route, RwLock, Semaphore, SemaphoreGuard, WriteGuard};
pub use loss::LeaseLost;
pub use multi::{MultiGuard, MultiLock};
pub use request::Mode;
pub use sentinel::SentinelMaster;
pub use session::close_session;
pub use shared::SharedConnection;
pub use times::{
    CANCEL_GRACE, DRIFT_MARGIN_MS, DRIFT_MARGIN_PERCENT, FOREVER, HEARTBEAT_FRACTION, WAIT_MARGIN, WATCHDOG_LEASE,
    WATCHDOG_RENEW_FRACTION,
};
