//! What every kind of lock keeps ([`Target`]) and how it acquires: one
//! `FLOCK.ACQUIRE` on the connection given to acquire, or a wait sent
//! through the session of the key's server, whose outcome the session's
//! reader hands over.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::{Client, ConnectionLike, RedisError, RedisResult, Value};

use crate::cancel::{cancelled, CancelToken};
use crate::cluster::{self, Via};
use crate::durable;
use crate::guard::renew_cmd;
use crate::guard::Guard;
use crate::link::{Link, RESENDS};
use crate::loss::{LeaseLost, Loss, Term};
use crate::owner::{is_notowner, thread_owner};
use crate::request::{Acquire, Mode};
use crate::session::{self, Outcome};
use crate::stale;
use crate::times::{millis, wait_ms, WAIT_MARGIN};

/// What every kind of lock keeps: the key, the lease of its grants, the
/// owner it acquires as, where a new connection (and the session) comes
/// from, and how it waits.
#[derive(Clone, Debug)]
pub(crate) struct Target {
    pub(crate) key: String,
    /// The lease of a grant without a session (which a watchdog renews),
    /// and of a renewal.
    pub(crate) lease: Duration,
    /// Set by `lease`: every grant, a session's too, has this lease of its
    /// own and is never renewed.
    pub(crate) fixed: Option<Duration>,
    /// Set by `session_timeout`: the timeout of the session waits go through.
    pub(crate) session_timeout: Option<Duration>,
    pub(crate) owner: Option<String>,
    pub(crate) client: Option<Client>,
    /// Set by `acquire_in`: the session and node come from there.
    pub(crate) via: Option<Via>,
    pub(crate) blocking: bool,
    pub(crate) cancel: Option<CancelToken>,
    /// Set by `durable`: (replicas, timeout) each grant waits for.
    pub(crate) durable: Option<(usize, Duration)>,
    /// Set by `lock_delay`: each grant's `LOCKDELAY`.
    pub(crate) lock_delay: Option<Duration>,
}

/// What sending a session wait came to.
enum Queued {
    /// A try that found the lock busy.
    Busy,
    Granted(u64, Arc<session::Server>, Arc<Loss>),
    /// Queued on `server`: the outcome comes on the receiver.
    Waiting(Arc<session::Server>, Arc<Loss>, Sender<Outcome>, Receiver<Outcome>),
}

impl Target {
    pub(crate) fn new(key: impl Into<String>, lease: Duration) -> Target {
        Target {
            key: key.into(),
            lease,
            fixed: None,
            session_timeout: None,
            owner: None,
            client: None,
            via: None,
            blocking: false,
            cancel: None,
            durable: None,
            lock_delay: None,
        }
    }

    pub(crate) fn owner(&self) -> String {
        self.owner.clone().unwrap_or_else(thread_owner)
    }

    /// `FLOCK.ACQUIRE` in `mode`; see [`Lock::acquire`](crate::Lock::acquire) for
    /// `wait`. A durable lock confirms each grant (see
    /// [`Lock::durable`](crate::Lock::durable)).
    pub(crate) fn acquire<C: ConnectionLike>(
        &self,
        conn: C,
        wait: Option<Duration>,
        mode: Mode,
    ) -> RedisResult<Option<Guard<C>>> {
        // Counted from before the send: a release of the same owner's last
        // other hold meanwhile must not take this one's for stale.
        let owner = self.owner();
        stale::hold(&self.key, &owner);
        let granted = self.grant(conn, wait, mode);
        if !matches!(granted, Ok(Some(_))) {
            stale::unhold(&self.key, &owner);
        }
        let mut guard = granted.inspect_err(|e| {
            // Every reply lost: the server may have granted it, a hold the
            // owner does not know of, which its next grant reenters.
            if e.is_io_error() {
                stale::remember(&self.key, &owner, None);
            }
        })?;
        if let Some(guard) = &mut guard {
            guard.reclaim();
        }
        match (guard, self.durable) {
            (Some(guard), Some((replicas, timeout))) => {
                durable::confirm(self.via(), guard, replicas, timeout).map(Some)
            }
            (guard, _) => Ok(guard),
        }
    }

    /// Where the key's node is reached apart from the connection given to
    /// acquire: the route, or the client's server; `None` for a bare
    /// connection.
    fn via(&self) -> Option<Via> {
        self.via.clone().or_else(|| self.client.as_ref().map(|c| Via::Server(session::server(c))))
    }

    /// The session server of `via` for `key`, with this lock's session timeout.
    fn server(&self, via: &Via, key: &str) -> RedisResult<Arc<session::Server>> {
        Ok(via.server(key)?.with_timeout(self.session_timeout))
    }

    /// The grant itself: `FLOCK.ACQUIRE` in `mode`.
    fn grant<C: ConnectionLike>(&self, conn: C, wait: Option<Duration>, mode: Mode) -> RedisResult<Option<Guard<C>>> {
        if self.cancel.as_ref().is_some_and(CancelToken::is_cancelled) {
            return Err(cancelled());
        }
        let via = self.via().filter(|_| !self.blocking);
        let renew_ms = millis(self.fixed.unwrap_or(self.lease));
        let acquire = Acquire {
            key: self.key.clone(),
            owner: self.owner(),
            // Through a session, a session grant unless the lease is fixed.
            lease_ms: match (&via, self.fixed) {
                (Some(_), None) => 0,
                _ => renew_ms,
            },
            renew_ms,
            mode,
            rid: uuid::Uuid::new_v4().to_string(),
            wait_ms: wait_ms(wait),
            // Rounded up, but 0 stays 0: none.
            lock_delay_ms: self.lock_delay.map(|d| if d.is_zero() { 0 } else { millis(d) }),
            started: Instant::now(),
        };
        let mut link = Link { conn, client: self.client.clone(), spare: None };
        match via {
            Some(via) => self.acquire_in_session(link, acquire, via),
            None => {
                let sent = Instant::now();
                let Some(token) = link.send::<Option<u64>>(&acquire.cmd(None))? else {
                    return match &self.cancel {
                        Some(cancel) if cancel.is_cancelled() => Err(cancelled()),
                        _ => Ok(None),
                    };
                };
                let loss = Arc::new(Loss::default());
                loss.granted(acquire.lease_ms, Term::of(acquire.lease_ms, sent, None, None));
                Self::confirm_after_wait(&mut link, &acquire, &loss, sent);
                Ok(Some(Guard::new(link, acquire, token, loss, None)))
            }
        }
    }

    /// A blocking wait's grant came at some time between the send and the
    /// reply, so its deadline counts from the send. After a wait of more
    /// than a third of the lease one `FLOCK.RENEW` (its send time) gives it
    /// back most of its lease: a contended grant's extra round trip.
    fn confirm_after_wait<C: ConnectionLike>(link: &mut Link<C>, acquire: &Acquire, loss: &Loss, sent: Instant) {
        let lease = Duration::from_millis(acquire.lease_ms);
        if acquire.wait_ms.is_none() || sent.elapsed() < lease / 3 {
            return;
        }
        let renewed_at = Instant::now();
        match link.query::<u64>(&renew_cmd(&acquire.key, &acquire.owner, acquire.lease_ms)) {
            Ok(_) => loss.renewed(renewed_at),
            Err(e) if is_notowner(&e) => {
                loss.mark(LeaseLost::NotOwner);
            }
            // Its deadline stands, counted from the acquire.
            Err(_) => {}
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
                Some(server) => server.with_timeout(self.session_timeout),
                None => self.server(via, &acquire.key)?,
            };
            let session = server.session()?;
            let sid = session.sid.as_str();
            // Registered before it is sent: the event can beat the reply.
            let registered = waits && server.register(acquire, sid, tx.clone(), &loss);
            let sent = Instant::now();
            let reply = match via {
                // The node importing the key's slot, which an ASK named.
                Via::Cluster(_) if asking => server.with_conn(|c| {
                    cluster::asking(c)?;
                    acquire.cmd(Some(sid)).query::<Value>(c)
                }),
                // To that node itself: a redirection followed elsewhere
                // would name a session the other node does not know.
                Via::Cluster(_) => server.command::<Value>(&acquire.cmd(Some(sid))),
                // A link that cannot reach the server any more hands over
                // to the session's own connection, which reconnects.
                Via::Server(_) => match link.send::<Value>(&acquire.cmd(Some(sid))) {
                    Err(e) if e.is_io_error() => server.command::<Value>(&acquire.cmd(Some(sid))),
                    reply => reply,
                },
            };
            // Every resend's reply was lost: the wait may be queued, and the
            // session's reader, whose connection breaks too, resends it (same
            // request ID) until it is answered or its time is over.
            let unreachable =
                registered && matches!(via, Via::Server(_)) && matches!(&reply, Err(e) if e.is_io_error());
            if registered && !unreachable && !matches!(&reply, Ok(Value::SimpleString(s)) if s == "WAITING") {
                let granted = match &reply {
                    Ok(Value::Int(token)) => Some(*token as u64),
                    _ => None,
                };
                server.unregister(&acquire.key, &acquire.owner, granted);
            }
            match reply {
                Ok(Value::SimpleString(s)) if s == "WAITING" && registered => {
                    return Ok(Queued::Waiting(server, loss, tx, rx))
                }
                Err(_) if unreachable => return Ok(Queued::Waiting(server, loss, tx, rx)),
                Ok(Value::Nil) => return Ok(Queued::Busy),
                Ok(Value::Int(token)) => {
                    let token = token as u64;
                    server.watch(acquire, token, &loss, sent, &session);
                    return Ok(Queued::Granted(token, server, loss));
                }
                Err(e) if e.code() == Some("NOSESSION") && nosession < RESENDS => {
                    server.forget(&session);
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
                server.unregister(&acquire.key, &acquire.owner, None);
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
            Some(Outcome::Granted(grant)) => {
                let guard = Guard::new(link, acquire, grant.token, loss, Some(server));
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
