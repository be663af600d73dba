//! The examples and the README's redis-cli session, run against a real
//! server: examples/walkthrough.redis through redis-cli and the Rust client
//! example (crate flock-client). The Java, Python and Node clients run their
//! README examples in their own suites (clients/<language>).

use crate::common::*;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn project_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(name)
}

fn stdout_of(what: &str, out: Output) -> String {
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{what} failed ({}):\n{stdout}\n{stderr}", out.status);
    stdout.into_owned()
}

/// Compares printed and real redis-cli output line by line. Fencing tokens
/// (integers of 16 or more digits) differ from run to run: each printed
/// token must stand for one real token, in the same order; a `ttl-ms` value
/// may be any lease left up to `max_ttl`, and the times FLOCK.INFO counts
/// (`held-ms`, `oldest-wait-ms`, `contended-ms` and the longest) any, as
/// may the figures of an `INFO flock` distribution.
#[derive(Default)]
struct Transcript {
    /// printed token -> real token
    tokens: BTreeMap<u64, u64>,
}

impl Transcript {
    fn token(word: &str) -> Option<u64> {
        word.parse().ok().filter(|_| word.len() >= 16)
    }

    fn compare(&mut self, what: &str, printed: &[&str], real: &[&str], max_ttl: u64) {
        assert_eq!(printed.len(), real.len(), "{what}: printed\n{}\nbut got\n{}", printed.join("\n"), real.join("\n"));
        let (mut after_ttl, mut after_time) = (false, false);
        for (p, r) in printed.iter().zip(real) {
            let (pw, rw): (Vec<&str>, Vec<&str>) = (p.split_whitespace().collect(), r.split_whitespace().collect());
            if let (Some((p_name, _)), Some((r_name, _))) = (distribution(p), distribution(r)) {
                assert_eq!(p_name, r_name, "{what}: printed `{p}`, got `{r}`");
                continue;
            }
            let same = pw.len() == rw.len()
                && pw.iter().zip(&rw).all(|(p, r)| {
                    p == r
                        || match (Self::token(p), Self::token(r)) {
                            (Some(p), Some(r)) => *self.tokens.entry(p).or_insert(r) == r,
                            _ if after_time => r.parse::<u64>().is_ok(),
                            _ => after_ttl && r.parse::<u64>().is_ok_and(|ttl| ttl > 0 && ttl <= max_ttl),
                        }
                });
            assert!(same, "{what}: printed `{p}`, got `{r}`");
            let field = p.trim_end_matches('"');
            after_ttl = field.ends_with("ttl-ms");
            after_time = ["held-ms", "oldest-wait-ms", "contended-ms", "longest-wait-ms", "longest-hold-ms"]
                .iter()
                .any(|f| field.ends_with(f));
        }
        let real: Vec<u64> = self.tokens.values().copied().collect();
        assert!(real.windows(2).all(|w| w[0] < w[1]), "{what}: tokens grow as printed: {:?}", self.tokens);
    }
}

/// The name of an `INFO flock` distribution's line.
fn distribution(line: &str) -> Option<(&str, &str)> {
    line.split_once(':').filter(|(name, _)| name.contains("_percentiles_usec"))
}

// ------------------------------------------------------ redis-cli session

fn redis_cli(s: &Server, args: &[&str]) -> Command {
    let mut cmd = Command::new("redis-cli");
    cmd.args(["-p", &s.port.to_string()]).args(args);
    cmd
}

#[test]
fn walkthrough_script_prints_the_expected_session() {
    let s = Server::start();
    let script = std::fs::File::open(project_file("examples/walkthrough.redis")).unwrap();
    let out = redis_cli(&s, &[]).stdin(script).output().expect("run redis-cli (`make deps`)");
    let real = stdout_of("redis-cli < examples/walkthrough.redis", out);
    let real: Vec<&str> = real.lines().collect();
    // Token T1 (worker-1's) is printed 4 times, T2 (worker-2's, larger) once;
    // the NOTOWNER line is checked for its start only.
    let notowner = real.iter().position(|l| l.starts_with("NOTOWNER ")).expect("a NOTOWNER line");
    assert!(real[notowner].starts_with("NOTOWNER the lock is not held by this owner"), "{}", real[notowner]);
    let mut real = real;
    real[notowner] = "NOTOWNER ...";
    let expected = WALKTHROUGH.lines().skip(1).collect::<Vec<_>>();
    Transcript::default().compare("walkthrough", &expected, &real, 30_000);
}

/// What `redis-cli < examples/walkthrough.redis` prints on a fresh server
/// (redis-cli without a terminal prints raw replies: nil as an empty line).
const WALKTHROUGH: &str = r#"
== FLOCK walkthrough: run it with  redis-cli < examples/walkthrough.redis  (or make example-cli)
-- 0. clear what an earlier run may have left (DEL answers 0 or 1):
0
-- 1. worker-1 takes the free lock; the reply is its fencing token:
1000000000000001
-- 2. worker-2 only tries (no WAIT): the lock is busy, so the reply is nil (an empty line) and nothing is queued:

-- 3. worker-2 waits up to 100 ms (WAIT 100): queued, blocked, nil when the time is up:

-- 4. worker-1 again: reentrant, same token, holds = 2:
1000000000000001
-- 5. the lock: owner, holds, token, ttl-ms, session, waiters, queue, then mode, limit, each holder, delayed-ms and its times:
owner
worker-1
holds
2
token
1000000000000001
ttl-ms
30000
session
0
waiters
0
queue

mode
exclusive
limit
0
holders
owner
worker-1
holds
2
token
1000000000000001
ttl-ms
30000
session
0
permits
0
lock-delay-ms
0
delayed-ms
0
held-ms
0
oldest-wait-ms
0
contended-ms
0
handoffs
0
waits-ended
0
longest-wait-ms
0
longest-hold-ms
0
-- 6. a renewal resets the lease and answers the current token:
1000000000000001
-- 7. release twice: the holds left, 1 then 0 (free; with nobody queued the key is gone):
1
0
0
-- 8. worker-1 is not the holder any more:
NOTOWNER ...

-- 9. worker-2 takes it now, with a larger token:
1000000000000002
-- 10. an administrator takes it away (1 = a holder was removed):
1
-- 11. server-wide counters:
# flock
flock_locks:0
flock_waiters:0
flock_leases:0
flock_grants:2
flock_immediate_grants:2
flock_handoffs:0
flock_reentrant_acquires:1
flock_releases:1
flock_lease_expiries:0
flock_force_releases:1
flock_session_releases:0
flock_deletions:0
flock_undelivered_grants:0
flock_wait_timeouts:1
flock_wait_disconnects:0
flock_waiters_deleted:0
flock_waiters_demoted:0
flock_waiters_resent:0
flock_wait_cancels:0
flock_deadlocks:0
flock_session_expiries:0
flock_lock_delays:0
flock_handoff_latency_mean_us:0
flock_handoff_latency_max_us:0
flock_eviction_unsafe:0
flock_eviction_refused_acquires:0
flock_sessions:0
flock_remembered_free_locks:0
flock_clock_steps:0
flock_contended_locks:0
flock_longlog_len:0
flock_wait_percentiles_usec:p50=100863.000,p90=100863.000,p99=100863.000,p99.9=100863.000,max=100863.000
flock_hold_percentiles_usec:p50=0.000,p90=101375.000,p99=101375.000,p99.9=101375.000,max=101375.000
flock_handoff_percentiles_usec:p50=0.000,p90=0.000,p99=0.000,p99.9=0.000,max=0.000
flock_wait_percentiles_usec_timeout:p50=100863.000,p90=100863.000,p99=100863.000,p99.9=100863.000,max=100863.000
flock_hold_percentiles_usec_released:p50=101375.000,p90=101375.000,p99=101375.000,p99.9=101375.000,max=101375.000
flock_hold_percentiles_usec_forcereleased:p50=0.000,p90=0.000,p99=0.000,p99.9=0.000,max=0.000"#;

/// A command typed at the prompt (none: output of an earlier command) and
/// the lines printed after it.
type Step = (Option<Vec<String>>, Vec<String>);

/// The ```text blocks of one README section, as steps.
fn readme_blocks(section: &str) -> Vec<Vec<Step>> {
    let readme = std::fs::read_to_string(project_file("README.md")).unwrap();
    let start = readme.find(section).unwrap_or_else(|| panic!("README has {section}"));
    let body = &readme[start + section.len()..];
    let body = &body[..body.find("\n## ").unwrap_or(body.len())];
    body.split("```text\n")
        .skip(1)
        .map(|block| {
            let mut steps: Vec<Step> = Vec::new();
            for line in block[..block.find("```").expect("closed block")].lines() {
                if let Some(cmd) = line.strip_prefix("127.0.0.1:6379> ") {
                    let cmd = cmd.split(" #").next().unwrap();
                    steps.push((Some(cmd.split_whitespace().map(String::from).collect()), Vec::new()));
                } else if !line.starts_with("$ ") {
                    if steps.is_empty() {
                        steps.push((None, Vec::new()));
                    }
                    steps.last_mut().unwrap().1.push(line.to_string());
                }
            }
            steps
        })
        .collect()
}

/// Runs the README's "A redis-cli session" as printed: each command through
/// `redis-cli --no-raw` (the formatting of an interactive session), the one
/// that waits in the background, its output when the next block shows it.
#[test]
fn readme_session_runs_as_printed() {
    let s = Server::start();
    let mut c = s.conn();
    let mut transcript = Transcript::default();
    let mut waiting = None;
    let mut ran = 0;
    for steps in readme_blocks("## A redis-cli session") {
        for (cmd, printed) in steps {
            let printed: Vec<&str> = printed.iter().map(String::as_str).collect();
            let Some(cmd) = cmd else {
                // The output of the command waiting in the other redis-cli.
                let child: std::process::Child = waiting.take().expect("a waiting command for this output");
                let real = stdout_of("waiting redis-cli", child.wait_with_output().unwrap());
                let printed: Vec<&str> =
                    printed.into_iter().filter(|l| !(l.starts_with('(') && l.ends_with("s)"))).collect();
                transcript.compare("the waiting redis-cli", &printed, &real.lines().collect::<Vec<_>>(), 30_000);
                continue;
            };
            let args: Vec<&str> = cmd.iter().map(String::as_str).collect();
            let mut run = redis_cli(&s, &["--no-raw"]);
            run.args(&args);
            ran += 1;
            if printed.is_empty() {
                // Blocks (WAIT 0): start it and go on once it is queued.
                waiting = Some(run.stdout(Stdio::piped()).spawn().unwrap());
                wait_until("the README's waiter to queue", 5 * SECOND, || !queue_of(&mut c, args[1]).is_empty());
                continue;
            }
            let real = stdout_of(&args.join(" "), run.output().unwrap());
            transcript.compare(&args.join(" "), &printed, &real.lines().collect::<Vec<_>>(), 30_000);
        }
    }
    assert!(ran >= 7 && waiting.is_none(), "the README session has its commands and the waiter's output");
    // "... and `FLOCK.RELEASE orders worker-1` now answers `(error) NOTOWNER ...`"
    let readme = std::fs::read_to_string(project_file("README.md")).unwrap();
    let printed = "`(error) NOTOWNER the lock is not held by this owner (...)`";
    assert!(readme.contains(printed), "README shows {printed}");
    let real = redis_cli(&s, &["--no-raw", "FLOCK.RELEASE", "orders", "worker-1"]).output().unwrap();
    let real = String::from_utf8_lossy(&real.stdout);
    assert!(real.starts_with("(error) NOTOWNER the lock is not held by this owner ("), "{real}");
}

/// The examples release what they take, and a free lock leaves no key.
fn assert_no_lock_left(s: &Server) {
    let mut c = s.conn();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
    assert!(keys.is_empty(), "the example leaves keys behind: {keys:?}");
}

// -------------------------------------------------------------------- Rust

/// examples/client.rs, compiled into this test (its `main` stays unused).
#[path = "../../examples/client.rs"]
mod client_example;

#[test]
fn rust_client_example_runs() {
    let s = Server::start();
    client_example::run(&s.url()).expect("examples/client.rs");
    assert_no_lock_left(&s);
    assert_eq!(s.stat("handoffs"), 1);
    assert_eq!(s.stat("force_releases"), 1);
}
