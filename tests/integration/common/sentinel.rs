//! Sentinels for tests: each on a free loopback port, watching one master as
//! `flock` (quorum 2, down after 1000 ms), killed when dropped.

use std::process::{Child, Command, Stdio};

use super::{free_port, server_program, Connection, RedisResult, TempDir, Value, SECOND};

/// The sentinels of a test, with their ports; every process is killed on drop.
pub struct Sentinels(pub Vec<(Child, u16)>);

impl Sentinels {
    /// `n` sentinels watching `master_port`, their config and logs in `dir`.
    pub fn start(dir: &TempDir, master_port: u16, n: usize) -> Sentinels {
        Sentinels((0..n).map(|_| start_sentinel(dir, master_port)).collect())
    }

    pub fn ports(&self) -> Vec<u16> {
        self.0.iter().map(|(_, port)| *port).collect()
    }
}

impl Drop for Sentinels {
    fn drop(&mut self) {
        for (child, _) in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A sentinel on a free port watching `master_port` as `flock`; its log in `dir`.
fn start_sentinel(dir: &TempDir, master_port: u16) -> (Child, u16) {
    let port = free_port();
    let conf = dir.path().join(format!("sentinel-{port}.conf"));
    let log = dir.path().join(format!("sentinel-{port}.log")).display().to_string();
    std::fs::write(
        &conf,
        format!(
            "port {port}\nbind 127.0.0.1\nlogfile {log}\nsentinel monitor flock 127.0.0.1 {master_port} 2\n\
             sentinel down-after-milliseconds flock 1000\nsentinel failover-timeout flock 10000\n"
        ),
    )
    .expect("write sentinel.conf");
    let child = Command::new(server_program())
        .arg(&conf)
        .arg("--sentinel")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start a sentinel");
    (child, port)
}

/// A connection to the sentinel on `port`, bounded so that a stalled sentinel fails a poll.
pub fn sentinel_conn(port: u16) -> RedisResult<Connection> {
    let c = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?.get_connection_with_timeout(SECOND)?;
    c.set_read_timeout(Some(5 * SECOND))?;
    Ok(c)
}

/// `SENTINEL MASTER flock` field `name`, as an integer (-1 if unknown).
pub fn sentinel_field(port: u16, name: &str) -> i64 {
    let fields: RedisResult<Vec<String>> = sentinel_conn(port).and_then(|mut c| {
        redis::cmd("SENTINEL").arg("MASTER").arg("flock").query(&mut c).map(|v: Value| match v {
            Value::Array(items) => items.iter().map(|i| redis::from_redis_value(i).unwrap_or_default()).collect(),
            Value::Map(pairs) => {
                pairs.iter().flat_map(|(k, v)| [k, v]).map(|i| redis::from_redis_value(i).unwrap_or_default()).collect()
            }
            _ => Vec::new(),
        })
    });
    let fields = fields.unwrap_or_default();
    fields.chunks(2).find(|kv| kv[0] == name).and_then(|kv| kv.get(1)?.parse().ok()).unwrap_or(-1)
}

/// The master port a sentinel names.
pub fn named_master(port: u16) -> Option<u16> {
    let mut c = sentinel_conn(port).ok()?;
    let addr: Vec<String> = redis::cmd("SENTINEL").arg("GET-MASTER-ADDR-BY-NAME").arg("flock").query(&mut c).ok()?;
    addr.get(1)?.parse().ok()
}
