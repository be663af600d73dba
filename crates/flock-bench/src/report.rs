//! The results as people read them: Markdown tables on stdout (pasted into
//! docs/benchmark.md as they are), and CSV files, the tables and a chart under the
//! output directory.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use redis::RedisResult;

use crate::config::Config;
use crate::results::{combine, Sample};
use crate::scenarios::{backlog, expiry, philosophers, scale, shared, vanished, waiters};
use crate::server::{field, info, Server};
use crate::{chart, targets};

/// Where the numbers were measured.
pub struct Machine {
    pub date: String,
    pub cpu: String,
    pub cores: usize,
    pub server: String,
}

impl Machine {
    pub fn describe(server: &Server) -> RedisResult<Machine> {
        let date = std::process::Command::new("date")
            .args(["-u", "+%Y-%m-%d %H:%M UTC"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_else(|_| "unknown date".into());
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|l| Some(l.strip_prefix("model name")?.split_once(':')?.1.trim().to_string()))
            .unwrap_or_else(|| "unknown CPU".into());
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let server_info = info(&mut server.connect()?, "server")?;
        // Valkey also reports the Redis version it is compatible with (7.2.4).
        let server = match field(&server_info, "valkey_version") {
            Some(v) => format!("Valkey {v}"),
            None => format!("Redis {}", field(&server_info, "redis_version").unwrap_or("?")),
        };
        Ok(Machine { date, cpu, cores, server })
    }
}

/// What each scenario's columns mean, by scenario name prefix.
fn legend(scenario: &str, config: &Config) -> String {
    let name = scenario.split_whitespace().next().unwrap_or(scenario);
    match name {
        "ping" => "PING round trips: the ceiling for one command per round trip.".into(),
        "fenced" => "Each client holds a lock of its own and writes a key of its own, one command per round trip: \
             set sends SET key value, fenced sends FLOCK.FENCED lock token SET key value."
            .into(),
        "uncontended" => "Each client locks and unlocks a key of its own; acquire latency; \
             server us/pair: time redis-server spent in commands (INFO commandstats) per pair."
            .into(),
        "contended" => "All clients on one key, each holding it for the hold time (busy, as work is; `hold us` is what it took). \
             handoff: from the release being sent to the next holder seeing its grant. \
             out of order: grants to a client while one that had joined over 1 ms earlier still waited. \
             max/min grants: most over fewest grants per client. req/grant: requests sent per grant, release included. \
             server us/grant: time redis-server spent in commands (INFO commandstats) per grant."
            .into(),
        "rwlock" | "semaphore" => format!(
            "All clients on one key, holding it {} us each time (busy): {}. \
             handoff: from the last release sent before a grant to the grant, for a client that was waiting at that release. \
             wait max: the longest from joining to the grant. exclusion broken: grants seen while the holds seen excluded them \
             (a write while anyone held, anything while a writer held, a permit beyond the limit). out of order: grants to a client while one that had joined over 1 ms \
             earlier still waited and was granted over 1 ms later (holders granted in one turn see their grants in some order); \
             the clients of overlapping holds can see a grant late by as long as the scheduler keeps them off a core. \
             out of order by token: the same in the order of the fencing tokens, the server's grant order (flock only). \
             max/min grants, req/grant and server us/grant as in contended.",
            shared::HOLD_NS / 1000,
            if name == "rwlock" {
                format!(
                    "one acquisition in {} is a write, the others reads (FLOCK: SHARED); writes %: the share of grants that were writes",
                    shared::WRITE_EVERY
                )
            } else {
                format!(
                    "a semaphore of {} permits, one per client (FLOCK: PERMITS 1 LIMIT {}); redisson is RSemaphore (no lease), \
                     redisson-expirable RPermitExpirableSemaphore",
                    shared::LIMIT,
                    shared::LIMIT
                )
            }
        ),
        "expiry" => format!(
            "Holders never release (lease {} ms); each client queues again under a new name. \
             delay: from a lease's end to the next grant. max req waiting: most requests a waiter sent between joining and its grant.",
            expiry::LEASE_MS
        ),
        "vanished" => format!(
            "A process holding a lock through its session (lease-ms 0) and waiting for another vanishes: its connections stay \
             open and silent, as behind a partition. Its session has a {} ms timeout; {} trials. freed late: from the last command \
             on its session's connection to the next waiter's grant, less the timeout. waits left: trials in which its own wait \
             had left the other lock's queue by then.",
            vanished::TIMEOUT_MS,
            vanished::TRIALS
        ),
        "backlog" => format!(
            "The leases, {} ms each, taken by scripts in one pipeline that then sleeps {} ms (DEBUG SLEEP: the event loop was busy), \
             all due at once when it wakes; setnx: SET NX PX keys, ended by Redis's active expiry. all ended: until DBSIZE is 0. \
             A pinger sends PING after PING meanwhile: ping p99 and max, its waits; overrun, the longest time without a reply; \
             pings: how many were answered.",
            backlog::LEASE_MS,
            backlog::SLEEP_MS
        ),
        "waiters" => format!(
            "One process with {} waiters on one held lock, on a fresh server each: flock-blocking, a connection per waiter in \
             FLOCK.ACQUIRE ... WAIT (open files permitting); flock-session, every wait sent on one connection with INBOX session-id, \
             read on the session's; redisson-shared, the Redisson port's tries on one connection and every waiter's channel \
             subscribed on one shared pub/sub connection, as Redisson waits. connections added: INFO connected_clients after parking \
             minus before. bytes/waiter: INFO used_memory after minus before, over the waiters, once idle buffers shrank. \
             Through the session, the first {} waiters are then granted one by one: grants out of order, hand-off p50 from a \
             RELEASE sent to the grant read from the inbox (a blocked FLOCK.INBOX), and PING p50 on the same connection, sent just before each RELEASE. \
             first and last waits: the server's time (INFO commandstats) per wait queued, in the first batch of {} sent and in the last.",
            config.size.waiters,
            waiters::HANDOFFS,
            waiters::BATCH
        ),
        "philosophers" => format!(
            "N clients over N keys (fork:0 ..), each again and again taking two keys picked at random, holding both {} us \
             (busy) and letting go. flock-acquireall: one FLOCK.ACQUIREALL 2 a b ... WAIT; flock-key-order: two FLOCK.ACQUIRE ... \
             WAIT in key order; redisson-multilock: a port of RedissonMultiLock.lock() (the locks one by one in the order picked, \
             each waiting at most the round's time left; one that does not come releases the others and the round starts over: \
             a retry; a round of {} ms out of time: a timeout, and another round). wait: from the first request of a take to \
             holding both keys.",
            philosophers::HOLD_NS / 1000,
            philosophers::MULTILOCK_ROUND_MS
        ),
        _ => format!(
            "{} idle held locks, then up to {} waiters on one lock (open files permitting). bytes: INFO used_memory before and after, \
             for waiters with their connections open before and after, once idle buffers have shrunk. A lone client's acquire+release pairs on an empty server \
             (pair p50 us as it saw them, server us/pair from INFO commandstats) and, in {} rounds alternating with it, on a server \
             holding the locks or the waiters: server x = the median of the rounds' cost ratios.",
            config.size.locks, config.size.waiters, scale::PROBE_ROUNDS
        ),
    }
}

fn number(v: f64) -> String {
    match v {
        v if v.is_nan() => "-".into(),
        v if v.is_infinite() => "inf".into(),
        v if v.abs() >= 100.0 => format!("{v:.0}"),
        v if v.abs() >= 10.0 => format!("{v:.1}"),
        v => format!("{v:.2}"),
    }
}

fn table(rows: &[&Sample]) -> String {
    let metrics: Vec<&str> = rows[0].values.iter().map(|(m, _)| m.name).collect();
    let mut out = format!("| method | clients | {} |\n", metrics.join(" | "));
    let _ = writeln!(out, "|---|---:|{}", "---:|".repeat(metrics.len()));
    for row in rows {
        let cells: Vec<String> = row.values.iter().map(|&(_, v)| number(v)).collect();
        let _ = writeln!(out, "| {} | {} | {} |", row.method, row.clients, cells.join(" | "));
    }
    out
}

/// The whole report, as Markdown.
pub fn render(config: &Config, machine: &Machine, samples: &[Sample], elapsed: Duration) -> String {
    let rows = combine(samples);
    let mut out = format!(
        "{} · {} ({} cores) · {} · load generator on the same machine · {} repeat(s) of {:.1} s per run, {:.0} s in all.\n\
         Cells are medians of the repeats, except `max` columns, out-of-order counts, max/min and request counts: the worst repeat.\n",
        machine.date, machine.cpu, machine.cores, machine.server, config.repeats, config.duration.as_secs_f64(), elapsed.as_secs_f64()
    );
    let mut scenarios: Vec<&str> = rows.iter().map(|r| r.scenario.as_str()).collect();
    scenarios.dedup();
    for scenario in scenarios {
        let of: Vec<&Sample> = rows.iter().filter(|r| r.scenario == scenario).collect();
        let _ = write!(out, "\n#### {scenario}\n\n{}\n\n{}", legend(scenario, config), table(&of));
    }
    let checks = targets::check(samples, &rows);
    if !checks.is_empty() {
        out.push_str("\n#### targets (issues 4, 13, 23, 30 and 31)\n\nRatios are medians of per-repeat ratios between methods run back to back.\n\n| target | FLOCK | met |\n|---|---|---|\n");
        for c in checks {
            let _ = writeln!(out, "| {} | {} | {} |", c.target, c.measured, if c.met { "yes" } else { "**no**" });
        }
    }
    out
}

/// Writes every sample and the combined rows as CSV, the report and the chart into `dir`.
pub fn write_files(dir: &Path, samples: &[Sample], report: &str) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(dir)?;
    let csv = |samples: &[Sample], repeat_column: &str| {
        let mut out = format!("scenario,method,clients,{repeat_column},metric,value\n");
        for s in samples {
            for (metric, value) in &s.values {
                let _ = writeln!(out, "{},{},{},{},{},{value}", s.scenario, s.method, s.clients, s.repeat, metric.name);
            }
        }
        out
    };
    let rows = combine(samples);
    std::fs::write(dir.join("samples.csv"), csv(samples, "repeat"))?;
    std::fs::write(dir.join("summary.csv"), csv(&rows, "repeats"))?;
    std::fs::write(dir.join("results.md"), report)?;
    chart::draw(&rows, &dir.join("contended.svg"))?;
    eprintln!("wrote samples.csv, summary.csv, results.md and contended.svg in {}", dir.display());
    Ok(())
}
