//! The redis-server under test: started here with the module loaded, on a
//! free loopback port, persisting nothing; killed when dropped. `FLOCK_SERVER`
//! (a path, as for the tests; `make bench SERVER=redis-8.2`) picks another
//! binary than the `redis-server` on PATH.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis::{Connection, RedisResult};

/// Files redis-server keeps for itself beyond its clients.
const SERVER_FILES: usize = 64;

pub struct Server {
    pub port: u16,
    child: Child,
    dir: PathBuf,
    client: redis::Client,
}

impl Server {
    /// Starts redis-server with `module` loaded, accepting as many clients
    /// as it may open files.
    pub fn start(module: &Path) -> Result<Server, String> {
        if !module.exists() {
            return Err(format!("{} is missing: build the module first (`make build`)", module.display()));
        }
        let program = std::env::var("FLOCK_SERVER").ok().filter(|s| !s.is_empty());
        let program = program.as_deref().unwrap_or("redis-server");
        // A port found free can be taken before redis-server binds it: retry.
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map_err(|e| format!("no free loopback port: {e}"))?
                .port();
            let dir = std::env::temp_dir().join(format!("flock-bench-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            let child = Command::new(program)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                // backlog makes the event loop busy with DEBUG SLEEP.
                .args(["--enable-debug-command", "local"])
                .args(["--maxclients", &open_files_limit().saturating_sub(SERVER_FILES).to_string()])
                .arg("--dir")
                .arg(&dir)
                .arg("--loadmodule")
                .arg(module)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("cannot start {program} ({e}): install it with `make deps`"))?;
            let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).map_err(|e| e.to_string())?;
            let mut server = Server { port, child, dir, client };
            if server.wait_ready() {
                return Ok(server);
            }
        }
        Err("redis-server did not start (see `redis-server --loadmodule <module>` by hand)".into())
    }

    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return false;
            }
            if self.connect().and_then(|mut c| redis::cmd("PING").query::<String>(&mut c)).is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    pub fn connect(&self) -> RedisResult<Connection> {
        self.client.get_connection()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The text of `INFO section`.
pub fn info(conn: &mut Connection, section: &str) -> RedisResult<String> {
    redis::cmd("INFO").arg(section).query(conn)
}

/// A field of an INFO text.
pub fn field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')).map(str::trim)
}

/// A numeric field of `INFO section`; a missing field is an error.
pub fn info_number(conn: &mut Connection, section: &str, name: &str) -> RedisResult<i64> {
    let text = info(conn, section)?;
    field(&text, name)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| (redis::ErrorKind::TypeError, "no such INFO field", name.to_string()).into())
}

pub fn flushall(conn: &mut Connection) -> RedisResult<()> {
    redis::cmd("FLUSHALL").arg("SYNC").query(conn)
}

/// How many files this process may open (the soft limit); every client
/// connection is one, and redis-server, started from here, has the same.
pub fn open_files_limit() -> usize {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|text| {
            let line = text.lines().find(|l| l.starts_with("Max open files"))?;
            line.split_whitespace().nth(3)?.parse().ok()
        })
        .unwrap_or(1024)
}

/// Commands the benchmark sends around its runs: not part of any method's cost.
const OWN_COMMANDS: [&str; 4] = ["client", "config", "info", "script"];

/// Runs `f` and returns, with its result, the µs redis-server spent
/// executing the methods' commands meanwhile (`INFO commandstats`): the
/// server's own cost, apart from the clients and the network.
pub fn measure_busy<T>(server: &Server, f: impl FnOnce() -> RedisResult<T>) -> RedisResult<(T, f64)> {
    let mut conn = server.connect()?;
    redis::cmd("CONFIG").arg("RESETSTAT").query::<()>(&mut conn)?;
    let result = f()?;
    let busy = busy_us(&mut conn, |command| !OWN_COMMANDS.contains(&command))?;
    Ok((result, busy))
}

/// The µs redis-server has spent executing the commands `counted` accepts
/// (by name, lower case), since the last `CONFIG RESETSTAT`.
pub fn busy_us(conn: &mut Connection, counted: impl Fn(&str) -> bool) -> RedisResult<f64> {
    Ok(info(conn, "commandstats")?
        .lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let command = name.split('|').next()?;
            let usec = stats.split(',').find_map(|kv| kv.strip_prefix("usec="))?;
            counted(command).then(|| usec.parse::<f64>().ok())?
        })
        .sum())
}
