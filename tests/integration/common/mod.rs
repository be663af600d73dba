//! Test support: a real redis-server with the module loaded, on a free
//! loopback port, stopped when dropped; clients from the `redis` crate.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Sender;
use std::sync::OnceLock;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use tempfile::TempDir;

pub use redis::{Commands, Connection, RedisResult, Value};

/// The module's release build, brought up to date once per test process:
/// `cargo test` builds nothing redis-server loads from there (the module is
/// not a dependency of the tests), so without this a test could load a
/// stale `.so`. Cargo sets `CARGO` for the processes it runs.
pub fn module_path() -> PathBuf {
    static MODULE: OnceLock<PathBuf> = OnceLock::new();
    MODULE
        .get_or_init(|| {
            let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let build = Command::new(cargo)
                .args(["build", "--release", "--package", "redis-flock"])
                .current_dir(&root)
                // `make test` sets it for libtest's --report-time only; cargo
                // counts it in every crate's fingerprint, so passing it on
                // would rebuild them all, and again at the next plain build.
                .env_remove("RUSTC_BOOTSTRAP")
                .output()
                .expect("run cargo");
            assert!(
                build.status.success(),
                "cargo build --release --package redis-flock failed:\n{}",
                String::from_utf8_lossy(&build.stderr)
            );
            root.join("target/release/libredis_flock.so")
        })
        .clone()
}

/// The server binary every test starts: `FLOCK_SERVER` (a path; `make test
/// SERVER=redis-8.2` sets it, see scripts/server.sh), else `redis-server` on PATH.
pub fn server_program() -> String {
    std::env::var("FLOCK_SERVER").ok().filter(|s| !s.is_empty()).unwrap_or_else(|| "redis-server".into())
}

/// The server behind `c` as ("redis" | "valkey", major, minor), for the few
/// tests whose expectations differ by server (they say so in their names).
/// Valkey also reports a `redis_version` (7.2.4, for clients): its own wins.
pub fn server_version(c: &mut Connection) -> (String, u32, u32) {
    let text: String = redis::cmd("INFO").arg("server").query(c).expect("INFO server");
    let field = |name: &str| text.lines().find_map(|l| l.strip_prefix(name)).map(str::trim);
    let (family, version) = match field("valkey_version:") {
        Some(v) => ("valkey", v),
        None => ("redis", field("redis_version:").expect("redis_version in INFO server")),
    };
    let mut parts = version.split('.').map(|p| p.parse::<u32>().expect("a numeric version"));
    (family.to_string(), parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

pub struct Server {
    pub port: u16,
    child: Child,
    pub dir: TempDir,
    /// The `extra` config args it was started with (a restart reuses them).
    args: Vec<String>,
    /// Environment variables it was started with (a restart reuses them).
    env: Vec<(String, String)>,
}

/// A unique scratch directory removed on drop: in memory (/dev/shm) where
/// there is one, so that an fsync (`appendfsync always`, a sentinel's
/// config, an RDB) does not wait for a disk that other work keeps busy.
pub fn temp_dir(tag: &str) -> TempDir {
    let prefix = format!("flock-test-{tag}-");
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix);
    let shm = std::path::Path::new("/dev/shm");
    let dir = if shm.is_dir() { builder.tempdir_in(shm) } else { builder.tempdir() };
    dir.expect("create temp dir")
}

/// Waits until the server `child` answers at `url`; false if it exits or
/// `timeout` passes first. It must be `child` that answers (its process
/// id), not a process of another suite that took the port first.
pub fn wait_ready(child: &mut Child, url: &str, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    let pid = format!("process_id:{}", child.id());
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return false;
        }
        let conn = redis::Client::open(url).and_then(|c| c.get_connection_with_timeout(Duration::from_secs(5)));
        if let Ok(mut c) = conn {
            if let Ok(info) = redis::cmd("INFO").arg("server").query::<String>(&mut c) {
                if !info.lines().any(|l| l.trim() == pid) {
                    return false;
                }
                // Not while it still loads its data (PING answers LOADING).
                if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                    return true;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// A loopback port that nobody listens on now and that no server of this
/// test process had before: the tests run side by side, and a test that
/// restarts its server on its old port, or whose clients reconnect to it,
/// must never meet another test's server there. Below 32768, where the
/// kernel starts choosing ports for outgoing connections.
pub fn free_port() -> u16 {
    fresh_port(&[0])
}

/// A port as `free_port` gives, with the ports at `offsets` from it
/// (0, and 10000 for a cluster node's bus) all free and given with it.
pub fn fresh_port(offsets: &[u16]) -> u16 {
    use rand::Rng;
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let top = 32_768 - offsets.iter().max().copied().unwrap_or(0);
    for _ in 0..10_000 {
        let port = rand::thread_rng().gen_range(10_000..top);
        let ports: Vec<u16> = offsets.iter().map(|o| port + o).collect();
        let mut given = GIVEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if ports.iter().all(|&p| !given.contains(&p) && TcpListener::bind(("127.0.0.1", p)).is_ok()) {
            given.extend(ports);
            return port;
        }
    }
    panic!("no free loopback port for {offsets:?}");
}

impl Server {
    /// Starts a server with the module; `extra` are more `--name value` config args.
    pub fn start_with(extra: &[&str]) -> Server {
        Server::start_in(temp_dir("srv"), extra)
    }

    pub fn start() -> Server {
        Server::start_with(&[])
    }

    /// Takes the server's directory for a successor: a fresh empty one,
    /// removed on drop, takes its place.
    fn take_dir(&mut self) -> TempDir {
        std::mem::replace(&mut self.dir, temp_dir("moved"))
    }

    fn wait_ready(&mut self) -> bool {
        let wrapped = std::env::var_os("FLOCK_REDIS_WRAPPER").is_some();
        let url = self.url();
        wait_ready(&mut self.child, &url, Duration::from_secs(if wrapped { 60 } else { 10 }))
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn try_conn(&self) -> RedisResult<Connection> {
        redis::Client::open(self.url())?.get_connection()
    }

    pub fn conn(&self) -> Connection {
        self.try_conn().expect("connect")
    }

    /// A connection that has selected database `db`.
    pub fn conn_db(&self, db: i64) -> Connection {
        redis::Client::open(format!("{}{db}", self.url())).expect("client").get_connection().expect("connect")
    }

    /// True while the process runs (false once it exited, e.g. aborted).
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Fails unless the process runs and answers PING.
    pub fn assert_alive(&mut self, what: &str) {
        let status = self.child.try_wait();
        assert!(matches!(status, Ok(None)), "{what}: redis-server exited ({status:?})");
        let pong = self.try_conn().and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
        assert_eq!(pong.as_deref().ok(), Some("PONG"), "{what}: PING failed ({pong:?})");
    }

    /// What the server's log says about a crash (from its bug report on), or
    /// its last lines; for servers started with `--logfile NAME` (in its dir).
    pub fn log_excerpt(&self, name: &str) -> String {
        let text = std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let from = match lines.iter().position(|l| l.contains("BUG REPORT START")) {
            Some(start) => start.saturating_sub(5),
            None => lines.len().saturating_sub(20),
        };
        lines[from..lines.len().min(from + 40)].join("\n")
    }

    /// A RESP3 connection.
    pub fn conn3(&self) -> Connection {
        redis::Client::open(format!("{}?protocol=resp3", self.url()))
            .expect("client")
            .get_connection()
            .expect("connect")
    }

    /// `INFO flock` as field -> number (without the `flock_` prefix).
    pub fn stats(&self) -> std::collections::HashMap<String, i64> {
        flock_stats(&mut self.conn())
    }

    pub fn stat(&self, name: &str) -> i64 {
        self.stats().get(name).copied().unwrap_or_else(|| panic!("no INFO flock field {name}"))
    }

    /// `INFO memory` used_memory.
    pub fn used_memory(&self) -> i64 {
        self.info_section("memory")["used_memory"].parse().expect("used_memory")
    }

    /// `used_memory` after MEMORY PURGE (which jemalloc needs to give back
    /// freed pages).
    pub fn purged_memory(&self) -> i64 {
        let _: RedisResult<Value> = redis::cmd("MEMORY").arg("PURGE").query(&mut self.conn());
        self.used_memory()
    }

    /// `INFO clients` blocked_clients.
    pub fn blocked_clients(&self) -> i64 {
        let text: String = redis::cmd("INFO").arg("clients").query(&mut self.conn()).expect("INFO clients");
        text.lines()
            .find_map(|l| l.strip_prefix("blocked_clients:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("blocked_clients")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `cond` until it holds or `timeout` passes; panics with `what`.
pub fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

pub const SECOND: Duration = Duration::from_secs(1);

/// One field of `INFO replication`, as a number.
fn replication_offset(c: &mut Connection, field: &str) -> i64 {
    let text: String = redis::cmd("INFO").arg("replication").query(c).expect("INFO replication");
    let value = text.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':'));
    value.and_then(|v| v.trim().parse().ok()).unwrap_or_else(|| panic!("no {field} in INFO replication"))
}

/// Waits until the replica behind `replica` has applied everything the master behind
/// `master` had written when this was called. Not `WAIT 1` on `master`: that counts the
/// acknowledgements of that connection's own last write, and a change made in another
/// client's command (a hand-off, a closed connection, a timer) is not one; Redis 8.2 and
/// Valkey 9.1 do not move a connection's offset for its reads, and a replica was seen
/// without a session grant after `WAIT 1` had answered 1.
pub fn wait_replica_applied(master: &mut Connection, replica: &mut Connection) {
    let written = replication_offset(master, "master_repl_offset");
    wait_until("the replica to apply the master's writes", 5 * SECOND, || {
        replication_offset(replica, "slave_repl_offset") >= written
    });
}

/// The server reads its clock in whole milliseconds, so a lease of n ms can
/// end up to 1 ms before n ms of the test's clock have passed since it sent
/// the acquire; "ended early" checks allow for that grain and no more.
pub const SERVER_CLOCK_GRAIN_MS: u64 = 1;

// Key names are binary: the helpers take any bytes (`&str`, `&[u8]`, ...).

pub fn acquire(
    c: &mut Connection,
    key: &(impl AsRef<[u8]> + ?Sized),
    owner: &str,
    lease_ms: u64,
) -> RedisResult<Option<i64>> {
    redis::cmd("FLOCK.ACQUIRE").arg(key.as_ref()).arg(owner).arg(lease_ms).query(c)
}

pub fn acquire_wait(
    c: &mut Connection,
    key: &(impl AsRef<[u8]> + ?Sized),
    owner: &str,
    lease_ms: u64,
    wait_ms: u64,
) -> RedisResult<Option<i64>> {
    redis::cmd("FLOCK.ACQUIRE").arg(key.as_ref()).arg(owner).arg(lease_ms).arg("WAIT").arg(wait_ms).query(c)
}

pub fn release(c: &mut Connection, key: &(impl AsRef<[u8]> + ?Sized), owner: &str) -> RedisResult<i64> {
    redis::cmd("FLOCK.RELEASE").arg(key.as_ref()).arg(owner).query(c)
}

/// A pipeline that starts with `FLOCK.RENEW key owner lease_ms`: a lease
/// held long while a test sets up, cut short in the packet of the command
/// that must follow its start at once.
pub fn renew_to(key: &(impl AsRef<[u8]> + ?Sized), owner: &str, lease_ms: u64) -> redis::Pipeline {
    let mut first = redis::pipe();
    first.cmd("FLOCK.RENEW").arg(key.as_ref()).arg(owner).arg(lease_ms);
    first
}

pub fn renew(c: &mut Connection, key: &(impl AsRef<[u8]> + ?Sized), owner: &str, lease_ms: u64) -> RedisResult<i64> {
    redis::cmd("FLOCK.RENEW").arg(key.as_ref()).arg(owner).arg(lease_ms).query(c)
}

pub fn force_release(c: &mut Connection, key: &(impl AsRef<[u8]> + ?Sized)) -> RedisResult<i64> {
    redis::cmd("FLOCK.FORCERELEASE").arg(key.as_ref()).query(c)
}

/// FLOCK.INFO's fields, in reply order.
pub const INFO_FIELDS: [&str; 18] = [
    "owner",
    "holds",
    "token",
    "ttl-ms",
    "session",
    "waiters",
    "queue",
    "mode",
    "limit",
    "holders",
    "delayed-ms",
    "held-ms",
    "oldest-wait-ms",
    "contended-ms",
    "handoffs",
    "waits-ended",
    "longest-wait-ms",
    "longest-hold-ms",
];

/// FLOCK.INFO as (field, value) pairs in reply order; `None` for nil.
pub fn info(c: &mut Connection, key: &(impl AsRef<[u8]> + ?Sized)) -> Option<Vec<(String, Value)>> {
    let v: Value = redis::cmd("FLOCK.INFO").arg(key.as_ref()).query(c).expect("FLOCK.INFO");
    match v {
        Value::Nil => None,
        v => Some(fields_of(&v)),
    }
}

pub fn info_field(c: &mut Connection, key: &(impl AsRef<[u8]> + ?Sized), field: &str) -> Option<Value> {
    info(c, key)?.into_iter().find(|(k, _)| k == field).map(|(_, v)| v)
}

pub fn owner_of(c: &mut Connection, key: &(impl AsRef<[u8]> + ?Sized)) -> Option<String> {
    // Nil while nobody holds a lock an ACQUIREALL waits first for.
    info_field(c, key, "owner").filter(|v| *v != Value::Nil).map(|v| redis::from_redis_value(&v).expect("owner"))
}

pub fn queue_of(c: &mut Connection, key: &(impl AsRef<[u8]> + ?Sized)) -> Vec<String> {
    info_field(c, key, "queue").map(|v| redis::from_redis_value(&v).expect("queue")).unwrap_or_default()
}

/// FLOCK.INFO without the fields that change with time: `ttl-ms` (also
/// those of each holder), `held-ms` and those counted while it has waiters.
pub fn info_still(c: &mut Connection, key: &(impl AsRef<[u8]> + ?Sized)) -> Option<Vec<(String, Value)>> {
    let still = |holder: &Value| -> Vec<(String, Value)> {
        fields_of(holder).into_iter().filter(|(k, _)| k != "ttl-ms").collect()
    };
    info(c, key).map(|fields| {
        fields
            .into_iter()
            .filter(|(k, _)| {
                !["ttl-ms", "held-ms", "oldest-wait-ms", "contended-ms", "longest-wait-ms", "longest-hold-ms"]
                    .contains(&k.as_str())
            })
            .map(|(k, v)| match (k.as_str(), &v) {
                ("holders", Value::Array(hs)) => {
                    let hs = hs.iter().map(|h| {
                        Value::Array(still(h).into_iter().flat_map(|(k, v)| [Value::SimpleString(k), v]).collect())
                    });
                    (k, Value::Array(hs.collect()))
                }
                _ => (k, v),
            })
            .collect()
    })
}

/// The (name, value) pairs of a map reply: a flat array on RESP2, a map on RESP3.
pub fn fields_of(v: &Value) -> Vec<(String, Value)> {
    match v {
        Value::Array(items) => items
            .chunks(2)
            .map(|p| (redis::from_redis_value::<String>(&p[0]).expect("field name"), p[1].clone()))
            .collect(),
        Value::Map(pairs) => {
            pairs.iter().map(|(k, v)| (redis::from_redis_value::<String>(k).expect("field name"), v.clone())).collect()
        }
        other => panic!("not a map reply: {other:?}"),
    }
}

/// A FLOCK.INFO field that must be there, as an integer.
pub fn int_field(c: &mut Connection, key: &(impl AsRef<[u8]> + ?Sized), field: &str) -> i64 {
    let key = key.as_ref();
    int(&info_field(c, key, field).unwrap_or_else(|| panic!("no lock {} or no field {field}", shown(key))))
}

pub fn token_of(c: &mut Connection, key: &(impl AsRef<[u8]> + ?Sized)) -> i64 {
    int_field(c, key, "token")
}

pub fn holds(c: &mut Connection, key: &(impl AsRef<[u8]> + ?Sized)) -> i64 {
    int_field(c, key, "holds")
}

pub fn ttl_ms(c: &mut Connection, key: &(impl AsRef<[u8]> + ?Sized)) -> i64 {
    int_field(c, key, "ttl-ms")
}

pub fn int(v: &Value) -> i64 {
    redis::from_redis_value(v).unwrap_or_else(|e| panic!("{v:?} is not an integer: {e}"))
}

pub fn exists(c: &mut Connection, key: &(impl AsRef<[u8]> + ?Sized)) -> bool {
    redis::cmd("EXISTS").arg(key.as_ref()).query::<i64>(c).expect("EXISTS") == 1
}

pub fn dbsize(c: &mut Connection) -> i64 {
    redis::cmd("DBSIZE").query(c).expect("DBSIZE")
}

/// Waits until `key` is gone (its lease ended) and checks that it did not
/// go before `not_before`.
pub fn wait_gone(c: &mut Connection, key: &(impl AsRef<[u8]> + ?Sized), not_before: Instant, within: Duration) {
    let key = key.as_ref();
    wait_until(&format!("{} to expire", shown(key)), within, || !exists(c, key));
    // The server's clock and ours may round differently by a millisecond.
    let now = Instant::now();
    let early = not_before.saturating_duration_since(now);
    assert!(now + Duration::from_millis(2) >= not_before, "{} was gone {early:?} before its lease ended", shown(key));
}

/// The error of a command that must fail.
pub fn expect_err<T: std::fmt::Debug>(r: RedisResult<T>, what: &str) -> redis::RedisError {
    match r {
        Ok(v) => panic!("{what}: expected an error, got {v:?}"),
        Err(e) => e,
    }
}

/// The token a waiter thread (`spawn_waiter`) was granted; fails if it was not.
pub fn granted(h: JoinHandle<RedisResult<Option<i64>>>, who: &str) -> i64 {
    h.join()
        .expect("waiter thread")
        .unwrap_or_else(|e| panic!("{who}: {e}"))
        .unwrap_or_else(|| panic!("{who} was not granted"))
}

/// A command in RESP, as an AOF file holds it.
pub fn resp(args: &[&str]) -> String {
    args.iter().fold(format!("*{}\r\n", args.len()), |out, a| out + &format!("${}\r\n{a}\r\n", a.len()))
}

/// `CONFIG SET` of `pairs`, which must succeed.
pub fn config_set(c: &mut Connection, pairs: &[(&str, &str)]) {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("SET");
    for (name, value) in pairs {
        cmd.arg(*name).arg(*value);
    }
    let _: () = cmd.query(c).unwrap_or_else(|e| panic!("CONFIG SET {pairs:?}: {e}"));
}

/// `CONFIG SET name value`, for settings the server may refuse.
pub fn try_config_set(c: &mut Connection, name: &str, value: &str) -> RedisResult<()> {
    redis::cmd("CONFIG").arg("SET").arg(name).arg(value).query(c)
}

/// `make deps` installs redis-py: the tests that use it always run.
pub fn require_redis_py() {
    let status = Command::new("python3").args(["-c", "import redis"]).stderr(Stdio::null()).status();
    assert!(
        status.is_ok_and(|s| s.success()),
        "python3 with redis-py is missing: run `make deps` (or python3 -m pip install redis)"
    );
}

/// A number from the environment (for knobs such as a run's length).
pub fn env_num(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// The soak run (`make soak`: FLOCK_SOAK=1): the long randomized and volume
/// tests at full scale. `make test` runs them at a scale that still finds
/// what each is for, in seconds rather than minutes.
pub fn soak() -> bool {
    std::env::var("FLOCK_SOAK").is_ok_and(|v| v == "1")
}

/// How many seconds a timed run lasts: its own variable `knob` if set; in
/// the soak run FLOCK_SOAK_SECS if set, else `full`; else `test`.
pub fn run_secs(knob: &str, test: u64, full: u64) -> u64 {
    env_num(knob).unwrap_or_else(|| if soak() { env_num("FLOCK_SOAK_SECS").unwrap_or(full) } else { test })
}

/// A long WAIT for waiters that are expected to be granted: finite, so that
/// a lost grant fails the test instead of hanging it.
pub const LONG_WAIT_MS: u64 = 30_000;

/// `FLOCK.ACQUIRE key owner lease WAIT LONG_WAIT_MS` on its own connection,
/// in a thread.
pub fn waiter(s: &Server, key: &str, owner: &str, lease_ms: u64) -> JoinHandle<RedisResult<Option<i64>>> {
    spawn_waiter(s, key, owner, lease_ms, LONG_WAIT_MS)
}

/// Starts `FLOCK.ACQUIRE ... WAIT` on its own connection in a thread.
pub fn spawn_waiter(
    server: &Server,
    key: &(impl AsRef<[u8]> + ?Sized),
    owner: &str,
    lease_ms: u64,
    wait_ms: u64,
) -> std::thread::JoinHandle<RedisResult<Option<i64>>> {
    let mut c = server.conn();
    let (key, owner) = (key.as_ref().to_vec(), owner.to_string());
    std::thread::spawn(move || acquire_wait(&mut c, &key, &owner, lease_ms, wait_ms))
}

/// The start of a deadlock: A holds L1, B holds L2 and waits for L1 (B's
/// wait, in a thread). A asking for L2 would close the cycle.
pub fn crossed(s: &Server, c: &mut Connection) -> JoinHandle<RedisResult<Option<i64>>> {
    acquire(c, "L1", "A", 30_000).unwrap().expect("A holds L1");
    acquire(c, "L2", "B", 30_000).unwrap().expect("B holds L2");
    let b = waiter(s, "L1", "B", 30_000);
    wait_queue(c, "L1", &["B"]);
    b
}

/// Waits until `owners` are queued on `key`, in this order.
pub fn wait_queue(c: &mut Connection, key: &(impl AsRef<[u8]> + ?Sized), owners: &[&str]) {
    let key = key.as_ref();
    wait_until(&format!("queue of {} = {owners:?}", shown(key)), 5 * SECOND, || queue_of(c, key) == owners);
}

/// A key name for messages: printable ASCII as it is, other bytes escaped.
pub fn shown(key: &[u8]) -> String {
    key.escape_ascii().to_string()
}

/// `INFO flock` of the server behind `c` as field -> number (without the `flock_` prefix).
pub fn flock_stats(c: &mut Connection) -> std::collections::HashMap<String, i64> {
    let text: String = redis::cmd("INFO").arg("flock").query(c).expect("INFO flock");
    text.lines()
        .filter_map(|l| l.strip_prefix("flock_")?.split_once(':'))
        .filter_map(|(k, v)| Some((k.to_string(), v.trim().parse().ok()?)))
        .collect()
}

/// A waiter's reply and when it arrived.
pub type TimedReply = (RedisResult<Option<i64>>, Instant);

/// A command's reply and when it arrived.
pub type Timed = (RedisResult<Value>, Instant);

/// Runs `cmd` on its own connection to `s` in a thread, connected and
/// started now but sending `cmd` only when told: for a command that must
/// follow a short timer closely, which connecting and starting a thread on
/// a loaded machine could outlast.
pub fn spawn_cmd_on_signal(s: &Server, cmd: redis::Cmd) -> (Sender<()>, JoinHandle<Timed>) {
    let mut c = s.conn();
    let (go, told) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        told.recv().expect("the test to say when");
        (cmd.query(&mut c), Instant::now())
    });
    (go, h)
}

/// How many `FLOCK.RENEW`s the server ran (`INFO commandstats`): a
/// watchdog's renewals, to wait for instead of sleeping through them.
pub fn renew_calls(c: &mut Connection) -> i64 {
    let text: String = redis::cmd("INFO").arg("commandstats").query(c).expect("INFO commandstats");
    text.lines()
        .find_map(|l| l.strip_prefix("cmdstat_flock.renew:calls="))
        .and_then(|v| v.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// Starts `FLOCK.ACQUIRE key owner 60000 WAIT wait_ms` on `c` in a thread.
pub fn spawn_timed_waiter(mut c: Connection, key: &str, owner: &str, wait_ms: u64) -> JoinHandle<TimedReply> {
    let (key, owner) = (key.to_string(), owner.to_string());
    std::thread::spawn(move || (acquire_wait(&mut c, &key, &owner, 60_000, wait_ms), Instant::now()))
}

/// What FLOCK promises the waiters of a master that becomes a replica, on
/// every server: each gets an error with code `UNBLOCKED` at once, never nil
/// and never a hang (the deadline is below the 20 s WAITs of the tests).
/// Returns each error's text and how long after `since` it arrived.
pub fn demoted_replies(waiters: Vec<(String, JoinHandle<TimedReply>)>, since: Instant) -> Vec<(String, Duration)> {
    wait_until("every waiter of the demoted master to be answered", 10 * SECOND, || {
        waiters.iter().all(|(_, h)| h.is_finished())
    });
    waiters
        .into_iter()
        .map(|(who, h)| {
            let (reply, at) = h.join().expect("waiter thread");
            let e = reply.expect_err(&format!("{who}: a waiter on a demoted master must get an error"));
            assert_eq!(error_code(&e), "UNBLOCKED", "{who}: a waiter on a demoted master: {e}");
            (e.to_string(), at.saturating_duration_since(since))
        })
        .collect()
}

/// After `n` waiters of the server behind `c` were answered by its
/// demotion: none is registered, each was counted once (as demoted where
/// FLOCK answered it, as a disconnect where the server did first), and FLOCK's
/// own replies say why.
pub fn assert_demotion_counted(c: &mut Connection, n: usize, replies: &[(String, Duration)]) {
    let st = flock_stats(c);
    assert_eq!(st["waiters"], 0, "no waiter stays registered on a demoted master: {st:?}");
    assert_eq!(st["waiters_demoted"] + st["wait_disconnects"], n as i64, "each waiter counted once: {st:?}");
    let by_flock = replies.iter().filter(|(e, _)| e.contains("this node is no longer a master")).count();
    assert_eq!(by_flock as i64, st["waiters_demoted"], "FLOCK's replies vs flock_waiters_demoted: {replies:?}");
}

/// The error code (first word) of a failed command.
pub fn error_code(e: &redis::RedisError) -> String {
    e.code().map(str::to_string).unwrap_or_else(|| e.to_string())
}

/// How `Server::stop` / `Server::restart` end the running process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// SIGKILL: nothing is saved on the way down.
    Kill,
    /// `SHUTDOWN SAVE`: writes an RDB file first.
    ShutdownSave,
    /// `SHUTDOWN NOSAVE`.
    ShutdownNoSave,
}

// Restarts and replication.
impl Server {
    /// Starts a server with the module in `dir` (its RDB and AOF files are
    /// loaded as usual); `extra` as for `start_with`.
    pub fn start_in(dir: TempDir, extra: &[&str]) -> Server {
        Server::spawn_in(dir, extra.iter().map(|a| a.to_string()).collect(), Vec::new(), None)
    }

    /// Starts a server with the module and these environment variables
    /// (LD_PRELOAD of libfaketime, say); `extra` as for `start_with`.
    pub fn start_env(env: &[(&str, &str)], extra: &[&str]) -> Server {
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Server::spawn_in(temp_dir("srv"), extra.iter().map(|a| a.to_string()).collect(), env, None)
    }

    /// Tries `port` first (if given), then free ports.
    fn spawn_in(mut dir: TempDir, mut args: Vec<String>, env: Vec<(String, String)>, port: Option<u16>) -> Server {
        for attempt in 0..5 {
            let port = match port {
                Some(p) if attempt == 0 => p,
                _ => free_port(),
            };
            // `FLOCK_REDIS_WRAPPER="valgrind ..."` runs the server under that
            // command (`make leakcheck`); unset, the server runs as it is.
            let wrapper = std::env::var("FLOCK_REDIS_WRAPPER").unwrap_or_default();
            let server = server_program();
            let mut program = wrapper.split_whitespace().chain([server.as_str()]);
            let mut cmd = Command::new(program.next().expect("a program"));
            cmd.args(program)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(dir.path())
                .arg("--loadmodule")
                .arg(module_path())
                .args(["--enable-debug-command", "local"])
                // A replica's sync starts at once, not after the default 5 s
                // in which a master waits for more replicas to share it.
                .args(["--repl-diskless-sync-delay", "0"])
                .args(&args)
                .envs(env.iter().map(|(k, v)| (k, v)))
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {server} (is it installed? `make deps`): {e}"));
            let mut server = Server { port, child, dir, args, env: env.clone() };
            if server.wait_ready() {
                return server;
            }
            let _ = server.child.kill();
            let _ = server.child.wait();
            dir = server.take_dir();
            args = std::mem::take(&mut server.args);
        }
        panic!("redis-server did not start");
    }

    /// The server's process id (for signals such as SIGSTOP).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Ends the process as `how` says and waits until it has exited.
    pub fn stop(&mut self, how: Stop) {
        match how {
            Stop::Kill => {
                let _ = self.child.kill();
            }
            Stop::ShutdownSave | Stop::ShutdownNoSave => {
                let arg = if how == Stop::ShutdownSave { "SAVE" } else { "NOSAVE" };
                // The server closes the connection instead of replying.
                let _ = redis::cmd("SHUTDOWN").arg(arg).query::<Value>(&mut self.conn());
            }
        }
        wait_until("redis-server to exit", Duration::from_secs(20), || matches!(self.child.try_wait(), Ok(Some(_))));
    }

    /// Stops the server as `how` says, then starts it again in the same
    /// directory with the same args (on the same port if it is still free).
    pub fn restart(&mut self, how: Stop) {
        self.stop(how);
        let (dir, args) = (self.take_dir(), std::mem::take(&mut self.args));
        let fresh = Server::spawn_in(dir, args, std::mem::take(&mut self.env), Some(self.port));
        // The old value's process has exited and its dir was taken.
        drop(std::mem::replace(self, fresh));
    }

    /// A server that appends every write to its AOF and fsyncs it at once;
    /// `preamble` ("yes" | "no") is its `aof-use-rdb-preamble`.
    pub fn start_aof(preamble: &str) -> Server {
        Server::start_with(&["--appendonly", "yes", "--appendfsync", "always", "--aof-use-rdb-preamble", preamble])
    }

    /// Starts a replica of `master` and waits until its initial sync is done.
    pub fn replica_of(master: &Server) -> Server {
        Server::replica_with(master, &[])
    }

    /// `replica_of` with more config args.
    pub fn replica_with(master: &Server, extra: &[&str]) -> Server {
        let port = master.port.to_string();
        let replica = Server::start_with(&[&["--replicaof", "127.0.0.1", &port], extra].concat());
        replica.wait_master_link();
        master.wait_stream_to(1);
        replica
    }

    /// Waits until `n` replicas acknowledge what the master sends them.
    /// After a diskless sync the master shows a replica online but sends it
    /// the stream (and `WAIT` counts it) only from its first
    /// acknowledgement, up to a second later: a test's first `WAIT` would
    /// take that second, and a short lease could end meanwhile. The probe
    /// is a PUBLISH, which replicas receive and `min-replicas-to-write` lets
    /// through, and which touches no key.
    pub fn wait_stream_to(&self, n: i64) {
        let mut c = self.conn();
        wait_until(&format!("{n} replicas to acknowledge the stream"), 10 * SECOND, || {
            let _: i64 = redis::cmd("PUBLISH").arg("flock-test:sync").arg(1).query(&mut c).expect("PUBLISH");
            redis::cmd("WAIT").arg(n).arg(100).query::<i64>(&mut c).expect("WAIT") >= n
        });
    }

    /// Waits until this replica's link to its master is up and synced.
    pub fn wait_master_link(&self) {
        wait_until("replica link up and synced", Duration::from_secs(20), || {
            let r = self.info_section("replication");
            r.get("master_link_status").map(String::as_str) == Some("up")
                && r.get("master_sync_in_progress").map(String::as_str) == Some("0")
        });
    }

    /// Waits until a BGREWRITEAOF has finished, and checks that it did.
    pub fn wait_aof_rewrite(&self) {
        wait_until("AOF rewrite to finish", 20 * SECOND, || {
            let p = self.info_section("persistence");
            p.get("aof_rewrite_in_progress").map(String::as_str) == Some("0")
                && p.get("aof_rewrite_scheduled").map(String::as_str) == Some("0")
        });
        let p = self.info_section("persistence");
        assert_eq!(p.get("aof_last_bgrewrite_status").map(String::as_str), Some("ok"), "BGREWRITEAOF failed");
        if let Some(n) = p.get("aof_rewrites") {
            assert!(n.parse::<i64>().unwrap_or(0) >= 1, "no AOF rewrite happened");
        }
    }

    /// `INFO section` as field -> value.
    pub fn info_section(&self, section: &str) -> std::collections::HashMap<String, String> {
        let text: String = redis::cmd("INFO").arg(section).query(&mut self.conn()).expect("INFO");
        text.lines().filter_map(|l| l.split_once(':')).map(|(k, v)| (k.to_string(), v.trim().to_string())).collect()
    }
}

/// The connection's id (`CLIENT ID`), for `CLIENT KILL ID` and `CLIENT LIST ID`.
pub fn client_id(c: &mut Connection) -> i64 {
    redis::cmd("CLIENT").arg("ID").query(c).expect("CLIENT ID")
}

/// Sleeps until `at`: a point of a test's schedule (a lease running out, a
/// run's third), not a synchronisation.
pub fn sleep_until(at: Instant) {
    std::thread::sleep(at.saturating_duration_since(Instant::now()));
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()).status();
}

/// A server process stopped with SIGSTOP (it neither expires leases nor
/// propagates nor acknowledges anything); SIGCONT on drop, also when the
/// test fails. Declare it after the `Server` so it is dropped first.
pub struct Stopped(u32);

impl Stopped {
    pub fn new(s: &Server) -> Stopped {
        Stopped::process(s.pid())
    }

    /// Any process of the test's (a child that runs a client).
    pub fn process(pid: u32) -> Stopped {
        signal(pid, "STOP");
        let state = || std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // Field 3 of /proc/PID/stat is the state; `T` = stopped.
        wait_until("the process to be stopped", 5 * SECOND, || {
            state().rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
        });
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        signal(self.0, "CONT");
    }
}

/// A local Redis Cluster with the module on every node (tests/integration/cluster.rs).
pub mod cluster;

/// A TCP proxy that loses chosen replies (tests/integration/request_ids.rs).
pub mod proxy;

/// Fixtures the tests of a module share (its Cluster).
pub mod shared;

/// Sentinels watching a master (tests/integration/client_topologies.rs, tests/integration/failover.rs).
pub mod sentinel;
