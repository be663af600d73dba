//! `flock-session`: FLOCK as its clients use it, every client thread of the
//! benchmark process waiting through one session per server. A wait is one
//! `FLOCK.ACQUIRE ... WAIT 0 INBOX session-id` on the client's connection,
//! answered `WAITING`; the grant arrives on the session's connection, whose
//! reader thread hands it to the waiting thread. Release is FLOCK.RELEASE.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use redis::{Pipeline, RedisResult, Value};

use super::flock::{acquire_cmd, wait_cmd};
use super::Method;
use crate::client::Client;
use crate::server::Server;
use crate::stop::Stop;

/// One server's session: its ID, and the waits its reader answers.
struct Session {
    id: String,
    /// Its reader still reads (the server is there).
    alive: AtomicBool,
    /// owner -> the waiting thread (true: granted).
    waits: Mutex<HashMap<String, Sender<bool>>>,
}

/// The benchmark process's sessions, by server port; a server that is gone
/// leaves a session whose reader has stopped, replaced on next use (the
/// scenarios that start servers of their own may reuse a port).
fn sessions() -> &'static Mutex<HashMap<u16, Arc<Session>>> {
    static SESSIONS: OnceLock<Mutex<HashMap<u16, Arc<Session>>>> = OnceLock::new();
    SESSIONS.get_or_init(Default::default)
}

impl Session {
    fn of(server: &Server) -> RedisResult<Arc<Session>> {
        let mut all = sessions().lock().expect("sessions");
        if let Some(session) = all.get(&server.port).filter(|s| s.alive.load(Ordering::Acquire)) {
            return Ok(session.clone());
        }
        let mut conn = server.connect()?;
        let id: String = redis::cmd("FLOCK.SESSION").query(&mut conn)?;
        let session = Arc::new(Session { id, alive: AtomicBool::new(true), waits: Mutex::new(HashMap::new()) });
        let reader = session.clone();
        std::thread::spawn(move || {
            while let Ok(events) =
                redis::cmd("FLOCK.INBOX").arg(0).query::<Vec<(String, String, String, i64, String)>>(&mut conn)
            {
                let mut waits = reader.waits.lock().expect("waits");
                for (kind, _, owner, _, _) in events.into_iter().filter(|e| e.0 != "lost") {
                    if let Some(waiting) = waits.remove(&owner) {
                        let _ = waiting.send(kind == "granted");
                    }
                }
            }
            // The server is gone: nothing will be granted.
            reader.alive.store(false, Ordering::Release);
            reader.waits.lock().expect("waits").clear();
        });
        all.insert(server.port, session.clone());
        Ok(session)
    }
}

pub struct FlockSession {
    session: Arc<Session>,
}

impl FlockSession {
    pub fn new(server: &Server) -> RedisResult<FlockSession> {
        Ok(FlockSession { session: Session::of(server)? })
    }
}

impl Method for FlockSession {
    /// Waits for the reader to hand over the grant; at the end of the run
    /// the wait is cancelled (FLOCK.CANCEL) and its event still decides.
    fn acquire(&mut self, c: &mut Client, key: &str, owner: &str, lease_ms: u64, stop: &Stop) -> RedisResult<bool> {
        let (tx, rx) = mpsc::channel();
        // Before sending: the grant can come before the reply.
        self.session.waits.lock().expect("waits").insert(owner.to_string(), tx);
        let reply = c.request(wait_cmd(key, owner, lease_ms).arg("INBOX").arg(&self.session.id));
        if !matches!(reply, Ok(Value::SimpleString(ref s)) if s == "WAITING") {
            self.session.waits.lock().expect("waits").remove(owner);
            return reply.map(|v| v != Value::Nil);
        }
        let mut cancelled = false;
        loop {
            match rx.recv_timeout(Duration::from_millis(5)) {
                Ok(granted) => return Ok(granted),
                Err(RecvTimeoutError::Timeout) if stop.is_set() && !cancelled => {
                    c.request(redis::cmd("FLOCK.CANCEL").arg(key).arg(owner))?;
                    cancelled = true;
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return Ok(false),
            }
        }
    }

    fn release(&mut self, c: &mut Client, key: &str, owner: &str) -> RedisResult<()> {
        c.request(redis::cmd("FLOCK.RELEASE").arg(key).arg(owner)).map(drop)
    }

    fn take_free(&self, pipe: &mut Pipeline, key: &str, owner: &str, lease_ms: u64) {
        pipe.add_command(acquire_cmd(key, owner, lease_ms));
    }

    fn park(&mut self, c: &mut Client, key: &str, owner: &str, lease_ms: u64) -> RedisResult<()> {
        c.send(wait_cmd(key, owner, lease_ms).arg("INBOX").arg(&self.session.id))
    }
}
