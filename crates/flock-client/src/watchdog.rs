//! Watchdogs: one renewal thread and one connection per server for the
//! whole process, however many guards it keeps alive (per cluster, one
//! thread renewing over its nodes' shared connections, following the keys). Each guard's lease is
//! renewed every third of it; a `NOTOWNER` or a whole lease without a
//! confirmed renewal marks the guard lost.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use redis::{Cmd, Connection, ConnectionLike, RedisResult};

use crate::cluster::{self, Via};
use crate::link::RESENDS;
use crate::loss::{LeaseLost, Loss};
use crate::mutex::lock;
use crate::owner::is_notowner;
use crate::session::Server;

struct Entry {
    /// The lock's key, which routes a cluster renewal.
    key: String,
    cmd: Cmd,
    period: Duration,
    lease: Duration,
    /// Each step of a renewal gives up after this, so that a hung server
    /// is noticed within a lease.
    io_timeout: Duration,
    loss: Arc<Loss>,
    confirmed: Instant,
    due: Instant,
}

#[derive(Default)]
struct Schedule {
    next_id: u64,
    entries: HashMap<u64, Entry>,
    /// The renewal being sent (outside the lock).
    in_flight: Option<u64>,
}

/// One server's renewals (or one cluster's).
pub(crate) struct Renewer {
    via: Via,
    schedule: Mutex<Schedule>,
    changed: Condvar,
}

/// The process's renewer for a server (or cluster), its thread started once.
pub(crate) fn renewer(via: &Via) -> RedisResult<Arc<Renewer>> {
    static RENEWERS: OnceLock<Mutex<HashMap<String, Arc<Renewer>>>> = OnceLock::new();
    let key = match via {
        Via::Server(server) => server.name().to_string(),
        Via::Cluster(cluster) => format!("cluster {}", cluster.id()),
    };
    let mut renewers = lock(RENEWERS.get_or_init(Default::default));
    if let Some(renewer) = renewers.get(&key) {
        return Ok(Arc::clone(renewer));
    }
    let renewer = Arc::new(Renewer { via: via.clone(), schedule: Mutex::default(), changed: Condvar::new() });
    let thread = Arc::clone(&renewer);
    std::thread::Builder::new().name("flock-watchdog".into()).spawn(move || thread.run())?;
    renewers.insert(key, Arc::clone(&renewer));
    Ok(renewer)
}

impl Renewer {
    /// Renews `cmd` every third of `lease` until [`Renewer::stop`] or a loss.
    pub(crate) fn start(&self, key: &str, cmd: Cmd, lease: Duration, loss: Arc<Loss>) -> u64 {
        let period = (lease / 3).max(Duration::from_millis(1));
        let now = Instant::now();
        let mut schedule = lock(&self.schedule);
        let id = schedule.next_id;
        schedule.next_id += 1;
        // Short enough that a hung server does not hold up the renewals of
        // the other guards for long (one thread renews them all).
        let io_timeout = period.clamp(Duration::from_millis(50), Duration::from_secs(2));
        schedule.entries.insert(
            id,
            Entry { key: key.to_string(), cmd, period, lease, io_timeout, loss, confirmed: now, due: now + period },
        );
        self.changed.notify_all();
        id
    }

    /// Stops renewal `id`; once this returns, none of it is in flight.
    pub(crate) fn stop(&self, id: u64) {
        let mut schedule = lock(&self.schedule);
        schedule.entries.remove(&id);
        while schedule.in_flight == Some(id) {
            schedule = self.changed.wait(schedule).unwrap_or_else(|e| e.into_inner());
        }
        self.changed.notify_all();
    }

    fn run(&self) {
        let mut conn: Option<Connection> = None;
        let mut schedule = lock(&self.schedule);
        loop {
            schedule.entries.retain(|_, e| !e.loss.is_lost());
            let next = schedule.entries.iter().min_by_key(|(_, e)| e.due).map(|(id, e)| (*id, e.due));
            let Some((id, due)) = next else {
                schedule = self.changed.wait(schedule).unwrap_or_else(|e| e.into_inner());
                continue;
            };
            let now = Instant::now();
            if due > now {
                schedule = self.changed.wait_timeout(schedule, due - now).unwrap_or_else(|e| e.into_inner()).0;
                continue;
            }
            let entry = &schedule.entries[&id];
            let (key, cmd, io_timeout) = (entry.key.clone(), entry.cmd.clone(), entry.io_timeout);
            schedule.in_flight = Some(id);
            drop(schedule);

            let sent = Instant::now();
            let result = self.renew(&mut conn, &key, cmd, io_timeout);

            schedule = lock(&self.schedule);
            schedule.in_flight = None;
            self.changed.notify_all();
            let Some(entry) = schedule.entries.get_mut(&id) else { continue };
            let reason = match result {
                Ok(_) => {
                    entry.confirmed = sent;
                    None
                }
                Err(e) if is_notowner(&e) => Some(LeaseLost::NotOwner),
                Err(_) if entry.confirmed.elapsed() >= entry.lease => Some(LeaseLost::Unconfirmed),
                Err(_) => None,
            };
            entry.due = sent + entry.period;
            if let Some(reason) = reason {
                entry.loss.mark(reason);
                schedule.entries.remove(&id);
            }
        }
    }

    /// One `FLOCK.RENEW` with a fresh request ID, resent with the same ID
    /// while its reply is lost; a connection that failed is not used again.
    fn renew(&self, conn: &mut Option<Connection>, key: &str, mut cmd: Cmd, io_timeout: Duration) -> RedisResult<u64> {
        cmd.arg("ID").arg(uuid::Uuid::new_v4().to_string());
        let mut resends = 0;
        loop {
            let result = match &self.via {
                Via::Server(server) => once(server, conn, &cmd, io_timeout),
                // Over the nodes' shared connections, which follow the key.
                Via::Cluster(c) => cluster::query(c, key, &cmd).and_then(|v| redis::from_redis_value(&v)),
            };
            match result {
                Err(e) if e.is_io_error() && resends < RESENDS => resends += 1,
                result => return result,
            }
        }
    }
}

/// One renewal on the renewer's own connection to `server`; a connection
/// that failed, or reached a demoted master, is not used again.
fn once(server: &Server, slot: &mut Option<Connection>, cmd: &Cmd, io_timeout: Duration) -> RedisResult<u64> {
    let mut conn = match slot.take().filter(ConnectionLike::is_open) {
        Some(conn) => conn,
        None => server.connect(Some(io_timeout))?,
    };
    conn.set_read_timeout(Some(io_timeout))?;
    conn.set_write_timeout(Some(io_timeout))?;
    let result = cmd.query(&mut conn);
    if !matches!(&result, Err(e) if e.is_io_error() || e.kind() == redis::ErrorKind::ReadOnly) {
        *slot = Some(conn);
    }
    result
}
