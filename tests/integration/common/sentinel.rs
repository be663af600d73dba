//! Sentinels for tests: each on a free loopback port, watching one master as
//! `flock` (quorum 2, down after 1000 ms), at test pace (`SENTINEL DEBUG`,
//! below), killed when dropped.

use std::process::{Child, Command, Stdio};

use super::{free_port, server_program, Connection, RedisResult, TempDir, Value, SECOND};

/// The sentinels of a test, with their ports; every process is killed on drop.
pub struct Sentinels(pub Vec<(Child, u16)>);

impl Sentinels {
    /// `n` sentinels watching `master_port`, their config and logs in `dir`.
    pub fn start(dir: &TempDir, master_port: u16, n: usize) -> Sentinels {
        let sentinels = Sentinels((0..n).map(|_| start_sentinel(dir, master_port)).collect());
        for port in sentinels.ports() {
            at_test_pace(port);
        }
        sentinels
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

/// Sentinel reads each server's INFO every 10 s and greets the other
/// sentinels every 2 s; a deposed master is demoted once its INFO has shown
/// it a master for 4 greeting periods. `SENTINEL DEBUG` (Redis 7.0+, Valkey)
/// sets 500 ms and 1 s, so that a failover test waits for the failover, not
/// the periods (a deposed master goes in about 4 s). Not shorter: a sentinel
/// promotes only a replica whose INFO is at most 3 periods old, and one
/// stalled on a busy machine then found no replica good enough; and a
/// sentinel that was not the leader turned a just-promoted replica back
/// into a replica after 4 greeting periods of 200 ms, before the leader's
/// greeting named it (both seen in the Python suite's failover tests).
fn at_test_pace(port: u16) {
    let deadline = std::time::Instant::now() + 10 * SECOND;
    loop {
        let set = sentinel_conn(port).and_then(|mut c| {
            redis::cmd("SENTINEL")
                .arg("DEBUG")
                .arg("info-period")
                .arg(500)
                .arg("publish-period")
                .arg(1000)
                .query(&mut c)
        });
        match set {
            Ok(()) => return,
            Err(e) if std::time::Instant::now() > deadline => panic!("SENTINEL DEBUG on the sentinel on {port}: {e}"),
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
        }
    }
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
