//! Durable grants ([`Lock::durable`](crate::Lock::durable)): a grant counts
//! once the replicas named have it, or is given back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::{Cmd, ConnectionLike, FromRedisValue, RedisError, RedisResult, Value};

use crate::cluster::{self, Via};
use crate::guard::{renew_cmd, Guard};
use crate::link::RESENDS;
use crate::owner::is_notowner;
use crate::request::Acquire;
use crate::session;
use crate::stale;
use crate::times::{millis, WAIT_MARGIN};

/// The write on the checking connection that follows the grant in the
/// replication stream, so that `WAIT` counts it.
enum Touch {
    /// `FLOCK.RENEW key owner lease-ms`: a grant with a lease of its own,
    /// and its token.
    Renew(u64, u64),
    /// A session grant, which a RENEW would give a lease: a reentrant
    /// `FLOCK.ACQUIRE key owner 0 ... INBOX session-id` (the same token if
    /// the grant is still there) and a `FLOCK.RELEASE` of that extra hold.
    Reenter(Acquire, String, u64),
}

impl Touch {
    fn cmds(&self, key: &str, owner: &str) -> Vec<Cmd> {
        let id = || uuid::Uuid::new_v4().to_string();
        match self {
            Touch::Renew(lease_ms, _) => vec![renew_cmd(key, owner, *lease_ms).arg("ID").arg(id()).clone()],
            Touch::Reenter(acquire, sid, _) => {
                let mut acquire = acquire.clone();
                acquire.rid = id();
                vec![
                    acquire.cmd(Some(sid)),
                    redis::cmd("FLOCK.RELEASE").arg(key).arg(owner).arg("ID").arg(id()).clone(),
                ]
            }
        }
    }

    /// Whether the first reply says the grant is still there: `Ok(None)`
    /// yes, `Ok(Some(why))` no (`NOTOWNER`, or a token not the grant's: another
    /// grant of this owner, an older one a failover's promoted replica kept),
    /// an error otherwise.
    fn gone(&self, reply: Value) -> RedisResult<Option<String>> {
        let reply = match reply {
            Value::ServerError(e) => Err(RedisError::from(e)),
            other => Ok(other),
        };
        match (self, reply) {
            (_, Err(e)) if is_notowner(&e) => Ok(Some(e.detail().unwrap_or_default().to_string())),
            (_, Err(e)) => Err(e),
            (Touch::Renew(_, token) | Touch::Reenter(_, _, token), Ok(Value::Int(t))) if t as u64 == *token => Ok(None),
            (Touch::Renew(_, token), Ok(t)) => Ok(Some(format!(
                "the grant (token {token}) was gone, the server holds another grant of this owner (token {})",
                i64::from_redis_value(&t)?
            ))),
            (Touch::Reenter(..), Ok(_)) => Ok(Some("the session grant ended".into())),
        }
    }
}

/// Durable grants: `FLOCK.RENEW key owner lease-ms ID <uuid>` and `WAIT
/// replicas timeout-ms` in one round trip on one connection to the key's
/// node (through `via`, the lock's route or its client's server: a
/// connection of its own from the process's pool for that node; `None`, no
/// client or route: the connection given to acquire). The RENEW is this connection's write, after the grant in the
/// replication stream, so the WAIT's count covers the grant even when
/// the grant was another connection's write (pushed to the session,
/// handed over by a release). Fewer than `replicas`, or the grant gone
/// (`NOTOWNER`, or another grant's token): the hold is given back (one
/// hold: a reentry keeps the ones before) and the acquire fails with
/// `NOTDURABLE`. Any other error (the node could
/// not be reached after [`RESENDS`] tries, each a fresh RENEW) also
/// gives the hold back, and is returned as it is.
pub(crate) fn confirm<C: ConnectionLike>(
    via: Option<Via>,
    mut guard: Guard<C>,
    replicas: usize,
    timeout: Duration,
) -> RedisResult<Guard<C>> {
    let (key, owner, lease_ms) = (guard.key.clone(), guard.owner.clone(), guard.lease_ms);
    let timeout_ms = millis(timeout);
    let touch = match (lease_ms, &guard.session) {
        (0, Some(server)) => match server.session() {
            Ok(session) => Touch::Reenter(
                Acquire {
                    key: key.clone(),
                    owner: owner.clone(),
                    lease_ms: 0,
                    renew_ms: 0,
                    mode: guard.mode(),
                    rid: String::new(),
                    wait_ms: None,
                    lock_delay_ms: None,
                    started: Instant::now(),
                },
                session.sid.clone(),
                guard.token(),
            ),
            Err(e) => {
                let _ = guard.release_once();
                return Err(e);
            }
        },
        _ => Touch::Renew(lease_ms, guard.token()),
    };
    let touch = &touch;
    let checked = match via {
        Some(via) => durable_via(&via, &key, &owner, touch, replicas, timeout_ms),
        None => {
            let mut tries = 0;
            loop {
                let result = guard
                    .link
                    .current()
                    .and_then(|c| durable_on(c, &key, &owner, touch, replicas, timeout_ms))
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

/// The durable check (see `confirm`) on the key's node of `via`:
/// again (a fresh RENEW each time) after an I/O error or `READONLY` (the
/// server was demoted: a sentinel's master is asked for again) and, on a
/// cluster, on the node a `MOVED` or `ASK` names.
fn durable_via(
    via: &Via,
    key: &str,
    owner: &str,
    touch: &Touch,
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
                Ok((durable_on(conn, key, owner, touch, replicas, timeout_ms)?, Some(addr.to_string())))
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

/// The touch (`FLOCK.RENEW key owner lease-ms ID <uuid>`, or a session
/// grant's reentry and release) then `WAIT replicas timeout-ms`, in one
/// round trip on `conn`.
fn durable_on(
    conn: &mut dyn ConnectionLike,
    key: &str,
    owner: &str,
    touch: &Touch,
    replicas: usize,
    timeout_ms: u64,
) -> RedisResult<Durable> {
    let mut pipe = redis::pipe();
    let cmds = touch.cmds(key, owner);
    let n = cmds.len();
    for cmd in cmds {
        pipe.add_command(cmd);
    }
    pipe.cmd("WAIT").arg(replicas).arg(timeout_ms);
    let mut replies = conn.req_packed_commands(&pipe.get_packed_pipeline(), 0, n + 1)?;
    if replies.len() != n + 1 {
        return Err(RedisError::from((
            redis::ErrorKind::TypeError,
            "unexpected replies to the durable check",
            format!("{replies:?}"),
        )));
    }
    let acked = replies.pop().expect("n + 1 replies");
    if let (Touch::Reenter(_, _, token), Some(Value::ServerError(e))) = (touch, replies.get(1)) {
        // The extra hold's release was refused: it stays, to be given
        // back with the owner's next grant of this token.
        if e.code() != "NOTOWNER" {
            stale::remember(key, owner, Some(*token));
        }
    }
    let first = replies.swap_remove(0);
    match touch.gone(first)? {
        Some(why) => Ok(Durable::NotOwner(why, i64::from_redis_value(&acked).unwrap_or(0))),
        None => match acked {
            Value::ServerError(e) => Err(RedisError::from(e)),
            acked => Ok(Durable::Acked(i64::from_redis_value(&acked)?)),
        },
    }
}
