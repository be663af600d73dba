//! Test support: a real redis-server with the module loaded, on a free
//! loopback port, stopped when dropped; clients from the `redis` crate.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use redis::{Commands, Connection, RedisResult, Value};

pub fn module_path() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/release/libredis_flock.so");
    assert!(path.exists(), "{} is missing: run `make build` (or `cargo build --release`) first", path.display());
    path
}

pub struct Server {
    pub port: u16,
    child: Child,
    pub dir: tempdir::Dir,
}

pub mod tempdir {
    use std::path::PathBuf;

    /// A scratch directory removed on drop.
    pub struct Dir(pub PathBuf);

    impl Dir {
        pub fn new(tag: &str) -> Self {
            let path = std::env::temp_dir().join(format!("flock-test-{tag}-{}-{}", std::process::id(), rand::random::<u64>()));
            std::fs::create_dir_all(&path).expect("create temp dir");
            Dir(path)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

impl Server {
    /// Starts a server with the module; `extra` are more `--name value` config args.
    pub fn start_with(extra: &[&str]) -> Server {
        let mut dir = tempdir::Dir::new("srv");
        for _ in 0..5 {
            let port = free_port();
            let mut cmd = Command::new("redis-server");
            cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(&dir.0)
                .arg("--loadmodule")
                .arg(module_path())
                .args(["--enable-debug-command", "local"])
                .args(extra)
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let child = cmd.spawn().expect("spawn redis-server (is it installed? `make deps`)");
            let mut server = Server { port, child, dir };
            if server.wait_ready() {
                return server;
            }
            let _ = server.child.kill();
            let _ = server.child.wait();
            dir = server.take_dir();
        }
        panic!("redis-server did not start");
    }

    pub fn start() -> Server {
        Server::start_with(&[])
    }

    fn take_dir(&mut self) -> tempdir::Dir {
        std::mem::replace(&mut self.dir, tempdir::Dir(PathBuf::new()))
    }

    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if let Ok(mut c) = self.try_conn() {
                if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                    return true;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
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

    /// A RESP3 connection.
    pub fn conn3(&self) -> Connection {
        redis::Client::open(format!("{}?protocol=resp3", self.url())).expect("client").get_connection().expect("connect")
    }

    /// `INFO flock` as field -> number (without the `flock_` prefix).
    pub fn stats(&self) -> std::collections::HashMap<String, i64> {
        let text: String = redis::cmd("INFO").arg("flock").query(&mut self.conn()).expect("INFO flock");
        text.lines()
            .filter_map(|l| l.strip_prefix("flock_")?.split_once(':'))
            .filter_map(|(k, v)| Some((k.to_string(), v.trim().parse().ok()?)))
            .collect()
    }

    pub fn stat(&self, name: &str) -> i64 {
        self.stats().get(name).copied().unwrap_or_else(|| panic!("no INFO flock field {name}"))
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

pub fn acquire(c: &mut Connection, key: &str, owner: &str, lease_ms: u64) -> RedisResult<Option<i64>> {
    redis::cmd("FLOCK.ACQUIRE").arg(key).arg(owner).arg(lease_ms).query(c)
}

pub fn acquire_wait(c: &mut Connection, key: &str, owner: &str, lease_ms: u64, wait_ms: u64) -> RedisResult<Option<i64>> {
    redis::cmd("FLOCK.ACQUIRE").arg(key).arg(owner).arg(lease_ms).arg("WAIT").arg(wait_ms).query(c)
}

pub fn release(c: &mut Connection, key: &str, owner: &str) -> RedisResult<i64> {
    redis::cmd("FLOCK.RELEASE").arg(key).arg(owner).query(c)
}

pub fn renew(c: &mut Connection, key: &str, owner: &str, lease_ms: u64) -> RedisResult<i64> {
    redis::cmd("FLOCK.RENEW").arg(key).arg(owner).arg(lease_ms).query(c)
}

pub fn force_release(c: &mut Connection, key: &str) -> RedisResult<i64> {
    redis::cmd("FLOCK.FORCERELEASE").arg(key).query(c)
}

/// FLOCK.INFO as (field, value) pairs in reply order; `None` for nil.
pub fn info(c: &mut Connection, key: &str) -> Option<Vec<(String, Value)>> {
    let v: Value = redis::cmd("FLOCK.INFO").arg(key).query(c).expect("FLOCK.INFO");
    match v {
        Value::Nil => None,
        Value::Array(items) => Some(
            items.chunks(2).map(|p| (redis::from_redis_value::<String>(&p[0]).expect("field name"), p[1].clone())).collect(),
        ),
        Value::Map(pairs) => Some(pairs.into_iter().map(|(k, v)| (redis::from_redis_value::<String>(&k).expect("field name"), v)).collect()),
        other => panic!("unexpected FLOCK.INFO reply {other:?}"),
    }
}

pub fn info_field(c: &mut Connection, key: &str, field: &str) -> Option<Value> {
    info(c, key)?.into_iter().find(|(k, _)| k == field).map(|(_, v)| v)
}

pub fn owner_of(c: &mut Connection, key: &str) -> Option<String> {
    info_field(c, key, "owner").map(|v| redis::from_redis_value(&v).expect("owner"))
}

pub fn queue_of(c: &mut Connection, key: &str) -> Vec<String> {
    info_field(c, key, "queue").map(|v| redis::from_redis_value(&v).expect("queue")).unwrap_or_default()
}

/// Starts `FLOCK.ACQUIRE ... WAIT` on its own connection in a thread.
pub fn spawn_waiter(
    server: &Server,
    key: &str,
    owner: &str,
    lease_ms: u64,
    wait_ms: u64,
) -> std::thread::JoinHandle<RedisResult<Option<i64>>> {
    let mut c = server.conn();
    let (key, owner) = (key.to_string(), owner.to_string());
    std::thread::spawn(move || acquire_wait(&mut c, &key, &owner, lease_ms, wait_ms))
}

/// Waits until `owners` are queued on `key`, in this order.
pub fn wait_queue(c: &mut Connection, key: &str, owners: &[&str]) {
    wait_until(&format!("queue of {key} = {owners:?}"), 5 * SECOND, || queue_of(c, key) == owners);
}

/// The error code (first word) of a failed command.
pub fn error_code(e: &redis::RedisError) -> String {
    e.code().map(str::to_string).unwrap_or_else(|| e.to_string())
}
