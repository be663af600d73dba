//! The operator's view: FLOCK.TOP (the contended locks, from an index),
//! FLOCK.OWNER (who an owner blocks and who blocks it), FLOCK.LONGLOG (long
//! holds and waits), the distributions of `INFO flock` with CONFIG
//! RESETSTAT, and FLOCK.INFO's figures of a contended lock.

use crate::common::*;

use redis::{Connection, Value};
use std::collections::HashMap;
use std::thread::JoinHandle;

type Row = HashMap<String, Value>;

fn rows(v: Value) -> Vec<Row> {
    let Value::Array(rows) = v else { panic!("not an array: {v:?}") };
    rows.iter().map(|r| fields_of(r).into_iter().collect()).collect()
}

fn top(c: &mut Connection, args: &[&str]) -> Vec<Row> {
    rows(redis::cmd("FLOCK.TOP").arg(args).query(c).expect("FLOCK.TOP"))
}

fn keys(rows: &[Row]) -> Vec<String> {
    rows.iter().map(|r| text(&r["key"])).collect()
}

fn text(v: &Value) -> String {
    redis::from_redis_value(v).expect("text")
}

fn holders(row: &Row) -> Vec<Row> {
    let Value::Array(hs) = &row["holders"] else { panic!("holders: {:?}", row["holders"]) };
    hs.iter().map(|h| fields_of(h).into_iter().collect()).collect()
}

/// `n` clients waiting at `key` (owners `prefix`1..n), queued in order.
fn queue(s: &Server, key: &str, prefix: &str, n: usize, wait_ms: u64) -> Vec<JoinHandle<TimedReply>> {
    let mut c = s.conn();
    let before = queue_of(&mut c, key).len();
    (1..=n)
        .map(|i| {
            let w = spawn_timed_waiter(s.conn(), key, &format!("{prefix}{i}"), wait_ms);
            wait_until("the waiter queued", 5 * SECOND, || queue_of(&mut c, key).len() == before + i);
            w
        })
        .collect()
}

fn let_go(c: &mut Connection, keys: &[&str], waiters: Vec<JoinHandle<TimedReply>>) {
    for k in keys {
        let _: i64 = redis::cmd("DEL").arg(*k).query(c).unwrap();
    }
    waiters.into_iter().for_each(|w| drop(w.join()));
}

#[test]
fn top_lists_the_contended_locks_most_waiters_first_with_their_holders() {
    let s = Server::start();
    let mut c = s.conn();
    // calm is held longer and waited at longer; busy has more waiters.
    acquire(&mut c, "calm", "bob", 60_000).unwrap().unwrap();
    let t_busy = acquire(&mut c, "busy", "alice", 60_000).unwrap().unwrap();
    acquire(&mut c, "idle", "carol", 60_000).unwrap().unwrap();
    let mut waiters = queue(&s, "calm", "c", 1, 20_000);
    waiters.extend(queue(&s, "busy", "b", 2, 20_000));
    // Another database's contention is not this one's.
    let mut db1 = s.conn_db(1);
    acquire(&mut db1, "elsewhere", "dave", 60_000).unwrap().unwrap();
    let other = spawn_timed_waiter(s.conn_db(1), "elsewhere", "eve", 20_000);
    wait_until("eve queued in db 1", 5 * SECOND, || queue_of(&mut db1, "elsewhere").len() == 1);

    let rows = top(&mut c, &[]);
    assert_eq!(keys(&rows), ["busy", "calm"], "most waiters first; the idle lock is not contended");
    let busy = &rows[0];
    let names: Vec<&str> = busy.keys().map(String::as_str).collect();
    assert_eq!(names.len(), 6, "{names:?}");
    assert_eq!(text(&busy["mode"]), "exclusive");
    assert_eq!(int(&busy["waiters"]), 2);
    assert!(int(&busy["oldest-wait-ms"]) <= int(&rows[1]["oldest-wait-ms"]), "{rows:?}");
    let hs = holders(busy);
    assert_eq!(hs.len(), 1);
    assert_eq!(text(&hs[0]["owner"]), "alice");
    assert_eq!(int(&hs[0]["token"]), t_busy);
    assert_eq!(int(&hs[0]["session"]), 0);
    assert!((59_000..=60_000).contains(&int(&hs[0]["ttl-ms"])), "{hs:?}");
    assert_eq!(int(&busy["held-ms"]), int(&hs[0]["held-ms"]));
    // Held since its grant, by the token's clock: no more than the test ran.
    assert!(int(&hs[0]["held-ms"]) < 60_000);

    // BY wait: calm's waiter queued first. BY hold: bob was granted first.
    assert_eq!(keys(&top(&mut c, &["BY", "wait"])), ["calm", "busy"]);
    assert_eq!(keys(&top(&mut c, &["by", "HOLD"])), ["calm", "busy"]);
    assert_eq!(keys(&top(&mut c, &["COUNT", "1"])), ["busy"]);
    assert_eq!(keys(&top(&mut c, &["COUNT", "0", "MATCH", "c*"])), ["calm"]);
    assert!(top(&mut c, &["MATCH", "nothing*"]).is_empty(), "a pattern that matches nothing: empty");
    assert_eq!(keys(&top(&mut db1, &[])), ["elsewhere"]);
    // RESP3: maps.
    let v: Value = redis::cmd("FLOCK.TOP").arg("COUNT").arg(1).query(&mut s.conn3()).unwrap();
    let Value::Array(r3) = v else { panic!("{v:?}") };
    assert!(matches!(r3[0], Value::Map(_)), "{r3:?}");

    let_go(&mut c, &["busy", "calm"], waiters);
    let_go(&mut db1, &["elsewhere"], vec![other]);
}

#[test]
fn top_opens_only_the_contended_keys_whatever_the_number_of_locks() {
    let s = Server::start();
    let mut c = s.conn();
    let mut pipe = redis::pipe();
    for i in 0..5_000 {
        pipe.cmd("FLOCK.ACQUIRE").arg(format!("lock:{i}")).arg("o").arg(60_000).ignore();
    }
    let () = pipe.query(&mut c).unwrap();
    let waiters = queue(&s, "lock:7", "w", 1, 20_000);
    let hits = |c: &mut Connection| -> i64 {
        let text: String = redis::cmd("INFO").arg("stats").query(c).unwrap();
        text.lines().find_map(|l| l.strip_prefix("keyspace_hits:")).unwrap().trim().parse().unwrap()
    };
    let before = hits(&mut c);
    assert_eq!(keys(&top(&mut c, &[])), ["lock:7"]);
    assert_eq!(hits(&mut c) - before, 1, "FLOCK.TOP read one key of 5,001");
    assert_eq!(s.stat("contended_locks"), 1);
    let_go(&mut c, &["lock:7"], waiters);
}

#[test]
fn a_lock_leaves_top_once_its_last_waiter_is_gone_however_it_went() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "L", "holder", 60_000).unwrap().unwrap();
    // A timeout, a cancel, a grant: each takes a waiter out.
    let mut waiters = queue(&s, "L", "w", 2, 20_000);
    let short = queue(&s, "L", "short", 1, 300).remove(0);
    assert_eq!(int(&top(&mut c, &[])[0]["waiters"]), 3);
    let (reply, _) = short.join().unwrap();
    assert_eq!(reply.unwrap(), None, "timed out");
    assert_eq!(int(&top(&mut c, &[])[0]["waiters"]), 2);
    let cancelled: i64 = redis::cmd("FLOCK.CANCEL").arg("L").arg("w2").query(&mut c).unwrap();
    assert_eq!(cancelled, 1);
    assert_eq!(int(&top(&mut c, &[])[0]["waiters"]), 1);
    release(&mut c, "L", "holder").unwrap();
    let w1 = waiters.remove(0).join().unwrap().0.unwrap();
    assert!(w1.is_some(), "w1 granted");
    drop(waiters.remove(0).join());
    wait_until("no lock contended", 5 * SECOND, || top(&mut c, &[]).is_empty());
    assert_eq!(s.stat("contended_locks"), 0);
    // A deleted lock's waiters go with it.
    let waiters = queue(&s, "L", "x", 2, 20_000);
    let _: i64 = redis::cmd("DEL").arg("L").query(&mut c).unwrap();
    waiters.into_iter().for_each(|w| assert!(w.join().unwrap().0.is_err(), "LOCKDELETED"));
    assert!(top(&mut c, &[]).is_empty());
    assert_eq!(s.stat("contended_locks"), 0);
}

#[test]
fn bad_input_to_the_operator_commands_gets_a_clear_error() {
    let s = Server::start();
    let mut c = s.conn();
    let err = |c: &mut Connection, args: &[&str]| -> String {
        let r: redis::RedisResult<Value> = redis::cmd(args[0]).arg(&args[1..]).query(c);
        r.expect_err("refused").to_string()
    };
    for (args, says) in [
        (&["FLOCK.TOP", "COUNT", "-1"][..], "invalid count"),
        (&["FLOCK.TOP", "COUNT", "ten"], "invalid count"),
        (&["FLOCK.TOP", "COUNT"], "COUNT has no value"),
        (&["FLOCK.TOP", "MATCH"], "MATCH has no value"),
        (&["FLOCK.TOP", "BY", "owner"], "invalid BY"),
        (&["FLOCK.TOP", "LIMIT", "3"], "unknown option 'LIMIT'"),
        (&["FLOCK.TOP", "COUNT", "1", "COUNT", "2"], "more than once"),
        (&["FLOCK.OWNER"], "wrong number of arguments"),
        (&["FLOCK.OWNER", "a", "b"], "wrong number of arguments"),
        (&["FLOCK.LONGLOG"], "wrong number of arguments"),
        (&["FLOCK.LONGLOG", "HELP"], "unknown FLOCK.LONGLOG subcommand"),
        (&["FLOCK.LONGLOG", "GET", "-2"], "invalid count"),
        (&["FLOCK.LONGLOG", "LEN", "1"], "unknown FLOCK.LONGLOG subcommand"),
    ] {
        let e = err(&mut c, args);
        assert!(e.contains(says), "{args:?}: {e}");
    }
    assert!(top(&mut c, &[]).is_empty(), "no contended lock: an empty array");
}

#[test]
fn owner_shows_the_locks_it_blocks_and_who_it_waits_behind() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "A", "w1", 60_000).unwrap().unwrap();
    let t_b = acquire(&mut c, "B", "w2", 60_000).unwrap().unwrap();
    acquire(&mut c, "solo", "w2", 60_000).unwrap().unwrap();
    let mut waiters = Vec::new();
    waiters.push(spawn_timed_waiter(s.conn(), "A", "w3", 20_000));
    wait_until("w3 queued at A", 5 * SECOND, || queue_of(&mut c, "A").len() == 1);
    waiters.push(spawn_timed_waiter(s.conn(), "A", "w2", 20_000));
    wait_until("w2 queued at A", 5 * SECOND, || queue_of(&mut c, "A").len() == 2);
    waiters.push(spawn_timed_waiter(s.conn(), "B", "w4", 20_000));
    wait_until("w4 queued at B", 5 * SECOND, || queue_of(&mut c, "B").len() == 1);

    let owner = |c: &mut Connection, who: &str| -> (Vec<Row>, Vec<Row>) {
        let v: Value = redis::cmd("FLOCK.OWNER").arg(who).query(c).unwrap();
        let f: HashMap<String, Value> = fields_of(&v).into_iter().collect();
        (rows(f["holds"].clone()), rows(f["waits"].clone()))
    };
    let (holds, waits) = owner(&mut c, "w2");
    // `solo` has no waiter: it blocks nobody and is not listed.
    assert_eq!(keys(&holds), ["B"]);
    assert_eq!(int(&holds[0]["token"]), t_b);
    assert_eq!(int(&holds[0]["waiters"]), 1);
    assert_eq!(keys(&waits), ["A"]);
    assert_eq!(int(&waits[0]["position"]), 2);
    let blocked_by: Vec<String> = redis::from_redis_value(&waits[0]["blocked-by"]).unwrap();
    assert_eq!(blocked_by, ["w1", "w3"], "the holder, then the waiter queued ahead");
    assert!(int(&waits[0]["waited-ms"]) < 20_000);

    let (holds, waits) = owner(&mut c, "w1");
    assert_eq!((keys(&holds), waits.len()), (vec!["A".to_string()], 0));
    assert_eq!(int(&holds[0]["waiters"]), 2);
    let (holds, waits) = owner(&mut c, "nobody");
    assert!(holds.is_empty() && waits.is_empty());
    let_go(&mut c, &["A", "B"], waiters);
}

fn longlog(c: &mut Connection, args: &[&str]) -> Vec<Row> {
    rows(redis::cmd("FLOCK.LONGLOG").arg("GET").arg(args).query(c).unwrap())
}

#[test]
fn longlog_keeps_holds_and_waits_past_their_thresholds_newest_first() {
    let s = Server::start();
    let mut c = s.conn();
    // Thresholds far above what a command takes, under valgrind too
    // (`make leakcheck` runs this).
    for (name, value) in [("flock.longlog-hold-ms", "300"), ("flock.longlog-wait-ms", "300")] {
        let () = redis::cmd("CONFIG").arg("SET").arg(name).arg(value).query(&mut c).unwrap();
    }
    // Short ones are not kept: a release at once, a wait granted at once.
    acquire(&mut c, "quick", "q", 60_000).unwrap().unwrap();
    release(&mut c, "quick", "q").unwrap();
    // A lease of 300 ms ends by itself; a wait of 300 ms times out.
    acquire(&mut c, "slow", "holder", 300).unwrap().unwrap();
    wait_until("the lease ended", 5 * SECOND, || info(&mut c, "slow").is_none());
    acquire(&mut c, "busy", "holder", 60_000).unwrap().unwrap();
    let (reply, _) = spawn_timed_waiter(s.conn(), "busy", "patient", 300).join().unwrap();
    assert_eq!(reply.unwrap(), None);

    let entries = longlog(&mut c, &[]);
    let seen: Vec<(String, String, String, String)> =
        entries.iter().map(|e| (text(&e["kind"]), text(&e["key"]), text(&e["owner"]), text(&e["ended"]))).collect();
    let want = |k: &str, key: &str, o: &str, e: &str| (k.into(), key.into(), o.into(), e.into());
    assert_eq!(seen, [want("wait", "busy", "patient", "timeout"), want("hold", "slow", "holder", "expired")]);
    assert!(int(&entries[0]["id"]) > int(&entries[1]["id"]));
    assert!((300..5_000).contains(&int(&entries[0]["duration-ms"])), "{entries:?}");
    assert!((300..5_000).contains(&int(&entries[1]["duration-ms"])), "{entries:?}");
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    assert!((now_ms - int(&entries[0]["time-unix-ms"])).abs() < 60_000, "{entries:?}");
    assert_eq!(entries[0].len(), 7);
    assert_eq!(keys(&longlog(&mut c, &["1"])), ["busy"]);
    assert_eq!(longlog(&mut c, &["-1"]).len(), 2);
    let len: i64 = redis::cmd("FLOCK.LONGLOG").arg("LEN").query(&mut c).unwrap();
    assert_eq!((len, s.stat("longlog_len")), (2, 2));

    // A lower max-len drops the oldest; RESET empties it.
    let () = redis::cmd("CONFIG").arg("SET").arg("flock.longlog-max-len").arg("1").query(&mut c).unwrap();
    assert_eq!(keys(&longlog(&mut c, &[])), ["busy"]);
    let () = redis::cmd("FLOCK.LONGLOG").arg("RESET").query(&mut c).unwrap();
    assert!(longlog(&mut c, &[]).is_empty());
    // 0 turns a threshold off.
    let () = redis::cmd("CONFIG").arg("SET").arg("flock.longlog-hold-ms").arg("0").query(&mut c).unwrap();
    acquire(&mut c, "slow", "holder", 60).unwrap().unwrap();
    wait_until("the lease ended", 5 * SECOND, || info(&mut c, "slow").is_none());
    assert!(longlog(&mut c, &[]).is_empty());
    release(&mut c, "busy", "holder").unwrap();
}

/// `INFO flock`'s distributions: name -> [p50, p90, p99, p99.9, max].
fn distributions(c: &mut Connection) -> HashMap<String, [f64; 5]> {
    let text: String = redis::cmd("INFO").arg("flock").query(c).unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix("flock_")?.split_once(':'))
        .filter(|(k, _)| k.contains("_percentiles_usec"))
        .map(|(k, v)| {
            let values: Vec<f64> = v.trim().split(',').map(|f| f.split_once('=').unwrap().1.parse().unwrap()).collect();
            let names: Vec<&str> = v.trim().split(',').map(|f| f.split_once('=').unwrap().0).collect();
            assert_eq!(names, ["p50", "p90", "p99", "p99.9", "max"], "{k}");
            (k.to_string(), values.try_into().unwrap())
        })
        .collect()
}

#[test]
fn info_shows_wait_hold_and_handoff_percentiles_by_how_each_ended_until_resetstat() {
    let s = Server::start();
    let mut c = s.conn();
    let empty = distributions(&mut c);
    let mut names: Vec<&String> = empty.keys().collect();
    names.sort();
    assert_eq!(names, ["handoff_percentiles_usec", "hold_percentiles_usec", "wait_percentiles_usec"]);
    assert!(empty.values().all(|d| *d == [0.0; 5]));

    // A hand-off (a granted wait, a released hold), a timed-out wait, an expired lease.
    acquire(&mut c, "L", "first", 60_000).unwrap().unwrap();
    let waiter = spawn_timed_waiter(s.conn(), "L", "second", 20_000);
    let (late, _) = spawn_timed_waiter(s.conn(), "L", "late", 80).join().unwrap();
    assert_eq!(late.unwrap(), None);
    wait_until("second queued", 5 * SECOND, || queue_of(&mut c, "L") == ["second"]);
    release(&mut c, "L", "first").unwrap();
    assert!(waiter.join().unwrap().0.unwrap().is_some());
    acquire(&mut c, "E", "short", 30).unwrap().unwrap();
    wait_until("the lease ended", 5 * SECOND, || info(&mut c, "E").is_none());
    wait_until("the hand-off's reply counted", 5 * SECOND, || {
        distributions(&mut c)["handoff_percentiles_usec"][4] > 0.0
    });

    let d = distributions(&mut c);
    for name in [
        "wait_percentiles_usec_granted",
        "wait_percentiles_usec_timeout",
        "hold_percentiles_usec_released",
        "hold_percentiles_usec_expired",
    ] {
        let p = d.get(name).unwrap_or_else(|| panic!("no {name} in {d:?}"));
        assert!(p.windows(2).all(|w| w[0] <= w[1]), "{name} rises: {p:?}");
    }
    assert!(!d.contains_key("wait_percentiles_usec_cancelled"), "an ending never seen has no line");
    // The timed-out wait lasted 80 ms, within 1%; the expired lease 30 ms (whole ms).
    assert!(d["wait_percentiles_usec_timeout"][4] >= 80_000.0 * 0.99, "{d:?}");
    assert!(d["hold_percentiles_usec_expired"][4] >= 30_000.0 * 0.99, "{d:?}");
    assert!(d["wait_percentiles_usec"][4] >= d["wait_percentiles_usec_timeout"][4] * 0.99, "all waits include it");
    assert!(s.stat("grants") >= 3);
    let locks = s.stat("locks");

    let () = redis::cmd("CONFIG").arg("RESETSTAT").query(&mut c).unwrap();
    let d = distributions(&mut c);
    assert_eq!(d.len(), 3, "only the three totals after RESETSTAT: {d:?}");
    assert!(d.values().all(|p| *p == [0.0; 5]), "{d:?}");
    assert_eq!((s.stat("grants"), s.stat("wait_timeouts"), s.stat("handoff_latency_max_us")), (0, 0, 0));
    assert_eq!(s.stat("locks"), locks, "gauges stay what they are");
}

#[test]
fn flock_info_shows_a_contended_locks_own_figures() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "L", "a", 60_000).unwrap().unwrap();
    let figures = |c: &mut Connection| -> HashMap<String, i64> {
        // Its own figures: the fields after `delayed-ms`.
        let names = &INFO_FIELDS[11..];
        let all = info(c, "L").unwrap();
        assert_eq!(all.len(), INFO_FIELDS.len());
        all.into_iter().filter(|(k, _)| names.contains(&k.as_str())).map(|(k, v)| (k, int(&v))).collect()
    };
    let f = figures(&mut c);
    assert_eq!((f["oldest-wait-ms"], f["contended-ms"], f["handoffs"], f["waits-ended"]), (0, 0, 0, 0));
    let mut waiters = queue(&s, "L", "w", 2, 20_000);
    let (gone, _) = spawn_timed_waiter(s.conn(), "L", "brief", 50).join().unwrap();
    assert_eq!(gone.unwrap(), None);
    release(&mut c, "L", "a").unwrap();
    assert!(waiters.remove(0).join().unwrap().0.unwrap().is_some());
    let f = figures(&mut c);
    assert_eq!((f["handoffs"], f["waits-ended"]), (1, 2), "{f:?}");
    assert!(f["longest-wait-ms"] >= 50, "{f:?}");
    assert!(f["contended-ms"] >= f["longest-wait-ms"], "{f:?}");
    assert!(f["oldest-wait-ms"] <= f["contended-ms"], "{f:?}");
    assert!(f["held-ms"] <= f["contended-ms"], "w1 holds since the hand-off: {f:?}");
    assert!(f["longest-hold-ms"] >= f["longest-wait-ms"], "a held past w1's whole wait: {f:?}");
    release(&mut c, "L", "w1").unwrap();
    assert!(waiters.remove(0).join().unwrap().0.unwrap().is_some());
    let f = figures(&mut c);
    assert_eq!((f["handoffs"], f["contended-ms"], f["oldest-wait-ms"]), (0, 0, 0), "no waiter: no figures");
    release(&mut c, "L", "w2").unwrap();
}

/// The incident of docs/observability.md, step by step: `batch-3` holds
/// `ledger` and is stuck; `worker-7` holds `billing:invoice-42` and waits
/// for `ledger`; three workers wait for the invoice.
#[test]
fn the_incident_in_the_observability_guide_goes_as_told() {
    let s = Server::start();
    let mut c = s.conn();
    for (name, value) in [("flock.longlog-hold-ms", "1"), ("flock.longlog-wait-ms", "1")] {
        let () = redis::cmd("CONFIG").arg("SET").arg(name).arg(value).query(&mut c).unwrap();
    }
    let stuck = acquire(&mut c, "ledger", "batch-3", 600_000).unwrap().unwrap();
    acquire(&mut c, "billing:invoice-42", "worker-7", 60_000).unwrap().unwrap();
    let w7 = spawn_timed_waiter(s.conn(), "ledger", "worker-7", 0);
    wait_until("worker-7 queued", 5 * SECOND, || queue_of(&mut c, "ledger").len() == 1);
    let mut workers = Vec::new();
    for w in ["worker-2", "worker-5", "worker-9"] {
        workers.push(spawn_timed_waiter(s.conn(), "billing:invoice-42", w, 120_000));
        wait_until("queued", 5 * SECOND, || {
            queue_of(&mut c, "billing:invoice-42").last().map(String::as_str) == Some(w)
        });
    }

    let contended = top(&mut c, &[]);
    assert_eq!(keys(&contended), ["billing:invoice-42", "ledger"]);
    let first_holder = |row: &Row| text(&holders(row)[0]["owner"]);
    assert_eq!((int(&contended[0]["waiters"]), first_holder(&contended[0])), (3, "worker-7".into()));
    assert_eq!((int(&contended[1]["waiters"]), first_holder(&contended[1])), (1, "batch-3".into()));
    // The keys it holds; each wait as (key, position, blocked-by).
    type Waits = Vec<(String, i64, Vec<String>)>;
    let owner = |c: &mut Connection, who: &str| -> (Vec<String>, Waits) {
        let v: Value = redis::cmd("FLOCK.OWNER").arg(who).query(c).unwrap();
        let f: HashMap<String, Value> = fields_of(&v).into_iter().collect();
        let waits = rows(f["waits"].clone())
            .iter()
            .map(|w| (text(&w["key"]), int(&w["position"]), redis::from_redis_value(&w["blocked-by"]).unwrap()))
            .collect();
        (keys(&rows(f["holds"].clone())), waits)
    };
    assert_eq!(
        owner(&mut c, "worker-7"),
        (vec!["billing:invoice-42".into()], vec![("ledger".into(), 1, vec!["batch-3".into()])])
    );
    assert_eq!(owner(&mut c, "batch-3"), (vec!["ledger".into()], vec![]), "the stuck holder waits for nothing");

    assert_eq!(force_release(&mut c, "ledger").unwrap(), 1);
    let granted = w7.join().unwrap().0.unwrap().expect("worker-7 granted the ledger");
    assert!(granted > stuck, "a new token, which a fenced write of batch-3 cannot match");
    release(&mut c, "ledger", "worker-7").unwrap();
    release(&mut c, "billing:invoice-42", "worker-7").unwrap();
    assert!(workers.remove(0).join().unwrap().0.unwrap().is_some(), "worker-2 gets the invoice");

    let entries = longlog(&mut c, &["-1"]);
    let seen: Vec<(String, String, String)> =
        entries.iter().map(|e| (text(&e["kind"]), text(&e["owner"]), text(&e["ended"]))).collect();
    assert_eq!(seen[0], ("wait".into(), "worker-2".into(), "granted".into()), "{seen:?}");
    assert_eq!(seen[1], ("hold".into(), "worker-7".into(), "released".into()), "{seen:?}");
    assert!(seen.contains(&("hold".into(), "batch-3".into(), "forcereleased".into())), "{seen:?}");
    assert!(distributions(&mut c).contains_key("hold_percentiles_usec_forcereleased"));
    let_go(&mut c, &["billing:invoice-42"], workers);
}

#[test]
fn the_prometheus_script_returns_every_flock_field_as_a_number() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "L", "a", 60_000).unwrap().unwrap();
    let script = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/flock-metrics.lua")).unwrap();
    for eval in ["EVAL", "EVAL_RO"] {
        let pairs: Vec<String> = redis::cmd(eval).arg(&script).arg(0).query(&mut c).unwrap();
        let fields: HashMap<&str, f64> =
            pairs.chunks(2).map(|p| (p[0].as_str(), p[1].parse().unwrap_or_else(|_| panic!("{p:?}")))).collect();
        assert_eq!(fields["flock_grants"], 1.0);
        assert_eq!(fields["flock_locks"], 1.0);
        // Every number of INFO flock, and five fields per distribution.
        let numbers = s.stats().len();
        let distributions = distributions(&mut c).len();
        assert_eq!(fields.len(), numbers + 5 * distributions, "{fields:?}");
        for p in ["p50", "p90", "p99", "p99_9", "max"] {
            assert!(fields.contains_key(format!("flock_wait_percentiles_usec_{p}").as_str()), "{p}");
        }
    }
}

#[test]
fn the_operator_commands_are_in_the_acl_categories_of_keys_scan_and_slowlog() {
    let s = Server::start();
    let mut c = s.conn();
    let (family, major, minor) = server_version(&mut c);
    if family == "redis" && (major, minor) < (7, 2) {
        eprintln!("{family} {major}.{minor} puts module commands in no ACL category");
        return;
    }
    let category = |c: &mut Connection, name: &str| -> Vec<String> {
        let mut all: Vec<String> = redis::cmd("ACL").arg("CAT").arg(name).query(c).unwrap();
        all.retain(|n| ["flock.top", "flock.owner", "flock.longlog"].contains(&n.as_str()));
        all.sort();
        all
    };
    assert_eq!(category(&mut c, "keyspace"), ["flock.owner", "flock.top"]);
    assert_eq!(category(&mut c, "read"), ["flock.owner", "flock.top"]);
    assert_eq!(category(&mut c, "slow"), ["flock.longlog", "flock.owner", "flock.top"]);
    assert_eq!(category(&mut c, "admin"), ["flock.longlog"]);
    assert_eq!(category(&mut c, "dangerous"), ["flock.longlog"]);
}
