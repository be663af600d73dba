//! Watchdogs: one scheduler thread per server for the whole process (per
//! cluster, one renewing over its nodes' shared connections, following the
//! keys), however many guards it keeps alive. Each guard's lease is renewed
//! every third of it; the renewals due together go out in one pipeline on
//! a connection of their own, each batch on its own thread, so that a slow
//! renewal never holds up another lock's. A batch gives up at the earliest
//! deadline it serves. A confirmed renewal moves its grant's deadline (the
//! send time + the lease − the drift margin); `NOTOWNER` marks the guard
//! lost, and a deadline that passes unconfirmed is the timer's to mark
//! (`Unconfirmed`).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use redis::{Cmd, ConnectionLike, RedisError, RedisResult, Value};

use crate::cluster::{self, Via};
use crate::link::RESENDS;
use crate::loss::{LeaseLost, Loss};
use crate::mutex::lock;
use crate::owner::is_notowner;
use crate::session::Kept;
use crate::times::WATCHDOG_RENEW_FRACTION;

struct Entry {
    /// The lock's key, which routes a cluster renewal.
    key: String,
    cmd: Cmd,
    period: Duration,
    loss: Arc<Loss>,
    due: Instant,
}

#[derive(Default)]
struct Schedule {
    next_id: u64,
    entries: HashMap<u64, Entry>,
    /// The renewals being sent (outside the lock).
    in_flight: HashSet<u64>,
}

/// One server's renewals (or one cluster's).
pub(crate) struct Renewer {
    via: Via,
    schedule: Mutex<Schedule>,
    changed: Condvar,
    /// Idle connections of the batches (one server's).
    conns: Mutex<Vec<Kept>>,
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
    let renewer = Arc::new(Renewer {
        via: via.clone(),
        schedule: Mutex::default(),
        changed: Condvar::new(),
        conns: Mutex::default(),
    });
    let thread = Arc::clone(&renewer);
    std::thread::Builder::new().name("flock-watchdog".into()).spawn(move || thread.run())?;
    renewers.insert(key, Arc::clone(&renewer));
    Ok(renewer)
}

/// A renewal due within this part of its period goes with a batch due now.
const EARLY_FRACTION: u32 = 8;

/// One renewal of a batch: its entry, key and command.
type Due = (u64, String, Cmd);

impl Renewer {
    /// Renews `cmd` every third of `lease` until [`Renewer::stop`] or a loss.
    pub(crate) fn start(&self, key: &str, cmd: Cmd, lease: Duration, loss: Arc<Loss>) -> u64 {
        let period = (lease / WATCHDOG_RENEW_FRACTION).max(Duration::from_millis(1));
        let mut schedule = lock(&self.schedule);
        let id = schedule.next_id;
        schedule.next_id += 1;
        schedule.entries.insert(id, Entry { key: key.to_string(), cmd, period, loss, due: Instant::now() + period });
        self.changed.notify_all();
        id
    }

    /// Stops renewal `id`; once this returns, none of it is in flight.
    pub(crate) fn stop(&self, id: u64) {
        let mut schedule = lock(&self.schedule);
        schedule.entries.remove(&id);
        while schedule.in_flight.contains(&id) {
            schedule = self.changed.wait(schedule).unwrap_or_else(|e| e.into_inner());
        }
        self.changed.notify_all();
    }

    fn run(self: Arc<Self>) {
        let mut schedule = lock(&self.schedule);
        loop {
            schedule.entries.retain(|_, e| !e.loss.is_lost());
            let now = Instant::now();
            let next =
                schedule.entries.iter().filter(|(id, _)| !schedule.in_flight.contains(id)).map(|(_, e)| e.due).min();
            let Some(due) = next else {
                schedule = self.changed.wait(schedule).unwrap_or_else(|e| e.into_inner());
                continue;
            };
            if due > now {
                schedule = self.changed.wait_timeout(schedule, due - now).unwrap_or_else(|e| e.into_inner()).0;
                continue;
            }
            // Every renewal due by now goes in this batch, which gives up at
            // the earliest deadline among them; so does one due within a
            // small part of its period, a little early: guards whose
            // watchdogs started together then share one pipeline (and one
            // connection) from their first renewal on, where each would
            // otherwise come due while the one before is in flight and take
            // a connection of its own.
            let mut batch: Vec<Due> = Vec::new();
            let mut deadline: Option<Instant> = None;
            let ids: Vec<u64> = schedule
                .entries
                .iter()
                .filter(|(id, e)| e.due <= now + e.period / EARLY_FRACTION && !schedule.in_flight.contains(id))
                .map(|(id, _)| *id)
                .collect();
            for id in ids {
                let entry = schedule.entries.get_mut(&id).expect("listed");
                entry.due = now + entry.period;
                if let Some(at) = entry.loss.deadline() {
                    deadline = Some(deadline.map_or(at, |d| d.min(at)));
                }
                batch.push((id, entry.key.clone(), entry.cmd.clone()));
                schedule.in_flight.insert(id);
            }
            drop(schedule);
            let renewer = Arc::clone(&self);
            let spawned = std::thread::Builder::new().name("flock-renewal".into()).spawn({
                let batch = batch.clone();
                move || renewer.send(batch, deadline)
            });
            schedule = lock(&self.schedule);
            if spawned.is_err() {
                // No thread to send them: they are due again at their period.
                for (id, _, _) in &batch {
                    schedule.in_flight.remove(id);
                }
            }
        }
    }

    /// Sends one batch of renewals and takes in their replies.
    fn send(&self, batch: Vec<Due>, deadline: Option<Instant>) {
        let sent = Instant::now();
        let results = self.renew(&batch, deadline);
        let mut schedule = lock(&self.schedule);
        for ((id, _, _), result) in batch.iter().zip(results) {
            schedule.in_flight.remove(id);
            let Some(entry) = schedule.entries.get(id) else { continue };
            match result {
                Ok(_) => entry.loss.renewed(sent),
                Err(e) if is_notowner(&e) => {
                    entry.loss.mark(LeaseLost::NotOwner);
                    schedule.entries.remove(id);
                }
                // The deadline is the timer's to watch.
                Err(_) => {}
            }
        }
        self.changed.notify_all();
    }

    /// The batch's `FLOCK.RENEW`s, each with a fresh request ID, resent
    /// with the same IDs while their replies are lost and time is left.
    fn renew(&self, batch: &[Due], deadline: Option<Instant>) -> Vec<RedisResult<Value>> {
        let cmds: Vec<Cmd> = batch
            .iter()
            .map(|(_, _, cmd)| {
                let mut cmd = cmd.clone();
                cmd.arg("ID").arg(uuid::Uuid::new_v4().to_string());
                cmd
            })
            .collect();
        match &self.via {
            Via::Server(server) => {
                let mut resends = 0;
                loop {
                    let timeout = match deadline {
                        Some(at) => at.saturating_duration_since(Instant::now()),
                        None => server.command_timeout(),
                    };
                    let result = if timeout.is_zero() {
                        Err(RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut)))
                    } else {
                        self.pipeline(server, &cmds, timeout)
                    };
                    match result {
                        Err(e) if e.is_io_error() && resends < RESENDS && !timeout.is_zero() => resends += 1,
                        Ok(replies) => return replies,
                        Err(e) => return batch.iter().map(|_| Err(copy(&e))).collect(),
                    }
                }
            }
            // Over the nodes' shared connections, which follow the key.
            Via::Cluster(c) => batch
                .iter()
                .zip(&cmds)
                .map(|((_, key, _), cmd)| {
                    let mut resends = 0;
                    loop {
                        match cluster::query(c, key, cmd) {
                            Err(e) if e.is_io_error() && resends < RESENDS => resends += 1,
                            result => return result,
                        }
                    }
                })
                .collect(),
        }
    }

    /// The renewals in one pipeline on a connection of the renewer's (an
    /// idle one, or a new one), each step giving up after `timeout`; a
    /// connection that failed, or reached a demoted master, is not kept.
    fn pipeline(
        &self,
        server: &crate::session::Server,
        cmds: &[Cmd],
        timeout: Duration,
    ) -> RedisResult<Vec<RedisResult<Value>>> {
        let idle = lock(&self.conns).pop().filter(|(epoch, conn)| server.usable(*epoch, conn));
        let (epoch, mut conn) = match idle {
            Some(kept) => kept,
            None => server.connect(Some(timeout))?,
        };
        conn.set_read_timeout(Some(timeout))?;
        conn.set_write_timeout(Some(timeout))?;
        let mut pipe = redis::pipe();
        for cmd in cmds {
            pipe.add_command(cmd.clone());
        }
        let replies = conn.req_packed_commands(&pipe.get_packed_pipeline(), 0, cmds.len())?;
        let results: Vec<RedisResult<Value>> = replies
            .into_iter()
            .map(|v| match v {
                Value::ServerError(e) => Err(RedisError::from(e)),
                v => Ok(v),
            })
            .collect();
        let demoted = results.iter().any(|r| matches!(r, Err(e) if e.kind() == redis::ErrorKind::ReadOnly));
        if !demoted {
            lock(&self.conns).push((epoch, conn));
        }
        Ok(results)
    }
}

/// The same error again, for each renewal of a batch that failed whole.
fn copy(e: &RedisError) -> RedisError {
    if e.is_io_error() {
        RedisError::from(std::io::Error::other(e.to_string()))
    } else {
        redis::make_extension_error(e.code().unwrap_or("ERR").to_string(), Some(e.to_string()))
    }
}
