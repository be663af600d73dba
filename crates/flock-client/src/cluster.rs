//! Redis Cluster: the slot map, a [`Cluster`] handle that resolves a key's
//! node, and [`Routed`], the connection a lock's commands go over when it
//! was acquired through a cluster or a sentinel master.
//!
//! The slot map is read with `CLUSTER SLOTS` and read again on `MOVED` (or
//! when a node cannot be reached). Each node is reached through the
//! process's session [`Server`] for its address: its shared command
//! connection and its session, so that a wait is sent on the same node
//! whose session it names.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::{
    Client, Cmd, ConnectionAddr, ConnectionInfo, ConnectionLike, ErrorKind, IntoConnectionInfo, RedisError,
    RedisResult, Value,
};

use crate::mutex::lock;
use crate::session::{self, Server};

/// How many `MOVED`/`ASK` redirections one command follows.
pub(crate) const REDIRECTS: usize = 16;
/// Before a command answered an `ASK` that names no node it can reach is
/// sent again: by then the move has usually ended in a `MOVED`.
pub(crate) const ASK_PAUSE: Duration = Duration::from_millis(100);
/// Between two sends of a cluster wait that its node's failover ended.
pub(crate) const FAILOVER_PAUSE: Duration = Duration::from_millis(100);
/// How long a wait without a time limit keeps being sent again after a
/// failover before the error stands.
pub(crate) const FAILOVER_WINDOW: Duration = Duration::from_secs(30);
/// Connect timeout while reading the slot map from a node.
const MAP_TIMEOUT: Duration = Duration::from_secs(2);

/// The cluster slot of `key`: CRC16 (XMODEM) of the key, or of its hash tag
/// (the part between the first `{` and the next `}`, if not empty), mod 16384.
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = match key.iter().position(|&b| b == b'{') {
        Some(open) => match key[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    };
    crc16::State::<crc16::XMODEM>::calculate(hashed) % 16384
}

/// A Redis Cluster as seen by this process: its seed nodes and slot map.
/// Clones share the map. Locks acquired with [`crate::Lock::acquire_in`]
/// wait through the session of their key's node and send every command to
/// that node, following `MOVED` (the map is read again) and `ASK` (sent
/// to the node it names after `ASKING`).
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<Inner>,
}

struct Inner {
    id: u64,
    seeds: Vec<ConnectionInfo>,
    /// (first slot, last slot, node address), sorted.
    slots: Mutex<Vec<(u16, u16, ConnectionAddr)>>,
}

impl Cluster {
    /// A cluster known by `seeds` (any of its nodes; the first one's user,
    /// password and database are used on every node). Reads the slot map.
    pub fn new<T: IntoConnectionInfo>(seeds: Vec<T>) -> RedisResult<Cluster> {
        static IDS: AtomicU64 = AtomicU64::new(0);
        let seeds = seeds.into_iter().map(IntoConnectionInfo::into_connection_info).collect::<RedisResult<Vec<_>>>()?;
        if seeds.is_empty() {
            return Err(RedisError::from((ErrorKind::InvalidClientConfig, "no seed node given")));
        }
        let cluster = Cluster {
            inner: Arc::new(Inner { id: IDS.fetch_add(1, Ordering::Relaxed), seeds, slots: Mutex::default() }),
        };
        cluster.refresh()?;
        Ok(cluster)
    }

    /// Reads the slot map again (`CLUSTER SLOTS`) from the first node that
    /// answers: the nodes of the current map, then the seeds.
    pub fn refresh(&self) -> RedisResult<()> {
        let known: Vec<ConnectionInfo> = {
            let slots = lock(&self.inner.slots);
            let mut addrs: Vec<&ConnectionAddr> = slots.iter().map(|(_, _, a)| a).collect();
            addrs.dedup();
            addrs.into_iter().map(|a| self.info(a.clone())).collect()
        };
        let mut last = None;
        for info in known.iter().chain(&self.inner.seeds) {
            match read_slots(info) {
                Ok(map) if !map.is_empty() => {
                    *lock(&self.inner.slots) = map;
                    return Ok(());
                }
                Ok(_) => {}
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| RedisError::from((ErrorKind::ClusterDown, "no node has a slot map"))))
    }

    /// The client of the master that serves `key`, as the map says.
    pub fn client_for(&self, key: &str) -> RedisResult<Client> {
        let slot = key_slot(key.as_bytes());
        let addr = {
            let slots = lock(&self.inner.slots);
            slots.iter().find(|(first, last, _)| (*first..=*last).contains(&slot)).map(|(_, _, a)| a.clone())
        };
        match addr {
            Some(addr) => Client::open(self.info(addr)),
            None => Err(RedisError::from((ErrorKind::ClusterDown, "no node serves the slot", slot.to_string()))),
        }
    }

    /// The process's session server of the node that serves `key`.
    pub(crate) fn server_for(&self, key: &str) -> RedisResult<Arc<Server>> {
        Ok(session::server(&self.client_for(key)?))
    }

    /// The process's session server of the node at `host`:`port` (one an
    /// `ASK` names), with the first seed's settings.
    pub(crate) fn server_at(&self, host: &str, port: u16) -> RedisResult<Arc<Server>> {
        let addr = match &self.inner.seeds[0].addr {
            ConnectionAddr::TcpTls { insecure, tls_params, .. } => ConnectionAddr::TcpTls {
                host: host.to_string(),
                port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => ConnectionAddr::Tcp(host.to_string(), port),
        };
        Ok(session::server(&Client::open(self.info(addr))?))
    }

    /// Told by a redirection `e` (or a failure to reach the node) that the
    /// map is stale: reads it again. False if `e` is not one of those.
    pub(crate) fn stale(&self, e: &RedisError) -> bool {
        let stale = e.kind() == ErrorKind::Moved || e.is_io_error() || e.kind() == ErrorKind::ClusterDown;
        if stale {
            // If no node answers, the next command finds that out again.
            let _ = self.refresh();
        }
        stale
    }

    /// Whether `key`, which `server` said it deleted under a waiter
    /// (`LOCKDELETED`), went to another node: `server` now redirects it.
    pub(crate) fn moved_away(&self, server: &Server, key: &str) -> bool {
        match server.command::<Value>(redis::cmd("EXISTS").arg(key)) {
            Err(e) if matches!(e.kind(), ErrorKind::Moved | ErrorKind::Ask) => {
                let _ = self.refresh();
                true
            }
            _ => false,
        }
    }

    pub(crate) fn id(&self) -> u64 {
        self.inner.id
    }

    /// The first seed's settings at `addr`.
    fn info(&self, addr: ConnectionAddr) -> ConnectionInfo {
        ConnectionInfo { addr, redis: self.inner.seeds[0].redis.clone() }
    }
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nodes = lock(&self.inner.slots).len();
        f.debug_struct("Cluster").field("seeds", &self.inner.seeds.len()).field("slot_ranges", &nodes).finish()
    }
}

/// `CLUSTER SLOTS` of the node at `info`, as (first, last, master address).
fn read_slots(info: &ConnectionInfo) -> RedisResult<Vec<(u16, u16, ConnectionAddr)>> {
    let mut conn = Client::open(info.clone())?.get_connection_with_timeout(MAP_TIMEOUT)?;
    conn.set_read_timeout(Some(MAP_TIMEOUT))?;
    let ranges: Vec<Value> = redis::cmd("CLUSTER").arg("SLOTS").query(&mut conn)?;
    let mut map = Vec::new();
    for range in ranges {
        let Value::Array(fields) = range else { continue };
        let (Some(first), Some(last), Some(Value::Array(master))) = (fields.first(), fields.get(1), fields.get(2))
        else {
            continue;
        };
        let (first, last): (u16, u16) = (redis::from_redis_value(first)?, redis::from_redis_value(last)?);
        let host: String = master.first().map(redis::from_redis_value).transpose()?.unwrap_or_default();
        let port: u16 = master.get(1).map(redis::from_redis_value).transpose()?.unwrap_or(0);
        // An empty or unknown host means "the node you asked".
        let host = match host.as_str() {
            "" | "?" => match &info.addr {
                ConnectionAddr::Tcp(h, _) | ConnectionAddr::TcpTls { host: h, .. } => h.clone(),
                ConnectionAddr::Unix(_) => continue,
            },
            _ => host,
        };
        let addr = match &info.addr {
            ConnectionAddr::TcpTls { insecure, tls_params, .. } => {
                ConnectionAddr::TcpTls { host, port, insecure: *insecure, tls_params: tls_params.clone() }
            }
            _ => ConnectionAddr::Tcp(host, port),
        };
        map.push((first, last, addr));
    }
    map.sort_by_key(|(first, _, _)| *first);
    Ok(map)
}

/// Where a lock acquired with `acquire_in` sends its commands.
#[derive(Clone)]
pub(crate) enum Via {
    /// One server, possibly found anew by a sentinel after a failover.
    Server(Arc<Server>),
    Cluster(Cluster),
}

impl Via {
    /// The session server for `key`.
    pub(crate) fn server(&self, key: &str) -> RedisResult<Arc<Server>> {
        match self {
            Via::Server(server) => Ok(Arc::clone(server)),
            Via::Cluster(cluster) => cluster.server_for(key),
        }
    }

    /// The node an `ASK` answer `e` names: its slot is being migrated
    /// there and the key is there already. The command goes there once,
    /// after `ASKING` on the same connection (the slot map stays as it is).
    pub(crate) fn asked(&self, e: &RedisError) -> Option<Arc<Server>> {
        match self {
            Via::Cluster(cluster) if e.kind() == ErrorKind::Ask => {
                // (address, slot): "host:port", an IPv6 host in brackets or not.
                let (addr, _) = e.redirect_node()?;
                let (host, port) = addr.rsplit_once(':')?;
                let host = host.trim_start_matches('[').trim_end_matches(']');
                cluster.server_at(host, port.parse().ok()?).ok()
            }
            _ => None,
        }
    }

    /// Whether a cluster wait that ended with `e` goes again, same request
    /// ID, to the key's master now: its node stopped being a master (a
    /// failover: `UNBLOCKED` from the node or from FLOCK, `READONLY`), or
    /// redirects the key (`MOVED`, also after the session reopened on a
    /// node that is a replica now), or could not be reached or serve it for
    /// a while (I/O, `CLUSTERDOWN`, `TRYAGAIN`). The slot map is read again.
    pub(crate) fn failed_over(&self, e: &RedisError) -> bool {
        let Via::Cluster(cluster) = self else { return false };
        let again = e.is_io_error()
            || matches!(e.kind(), ErrorKind::Moved | ErrorKind::Ask | ErrorKind::ClusterDown | ErrorKind::TryAgain)
            || matches!(e.code(), Some("UNBLOCKED" | "READONLY" | "MOVED" | "ASK" | "CLUSTERDOWN" | "TRYAGAIN"));
        if again {
            // If no node answers, the next try finds that out again.
            let _ = cluster.refresh();
        }
        again
    }

    /// Whether a command answered `e` goes again: a cluster redirected it
    /// (`MOVED`: the slot map is read again; an `ASK` that [`Via::asked`]
    /// could not follow: after a pause) or could not be reached (the map is
    /// read again too).
    pub(crate) fn redirected(&self, e: &RedisError) -> bool {
        match self {
            Via::Server(_) => false,
            Via::Cluster(_) if e.kind() == ErrorKind::Ask => {
                std::thread::sleep(ASK_PAUSE);
                true
            }
            Via::Cluster(cluster) => cluster.stale(e),
        }
    }
}

impl std::fmt::Debug for Via {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Via::Server(server) => f.debug_tuple("Server").field(&server.name()).finish(),
            Via::Cluster(cluster) => cluster.fmt(f),
        }
    }
}

/// The connection of a lock acquired with `acquire_in`: each command goes
/// to the shared command connection of the node that serves the lock's key
/// (of the master the sentinels name), following `MOVED` and `ASK`. One per
/// guard costs no socket: the process keeps one connection per node.
#[derive(Clone)]
pub struct Routed {
    pub(crate) via: Via,
    pub(crate) key: String,
}

impl Routed {
    /// `f` on the shared connection of the key's node, again on that of the
    /// node a redirection names.
    fn route<T>(&self, mut f: impl FnMut(&mut redis::Connection) -> RedisResult<T>) -> RedisResult<T> {
        let mut redirects = 0;
        let mut asked: Option<Arc<Server>> = None;
        loop {
            let result = match asked.take() {
                Some(server) => server.with_conn(|c| {
                    asking(c)?;
                    f(c)
                }),
                None => self.via.server(&self.key)?.with_conn(&mut f),
            };
            match &result {
                // An I/O error goes back to the caller, which resends with
                // the same request ID (to the node the map names by then).
                Err(e) if redirects < REDIRECTS && !e.is_io_error() => {
                    asked = self.via.asked(e);
                    if asked.is_none() && !self.via.redirected(e) {
                        return result;
                    }
                    redirects += 1;
                }
                _ => return result,
            }
        }
    }
}

impl ConnectionLike for Routed {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        // The connection hands an error reply back as a value: as an error
        // here, so that `MOVED` and `ASK` are followed.
        self.route(|c| match c.req_packed_command(cmd)? {
            Value::ServerError(e) => Err(e.into()),
            reply => Ok(reply),
        })
    }

    fn req_packed_commands(&mut self, cmd: &[u8], offset: usize, count: usize) -> RedisResult<Vec<Value>> {
        self.route(|c| c.req_packed_commands(cmd, offset, count))
    }

    fn get_db(&self) -> i64 {
        match &self.via {
            Via::Server(server) => server.client().get_connection_info().redis.db,
            // A cluster has only database 0.
            Via::Cluster(_) => 0,
        }
    }

    fn check_connection(&mut self) -> bool {
        self.route(|c| Ok(c.check_connection())).unwrap_or(false)
    }

    fn is_open(&self) -> bool {
        true
    }
}

impl std::fmt::Debug for Routed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Routed").field("via", &self.via).field("key", &self.key).finish()
    }
}

/// `ASKING`: the next command on `conn` is served by the node importing
/// its key's slot.
pub(crate) fn asking(conn: &mut dyn ConnectionLike) -> RedisResult<()> {
    redis::cmd("ASKING").query(conn)
}

/// A command to the key's node, following redirections (the watchdog's
/// renewals of a cluster lock).
pub(crate) fn query(cluster: &Cluster, key: &str, cmd: &Cmd) -> RedisResult<Value> {
    cmd.query(&mut Routed { via: Via::Cluster(cluster.clone()), key: key.to_string() })
}

#[cfg(test)]
mod tests {
    use super::key_slot;

    #[test]
    fn slots_follow_crc16_and_hash_tags() {
        // Values from CLUSTER KEYSLOT.
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"123456789"), 12739);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_ne!(key_slot(b"foo{}{bar}"), key_slot(b"bar"));
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(key_slot(b"foo{bar}{zap}"), key_slot(b"bar"));
    }
}
