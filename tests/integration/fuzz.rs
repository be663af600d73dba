//! A randomized command fuzzer against a real server: several connections
//! send random commands (every FLOCK command with good and bad arguments,
//! and the Redis commands that move, copy, expire, flush, reload or unblock
//! what FLOCK keeps) over a few keys with binary names, and drop or kill
//! their own connections in the middle of a wait; a replica follows.
//! Replies may be anything; both servers must stay up, the master must
//! answer every command (a WAIT within its timeout), and at the end nothing
//! is stranded: no blocked client, no waiter, and no lock or filed lease on
//! either server once every lease (at most `MAX_LEASE_MS`) has run out.
//!
//! Environment: `FLOCK_FUZZ_SECS` (default 5; in `make soak` FLOCK_SOAK_SECS,
//! default 20), `FLOCK_FUZZ_SEED` (replays a
//! run; the seed is printed and in every failure). The seed fixes every
//! connection's choices; the interleaving is up to the machine.
use crate::common::*;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

const THREADS: usize = 8;
/// `flock.max-lease-ms` and `flock.retry-window-ms` for the run: every lease,
/// WAIT and remembered request ID lasts at most this.
const MAX_LEASE_MS: u64 = 3_000;
/// A reply later than this (beyond the longest WAIT) counts as a hang.
const REPLY_LIMIT: Duration = Duration::from_millis(MAX_LEASE_MS + 10_000);
const LOG: &str = "redis.log";

const REQUEST_IDS: &[&[u8]] = &[b"r1", b"r2", b"\0id", b"\xff\r\n"];
const OWNERS: &[&[u8]] = &[b"o1", b"o2", b"\0", b"\xff\r\n", b"%n%s", b" "];

/// Numbers a client might send where milliseconds are expected; none of
/// them parses to 0 (a WAIT 0 never ends by itself).
const ODD_NUMBERS: &[&[u8]] = &[
    b"-1",
    b"",
    b"1.5",
    b"+5",
    b" 5",
    b"5 ",
    b"0x10",
    b"1e3",
    b"-0",
    b"3001",
    b"1099511627776",
    b"1099511627777",
    b"9223372036854775807",
    b"9223372036854775808",
    b"-9223372036854775808",
    b"18446744073709551615",
    b"18446744073709551616",
    b"99999999999999999999999999999",
    b"\x00",
    b"5\x00",
    b"\xff",
    b"1\r\n",
];

/// The key names every connection shares: binary, empty, printf-like, long.
fn keys() -> Vec<Vec<u8>> {
    let mut long = vec![b'L'; 3000];
    long[1500] = 0;
    [&b"plain"[..], b"a\0b", b"\xff\xfe\x80", b"cr\r\nlf", b"", b"%s%n%d", b"{t}\0x"]
        .iter()
        .map(|k| k.to_vec())
        .chain([long])
        .collect()
}

struct Shared {
    stop: AtomicBool,
    /// Each fuzzer's current client id (for CLIENT UNBLOCK by the others).
    ids: Vec<AtomicU64>,
    failures: Mutex<Vec<String>>,
    counts: Mutex<BTreeMap<&'static str, u64>>,
}

impl Shared {
    fn fail(&self, what: String) {
        let mut f = self.failures.lock().unwrap();
        if f.len() < 20 {
            f.push(what);
        }
    }
}

struct Fuzzer {
    n: usize,
    rng: StdRng,
    url: String,
    keys: Arc<Vec<Vec<u8>>>,
    shared: Arc<Shared>,
    conn: Connection,
    id: u64,
    /// A second connection of the same thread, to kill or unblock `conn`.
    ctl: Connection,
    counts: BTreeMap<&'static str, u64>,
    /// The session `conn` opened, if it did: its waits name it.
    session: Option<Vec<u8>>,
}

/// A connection to database `db`, speaking RESP3 if `resp3`.
fn connect_with_id(url: &str, db: i64, resp3: bool) -> RedisResult<(Connection, u64)> {
    let protocol = if resp3 { "?protocol=resp3" } else { "" };
    let mut c = redis::Client::open(format!("{url}{db}{protocol}"))?.get_connection()?;
    c.set_read_timeout(Some(REPLY_LIMIT))?;
    let id = redis::cmd("CLIENT").arg("ID").query(&mut c)?;
    Ok((c, id))
}

type Args = Vec<Vec<u8>>;

/// No reply, or none that the client could read.
fn is_link_error(e: &redis::RedisError) -> bool {
    e.is_timeout() || e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error()
}

/// Commands that never fail on data the server made itself: a failed DEBUG
/// RELOAD would have lost the data set behind the replica's back.
const MUST_SUCCEED: &[&str] = &["DEBUG RELOAD", "RESTORE REPLACE", "SWAPDB", "FLUSHDB", "FLUSHALL"];

impl Fuzzer {
    fn new(n: usize, seed: u64, url: String, keys: Arc<Vec<Vec<u8>>>, shared: Arc<Shared>) -> RedisResult<Fuzzer> {
        let (conn, id) = connect_with_id(&url, 0, false)?;
        let (ctl, _) = connect_with_id(&url, 0, false)?;
        shared.ids[n].store(id, Ordering::Relaxed);
        let rng = StdRng::seed_from_u64(seed ^ (n as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        Ok(Fuzzer { n, rng, url, keys, shared, conn, id, ctl, counts: BTreeMap::new(), session: None })
    }

    fn fail(&self, what: String) {
        self.shared.fail(format!("fuzzer {}: {what}", self.n));
    }

    /// A fresh connection in db 0 or 1, RESP2 or RESP3, in place of `conn`,
    /// which is closed.
    fn reconnect(&mut self) {
        let (db, resp3) = (self.rng.gen_range(0..2), self.rng.gen_bool(0.3));
        match connect_with_id(&self.url, db, resp3) {
            Ok((conn, id)) => {
                (self.conn, self.id, self.session) = (conn, id, None);
                self.shared.ids[self.n].store(id, Ordering::Relaxed);
            }
            Err(e) => self.fail(format!("cannot reconnect: {e}")),
        }
    }

    /// Sends `cmd`; most replies will do. Failures: no reply in time, a
    /// connection the server closed, an error from a `MUST_SUCCEED`
    /// command, an internal command accepted from a client.
    fn run(&mut self, what: &'static str, cmd: &redis::Cmd) {
        *self.counts.entry(what).or_default() += 1;
        let sent = || cmd.get_packed_command().escape_ascii().to_string();
        match cmd.query::<Value>(&mut self.conn) {
            Err(e) if MUST_SUCCEED.contains(&what) && !is_link_error(&e) => self.fail(format!("{what}: {e}")),
            Err(e) => {
                let sent = sent();
                self.check_link(&format!("{what} {}", &sent[..sent.len().min(300)]), &e);
            }
            Ok(reply) if what == "FLOCK.STATE" || what == "FLOCK.ID" => {
                self.fail(format!("{what} from a client was accepted ({reply:?}): {}", sent()))
            }
            Ok(Value::BulkString(id)) if what == "FLOCK.SESSION" => self.session = Some(id),
            Ok(_) => {}
        }
    }

    fn check_link(&mut self, what: &str, e: &redis::RedisError) {
        if is_link_error(e) {
            self.fail(format!("{what}: no reply ({e})"));
            self.reconnect();
        }
    }

    fn key(&mut self) -> Vec<u8> {
        self.keys.choose(&mut self.rng).expect("keys").clone()
    }

    fn owner(&mut self) -> Vec<u8> {
        match self.rng.gen_range(0..40) {
            0 => Vec::new(),
            1 => vec![b'x'; 257],
            2 => vec![b'y'; 256],
            3 => self.junk(),
            _ => OWNERS.choose(&mut self.rng).expect("owners").to_vec(),
        }
    }

    /// A request ID from a small shared set (so that resends and reuse with
    /// another command happen), sometimes fresh, binary or malformed.
    fn request_id(&mut self) -> Vec<u8> {
        match self.rng.gen_range(0..20) {
            0 => Vec::new(),
            1 => vec![b'i'; 65],
            2 => vec![b'j'; 64],
            3 => self.junk(),
            4..=7 => format!("fresh-{}", self.rng.gen::<u64>()).into_bytes(),
            _ => REQUEST_IDS.choose(&mut self.rng).expect("ids").to_vec(),
        }
    }

    /// `ID request-id` a third of the time.
    fn id_option(&mut self) -> Args {
        match self.rng.gen_range(0..3) {
            0 => vec![b"ID".to_vec(), self.request_id()],
            _ => Vec::new(),
        }
    }

    /// Milliseconds, mostly short enough that timers fire during the run;
    /// never 0 (only `drop_mid_wait` may WAIT without limit).
    fn ms(&mut self) -> Vec<u8> {
        let n = match self.rng.gen_range(0..20) {
            0 => return ODD_NUMBERS.choose(&mut self.rng).expect("numbers").to_vec(),
            1 => self.rng.gen_range(201..=MAX_LEASE_MS),
            _ => self.rng.gen_range(1..=200),
        };
        n.to_string().into_bytes()
    }

    fn junk(&mut self) -> Vec<u8> {
        const BYTES: &[u8] = b"\0\r\n\xff\x80 %aW1";
        let len = self.rng.gen_range(0..24);
        (0..len)
            .map(|_| if self.rng.gen_bool(0.5) { *BYTES.choose(&mut self.rng).expect("bytes") } else { self.rng.gen() })
            .collect()
    }

    /// A FLOCK command with its arguments, well-formed most of the time.
    fn flock_args(&mut self) -> (&'static str, Args) {
        let key = self.key();
        let (name, mut args) = match self.rng.gen_range(0..120) {
            0..=44 => {
                let mut args = vec![key, self.owner(), self.ms()];
                for _ in 0..self.rng.gen_range(0..3) {
                    match self.rng.gen_range(0..13) {
                        0..=4 => args.extend([b"WAIT".to_vec(), self.ms()]),
                        5..=7 => args.push(b"SESSION".to_vec()),
                        8 => args.extend([b"wait".to_vec(), self.ms()]),
                        9 if self.rng.gen_bool(0.5) => args.push(self.junk()),
                        10 if self.rng.gen_bool(0.5) => args.push(b"SHARED".to_vec()),
                        // Its own session (when it opened one), or one that is not there.
                        10 => args.extend([
                            b"INBOX".to_vec(),
                            self.session.clone().unwrap_or_else(|| b"0123456789abcdef0123456789abcdef".to_vec()),
                        ]),
                        // Small numbers, so that keys meet both kinds, several limits and n > m.
                        11 => {
                            let (n, m) = (self.rng.gen_range(0..=3u32), self.rng.gen_range(1..=3u32));
                            args.extend([
                                b"PERMITS".to_vec(),
                                n.to_string().into(),
                                b"LIMIT".to_vec(),
                                m.to_string().into(),
                            ]);
                        }
                        _ => args.extend(self.id_option()),
                    }
                }
                ("FLOCK.ACQUIRE", args)
            }
            45..=64 => ("FLOCK.RELEASE", [vec![key, self.owner()], self.id_option()].concat()),
            65..=79 => ("FLOCK.RENEW", [vec![key, self.owner(), self.ms()], self.id_option()].concat()),
            80..=87 => ("FLOCK.FORCERELEASE", [vec![key], self.id_option()].concat()),
            88..=95 => ("FLOCK.INFO", vec![key]),
            // The internal commands, which refuse clients.
            96 => {
                let mut args = vec![key, self.owner()];
                args.extend((0..4).map(|_| self.ms()));
                ("FLOCK.STATE", args)
            }
            97 => {
                let mut args = vec![key, b"semaphore".to_vec(), b"2".to_vec(), self.owner()];
                args.extend((0..5).map(|_| self.ms()));
                ("FLOCK.HOLDER", args)
            }
            98..=99 => {
                let mut args = vec![key, self.request_id()];
                args.extend((0..3).map(|_| self.ms()));
                ("FLOCK.ID", args)
            }
            100..=103 => ("FLOCK.CANCEL", vec![key, self.owner()]),
            // Read with a limit: an INBOX without one could outwait the reply limit.
            104..=106 => ("FLOCK.INBOX", vec![self.rng.gen_range(1..=200u32).to_string().into_bytes()]),
            // Several keys, now and then named twice or miscounted.
            110..=114 => {
                let mut args = self.counted_keys(key);
                args.extend([self.owner(), self.ms()]);
                for _ in 0..self.rng.gen_range(0..3) {
                    match self.rng.gen_range(0..6) {
                        0..=2 => args.extend([b"WAIT".to_vec(), self.ms()]),
                        3 => args.push(b"SESSION".to_vec()),
                        4 => args.push(b"SHARED".to_vec()),
                        _ => args.extend(self.id_option()),
                    }
                }
                ("FLOCK.ACQUIREALL", args)
            }
            115..=117 => {
                let mut args = self.counted_keys(key);
                args.push(self.owner());
                args.extend(self.id_option());
                ("FLOCK.RELEASEALL", args)
            }
            _ => ("FLOCK.SESSION", Vec::new()),
        };
        match self.rng.gen_range(0..30) {
            0 if !args.is_empty() => args.truncate(self.rng.gen_range(0..args.len())),
            1 => args.extend((0..self.rng.gen_range(1..6)).map(|_| self.junk())),
            _ => {}
        }
        (name, args)
    }

    /// `numkeys key [key ...]` starting with `first`: 1 to 3 keys, a
    /// repeated one or a wrong count now and then.
    fn counted_keys(&mut self, first: Vec<u8>) -> Args {
        let mut keys = vec![first];
        keys.extend((0..self.rng.gen_range(0..3)).map(|_| self.key()));
        let n = match self.rng.gen_range(0..20) {
            0 => self.rng.gen_range(0..5),
            _ => keys.len(),
        };
        [vec![n.to_string().into_bytes()], keys].concat()
    }

    fn flock_cmd(&mut self) -> (&'static str, redis::Cmd) {
        let (name, args) = self.flock_args();
        let mut cmd = redis::cmd(name);
        cmd.arg(args);
        (name, cmd)
    }

    fn step(&mut self) {
        match self.rng.gen_range(0..1000) {
            0..=549 => {
                let (name, cmd) = self.flock_cmd();
                self.run(name, &cmd);
            }
            550..=599 => self.drop_mid_wait(),
            600..=629 => self.multi_exec(),
            630..=659 => self.eval(),
            660..=679 => self.keyed("DEL", &[]),
            680..=689 => self.keyed("UNLINK", &[]),
            690..=719 => {
                let (name, to) = (if self.rng.gen_bool(0.8) { "RENAME" } else { "RENAMENX" }, self.key());
                self.keyed(name, &[to]);
            }
            720..=739 => {
                let db = self.rng.gen_range(0..2).to_string().into_bytes();
                self.keyed("MOVE", &[db]);
            }
            740..=749 => self.run("SWAPDB", redis::cmd("SWAPDB").arg(0).arg(1)),
            750..=764 => {
                let mut extra = vec![self.key()];
                if self.rng.gen_bool(0.3) {
                    extra.extend([b"DB".to_vec(), self.rng.gen_range(0..2).to_string().into_bytes()]);
                }
                if self.rng.gen_bool(0.5) {
                    extra.push(b"REPLACE".to_vec());
                }
                self.keyed("COPY", &extra);
            }
            765..=784 => {
                let ms = self.ms();
                self.keyed("PEXPIRE", &[ms]);
            }
            // A plain string, or a lock of another client (`flock.legacy-locks`).
            785..=794 => match self.rng.gen_bool(0.5) {
                true => self.keyed("SET", &[b"v".to_vec()]),
                false => {
                    let ms = self.ms();
                    self.keyed("SET", &[b"legacy".to_vec(), b"NX".to_vec(), b"PX".to_vec(), ms]);
                }
            },
            795..=809 => {
                let name = ["TYPE", "EXISTS", "GET", "PTTL"][self.rng.gen_range(0..4)];
                self.keyed(name, &[]);
            }
            810..=819 => {
                let key = self.key();
                self.run("MEMORY USAGE", redis::cmd("MEMORY").arg("USAGE").arg(key));
            }
            820..=834 => self.dump_restore(),
            835..=839 => {
                let async_ = if self.rng.gen_bool(0.5) { "ASYNC" } else { "SYNC" };
                self.run("FLUSHDB", redis::cmd("FLUSHDB").arg(async_));
            }
            840..=841 => self.run("FLUSHALL", redis::cmd("FLUSHALL").arg("ASYNC")),
            842..=845 => self.run("DEBUG RELOAD", redis::cmd("DEBUG").arg("RELOAD")),
            846..=869 => self.client_unblock_other(),
            870..=879 => self.kill_self(),
            880..=884 => self.sleep_then_release(),
            885..=919 => {
                let db = self.rng.gen_range(0..2);
                self.run("SELECT", redis::cmd("SELECT").arg(db));
            }
            920..=922 => {
                let n = [1, 2, 100_000][self.rng.gen_range(0..3)];
                self.run("CONFIG SET max-waiters", redis::cmd("CONFIG").arg("SET").arg("flock.max-waiters").arg(n));
            }
            923..=924 => {
                let which = ["ttl", "all", "no"][self.rng.gen_range(0..3)];
                self.run(
                    "CONFIG SET legacy-locks",
                    redis::cmd("CONFIG").arg("SET").arg("flock.legacy-locks").arg(which),
                );
            }
            _ => self.pipeline(),
        }
    }

    fn keyed(&mut self, name: &'static str, extra: &[Vec<u8>]) {
        let key = self.key();
        self.run(name, redis::cmd(name).arg(key).arg(extra));
    }

    fn multi_exec(&mut self) {
        let mut pipe = redis::pipe();
        pipe.atomic();
        for _ in 0..self.rng.gen_range(1..5) {
            pipe.add_command(self.flock_cmd().1);
        }
        *self.counts.entry("MULTI/EXEC").or_default() += 1;
        if let Err(e) = pipe.query::<Value>(&mut self.conn) {
            self.check_link("MULTI/EXEC", &e);
        }
    }

    /// Several commands in one packet, sometimes with a pause in the server
    /// before them, so that timers, grants and timeouts meet in one turn.
    fn pipeline(&mut self) {
        let mut pipe = redis::pipe();
        if self.rng.gen_bool(0.1) {
            pipe.cmd("DEBUG").arg("SLEEP").arg(self.rng.gen_range(0..60) as f64 / 1000.0);
        }
        for _ in 0..self.rng.gen_range(2..6) {
            pipe.add_command(self.flock_cmd().1);
        }
        *self.counts.entry("pipeline").or_default() += 1;
        if let Err(e) = pipe.query::<Value>(&mut self.conn) {
            self.check_link("pipeline", &e);
        }
    }

    fn eval(&mut self) {
        let script = if self.rng.gen_bool(0.5) {
            "return redis.call(ARGV[1], KEYS[1], unpack(ARGV, 2))"
        } else {
            "return redis.pcall(ARGV[1], KEYS[1], unpack(ARGV, 2))"
        };
        let (name, args) = self.flock_args();
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(script);
        match args.split_first() {
            Some((key, rest)) => cmd.arg(1).arg(key).arg(name).arg(rest),
            None => cmd.arg(0).arg(name),
        };
        self.run("EVAL", &cmd);
    }

    fn dump_restore(&mut self) {
        let (from, to) = (self.key(), self.key());
        *self.counts.entry("DUMP/RESTORE").or_default() += 1;
        let dumped: RedisResult<Option<Vec<u8>>> = redis::cmd("DUMP").arg(&from).query(&mut self.conn);
        match dumped {
            Ok(Some(blob)) => {
                let mut cmd = redis::cmd("RESTORE");
                cmd.arg(to).arg(0).arg(blob);
                if self.rng.gen_bool(0.7) {
                    self.run("RESTORE REPLACE", cmd.arg("REPLACE"));
                } else {
                    self.run("RESTORE", &cmd);
                }
            }
            Ok(None) => {}
            Err(e) => self.check_link("DUMP", &e),
        }
    }

    fn client_unblock_other(&mut self) {
        let other = self.shared.ids[self.rng.gen_range(0..THREADS)].load(Ordering::Relaxed);
        let mut cmd = redis::cmd("CLIENT");
        cmd.arg("UNBLOCK").arg(other);
        if self.rng.gen_bool(0.5) {
            cmd.arg(if self.rng.gen_bool(0.5) { "TIMEOUT" } else { "ERROR" });
        }
        self.run("CLIENT UNBLOCK", &cmd);
    }

    /// CLIENT KILL of its own connection, from that connection.
    fn kill_self(&mut self) {
        *self.counts.entry("CLIENT KILL self").or_default() += 1;
        let _ = redis::cmd("CLIENT").arg("KILL").arg("ID").arg(self.id).query::<Value>(&mut self.conn);
        self.reconnect();
    }

    /// A RELEASE after a pause in the server, in one packet with a short
    /// WAIT on the same key from another connection (the timeout and the
    /// hand-off come due in the same event-loop turn).
    fn sleep_then_release(&mut self) {
        let (key, owner) = (self.key(), self.owner());
        let waiter = redis::cmd("FLOCK.ACQUIRE").arg(&key).arg(b"sleeper").arg(100).arg("WAIT").arg(20).clone();
        if self.ctl.send_packed_command(&waiter.get_packed_command()).is_err() {
            self.fail("cannot send to the control connection".into());
            return;
        }
        let mut pipe = redis::pipe();
        pipe.cmd("DEBUG").arg("SLEEP").arg(0.05).cmd("FLOCK.RELEASE").arg(&key).arg(owner);
        *self.counts.entry("DEBUG SLEEP + RELEASE").or_default() += 1;
        if let Err(e) = pipe.query::<Value>(&mut self.conn) {
            self.check_link("DEBUG SLEEP + RELEASE", &e);
        }
        if let Err(e) = self.ctl.recv_response() {
            self.fail(format!("the 20 ms WAIT beside DEBUG SLEEP got no reply ({e})"));
            self.reconnect_ctl();
        }
    }

    fn reconnect_ctl(&mut self) {
        match connect_with_id(&self.url, 0, false) {
            Ok((ctl, _)) => self.ctl = ctl,
            Err(e) => self.fail(format!("cannot reconnect: {e}")),
        }
    }

    /// An ACQUIRE with WAIT (0 = no limit, allowed here only) whose
    /// connection is closed, killed or unblocked while it may be waiting.
    fn drop_mid_wait(&mut self) {
        let (key, owner) = (self.key(), self.owner());
        let how = self.rng.gen_range(0..3);
        // CLIENT UNBLOCK may come before the command blocks: then only a
        // finite WAIT ends.
        let wait = if how == 2 { self.rng.gen_range(1..=200) } else { self.rng.gen_range(0..=200) };
        let mut cmd = redis::cmd("FLOCK.ACQUIRE");
        cmd.arg(key).arg(owner).arg(self.rng.gen_range(1..=200)).arg("WAIT").arg(wait);
        if self.rng.gen_bool(0.3) {
            cmd.arg("SESSION");
        }
        *self.counts.entry(["drop mid-wait", "CLIENT KILL mid-wait", "CLIENT UNBLOCK mid-wait"][how]).or_default() += 1;
        if let Err(e) = self.conn.send_packed_command(&cmd.get_packed_command()) {
            self.check_link("send ACQUIRE WAIT", &e);
            return;
        }
        // Not a synchronisation: a random moment to strike, before or
        // after the command blocks.
        std::thread::sleep(Duration::from_millis(self.rng.gen_range(0..20)));
        match how {
            0 => self.reconnect(),
            1 => {
                let killed = redis::cmd("CLIENT").arg("KILL").arg("ID").arg(self.id).query::<Value>(&mut self.ctl);
                if let Err(e) = killed {
                    self.fail(format!("CLIENT KILL ID from the control connection: {e}"));
                    self.reconnect_ctl();
                }
                self.reconnect();
            }
            _ => {
                let unblock = redis::cmd("CLIENT").arg("UNBLOCK").arg(self.id).query::<Value>(&mut self.ctl);
                if let Err(e) = unblock {
                    self.fail(format!("CLIENT UNBLOCK from the control connection: {e}"));
                    self.reconnect_ctl();
                }
                if let Err(e) = self.conn.recv_response() {
                    self.check_link("ACQUIRE WAIT after CLIENT UNBLOCK", &e);
                }
            }
        }
    }

    fn go(mut self) -> BTreeMap<&'static str, u64> {
        while !self.shared.stop.load(Ordering::Relaxed) {
            self.step();
        }
        self.counts
    }
}

/// The lock keys of databases 0 and 1 with their FLOCK.INFO, for a failure.
fn lock_keys(s: &Server) -> String {
    let mut out = format!("{:?}; ", s.info_section("keyspace"));
    for db in 0..2 {
        let mut c = s.conn_db(db);
        let keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap_or_default();
        for key in keys {
            let kind: String = redis::cmd("TYPE").arg(&key).query(&mut c).unwrap_or_default();
            let pttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut c).unwrap_or_default();
            let v: Value = redis::cmd("FLOCK.INFO").arg(&key).query(&mut c).unwrap_or(Value::Nil);
            // FLOCK.INFO is nil without a holder: the size tells a queue or request IDs left.
            let bytes: i64 = redis::cmd("MEMORY").arg("USAGE").arg(&key).query(&mut c).unwrap_or_default();
            out += &format!("db {db} {} {kind} pttl {pttl} {bytes} bytes {v:?}; ", shown(&key));
        }
    }
    out
}

fn settle_and_check(s: &mut Server, r: &mut Server, what: &str) {
    s.assert_alive(what);
    r.assert_alive(&format!("{what}: the replica"));
    wait_until(&format!("{what}: blocked_clients 0"), 10 * SECOND, || s.blocked_clients() == 0);
    wait_until(&format!("{what}: flock_waiters 0"), 10 * SECOND, || s.stat("waiters") == 0);
    // Every lease is at most MAX_LEASE_MS: none may outlive it, nor its
    // entry in the deadline wheel, nor its copy on the replica; nor may a
    // free lock's request IDs outlive the retry window, of the same length.
    let leases_end = Duration::from_millis(MAX_LEASE_MS) + 5 * SECOND;
    for (server, name) in [(&*s, "master"), (&*r, "replica")] {
        let deadline = Instant::now() + leases_end;
        // Free locks' request IDs last the retry window, as long as the leases.
        while server.stat("locks") + server.stat("leases") + server.stat("remembered_free_locks") != 0 {
            if Instant::now() > deadline {
                panic!(
                    "{what}: the {name} keeps locks or leases after every lease ran out: {:?}\nmaster: {}\nreplica: {}",
                    server.stats(),
                    lock_keys(s),
                    lock_keys(r)
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let mut c = s.conn();
    let _: () = redis::cmd("FLUSHALL").query(&mut c).expect("FLUSHALL");
    let synced: i64 = redis::cmd("WAIT").arg(1).arg(5_000).query(&mut c).expect("WAIT");
    assert_eq!(synced, 1, "{what}: the replica acknowledges the FLUSHALL");
    for server in [&*s, &*r] {
        wait_until(&format!("{what}: flock_locks 0 after FLUSHALL"), 5 * SECOND, || server.stat("locks") == 0);
    }
    // Still a working lock service, on a binary name too.
    let key = b"after\0fuzz\xff";
    let t = acquire(&mut c, key, "o", 1_000).expect("ACQUIRE after the fuzz").expect("granted");
    assert!(t > 0);
    assert_eq!(release(&mut c, key, "o").expect("RELEASE after the fuzz"), 0);
    s.assert_alive(what);
    r.assert_alive(&format!("{what}: the replica"));
}

/// About 9 s: the 5 s run, then every lease (at most MAX_LEASE_MS) running
/// out before nothing may be left.
#[test]
fn random_commands_from_many_connections_never_crash_hang_or_strand_anything() {
    let seed = env_num("FLOCK_FUZZ_SEED").unwrap_or_else(rand::random);
    let secs = run_secs("FLOCK_FUZZ_SECS", 5, 20);
    eprintln!("fuzz: seed {seed}, {secs} s, {THREADS} connections (replay: FLOCK_FUZZ_SEED={seed})");
    let what = format!("fuzz seed {seed} (FLOCK_FUZZ_SEED={seed} replays it)");
    let mut s = Server::start_with(&["--logfile", LOG]);
    let mut c = s.conn();
    // Holderless keys that remember request IDs last the retry window.
    for name in ["flock.max-lease-ms", "flock.retry-window-ms"] {
        config_set(&mut c, &[(name, &MAX_LEASE_MS.to_string())]);
    }
    drop(c);
    // A replica applies everything the master propagates, binary names too.
    let mut r = Server::replica_with(&s, &["--logfile", LOG]);

    let shared = Arc::new(Shared {
        stop: AtomicBool::new(false),
        ids: (0..THREADS).map(|_| AtomicU64::new(0)).collect(),
        failures: Mutex::new(Vec::new()),
        counts: Mutex::new(BTreeMap::new()),
    });
    let keys = Arc::new(keys());
    let threads: Vec<_> = (0..THREADS)
        .map(|n| {
            let (url, keys, shared) = (s.url(), keys.clone(), shared.clone());
            std::thread::spawn(move || match Fuzzer::new(n, seed, url, keys, shared.clone()) {
                Ok(fuzzer) => {
                    for (k, v) in fuzzer.go() {
                        *shared.counts.lock().unwrap().entry(k).or_default() += v;
                    }
                }
                Err(e) => shared.fail(format!("fuzzer {n}: cannot connect: {e}")),
            })
        })
        .collect();

    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end && s.running() && r.running() && shared.failures.lock().unwrap().is_empty() {
        std::thread::sleep(Duration::from_millis(50));
    }
    shared.stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("fuzzer thread");
    }
    let counts = shared.counts.lock().unwrap().clone();
    eprintln!("fuzz: {} commands: {counts:?}", counts.values().sum::<u64>());
    for (server, name) in [(&mut s, "master"), (&mut r, "replica")] {
        if !server.running() {
            panic!("{what}: the {name} redis-server exited; its log says:\n{}", server.log_excerpt(LOG));
        }
    }
    let failures = shared.failures.lock().unwrap().clone();
    assert!(failures.is_empty(), "{what}: {failures:#?}\nserver log ends:\n{}", s.log_excerpt(LOG));
    settle_and_check(&mut s, &mut r, &what);
}
