//! [`Guard`]: one hold of a lock, its lease, its watchdog, how it is known
//! lost and its release.

use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::{Arg, Client, Cmd, ConnectionLike, ErrorKind, FromRedisValue, RedisError, RedisResult, Value};

use crate::cluster::{Routed, Via};
use crate::link::Link;
use crate::loss::{LeaseLost, Loss};
use crate::mutex::lock;
use crate::owner::is_notowner;
use crate::request::{Acquire, Mode};
use crate::session;
use crate::stale;
use crate::watchdog;

/// One hold of a lock, of either side of a read-write lock or of permits of
/// a semaphore: released (one hold) when dropped. Errors on drop are
/// ignored; call [`Guard::release`] to see them.
pub struct Guard<C: ConnectionLike> {
    pub(crate) link: Link<C>,
    pub(crate) key: String,
    pub(crate) owner: String,
    mode: Mode,
    token: u64,
    /// The grant's own lease: 0 for a session grant.
    pub(crate) lease_ms: u64,
    /// The lease a renewal gives.
    renew_ms: u64,
    loss: Arc<Loss>,
    /// The session watching this grant.
    pub(crate) session: Option<Arc<session::Server>>,
    /// The process's renewer of this grant's server, and its entry there.
    watchdog: Option<(Arc<watchdog::Renewer>, u64)>,
    released: bool,
    /// Of a durable grant: the address of the node that confirmed it.
    pub(crate) node: Option<String>,
}

impl<C: ConnectionLike> Guard<C> {
    /// A grant that may have reentered stale holds of its owner (see
    /// `stale`): the holds `FLOCK.INFO` counts beyond the process's own are
    /// given back now, so that this guard's is the only new one. A give-back
    /// refused is remembered again, for the next grant.
    pub(crate) fn reclaim(&mut self) {
        if !stale::take(&self.key, &self.owner, self.token) {
            return;
        }
        let info: RedisResult<Value> = self.link.send(redis::cmd("FLOCK.INFO").arg(&self.key));
        let Ok(holds) = info.map(|info| stale::holds_of(&info, &self.owner, self.token)) else {
            stale::remember(&self.key, &self.owner, Some(self.token));
            return;
        };
        let stale = holds.saturating_sub(stale::held(&self.key, &self.owner));
        if stale > 0 {
            if let Err(e) = self.release_n(stale.into()) {
                stale::released(&self.key, &self.owner, self.token, Err(&e));
            }
        }
    }

    /// Releases `n` holds of this grant; returns the holds left after the
    /// last.
    fn release_n(&mut self, n: u64) -> RedisResult<u64> {
        let mut left = 0;
        for _ in 0..n {
            left = self.link.query(redis::cmd("FLOCK.RELEASE").arg(&self.key).arg(&self.owner))?;
        }
        Ok(left)
    }

    pub(crate) fn new(
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
            renew_ms: acquire.renew_ms,
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

    /// Of a durable grant ([`Lock::durable`](crate::Lock::durable)) acquired with a client or a
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

    /// Whether this hold is a session grant: no lease of its own, it lives
    /// until released or its session ends, and its deadline is the
    /// session's (the default for a lock acquired through a session without
    /// a fixed [`lease`](crate::Lock::lease)).
    pub fn session_grant(&self) -> bool {
        self.lease_ms == 0
    }

    /// True once the lock is known lost: its deadline passed unconfirmed
    /// (checked against the clock at each call too, so that a process paused
    /// past it sees the loss at its first check), the session pushed the loss
    /// or ended, or a renewal found it. Stop acting on the protected
    /// resource.
    pub fn lost(&self) -> bool {
        self.loss.is_lost()
    }

    /// Why it was lost, once it is.
    pub fn lost_reason(&self) -> Option<LeaseLost> {
        self.loss.reason()
    }

    /// Since when it is lost, once it is: the deadline that passed (from
    /// then on [`Guard::lost`] says so, whenever the timer thread gets to
    /// run), or when the loss was heard of.
    pub fn lost_at(&self) -> Option<Instant> {
        self.loss.lost_since().map(|(_, at)| at)
    }

    /// A receiver that gets one [`LeaseLost`] when the lock is lost (at
    /// once if it already is), and disconnects without a message when the
    /// guard is released. With a session (a lock with a client) the loss is
    /// pushed by the server, watchdog or not.
    pub fn lost_channel(&self) -> Receiver<LeaseLost> {
        self.loss.subscribe()
    }

    /// `FLOCK.RENEW` by hand: a fresh lease from now (the lock's lease; a
    /// session grant gets that lease of its own and from then on no longer
    /// lives with its session). A `NOTOWNER` error also marks the guard lost.
    pub fn renew(&mut self) -> RedisResult<u64> {
        let sent = Instant::now();
        let renewed = self.link.query(&renew_cmd(&self.key, &self.owner, self.renew_ms)).inspect_err(|e| {
            if is_notowner(e) {
                self.loss.mark(LeaseLost::NotOwner);
            }
        });
        if renewed.is_ok() {
            if self.lease_ms == 0 {
                self.lease_ms = self.renew_ms;
                self.loss.leased(self.renew_ms, sent);
            } else {
                self.loss.renewed(sent);
            }
        }
        renewed
    }

    /// Runs `command` (built as usual: `redis::cmd("HSET").arg("{order:42}:row")
    /// .arg("status").arg("paid")`) only while this grant holds the lock,
    /// as `FLOCK.FENCED key token command ...`: the server checks the token
    /// and runs the command in one step, so a holder that paused past the
    /// end of its grant cannot write after the next holder has (see
    /// docs/fencing.md). Answers the command's own reply; its own errors
    /// (`WRONGTYPE`, ...) come back as they are and lose nothing.
    ///
    /// An error of code `STALE` means nothing ran: either the server
    /// answered that the token no longer holds the lock (its text says what
    /// does), and the guard is then marked lost ([`LeaseLost::NotOwner`]),
    /// or the guard was already known lost ([`Guard::lost`]) and nothing was
    /// sent, since the server could only refuse it.
    ///
    /// Sent once, never again after an I/O error: `FLOCK.FENCED` takes no
    /// request ID, so the server could not tell a resend from a second
    /// write, and a lost reply leaves it unknown whether the command ran.
    /// In a Cluster the command's keys must share the lock's slot (a hash
    /// tag), or Redis answers `CROSSSLOT`.
    pub fn fenced<T: FromRedisValue>(&mut self, command: &Cmd) -> RedisResult<T> {
        if let Some(why) = self.loss.reason() {
            return Err(redis::make_extension_error(
                "STALE".into(),
                Some(format!("token {} of {} was lost here ({why}): the command was not sent", self.token, self.key)),
            ));
        }
        let fenced = fenced_cmd(&self.key, self.token, command)?;
        // `current`, not `send`: a new connection if the old one broke, but
        // no resend once the command may have gone out.
        let conn = self.link.current()?;
        fenced.query(conn).inspect_err(|e| {
            if is_stale(e) {
                self.loss.mark(LeaseLost::NotOwner);
            }
        })
    }

    /// Renews the lease every third of it (the process's renewer of
    /// `client`'s server), until the guard is released or dropped or the
    /// lock is lost: its deadline is then the send time of the last renewal
    /// answered + the lease − the drift margin, and passing it unconfirmed
    /// is a loss ([`LeaseLost::Unconfirmed`]). A session grant has no lease
    /// to renew: nothing is started, its deadline stays the session's. The
    /// receiver (as [`Guard::lost_channel`]) gets one [`LeaseLost`] if the
    /// lock is lost; it disconnects without a message when the guard is
    /// released. A watchdog already running is replaced. Unless the lock was
    /// given another, `client` also replaces the guard's connection if it
    /// breaks.
    pub fn watchdog(&mut self, client: &Client) -> RedisResult<Receiver<LeaseLost>> {
        self.link.client.get_or_insert_with(|| client.clone());
        self.start_renewer(&Via::Server(session::server(client)))
    }

    fn start_renewer(&mut self, via: &Via) -> RedisResult<Receiver<LeaseLost>> {
        if self.session_grant() {
            return Ok(self.loss.subscribe());
        }
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
    /// (its text says why: the lease ended, force-released, deleted). A
    /// guard already known lost ([`Guard::lost`]: its deadline passed
    /// before the server's end of it, say) still sends the release, so that
    /// nothing is left held, and fails with `NOTOWNER` whatever the server
    /// answers.
    pub fn release(mut self) -> RedisResult<u64> {
        self.release_once()
    }

    fn stop_watchdog(&mut self) {
        if let Some((renewer, id)) = self.watchdog.take() {
            renewer.stop(id);
        }
    }

    pub(crate) fn release_once(&mut self) -> RedisResult<u64> {
        self.stop_watchdog();
        self.released = true;
        // Not while a re-watch on a new session holds its extra hold.
        let hold = self.session.as_ref().and_then(|s| s.unwatch(&self.key, &self.owner, self.token, &self.loss));
        let _hold = hold.as_ref().map(|h| lock(h));
        let lost = self.loss.reason();
        self.loss.close();
        let mut released = self.release_n(1);
        stale::unhold(&self.key, &self.owner);
        if let Ok(left @ 1..) = released {
            if stale::held(&self.key, &self.owner) == 0 {
                // The process's last hold, and the server counts more: holds
                // it let go that stayed (see `stale`), given back now.
                released = self.release_n(left);
            }
        }
        stale::released(&self.key, &self.owner, self.token, released.as_ref().copied());
        match (lost, released) {
            (Some(why), Ok(_)) => Err(redis::make_extension_error(
                "NOTOWNER".into(),
                Some(format!(
                    "the lock was lost ({why}) before its release; the hold the server still had was given back"
                )),
            )),
            (_, released) => released,
        }
    }
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

/// `FLOCK.FENCED key token` followed by `command`'s words. A cursor
/// argument (`Cmd::cursor_arg`) is refused before anything is sent: its
/// value is not readable from the `Cmd`, and a guess would run another
/// command than the one asked for.
pub(crate) fn fenced_cmd(key: &str, token: u64, command: &Cmd) -> RedisResult<Cmd> {
    let mut fenced = redis::cmd("FLOCK.FENCED");
    fenced.arg(key).arg(token);
    for arg in command.args_iter() {
        match arg {
            Arg::Simple(word) => fenced.arg(word),
            Arg::Cursor => {
                return Err(RedisError::from((
                    ErrorKind::ClientError,
                    "FLOCK.FENCED takes no cursor argument",
                    "give the cursor with arg() instead of cursor_arg(); nothing was sent".to_string(),
                )))
            }
        };
    }
    Ok(fenced)
}

/// The error code `STALE`: a `FLOCK.FENCED` token no longer holds its lock,
/// and the command did not run.
pub(crate) fn is_stale(e: &RedisError) -> bool {
    e.code() == Some("STALE")
}

pub(crate) fn renew_cmd(key: &str, owner: &str, lease_ms: u64) -> Cmd {
    let mut cmd = redis::cmd("FLOCK.RENEW");
    cmd.arg(key).arg(owner).arg(lease_ms);
    cmd
}
