//! What operators see: INFO flock, keyspace notifications, COMMAND DOCS and
//! COMMAND INFO, COMMAND GETKEYS, module configuration (load arguments and
//! CONFIG GET/SET), MEMORY USAGE and MODULE LIST.

use crate::common::*;

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const MS: Duration = Duration::from_millis(1);

// ---------------------------------------------------------------- INFO flock

/// Every field of `INFO flock`, in order (Redis adds the `flock_` prefix).
const INFO_FIELDS: [&str; 34] = [
    "locks",
    "waiters",
    "leases",
    "grants",
    "immediate_grants",
    "handoffs",
    "reentrant_acquires",
    "releases",
    "lease_expiries",
    "force_releases",
    "session_releases",
    "deletions",
    "undelivered_grants",
    "wait_timeouts",
    "wait_disconnects",
    "waiters_deleted",
    "waiters_demoted",
    "waiters_resent",
    "wait_cancels",
    "deadlocks",
    "session_expiries",
    "lock_delays",
    "handoff_latency_mean_us",
    "handoff_latency_max_us",
    "eviction_unsafe",
    "eviction_refused_acquires",
    "sessions",
    "remembered_free_locks",
    "clock_steps",
    "contended_locks",
    "longlog_len",
    "wait_percentiles_usec",
    "hold_percentiles_usec",
    "handoff_percentiles_usec",
];

#[test]
fn info_flock_lists_every_field_in_order_starting_at_zero() {
    let s = Server::start();
    let text: String = redis::cmd("INFO").arg("flock").query(&mut s.conn()).unwrap();
    let mut lines = text.lines().filter(|l| !l.is_empty());
    assert_eq!(lines.next(), Some("# flock"));
    let fields: Vec<(&str, &str)> = lines.map(|l| l.split_once(':').expect("field:value")).collect();
    let names: Vec<&str> = fields.iter().map(|(k, _)| k.strip_prefix("flock_").expect("flock_ prefix")).collect();
    assert_eq!(names, INFO_FIELDS);
    let zero = |v: &str| v == "0" || v == "p50=0.000,p90=0.000,p99=0.000,p99.9=0.000,max=0.000";
    assert!(fields.iter().all(|(_, v)| zero(v)), "fresh server: {fields:?}");
    // Also part of plain INFO (and of INFO modules / INFO everything).
    let all: String = redis::cmd("INFO").arg("everything").query(&mut s.conn()).unwrap();
    assert!(all.contains("flock_grants:0"));
}

/// The counters (and gauges) of `INFO flock`, without the latencies and
/// the contended locks (tests/integration/operator_view.rs follows those).
fn counters(s: &Server) -> BTreeMap<String, i64> {
    s.stats().into_iter().filter(|(k, _)| !k.starts_with("handoff_latency") && k != "contended_locks").collect()
}

/// Asserts that since `before` exactly the `changed` fields moved, by the
/// given amounts; returns the new snapshot.
fn assert_delta(
    s: &Server,
    before: &BTreeMap<String, i64>,
    step: &str,
    changed: &[(&str, i64)],
) -> BTreeMap<String, i64> {
    let after = counters(s);
    // Every lock here is held, so each has its lease filed; the rest must
    // move exactly as `changed` says.
    assert_eq!(after["leases"], after["locks"], "one lease filed per held lock after: {step}");
    let delta: BTreeMap<&str, i64> = after
        .iter()
        .filter(|(k, _)| *k != "leases")
        .map(|(k, v)| (k.as_str(), v - before[k]))
        .filter(|(_, d)| *d != 0)
        .collect();
    let expected: BTreeMap<&str, i64> = changed.iter().copied().collect();
    assert_eq!(delta, expected, "INFO flock change after: {step}");
    after
}

#[test]
fn info_flock_counts_each_kind_of_event() {
    let s = Server::start();
    let mut c = s.conn();
    let mut snap = counters(&s);

    acquire(&mut c, "L", "a", 10_000).unwrap().unwrap();
    snap = assert_delta(&s, &snap, "immediate grant", &[("locks", 1), ("grants", 1), ("immediate_grants", 1)]);
    acquire(&mut c, "L", "a", 10_000).unwrap().unwrap();
    snap = assert_delta(&s, &snap, "reentrant acquire", &[("reentrant_acquires", 1)]);
    let w = spawn_waiter(&s, "L", "w", 10_000, 0);
    wait_queue(&mut c, "L", &["w"]);
    snap = assert_delta(&s, &snap, "a waiter queues", &[("waiters", 1)]);
    release(&mut c, "L", "a").unwrap();
    snap = assert_delta(&s, &snap, "release of one of two holds", &[]);
    release(&mut c, "L", "a").unwrap();
    w.join().unwrap().unwrap().expect("handed over");
    snap = assert_delta(&s, &snap, "hand-off", &[("waiters", -1), ("releases", 1), ("grants", 1), ("handoffs", 1)]);
    let stats = s.stats();
    let (mean, max) = (stats["handoff_latency_mean_us"], stats["handoff_latency_max_us"]);
    assert!(mean <= max && max < 1_000_000, "hand-off latency mean {mean} µs, max {max} µs");
    release(&mut c, "L", "w").unwrap();
    snap = assert_delta(&s, &snap, "last release", &[("locks", -1), ("releases", 1)]);

    acquire(&mut c, "E", "e", 30).unwrap().unwrap();
    wait_until("lease of E to end", 2 * SECOND, || info(&mut c, "E").is_none());
    snap = assert_delta(&s, &snap, "lease expiry", &[("grants", 1), ("immediate_grants", 1), ("lease_expiries", 1)]);

    acquire(&mut c, "T", "h", 10_000).unwrap().unwrap();
    assert_eq!(acquire_wait(&mut c, "T", "x", 10_000, 30).unwrap(), None);
    snap = assert_delta(
        &s,
        &snap,
        "wait timeout",
        &[("locks", 1), ("grants", 1), ("immediate_grants", 1), ("wait_timeouts", 1)],
    );

    let mut doomed = s.conn();
    let id: i64 = redis::cmd("CLIENT").arg("ID").query(&mut doomed).unwrap();
    let gone = std::thread::spawn(move || acquire_wait(&mut doomed, "T", "d", 10_000, 0));
    wait_queue(&mut c, "T", &["d"]);
    let _: i64 = redis::cmd("CLIENT").arg("KILL").arg("ID").arg(id).query(&mut c).unwrap();
    assert!(gone.join().unwrap().is_err(), "the killed waiter's connection failed");
    wait_until("the killed waiter to leave", 2 * SECOND, || queue_of(&mut c, "T").is_empty());
    snap = assert_delta(&s, &snap, "waiter disconnect", &[("wait_disconnects", 1)]);

    assert_eq!(force_release(&mut c, "T").unwrap(), 1);
    snap = assert_delta(&s, &snap, "force release", &[("locks", -1), ("force_releases", 1)]);

    let mut session = s.conn();
    let _: i64 = redis::cmd("FLOCK.ACQUIRE").arg("S").arg("o").arg(10_000).arg("SESSION").query(&mut session).unwrap();
    drop(session);
    wait_until("the session lock to go", 2 * SECOND, || info(&mut c, "S").is_none());
    snap = assert_delta(&s, &snap, "session close", &[("grants", 1), ("immediate_grants", 1), ("session_releases", 1)]);

    acquire(&mut c, "D", "h", 10_000).unwrap().unwrap();
    let w = spawn_waiter(&s, "D", "w", 10_000, 0);
    wait_queue(&mut c, "D", &["w"]);
    let _: i64 = redis::cmd("DEL").arg("D").query(&mut c).unwrap();
    assert_eq!(error_code(&w.join().unwrap().unwrap_err()), "LOCKDELETED");
    assert_delta(
        &s,
        &snap,
        "DEL of a held lock with a waiter",
        &[("grants", 1), ("immediate_grants", 1), ("deletions", 1), ("waiters_deleted", 1)],
    );
}

// ------------------------------------------------- keyspace notifications

/// The next `n` (channel, payload) messages of a subscription.
fn messages(sub: &mut redis::PubSub, n: usize) -> Vec<(String, String)> {
    sub.set_read_timeout(Some(2 * SECOND)).unwrap();
    (0..n)
        .map(|i| {
            let m = sub.get_message().unwrap_or_else(|e| panic!("message {} of {n}: {e}", i + 1));
            (m.get_channel_name().to_string(), m.get_payload().unwrap())
        })
        .collect()
}

fn assert_no_message(sub: &mut redis::PubSub) {
    sub.set_read_timeout(Some(200 * MS)).unwrap();
    if let Ok(m) = sub.get_message() {
        panic!("unexpected message on {}: {:?}", m.get_channel_name(), m.get_payload::<String>());
    }
}

#[test]
fn keyspace_events_for_grant_handoff_release_and_expiry() {
    let s = Server::start();
    let mut c = s.conn();
    config_set(&mut c, &[("notify-keyspace-events", "Ed")]);
    let mut sub_conn = s.conn();
    let mut sub = sub_conn.as_pubsub();
    sub.psubscribe("__keyevent@*__:flock.*").unwrap();

    acquire(&mut c, "L", "a", 10_000).unwrap().unwrap();
    acquire(&mut c, "L", "a", 10_000).unwrap().unwrap(); // reentrant: no event
    renew(&mut c, "L", "a", 10_000).unwrap(); // no event
    let w = spawn_waiter(&s, "L", "w", 50, 0);
    wait_queue(&mut c, "L", &["w"]);
    release(&mut c, "L", "a").unwrap(); // one hold left: no event
    release(&mut c, "L", "a").unwrap(); // released, handed to w
    w.join().unwrap().unwrap().unwrap();
    wait_until("w's lease to end", 2 * SECOND, || info(&mut c, "L").is_none());
    acquire(&mut c, "L", "b", 10_000).unwrap().unwrap();
    force_release(&mut c, "L").unwrap();
    // An expiry that hands the lock to a waiter.
    acquire(&mut c, "M", "x", 50).unwrap().unwrap();
    let y = spawn_waiter(&s, "M", "y", 10_000, 0);
    y.join().unwrap().unwrap().unwrap();
    release(&mut c, "M", "y").unwrap();

    let events = [
        ("acquired", "L"),
        ("released", "L"),
        ("acquired", "L"),
        ("expired", "L"),
        ("acquired", "L"),
        ("released", "L"),
        ("acquired", "M"),
        ("expired", "M"),
        ("acquired", "M"),
        ("released", "M"),
    ];
    let expected: Vec<(String, String)> =
        events.iter().map(|(e, k)| (format!("__keyevent@0__:flock.{e}"), k.to_string())).collect();
    assert_eq!(messages(&mut sub, events.len()), expected);
    assert_no_message(&mut sub);
}

#[test]
fn keyspace_channel_and_disabled_notifications() {
    let s = Server::start();
    let mut c = s.conn();
    // Off by default: nothing is published.
    let mut sub_conn = s.conn();
    let mut sub = sub_conn.as_pubsub();
    sub.psubscribe("__key*__:*").unwrap();
    acquire(&mut c, "K", "a", 10_000).unwrap().unwrap();
    release(&mut c, "K", "a").unwrap();
    assert_no_message(&mut sub);
    // `K` (keyspace channel) with `d` (module events): the event is the payload.
    config_set(&mut c, &[("notify-keyspace-events", "Kd")]);
    acquire(&mut c, "K", "a", 10_000).unwrap().unwrap();
    release(&mut c, "K", "a").unwrap();
    let expected = [("__keyspace@0__:K", "flock.acquired"), ("__keyspace@0__:K", "flock.released")];
    let expected: Vec<(String, String)> = expected.iter().map(|(c, p)| (c.to_string(), p.to_string())).collect();
    assert_eq!(messages(&mut sub, 2), expected);
}

// ------------------------------------------------ COMMAND DOCS and INFO

/// A flat field/value array (or a RESP3 map) as pairs.
fn pairs(v: &Value) -> Vec<(String, Value)> {
    match v {
        Value::Array(items) => {
            items.chunks(2).map(|p| (redis::from_redis_value(&p[0]).unwrap(), p[1].clone())).collect()
        }
        Value::Map(kv) => kv.iter().map(|(k, v)| (redis::from_redis_value(k).unwrap(), v.clone())).collect(),
        other => panic!("not a map: {other:?}"),
    }
}

fn get(v: &Value, field: &str) -> Option<Value> {
    pairs(v).into_iter().find(|(k, _)| k == field).map(|(_, v)| v)
}

fn text(v: &Value) -> String {
    redis::from_redis_value(v).unwrap()
}

fn strings(v: &Value) -> Vec<String> {
    redis::from_redis_value(v).unwrap()
}

/// `COMMAND DOCS name`: the doc map of one command.
fn docs(c: &mut Connection, name: &str) -> Value {
    let reply: Value = redis::cmd("COMMAND").arg("DOCS").arg(name).query(c).unwrap();
    let (got, doc) = pairs(&reply).pop().unwrap_or_else(|| panic!("no COMMAND DOCS for {name}"));
    assert_eq!(got, name);
    doc
}

/// (name, type, token, optional) of each argument, nested blocks flattened.
fn arguments(args: &Value) -> Vec<(String, String, Option<String>, bool)> {
    let Value::Array(args) = args else { panic!("arguments: {args:?}") };
    let mut out = Vec::new();
    for arg in args {
        let optional = get(arg, "flags").is_some_and(|f| strings(&f).contains(&"optional".to_string()));
        out.push((
            text(&get(arg, "name").unwrap()),
            text(&get(arg, "type").unwrap()),
            get(arg, "token").map(|t| text(&t)),
            optional,
        ));
        if let Some(sub) = get(arg, "arguments") {
            out.extend(arguments(&sub));
        }
    }
    out
}

fn arg(name: &str, kind: &str, token: Option<&str>, optional: bool) -> (String, String, Option<String>, bool) {
    (name.into(), kind.into(), token.map(Into::into), optional)
}

#[test]
fn command_docs_describe_every_command() {
    let s = Server::start();
    let mut c = s.conn();
    let key = arg("key", "key", None, false);
    let owner = arg("owner", "string", None, false);
    let lease = arg("lease-ms", "integer", None, false);
    let id = arg("request-id", "string", Some("ID"), true);
    // A remembered request ID, as the internal commands carry it.
    let record = [
        arg("request-id", "string", None, false),
        arg("command", "integer", None, false),
        arg("reply", "integer", None, false),
        arg("expires-unix-ms", "integer", None, false),
    ];
    let riding = || [vec![arg("request", "block", Some("ID"), true)], record.to_vec()].concat();
    let table = [
        (
            "flock.acquire",
            "fair lock",
            vec![
                key.clone(),
                owner.clone(),
                lease.clone(),
                arg("timeout-ms", "integer", Some("WAIT"), true),
                arg("session", "pure-token", Some("SESSION"), true),
                arg("session-id", "string", Some("INBOX"), true),
                id.clone(),
                arg("lock-delay-ms", "integer", Some("LOCKDELAY"), true),
                arg("kind", "oneof", None, true),
                arg("shared", "pure-token", Some("SHARED"), false),
                arg("semaphore", "block", None, false),
                arg("n", "integer", Some("PERMITS"), false),
                arg("m", "integer", Some("LIMIT"), false),
            ],
        ),
        ("flock.release", "next waiter", vec![key.clone(), owner.clone(), id.clone()]),
        ("flock.renew", "lease", vec![key.clone(), owner.clone(), lease.clone(), id.clone()]),
        ("flock.forcerelease", "administrative", vec![key.clone(), id.clone()]),
        ("flock.info", "queue", vec![key.clone()]),
        ("flock.cancel", "wait", vec![key.clone(), owner.clone()]),
        (
            "flock.session",
            "session",
            vec![
                arg("ms", "integer", Some("TIMEOUT"), true),
                arg("withtimeout", "pure-token", Some("WITHTIMEOUT"), true),
            ],
        ),
        ("flock.inbox", "inbox", vec![arg("timeout-ms", "integer", None, false)]),
        (
            "flock.state",
            "Internal",
            vec![
                key.clone(),
                arg("holder", "block", None, true),
                owner.clone(),
                arg("holds", "integer", None, false),
                arg("token", "integer", None, false),
                arg("deadline-unix-ms", "integer", None, false),
                arg("session", "integer", None, false),
            ],
        ),
        ("flock.id", "Internal", [vec![key.clone(), arg("request", "block", None, false)], record.to_vec()].concat()),
        (
            "flock.holder",
            "Internal",
            vec![
                key.clone(),
                arg("mode", "string", None, false),
                arg("limit", "integer", None, false),
                arg("grant", "block", None, true),
                owner.clone(),
                arg("holder", "block", None, true),
                arg("holds", "integer", None, false),
                arg("token", "integer", None, false),
                arg("deadline-unix-ms", "integer", None, false),
                arg("session", "integer", None, false),
                arg("permits", "integer", None, false),
            ]
            .into_iter()
            .chain(riding())
            .collect(),
        ),
        ("flock.free", "Internal", [vec![key.clone()], riding()].concat()),
        (
            "flock.top",
            "contended locks",
            vec![
                arg("count", "integer", Some("COUNT"), true),
                arg("pattern", "pattern", Some("MATCH"), true),
                arg("order", "oneof", Some("BY"), true),
                arg("waiters", "pure-token", Some("WAITERS"), false),
                arg("wait", "pure-token", Some("WAIT"), false),
                arg("hold", "pure-token", Some("HOLD"), false),
            ],
        ),
        ("flock.owner", "blocks", vec![owner.clone()]),
        (
            "flock.longlog",
            "record",
            vec![
                arg("subcommand", "oneof", None, false),
                arg("get", "block", Some("GET"), false),
                arg("count", "integer", None, true),
                arg("len", "pure-token", Some("LEN"), false),
                arg("reset", "pure-token", Some("RESET"), false),
            ],
        ),
        (
            "flock.fenced",
            "fencing token",
            vec![
                key.clone(),
                arg("token", "integer", None, false),
                arg("command", "string", None, false),
                arg("arg", "string", None, true),
            ],
        ),
    ];
    for (name, in_summary, expected_args) in table {
        let doc = docs(&mut c, name);
        let summary = text(&get(&doc, "summary").expect("summary"));
        assert!(summary.contains(in_summary), "{name} summary: {summary}");
        assert_eq!(text(&get(&doc, "since").unwrap()), "1.0.0", "{name}");
        assert_eq!(text(&get(&doc, "group").unwrap()), "module", "{name}");
        assert_eq!(text(&get(&doc, "module").unwrap()), "flock", "{name}");
        assert!(text(&get(&doc, "complexity").unwrap()).starts_with("O("), "{name}");
        assert_eq!(arguments(&get(&doc, "arguments").unwrap()), expected_args, "{name} arguments");
    }
}

/// COMMAND INFO of one command: (arity, flags, first/last/step, key spec flags).
fn command_info(c: &mut Connection, name: &str) -> (i64, Vec<String>, [i64; 3], Vec<String>, Value) {
    let reply: Vec<Value> = redis::cmd("COMMAND").arg("INFO").arg(name).query(c).unwrap();
    let Some(Value::Array(info)) = reply.into_iter().next() else { panic!("no COMMAND INFO for {name}") };
    assert_eq!(text(&info[0]), name);
    let int = |v: &Value| -> i64 { redis::from_redis_value(v).unwrap() };
    let Value::Array(specs) = &info[8] else { panic!("{name} key specs: {:?}", info[8]) };
    assert_eq!(specs.len(), 1, "{name} has one key spec");
    let spec = &specs[0];
    (
        int(&info[1]),
        strings(&info[2]),
        [int(&info[3]), int(&info[4]), int(&info[5])],
        strings(&get(spec, "flags").unwrap()),
        spec.clone(),
    )
}

#[test]
fn command_info_flags_arity_and_key_specs() {
    let s = Server::start();
    let mut c = s.conn();
    let table: [(&str, i64, &[&str], &[&str]); 5] = [
        ("flock.acquire", -4, &["write", "denyoom", "blocking"], &["RW", "update"]),
        ("flock.release", -3, &["write", "fast"], &["RW", "update"]),
        ("flock.renew", -4, &["write", "fast"], &["RW", "update"]),
        ("flock.forcerelease", -2, &["write", "fast"], &["RW", "update"]),
        ("flock.info", 2, &["readonly", "fast"], &["RO", "access"]),
    ];
    for (name, arity, flags, key_flags) in table {
        let (got_arity, mut got_flags, keys, got_key_flags, spec) = command_info(&mut c, name);
        assert_eq!(got_arity, arity, "{name} arity");
        got_flags.retain(|f| f != "module");
        got_flags.sort();
        let mut flags: Vec<String> = flags.iter().map(|f| f.to_string()).collect();
        flags.sort();
        assert_eq!(got_flags, flags, "{name} flags");
        assert_eq!(keys, [1, 1, 1], "{name} first/last/step key");
        assert_eq!(got_key_flags, key_flags, "{name} key spec flags");
        // The key is found at index 1, one key.
        let begin = get(&spec, "begin_search").unwrap();
        assert_eq!(text(&get(&begin, "type").unwrap()), "index");
        assert_eq!(get(&get(&begin, "spec").unwrap(), "index"), Some(Value::Int(1)), "{name}");
        let find = get(&spec, "find_keys").unwrap();
        assert_eq!(text(&get(&find, "type").unwrap()), "range");
        assert_eq!(get(&get(&find, "spec").unwrap(), "lastkey"), Some(Value::Int(0)), "{name}");
    }
    // ACQUIRE may block (WAIT) and allocates: never `fast`.
    assert!(!command_info(&mut c, "flock.acquire").1.contains(&"fast".to_string()));
}

#[test]
fn command_getkeys_finds_the_lock_key() {
    let s = Server::start();
    let mut c = s.conn();
    let cases: [&[&str]; 5] = [
        &["FLOCK.ACQUIRE", "{user}:lock", "me", "1000", "WAIT", "10", "SESSION"],
        &["FLOCK.RELEASE", "{user}:lock", "me"],
        &["FLOCK.RENEW", "{user}:lock", "me", "1000"],
        &["FLOCK.FORCERELEASE", "{user}:lock"],
        &["FLOCK.INFO", "{user}:lock"],
    ];
    for args in cases {
        let keys: Vec<String> = redis::cmd("COMMAND").arg("GETKEYS").arg(args).query(&mut c).unwrap();
        assert_eq!(keys, ["{user}:lock"], "{args:?}");
    }
}

// ------------------------------------------------------------ configuration

fn config_get(c: &mut Connection, name: &str) -> String {
    let reply: Vec<String> = redis::cmd("CONFIG").arg("GET").arg(name).query(c).unwrap();
    assert_eq!(reply.len(), 2, "CONFIG GET {name}: {reply:?}");
    reply[1].clone()
}

#[test]
fn config_get_and_set_round_trip_and_refuse_out_of_range() {
    let s = Server::start();
    let mut c = s.conn();
    assert_eq!(config_get(&mut c, "flock.max-waiters"), "100000");
    assert_eq!(config_get(&mut c, "flock.max-lease-ms"), "1099511627776");
    let all: Vec<String> = redis::cmd("CONFIG").arg("GET").arg("flock.*").query(&mut c).unwrap();
    assert_eq!(config_get(&mut c, "flock.allow-eviction"), "no");
    assert_eq!(config_get(&mut c, "flock.retry-window-ms"), "60000");
    assert_eq!(config_get(&mut c, "flock.legacy-locks"), "ttl");
    assert_eq!(config_get(&mut c, "flock.session-timeout-ms"), "10000");
    assert_eq!(config_get(&mut c, "flock.lock-delay-ms"), "0");
    assert_eq!(config_get(&mut c, "flock.longlog-hold-ms"), "60000");
    assert_eq!(config_get(&mut c, "flock.longlog-wait-ms"), "10000");
    assert_eq!(config_get(&mut c, "flock.longlog-max-len"), "128");
    assert_eq!(all.len(), 20, "{all:?}");

    let good = [
        ("flock.max-waiters", "7"),
        ("flock.max-lease-ms", "5000"),
        ("flock.max-waiters", "1"),
        ("flock.retry-window-ms", "250"),
        ("flock.session-timeout-ms", "100"),
        ("flock.session-timeout-ms", "3600000"),
        ("flock.legacy-locks", "all"),
        ("flock.legacy-locks", "no"),
        ("flock.longlog-hold-ms", "0"),
        ("flock.longlog-wait-ms", "1099511627776"),
        ("flock.longlog-max-len", "100000"),
    ];
    for (name, value) in good {
        try_config_set(&mut c, name, value).unwrap();
        assert_eq!(config_get(&mut c, name), value);
    }
    let bad = [
        ("flock.max-waiters", "0"),
        ("flock.max-waiters", "-1"),
        ("flock.max-waiters", "many"),
        ("flock.max-lease-ms", "0"),
        ("flock.max-lease-ms", "1099511627777"),
        ("flock.max-lease-ms", "1.5"),
        ("flock.retry-window-ms", "0"),
        ("flock.session-timeout-ms", "99"),
        ("flock.session-timeout-ms", "3600001"),
        ("flock.legacy-locks", "yes"),
        ("flock.longlog-hold-ms", "-1"),
        ("flock.longlog-max-len", "100001"),
    ];
    for (name, value) in bad {
        let e = try_config_set(&mut c, name, value).expect_err(&format!("{name} {value} refused"));
        assert_eq!(error_code(&e), "ERR", "{name} {value}: {e}");
    }
    assert_eq!(config_get(&mut c, "flock.max-waiters"), "1");
    assert_eq!(config_get(&mut c, "flock.max-lease-ms"), "5000");
    assert_eq!(config_get(&mut c, "flock.legacy-locks"), "no");
}

#[test]
fn max_lease_ms_bounds_leases_and_wait_timeouts() {
    let s = Server::start();
    let mut c = s.conn();
    try_config_set(&mut c, "flock.max-lease-ms", "5000").unwrap();
    for (args, what) in [(vec!["6000"], "lease-ms"), (vec!["1000", "WAIT", "6000"], "timeout-ms")] {
        let e = redis::cmd("FLOCK.ACQUIRE").arg("L").arg("a").arg(&args).query::<Value>(&mut c).unwrap_err();
        assert_eq!(error_code(&e), "ERR");
        let detail = e.detail().unwrap_or_default();
        assert!(detail.contains(what) && detail.contains("flock.max-lease-ms") && detail.contains("5000"), "{e}");
    }
    acquire(&mut c, "L", "a", 5000).unwrap().expect("a lease at the limit is fine");
    let e = renew(&mut c, "L", "a", 5001).unwrap_err();
    assert!(e.detail().unwrap_or_default().contains("flock.max-lease-ms"), "{e}");
    assert_eq!(info(&mut c, "L").map(|_| ()), Some(()));
}

#[test]
fn max_waiters_refuses_one_more_waiter_and_queues_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    try_config_set(&mut c, "flock.max-waiters", "2").unwrap();
    acquire(&mut c, "L", "h", 10_000).unwrap().unwrap();
    let w1 = spawn_waiter(&s, "L", "w1", 10_000, 0);
    wait_queue(&mut c, "L", &["w1"]);
    let w2 = spawn_waiter(&s, "L", "w2", 10_000, 0);
    wait_queue(&mut c, "L", &["w1", "w2"]);

    let e = acquire_wait(&mut s.conn(), "L", "w3", 10_000, 0).unwrap_err();
    assert_eq!(error_code(&e), "MAXWAITERS", "{e}");
    assert!(e.detail().unwrap_or_default().contains("flock.max-waiters"), "{e}");
    assert_eq!(queue_of(&mut c, "L"), ["w1", "w2"]);
    assert_eq!(s.stat("waiters"), 2);
    assert_eq!(s.blocked_clients(), 2);
    // A try never queues, so the limit does not concern it.
    assert_eq!(acquire(&mut c, "L", "w3", 10_000).unwrap(), None);

    // Raised at run time: the next waiter is accepted.
    try_config_set(&mut c, "flock.max-waiters", "3").unwrap();
    let w3 = spawn_waiter(&s, "L", "w3", 10_000, 0);
    wait_queue(&mut c, "L", &["w1", "w2", "w3"]);
    for (w, name) in [(w1, "w1"), (w2, "w2"), (w3, "w3")] {
        force_release(&mut c, "L").unwrap();
        assert!(w.join().unwrap().unwrap().is_some(), "{name} granted");
    }
}

/// A redis-server loading the module with `module_args` (the harness loads
/// it without arguments); stopped on drop.
struct ModuleArgsServer {
    child: Child,
    port: u16,
}

impl ModuleArgsServer {
    /// `None` if the server exited (refused the arguments) instead of starting.
    fn start(module_args: &[&str]) -> Option<ModuleArgsServer> {
        let port = free_port();
        let child = Command::new(server_program())
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--loadmodule")
            .arg(module_path())
            .args(module_args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the server");
        let mut server = ModuleArgsServer { child, port };
        let url = format!("redis://127.0.0.1:{port}/");
        if wait_ready(&mut server.child, &url, 10 * SECOND) {
            return Some(server);
        }
        let exited = matches!(server.child.try_wait(), Ok(Some(_)));
        assert!(exited, "redis-server with module args {module_args:?} neither started nor exited");
        None
    }

    fn try_conn(&self) -> RedisResult<Connection> {
        redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))?.get_connection()
    }
}

impl Drop for ModuleArgsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn load_arguments_set_the_options() {
    let load_args = [
        "max-waiters",
        "3",
        "max-lease-ms",
        "5000",
        "allow-eviction",
        "yes",
        "retry-window-ms",
        "900",
        "session-timeout-ms",
        "2500",
        "legacy-locks",
        "all",
        "lock-delay-ms",
        "40",
        "longlog-hold-ms",
        "0",
        "longlog-wait-ms",
        "2000",
        "longlog-max-len",
        "5",
    ];
    let s = ModuleArgsServer::start(&load_args).expect("server starts");
    let mut c = s.try_conn().unwrap();
    assert_eq!(config_get(&mut c, "flock.max-waiters"), "3");
    assert_eq!(config_get(&mut c, "flock.max-lease-ms"), "5000");
    assert_eq!(config_get(&mut c, "flock.allow-eviction"), "yes");
    assert_eq!(config_get(&mut c, "flock.retry-window-ms"), "900");
    assert_eq!(config_get(&mut c, "flock.session-timeout-ms"), "2500");
    assert_eq!(config_get(&mut c, "flock.legacy-locks"), "all");
    assert_eq!(config_get(&mut c, "flock.lock-delay-ms"), "40");
    assert_eq!(config_get(&mut c, "flock.longlog-hold-ms"), "0");
    assert_eq!(config_get(&mut c, "flock.longlog-wait-ms"), "2000");
    assert_eq!(config_get(&mut c, "flock.longlog-max-len"), "5");
    assert_eq!(strings(&get(&flock_module(&mut c), "args").unwrap()), load_args);
    assert!(acquire(&mut c, "L", "a", 5001).is_err());
    acquire(&mut c, "L", "a", 5000).unwrap().unwrap();
    // Still changeable at run time.
    try_config_set(&mut c, "flock.max-waiters", "4").unwrap();
    assert_eq!(config_get(&mut c, "flock.max-waiters"), "4");
}

#[test]
fn a_non_numeric_load_argument_stops_the_server() {
    // Plain digits, as in commands: no sign, no spaces.
    for value in ["many", "+5", " 5", ""] {
        assert!(ModuleArgsServer::start(&["max-waiters", value]).is_none(), "{value:?} accepted");
    }
}

#[test]
fn out_of_range_or_unknown_load_arguments_stop_the_server() {
    for args in [
        &["max-waiters", "0"][..],
        &["max-lease-ms", "0"],
        &["max-lease-ms", "1099511627777"],
        &["session-timeout-ms", "99"],
        &["session-timeout-ms", "3600001"],
        &["no-such-option", "1"],
        // The crate would read anything but `yes` as `no`.
        &["allow-eviction", "maybe"],
        &["allow-eviction", "1"],
        &["legacy-locks", "some"],
        &["lock-delay-ms", "60001"],
        &["longlog-max-len", "100001"],
        &["longlog-wait-ms", "-5"],
    ] {
        assert!(ModuleArgsServer::start(args).is_none(), "{args:?} accepted");
    }
}

// ------------------------------------------------------------ error messages

#[test]
fn error_messages_say_what_was_wrong_and_what_is_allowed() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "L", "h", 60_000).unwrap().unwrap();
    let _ = spawn_waiter(&s, "L", "q", 1000, 2000);
    wait_queue(&mut c, "L", &["q"]);
    let _: () = redis::cmd("SET").arg("str").arg("x").query(&mut c).unwrap();
    let table: [(&[&str], &str, &[&str]); 13] = [
        (&["FLOCK.ACQUIRE", "L", "", "1000"], "ERR", &["invalid owner", "1 to 256 bytes"]),
        (&["FLOCK.RENEW", "L", "h", "0"], "ERR", &["invalid lease-ms", "from 1 to 1099511627776"]),
        (
            &["FLOCK.ACQUIRE", "L", "a", "1000", "WAIT", "-1"],
            "ERR",
            &["invalid WAIT timeout-ms", "from 0 (no limit) to 1099511627776"],
        ),
        (
            &["FLOCK.ACQUIRE", "L", "a", "1000", "NX"],
            "ERR",
            &["unknown option 'NX'", "only WAIT timeout-ms, SESSION, INBOX session-id, ID request-id and LOCKDELAY ms"],
        ),
        (&["FLOCK.ACQUIRE", "L", "a", "1000", "wait", "1", "WAIT", "1"], "ERR", &["WAIT given more than once", "once"]),
        (&["FLOCK.ACQUIRE", "L", "a", "1000", "WAIT"], "ERR", &["WAIT has no value", "WAIT timeout-ms"]),
        (&["FLOCK.RELEASE", "L", "a"], "NOTOWNER", &["not held by this owner", "only its holder may release or renew"]),
        (&["FLOCK.RENEW", "nolock", "a", "1000"], "NOTOWNER", &["not held by this owner"]),
        (&["FLOCK.ACQUIRE", "L", "q", "1000", "WAIT", "10"], "QUEUED", &["already waiting", "distinct owner"]),
        (&["FLOCK.STATE", "L"], "ERR", &["internal", "replication stream and the AOF"]),
        (&["FLOCK.RELEASE", "L"], "ERR", &["wrong number of arguments"]),
        (&["FLOCK.ACQUIRE", "str", "a", "1000"], "WRONGTYPE", &["wrong kind of value"]),
        (&["GET", "L"], "WRONGTYPE", &["wrong kind of value"]),
    ];
    for (args, code, says) in table {
        let e = redis::cmd(args[0]).arg(&args[1..]).query::<Value>(&mut c).unwrap_err();
        assert_eq!(error_code(&e), code, "{args:?}: {e}");
        let detail = e.detail().unwrap_or_default();
        for part in says {
            assert!(detail.contains(part), "{args:?}: `{e}` does not say `{part}`");
        }
    }
    assert_eq!(queue_of(&mut c, "L"), ["q"], "errors changed nothing");
}

// ------------------------------------------------- MEMORY USAGE, MODULE LIST

fn memory_usage(c: &mut Connection, key: &str) -> i64 {
    redis::cmd("MEMORY").arg("USAGE").arg(key).query(c).unwrap()
}

#[test]
fn memory_usage_grows_with_waiters_and_shrinks_back() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "L", "holder", 60_000).unwrap().unwrap();
    let idle = memory_usage(&mut c, "L");
    assert!(idle > 64, "an idle lock has a size: {idle}");

    // Waits without a limit, ended by FLOCK.CANCEL: a timeout would have to
    // outlast connecting 20 clients on a loaded machine.
    let owners: Vec<String> = (0..20).map(|i| format!("waiter-{i:02}-{}", "x".repeat(40))).collect();
    let waiters: Vec<_> = owners.iter().map(|o| spawn_waiter(&s, "L", o, 10_000, 0)).collect();
    wait_until("20 waiters queued", 5 * SECOND, || queue_of(&mut c, "L").len() == 20);
    let busy = memory_usage(&mut c, "L");
    let owner_bytes: i64 = owners.iter().map(|o| o.len() as i64).sum();
    assert!(busy >= idle + owner_bytes, "20 waiters with {owner_bytes} bytes of owners: {idle} -> {busy}");

    for (o, w) in owners.iter().zip(waiters) {
        assert_eq!(redis::cmd("FLOCK.CANCEL").arg("L").arg(o).query::<i64>(&mut c).unwrap(), 1, "{o} was waiting");
        assert_eq!(w.join().unwrap().unwrap(), None, "cancelled");
    }
    assert_eq!(memory_usage(&mut c, "L"), idle, "back to the idle size once the queue is empty");
}

#[test]
fn module_list_shows_flock_version_1() {
    let s = Server::start();
    assert_eq!(get(&flock_module(&mut s.conn()), "ver"), Some(Value::Int(1)));
}

/// FLOCK's entry in MODULE LIST, which has others in no set order on newer
/// servers (Redis 8's built-in `vectorset`, Valkey 9's `lua`).
fn flock_module(c: &mut Connection) -> Value {
    let modules: Vec<Value> = redis::cmd("MODULE").arg("LIST").query(c).unwrap();
    modules.into_iter().find(|m| get(m, "name").map(|n| text(&n)) == Some("flock".into())).expect("flock loaded")
}
