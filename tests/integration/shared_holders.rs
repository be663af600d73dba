//! Shared holders (a fair read-write lock, `SHARED`) and semaphores
//! (`PERMITS n LIMIT m`): every rule of docs/commands.md, "Shared holders and
//! semaphores", against a real server.
use crate::common::*;

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const LEASE: u64 = 60_000;

/// `FLOCK.ACQUIRE key owner lease [extra...]`.
fn acq(c: &mut Connection, key: &str, owner: &str, lease: u64, extra: &[&str]) -> RedisResult<Option<i64>> {
    redis::cmd("FLOCK.ACQUIRE").arg(key).arg(owner).arg(lease).arg(extra).query(c)
}

fn shared(c: &mut Connection, key: &str, owner: &str) -> Option<i64> {
    acq(c, key, owner, LEASE, &["SHARED"]).unwrap()
}

fn sem(c: &mut Connection, key: &str, owner: &str, n: u32, limit: u32) -> Option<i64> {
    acq(c, key, owner, LEASE, &["PERMITS", &n.to_string(), "LIMIT", &limit.to_string()]).unwrap()
}

/// `FLOCK.ACQUIRE key owner lease WAIT 30000 [extra...]` on its own connection, in a thread.
fn wait_for(s: &Server, key: &str, owner: &str, lease: u64, extra: &[&str]) -> JoinHandle<RedisResult<Option<i64>>> {
    let mut c = s.conn();
    let (key, owner) = (key.to_string(), owner.to_string());
    let mut args: Vec<String> = vec!["WAIT".into(), LONG_WAIT_MS.to_string()];
    args.extend(extra.iter().map(|a| a.to_string()));
    std::thread::spawn(move || redis::cmd("FLOCK.ACQUIRE").arg(&key).arg(&owner).arg(lease).arg(&args).query(&mut c))
}

/// Queues `owner` (with `extra`) and waits until the queue shows it.
fn queue(
    s: &Server,
    c: &mut Connection,
    key: &str,
    owner: &str,
    extra: &[&str],
) -> JoinHandle<RedisResult<Option<i64>>> {
    let before = queue_of(c, key).len();
    let h = wait_for(s, key, owner, LEASE, extra);
    wait_until(&format!("{owner} queued on {key}"), 5 * SECOND, || queue_of(c, key).len() == before + 1);
    h
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    owner: String,
    holds: i64,
    token: i64,
    session: i64,
    permits: i64,
}

/// The `holders` of FLOCK.INFO, earliest grant first.
fn holders(c: &mut Connection, key: &str) -> Vec<Held> {
    let Some(Value::Array(list)) = info_field(c, key, "holders") else { return Vec::new() };
    list.iter()
        .map(|h| {
            let f = fields_of(h);
            let get = |name: &str| f.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()).expect(name);
            Held {
                owner: redis::from_redis_value(&get("owner")).unwrap(),
                holds: int(&get("holds")),
                token: int(&get("token")),
                session: int(&get("session")),
                permits: int(&get("permits")),
            }
        })
        .collect()
}

fn owners(c: &mut Connection, key: &str) -> Vec<String> {
    holders(c, key).into_iter().map(|h| h.owner).collect()
}

fn mode(c: &mut Connection, key: &str) -> String {
    info_field(c, key, "mode").map(|v| redis::from_redis_value(&v).unwrap()).unwrap_or_default()
}

fn release_ok(c: &mut Connection, key: &str, owner: &str) -> i64 {
    release(c, key, owner).unwrap_or_else(|e| panic!("release {key} by {owner}: {e}"))
}

// ---------------------------------------------------------------- read-write

#[test]
fn shared_is_granted_to_many_owners_at_once_each_with_its_own_token() {
    let s = Server::start();
    let mut c = s.conn();
    let a = shared(&mut c, "rw", "a").expect("a reads");
    let b = shared(&mut c, "rw", "b").expect("b reads too");
    assert!(b > a, "every grant has a new, larger token");
    assert_eq!(owners(&mut c, "rw"), ["a", "b"]);
    assert_eq!(mode(&mut c, "rw"), "shared");
    assert_eq!(acq(&mut c, "rw", "w", LEASE, &[]).unwrap(), None, "the exclusive side is a try while readers hold it");
    assert_eq!(queue_of(&mut c, "rw"), Vec::<String>::new(), "a try queues nothing");
}

#[test]
fn a_shared_try_never_cuts_in_front_of_a_queued_writer_and_no_reader_overtakes_it() {
    let s = Server::start();
    let mut c = s.conn();
    shared(&mut c, "rw", "r1").unwrap();
    let w = queue(&s, &mut c, "rw", "w", &[]);
    assert_eq!(shared(&mut c, "rw", "r2"), None, "a shared try waits behind the queued writer");
    let r3 = queue(&s, &mut c, "rw", "r3", &["SHARED"]);
    assert_eq!(queue_of(&mut c, "rw"), ["w", "r3"]);
    assert_eq!(release_ok(&mut c, "rw", "r1"), 0);
    let tw = granted(w, "w");
    assert_eq!(owners(&mut c, "rw"), ["w"]);
    assert_eq!(mode(&mut c, "rw"), "exclusive");
    release_ok(&mut c, "rw", "w");
    assert!(granted(r3, "r3") > tw);
}

#[test]
fn a_release_grants_the_shared_waiters_behind_the_head_up_to_the_next_writer_in_one_turn() {
    let s = Server::start();
    let mut c = s.conn();
    config_set(&mut c, &[("notify-keyspace-events", "Ed")]);
    acq(&mut c, "rw", "w0", LEASE, &[]).unwrap().unwrap();
    let readers: Vec<_> = ["r1", "r2", "r3"].iter().map(|r| (r, queue(&s, &mut c, "rw", r, &["SHARED"]))).collect();
    let w1 = queue(&s, &mut c, "rw", "w1", &[]);
    let r4 = queue(&s, &mut c, "rw", "r4", &["SHARED"]);
    let mut sub_conn = s.conn();
    let mut sub = sub_conn.as_pubsub();
    sub.psubscribe("__keyevent@*__:flock.acquired").unwrap();
    let grants_before = s.stat("grants");

    release_ok(&mut c, "rw", "w0");
    let tokens: Vec<i64> = readers.into_iter().map(|(r, h)| granted(h, r)).collect();
    assert!(tokens.windows(2).all(|t| t[0] < t[1]), "readers granted together get rising tokens: {tokens:?}");
    assert_eq!(owners(&mut c, "rw"), ["r1", "r2", "r3"]);
    assert_eq!(queue_of(&mut c, "rw"), ["w1", "r4"], "the writer and the reader behind it still wait");
    assert_eq!(s.stat("grants") - grants_before, 3, "INFO flock counts each grant");
    sub.set_read_timeout(Some(2 * SECOND)).unwrap();
    for i in 0..3 {
        let m = sub.get_message().unwrap_or_else(|e| panic!("flock.acquired {} of 3: {e}", i + 1));
        assert_eq!(m.get_payload::<String>().unwrap(), "rw");
    }
    sub.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    assert!(sub.get_message().is_err(), "one flock.acquired per grant, no more");

    for r in ["r1", "r2", "r3"] {
        release_ok(&mut c, "rw", r);
    }
    granted(w1, "w1");
    release_ok(&mut c, "rw", "w1");
    granted(r4, "r4");
}

#[test]
fn reentry_shared_twice_keeps_the_token_and_a_writer_may_also_read() {
    let s = Server::start();
    let mut c = s.conn();
    let t = shared(&mut c, "rw", "a").unwrap();
    assert_eq!(shared(&mut c, "rw", "a"), Some(t), "shared again: one more hold, same token");
    assert_eq!(holders(&mut c, "rw")[0].holds, 2);
    assert_eq!(release_ok(&mut c, "rw", "a"), 1);
    assert_eq!(release_ok(&mut c, "rw", "a"), 0);

    let tw = acq(&mut c, "rw", "w", LEASE, &[]).unwrap().unwrap();
    assert_eq!(shared(&mut c, "rw", "w"), Some(tw), "a writer asking SHARED gets a hold on its grant");
    assert_eq!(holders(&mut c, "rw"), [Held { owner: "w".into(), holds: 2, token: tw, session: 0, permits: 0 }]);
    assert_eq!(mode(&mut c, "rw"), "exclusive");
}

#[test]
fn upgrade_from_shared_to_exclusive_is_an_error_and_changes_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    shared(&mut c, "rw", "a").unwrap();
    let before = info_still(&mut c, "rw");
    for extra in [&[][..], &["WAIT", "100"][..]] {
        let e = expect_err(acq(&mut c, "rw", "a", LEASE, extra), "upgrade");
        assert_eq!(error_code(&e), "UPGRADE", "{e}");
    }
    assert_eq!(info_still(&mut c, "rw"), before);
}

// ---------------------------------------------------------------- semaphore

#[test]
fn a_semaphore_grants_while_permits_are_free_and_in_order_when_they_come_back() {
    let s = Server::start();
    let mut c = s.conn();
    sem(&mut c, "sem", "a", 3, 4).expect("3 of 4");
    assert_eq!(sem(&mut c, "sem", "b", 2, 4), None, "only one permit is free");
    let b = queue(&s, &mut c, "sem", "b", &["PERMITS", "2", "LIMIT", "4"]);
    assert_eq!(sem(&mut c, "sem", "c", 1, 4), None, "a free permit, but b waits first: no overtaking");
    let c1 = queue(&s, &mut c, "sem", "c", &["PERMITS", "1", "LIMIT", "4"]);
    let d = queue(&s, &mut c, "sem", "d", &["PERMITS", "2", "LIMIT", "4"]);
    assert_eq!(release_ok(&mut c, "sem", "a"), 0);
    granted(b, "b");
    granted(c1, "c");
    assert_eq!(owners(&mut c, "sem"), ["b", "c"]);
    assert_eq!(queue_of(&mut c, "sem"), ["d"], "d needs 2 permits, 1 is free");
    release_ok(&mut c, "sem", "c");
    granted(d, "d");
    let got: Vec<i64> = holders(&mut c, "sem").iter().map(|h| h.permits).collect();
    assert_eq!(got, [2, 2]);
    assert_eq!(mode(&mut c, "sem"), "semaphore");
    assert_eq!(int_field(&mut c, "sem", "limit"), 4);
}

#[test]
fn a_semaphore_holder_asking_again_with_the_same_n_reenters_and_with_another_n_is_refused() {
    let s = Server::start();
    let mut c = s.conn();
    let t = sem(&mut c, "sem", "a", 2, 5).unwrap();
    assert_eq!(sem(&mut c, "sem", "a", 2, 5), Some(t));
    assert_eq!(holders(&mut c, "sem")[0].holds, 2);
    let before = info_still(&mut c, "sem");
    let e = expect_err(acq(&mut c, "sem", "a", LEASE, &["PERMITS", "1", "LIMIT", "5"]), "other n");
    assert_eq!(error_code(&e), "ERR");
    assert!(e.to_string().contains("holds 2 permits"), "{e}");
    assert_eq!(info_still(&mut c, "sem"), before);
}

#[test]
fn wrongmode_and_bad_permits_are_errors_that_change_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    shared(&mut c, "rw", "a").unwrap();
    sem(&mut c, "sem", "a", 1, 3).unwrap();
    let before = (info_still(&mut c, "rw"), info_still(&mut c, "sem"));
    let cases: [(&str, &[&str], &str); 9] = [
        ("rw", &["PERMITS", "1", "LIMIT", "3"], "WRONGMODE"),
        ("sem", &[], "WRONGMODE"),
        ("sem", &["SHARED"], "WRONGMODE"),
        ("sem", &["PERMITS", "1", "LIMIT", "4"], "WRONGMODE"),
        ("new", &["SHARED", "PERMITS", "1", "LIMIT", "2"], "ERR"),
        ("new", &["PERMITS", "3", "LIMIT", "2"], "ERR"),
        ("new", &["PERMITS", "0", "LIMIT", "2"], "ERR"),
        ("new", &["PERMITS", "1", "LIMIT", "4294967296"], "ERR"),
        ("new", &["PERMITS", "1"], "ERR"),
    ];
    for (key, extra, code) in cases {
        let e = expect_err(acq(&mut c, key, "b", LEASE, extra), &format!("{key} {extra:?}"));
        assert_eq!(error_code(&e), code, "{key} {extra:?}: {e}");
    }
    assert_eq!((info_still(&mut c, "rw"), info_still(&mut c, "sem")), before);
    assert!(!exists(&mut c, "new"));
    assert_eq!(sem(&mut c, "max", "a", 4_294_967_295, 4_294_967_295).map(|t| t > 0), Some(true), "2^32-1 is allowed");
}

// ------------------------------------------------------- per-holder commands

#[test]
fn release_renew_and_lease_expiry_act_on_one_holder_only() {
    let s = Server::start();
    let mut c = s.conn();
    shared(&mut c, "rw", "a").unwrap();
    // Held long through the round trips below (slow on a loaded machine);
    // its lease is cut to 300 ms once w is queued.
    let short = shared(&mut c, "rw", "short").unwrap();
    let b = shared(&mut c, "rw", "b").unwrap();
    assert_eq!(renew(&mut c, "rw", "b", 90_000).unwrap(), b, "RENEW answers that holder's token");
    let ttls: Vec<i64> = {
        let Some(Value::Array(list)) = info_field(&mut c, "rw", "holders") else { panic!("holders") };
        list.iter().map(|h| int(&fields_of(h).into_iter().find(|(k, _)| k == "ttl-ms").unwrap().1)).collect()
    };
    assert!(ttls[2] > 60_000 && ttls[0] <= 60_000, "b's lease alone was renewed: {ttls:?}");
    assert_eq!(release_ok(&mut c, "rw", "a"), 0);
    assert_eq!(owners(&mut c, "rw"), ["short", "b"]);
    let e = expect_err(release(&mut c, "rw", "a"), "a holds nothing now");
    assert_eq!(error_code(&e), "NOTOWNER");
    let w = queue(&s, &mut c, "rw", "w", &[]);
    assert_eq!(renew(&mut c, "rw", "short", 300).unwrap(), short);
    wait_until("short's lease to end", 5 * SECOND, || owners(&mut c, "rw") == ["b"]);
    assert_eq!(queue_of(&mut c, "rw"), ["w"], "b still reads");
    assert_eq!(expect_err(renew(&mut c, "rw", "short", 1000), "expired").code(), Some("NOTOWNER"));
    release_ok(&mut c, "rw", "b");
    granted(w, "w");
}

#[test]
fn a_closed_session_releases_exactly_the_holders_bound_to_it() {
    let s = Server::start();
    let mut c = s.conn();
    let mut sc = s.conn();
    acq(&mut sc, "sem", "bound", LEASE, &["SESSION", "PERMITS", "2", "LIMIT", "3"]).unwrap().unwrap();
    acq(&mut sc, "sem", "unbound", LEASE, &["PERMITS", "1", "LIMIT", "3"]).unwrap().unwrap();
    acq(&mut sc, "rw", "r", LEASE, &["SESSION", "SHARED"]).unwrap().unwrap();
    shared(&mut c, "rw", "other").unwrap();
    let w = queue(&s, &mut c, "sem", "w", &["PERMITS", "2", "LIMIT", "3"]);
    assert_eq!(holders(&mut c, "sem")[0].session, 1);
    drop(sc);
    granted(w, "w");
    assert_eq!(owners(&mut c, "sem"), ["unbound", "w"]);
    assert_eq!(owners(&mut c, "rw"), ["other"]);
}

#[test]
fn forcerelease_removes_every_holder_and_answers_how_many() {
    let s = Server::start();
    let mut c = s.conn();
    for r in ["a", "b", "c"] {
        shared(&mut c, "rw", r).unwrap();
    }
    let w = queue(&s, &mut c, "rw", "w", &[]);
    assert_eq!(force_release(&mut c, "rw").unwrap(), 3);
    granted(w, "w");
    assert_eq!(force_release(&mut c, "rw").unwrap(), 1, "an exclusive lock: 1, as before");
    assert_eq!(force_release(&mut c, "rw").unwrap(), 0);
    assert_eq!(s.stat("force_releases"), 4, "counted per holder removed");
}

/// Every grant ends once in the counters (release, expiry, force release,
/// session, deletion, undelivered), one per holder, also for shared holders.
#[test]
fn counters_end_each_shared_holder_once() {
    let s = Server::start();
    let mut c = s.conn();
    for r in ["a", "b"] {
        shared(&mut c, "gone", r).unwrap();
    }
    let _: () = redis::cmd("RENAME").arg("gone").arg("moved").query(&mut c).unwrap();
    assert_eq!(s.stat("deletions"), 0, "a rename ends no holder");
    let _: i64 = redis::cmd("DEL").arg("moved").query(&mut c).unwrap();
    assert_eq!(s.stat("deletions"), 2, "a deleted key ends each of its holders");
    for r in ["a", "b", "c"] {
        shared(&mut c, "rw", r).unwrap();
    }
    assert_eq!(release(&mut c, "rw", "a").unwrap(), 0);
    assert_eq!(force_release(&mut c, "rw").unwrap(), 2);
    let st = s.stats();
    let ended = st["releases"] + st["lease_expiries"] + st["force_releases"] + st["session_releases"] + st["deletions"];
    assert_eq!((st["grants"], ended), (5, 5));
}

// ---------------------------------------------------------------- FLOCK.INFO

fn check_info_shape(fields: &[(String, Value)], first_token: i64) {
    let names: Vec<&str> = fields.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, INFO_FIELDS);
    assert_eq!(fields[0].1, Value::BulkString(b"a".to_vec()), "the first seven show the earliest grant");
    assert_eq!(fields[2].1, Value::Int(first_token));
    assert_eq!(fields[5].1, Value::Int(1), "waiters");
    assert_eq!(fields[8].1, Value::Int(3), "limit");
    let Value::Array(list) = &fields[9].1 else { panic!("holders: {:?}", fields[9].1) };
    let names: Vec<Vec<String>> = list.iter().map(|h| fields_of(h).into_iter().map(|(k, _)| k).collect()).collect();
    assert_eq!(names, vec![vec!["owner", "holds", "token", "ttl-ms", "session", "permits", "lock-delay-ms"]; 2]);
}

#[test]
fn info_lists_mode_limit_and_each_holder_as_flat_arrays_on_resp2_and_maps_on_resp3() {
    let s = Server::start();
    let mut c = s.conn();
    let t = sem(&mut c, "sem", "a", 1, 3).unwrap();
    sem(&mut c, "sem", "b", 2, 3).unwrap();
    let w = queue(&s, &mut c, "sem", "w", &["PERMITS", "1", "LIMIT", "3"]);
    let v2: Value = redis::cmd("FLOCK.INFO").arg("sem").query(&mut c).unwrap();
    let Value::Array(items) = &v2 else { panic!("RESP2: {v2:?}") };
    assert!(matches!(&items[19], Value::Array(l) if matches!(&l[0], Value::Array(h) if h.len() == 14)), "{v2:?}");
    check_info_shape(&fields_of(&v2), t);
    let v3: Value = redis::cmd("FLOCK.INFO").arg("sem").query(&mut s.conn3()).unwrap();
    let Value::Map(pairs) = &v3 else { panic!("RESP3: {v3:?}") };
    assert!(matches!(&pairs[9].1, Value::Array(l) if matches!(&l[0], Value::Map(_))), "{v3:?}");
    check_info_shape(&fields_of(&v3), t);
    release_ok(&mut c, "sem", "a");
    granted(w, "w");
}

// ------------------------------------------------------------ durability

fn make_state(s: &Server) -> Vec<Option<Vec<(String, Value)>>> {
    let mut c = s.conn();
    shared(&mut c, "rw", "a").unwrap();
    shared(&mut c, "rw", "a").unwrap();
    acq(&mut c, "rw", "b", LEASE, &["SHARED", "ID", "req-b"]).unwrap().unwrap();
    sem(&mut c, "sem", "x", 2, 5).unwrap();
    sem(&mut c, "sem", "y", 3, 5).unwrap();
    acq(&mut c, "ex", "e", LEASE, &[]).unwrap().unwrap();
    snapshot(&mut c)
}

fn snapshot(c: &mut Connection) -> Vec<Option<Vec<(String, Value)>>> {
    ["rw", "sem", "ex"].iter().map(|k| info_still(c, k)).collect()
}

/// After a reload, restart or failover: the same holders, and everything still works.
fn check_state(c: &mut Connection, before: &[Option<Vec<(String, Value)>>], how: &str) {
    assert_eq!(snapshot(c), before, "{how}: every holder kept");
    let b = holders(c, "rw")[1].token;
    let again: Option<i64> = redis::cmd("FLOCK.ACQUIRE")
        .arg("rw")
        .arg("b")
        .arg(LEASE)
        .arg("SHARED")
        .arg("ID")
        .arg("req-b")
        .query(c)
        .unwrap();
    assert_eq!(again, Some(b), "{how}: the request ID of b's grant answers its token");
    assert_eq!(holders(c, "rw")[1].holds, 1, "{how}: and changes nothing");
    assert_eq!(sem(c, "sem", "z", 1, 5), None, "{how}: the 5 permits are still in use");
    let e = expect_err(acq(c, "sem", "z", LEASE, &["SHARED"]), "mode kept");
    assert_eq!(error_code(&e), "WRONGMODE", "{how}");
    assert_eq!(release_ok(c, "sem", "x"), 0, "{how}");
    assert!(sem(c, "sem", "z", 2, 5).unwrap() > b, "{how}: tokens keep rising");
}

#[test]
fn shared_and_semaphore_holders_survive_debug_reload_and_an_rdb_restart() {
    let mut s = Server::start();
    let before = make_state(&s);
    let mut c = s.conn();
    let ok: String = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    assert_eq!(ok, "OK");
    assert_eq!(snapshot(&mut c), before, "DEBUG RELOAD");
    drop(c);
    s.restart(Stop::ShutdownSave);
    check_state(&mut s.conn(), &before, "RDB restart");
}

#[test]
fn dump_and_restore_carry_every_holder_mode_and_limit() {
    let s = Server::start();
    let mut c = s.conn();
    make_state(&s);
    for key in ["rw", "sem"] {
        let payload: Vec<u8> = redis::cmd("DUMP").arg(key).query(&mut c).unwrap();
        let copy = format!("{key}-copy");
        let ok: String = redis::cmd("RESTORE").arg(&copy).arg(0).arg(payload).query(&mut c).unwrap();
        assert_eq!(ok, "OK");
        assert_eq!(info_still(&mut c, &copy), info_still(&mut c, key), "{key}: the restored copy");
    }
    assert_eq!(sem(&mut c, "sem-copy", "z", 1, 5), None, "the copy's permits are in use too");
}

fn aof_restart(preamble: &str) {
    let mut s = Server::start_aof(preamble);
    let before = make_state(&s);
    let mut c = s.conn();
    let _: Value = redis::cmd("BGREWRITEAOF").query(&mut c).unwrap();
    s.wait_aof_rewrite();
    // Changes after the rewrite land in the incremental file, as propagated.
    sem(&mut c, "sem2", "p", 1, 2).unwrap();
    acq(&mut c, "rw2", "q", LEASE, &["SHARED", "SESSION"]).unwrap().unwrap();
    let later = (info_still(&mut c, "sem2"), info_still(&mut c, "rw2"));
    s.restart(Stop::Kill);
    let mut c = s.conn();
    assert_eq!((info_still(&mut c, "sem2"), info_still(&mut c, "rw2")), later, "AOF preamble {preamble}");
    check_state(&mut c, &before, &format!("AOF restart, preamble {preamble}"));
}

#[test]
fn shared_and_semaphore_holders_survive_an_aof_restart_without_rdb_preamble() {
    aof_restart("no");
}

#[test]
fn shared_and_semaphore_holders_survive_an_aof_restart_with_rdb_preamble() {
    aof_restart("yes");
}

#[test]
fn replicas_follow_each_holder_and_a_promoted_replica_ends_their_leases() {
    let m = Server::start();
    let r = Server::replica_of(&m);
    let mut mc = m.conn();
    let mut rc = r.conn();
    let before = make_state(&m);
    // Long enough to be read back on the replica before it ends.
    acq(&mut mc, "rw", "short", 1_500, &["SHARED"]).unwrap().unwrap();
    let n: i64 = redis::cmd("WAIT").arg(1).arg(2000).query(&mut mc).unwrap();
    assert_eq!(n, 1);
    assert_eq!(owners(&mut rc, "rw"), ["a", "b", "short"]);
    assert_eq!(owners(&mut rc, "sem"), ["x", "y"]);
    wait_until("short's lease to end on the master and the replica", 5 * SECOND, || {
        owners(&mut rc, "rw") == ["a", "b"]
    });
    assert_eq!(snapshot(&mut rc), before, "the replica shows every holder as the master");
    release_ok(&mut mc, "rw", "a");
    let n: i64 = redis::cmd("WAIT").arg(1).arg(2000).query(&mut mc).unwrap();
    assert_eq!(n, 1);
    assert_eq!(holders(&mut rc, "rw")[0].holds, 1, "a's release reached the replica");

    // Promotion: the replica enforces the leases of the holders it has.
    acq(&mut mc, "sem", "x", 300, &["PERMITS", "2", "LIMIT", "5"]).unwrap().unwrap();
    let n: i64 = redis::cmd("WAIT").arg(1).arg(2000).query(&mut mc).unwrap();
    assert_eq!(n, 1);
    drop(m);
    let ok: String = redis::cmd("REPLICAOF").arg("NO").arg("ONE").query(&mut rc).unwrap();
    assert_eq!(ok, "OK");
    wait_until("x's renewed 300 ms lease to end on the promoted replica", 5 * SECOND, || {
        owners(&mut rc, "sem") == ["y"]
    });
    assert_eq!(sem(&mut rc, "sem", "z", 2, 5).map(|t| t > 0), Some(true), "the freed permits are granted");
}

// ------------------------------------------------------- waiting and MULTI

#[test]
fn wait_acts_as_a_try_inside_multi_and_lua() {
    let s = Server::start();
    let mut c = s.conn();
    acq(&mut c, "rw", "w", LEASE, &[]).unwrap().unwrap();
    let replies: (Option<i64>, Option<i64>) = redis::pipe()
        .atomic()
        .cmd("FLOCK.ACQUIRE")
        .arg("rw")
        .arg("r")
        .arg(LEASE)
        .arg("WAIT")
        .arg(0)
        .arg("SHARED")
        .cmd("FLOCK.ACQUIRE")
        .arg("free")
        .arg("r")
        .arg(LEASE)
        .arg("WAIT")
        .arg(0)
        .arg("SHARED")
        .query(&mut c)
        .unwrap();
    assert_eq!(replies.0, None, "WAIT inside MULTI is a try");
    assert!(replies.1.is_some());
    let lua: Option<i64> = redis::cmd("EVAL")
        .arg("return redis.call('FLOCK.ACQUIRE', KEYS[1], 'l', 60000, 'WAIT', 0, 'PERMITS', 1, 'LIMIT', 1)")
        .arg(1)
        .arg("sem")
        .query(&mut c)
        .unwrap();
    assert!(lua.is_some());
    let lua: Option<i64> = redis::cmd("EVAL")
        .arg("return redis.call('FLOCK.ACQUIRE', KEYS[1], 'k', 60000, 'WAIT', 0, 'PERMITS', 1, 'LIMIT', 1)")
        .arg(1)
        .arg("sem")
        .query(&mut c)
        .unwrap();
    assert_eq!(lua, None, "WAIT inside Lua is a try");
    assert!(queue_of(&mut c, "sem").is_empty() && queue_of(&mut c, "rw").is_empty());
}

#[test]
fn a_big_head_that_times_out_or_disconnects_lets_the_waiters_behind_it_in() {
    let s = Server::start();
    let mut c = s.conn();
    sem(&mut c, "sem", "a", 2, 3).unwrap();
    // The head wants 2 of the 3 permits; the one free permit waits behind it.
    // Its 300 ms WAIT must outlast the small one's queueing: that one is
    // connected and started before, and only sent once the head is queued.
    let mut small = redis::cmd("FLOCK.ACQUIRE");
    small.arg("sem").arg("small").arg(LEASE).arg("WAIT").arg(LONG_WAIT_MS).arg(&["PERMITS", "1", "LIMIT", "3"]);
    let (small_go, small) = spawn_cmd_on_signal(&s, small);
    let big = {
        let mut bc = s.conn();
        std::thread::spawn(move || acq(&mut bc, "sem", "big", LEASE, &["WAIT", "300", "PERMITS", "2", "LIMIT", "3"]))
    };
    wait_queue(&mut c, "sem", &["big"]);
    small_go.send(()).expect("small's thread");
    wait_queue(&mut c, "sem", &["big", "small"]);
    assert_eq!(big.join().unwrap().unwrap(), None, "the head's WAIT ran out");
    let (small, _) = small.join().expect("small's thread");
    assert!(matches!(small, Ok(Value::Int(_))), "small was not granted: {small:?}");
    assert_eq!(owners(&mut c, "sem"), ["a", "small"]);

    // The same with a writer at the head of a read-write lock that disconnects.
    shared(&mut c, "rw", "r1").unwrap();
    let mut wc = s.conn();
    let writer_id = client_id(&mut wc);
    let writer = std::thread::spawn(move || acq(&mut wc, "rw", "w", LEASE, &["WAIT", "0"]));
    wait_queue(&mut c, "rw", &["w"]);
    let r2 = queue(&s, &mut c, "rw", "r2", &["SHARED"]);
    let killed: i64 = redis::cmd("CLIENT").arg("KILL").arg("ID").arg(writer_id).query(&mut c).unwrap();
    assert_eq!(killed, 1);
    granted(r2, "r2");
    assert!(writer.join().unwrap().is_err(), "the writer's connection was closed");
    assert_eq!(owners(&mut c, "rw"), ["r1", "r2"]);
    assert!(s.stat("wait_disconnects") >= 1 && s.stat("wait_timeouts") >= 1);
}

#[test]
fn an_undelivered_shared_grant_frees_only_its_share() {
    let s = Server::start();
    let mut c = s.conn();
    acq(&mut c, "rw", "w", LEASE, &[]).unwrap().unwrap();
    let keep = queue(&s, &mut c, "rw", "keep", &["SHARED"]);
    let mut lc = s.conn();
    let lost_id = client_id(&mut lc);
    let lost = std::thread::spawn(move || acq(&mut lc, "rw", "lost", LEASE, &["WAIT", "0", "SHARED"]));
    wait_queue(&mut c, "rw", &["keep", "lost"]);
    let w2 = queue(&s, &mut c, "rw", "w2", &[]);
    let undelivered = s.stat("undelivered_grants");
    // One pipeline, one event-loop turn: the release grants keep and lost
    // together, and lost's client is killed before its reply is written.
    let (left, killed): (i64, i64) = redis::pipe()
        .cmd("FLOCK.RELEASE")
        .arg("rw")
        .arg("w")
        .cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(lost_id)
        .query(&mut c)
        .unwrap();
    assert_eq!((left, killed), (0, 1));
    granted(keep, "keep");
    assert!(lost.join().unwrap().is_err(), "lost's connection was closed");
    wait_until("lost's undelivered grant to end", 5 * SECOND, || owners(&mut c, "rw") == ["keep"]);
    assert_eq!(s.stat("undelivered_grants"), undelivered + 1);
    assert_eq!(queue_of(&mut c, "rw"), ["w2"], "keep still reads: the writer waits");
    release_ok(&mut c, "rw", "keep");
    granted(w2, "w2");
}

#[test]
fn max_waiters_bounds_shared_and_semaphore_queues_too() {
    let s = Server::start();
    let mut c = s.conn();
    config_set(&mut c, &[("flock.max-waiters", "1")]);
    sem(&mut c, "sem", "a", 1, 1).unwrap();
    let w = queue(&s, &mut c, "sem", "w", &["PERMITS", "1", "LIMIT", "1"]);
    let e = expect_err(acq(&mut c, "sem", "x", LEASE, &["WAIT", "0", "PERMITS", "1", "LIMIT", "1"]), "max-waiters");
    assert_eq!(error_code(&e), "MAXWAITERS");
    assert_eq!(queue_of(&mut c, "sem"), ["w"]);
    release_ok(&mut c, "sem", "a");
    granted(w, "w");
}

#[test]
fn request_ids_are_remembered_per_owner_grant() {
    let s = Server::start();
    let mut c = s.conn();
    let ta = acq(&mut c, "sem", "a", LEASE, &["ID", "ia", "PERMITS", "1", "LIMIT", "2"]).unwrap().unwrap();
    let tb = acq(&mut c, "sem", "b", LEASE, &["ID", "ib", "PERMITS", "1", "LIMIT", "2"]).unwrap().unwrap();
    assert_ne!(ta, tb);
    let again = acq(&mut c, "sem", "b", LEASE, &["ID", "ib", "PERMITS", "1", "LIMIT", "2"]).unwrap();
    assert_eq!(again, Some(tb), "a resend answers that owner's grant");
    assert_eq!(holders(&mut c, "sem")[1].holds, 1, "and adds no hold");
    let r: i64 = redis::cmd("FLOCK.RELEASE").arg("sem").arg("a").arg("ID").arg("ra").query(&mut c).unwrap();
    let r2: i64 = redis::cmd("FLOCK.RELEASE").arg("sem").arg("a").arg("ID").arg("ra").query(&mut c).unwrap();
    assert_eq!((r, r2), (0, 0), "a resent release is answered, not applied");
    assert_eq!(owners(&mut c, "sem"), ["b"]);
    // A grant handed to a waiter remembers its ID too.
    acq(&mut c, "rw", "x", LEASE, &[]).unwrap().unwrap();
    let r = {
        let mut rc = s.conn();
        std::thread::spawn(move || acq(&mut rc, "rw", "r", LEASE, &["WAIT", "0", "ID", "ir", "SHARED"]))
    };
    wait_queue(&mut c, "rw", &["r"]);
    release_ok(&mut c, "rw", "x");
    let tr = r.join().unwrap().unwrap().unwrap();
    assert_eq!(acq(&mut c, "rw", "r", LEASE, &["ID", "ir", "SHARED"]).unwrap(), Some(tr));
}

#[test]
fn memory_usage_counts_every_holder() {
    let s = Server::start();
    let mut c = s.conn();
    let usage = |c: &mut Connection, key: &str| -> i64 { redis::cmd("MEMORY").arg("USAGE").arg(key).query(c).unwrap() };
    acq(&mut c, "ex", "o0", LEASE, &[]).unwrap().unwrap();
    shared(&mut c, "rw", "o0").unwrap();
    let one = usage(&mut c, "rw");
    let mut last = one;
    for i in 1..10 {
        shared(&mut c, "rw", &format!("o{i}")).unwrap();
        let now = usage(&mut c, "rw");
        assert!(now > last, "MEMORY USAGE grows with each holder: {last} -> {now}");
        last = now;
    }
    for i in 0..4 {
        sem(&mut c, "sem", &format!("o{i}"), 1, 4).unwrap();
    }
    eprintln!(
        "MEMORY USAGE: exclusive {}, shared with 1 holder {one}, with 10 holders {last}, semaphore with 4 holders {}",
        usage(&mut c, "ex"),
        usage(&mut c, "sem")
    );
    for i in 0..10 {
        release_ok(&mut c, "rw", &format!("o{i}"));
    }
    assert!(!exists(&mut c, "rw"), "the last release removes the key");
}

#[test]
fn a_lapsed_shared_lease_seen_by_a_command_ends_before_the_command_runs() {
    let s = Server::start();
    let mut c = s.conn();
    let t0 = Instant::now();
    acq(&mut c, "rw", "a", 200, &["SHARED"]).unwrap().unwrap();
    wait_until("a's lease to run out", 5 * SECOND, || t0.elapsed() > Duration::from_millis(250));
    // Whether the timer or this command ends it first, a's grant is gone.
    let again = shared(&mut c, "rw", "a").unwrap();
    assert_eq!(holders(&mut c, "rw").len(), 1);
    assert_eq!(holders(&mut c, "rw")[0].holds, 1, "a new grant, not a reentry of the lapsed one ({again})");
}

// ---------------------------------------------------------------- Cluster

#[test]
fn on_a_cluster_shared_and_semaphore_keys_are_routed_and_move_with_their_slot() {
    use crate::common::cluster::Cluster;
    let cl = Cluster::start();
    let mut cc = cl.client();
    let (rw, pool) = ("{sh}:rw", "{sh}:pool");
    let ta: Option<i64> = redis::cmd("FLOCK.ACQUIRE").arg(rw).arg("a").arg(LEASE).arg("SHARED").query(&mut cc).unwrap();
    let tb: Option<i64> = redis::cmd("FLOCK.ACQUIRE").arg(rw).arg("b").arg(LEASE).arg("SHARED").query(&mut cc).unwrap();
    assert!(ta.is_some() && tb > ta, "the cluster client routes SHARED grants");
    let tp: Option<i64> = redis::cmd("FLOCK.ACQUIRE")
        .arg(pool)
        .arg("p")
        .arg(LEASE)
        .arg("PERMITS")
        .arg(2)
        .arg("LIMIT")
        .arg(3)
        .query(&mut cc)
        .unwrap();
    assert!(tp.is_some());

    let slot = cl.keyslot(rw);
    let src = cl.owner_of_slot(slot);
    let dst = *cl.masters().iter().find(|&&m| m != src).expect("another master");
    let (mut sc, mut dc) = (cl.conn(src), cl.conn(dst));
    let before = (info_still(&mut sc, rw), info_still(&mut sc, pool));
    cl.migrate_keys(slot, src, dst, &[rw, pool]);
    cl.assign_slot(slot, src, dst);
    assert_eq!((info_still(&mut dc, rw), info_still(&mut dc, pool)), before, "every holder moved with the slot");
    let full: Option<i64> = redis::cmd("FLOCK.ACQUIRE")
        .arg(pool)
        .arg("q")
        .arg(LEASE)
        .arg("PERMITS")
        .arg(2)
        .arg("LIMIT")
        .arg(3)
        .query(&mut dc)
        .unwrap();
    assert_eq!(full, None, "p's 2 permits are still in use on the new master");
    assert_eq!(release_ok(&mut dc, rw, "a"), 0);
    assert_eq!(owners(&mut dc, rw), ["b"]);
}

// ------------------------------------------------------- many clients at once

/// One client's rounds on `key`: acquire (waiting), then, while it holds,
/// add to a plain Redis counter and check the others (`writers`: alone;
/// `readers`: no writer; `permits`: at most 4), take it off, release.
/// `kind(i)` gives round i's extra ACQUIRE args, its counter and amount.
/// Returns the tokens it was granted.
fn rounds(
    s: &Server,
    key: &'static str,
    owner: String,
    n: usize,
    kind: impl Fn(usize) -> (Vec<String>, &'static str, i64) + Send + 'static,
) -> JoinHandle<Vec<i64>> {
    let mut c = s.conn();
    std::thread::spawn(move || {
        let mut tokens = Vec::new();
        for i in 0..n {
            let (extra, counter, add) = kind(i);
            let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
            let args = [&["WAIT", "20000"][..], &extra].concat();
            let t = acq(&mut c, key, &owner, LEASE, &args).unwrap().unwrap_or_else(|| panic!("{owner} round {i}"));
            tokens.push(t);
            let now: i64 = redis::cmd("INCRBY").arg(counter).arg(add).query(&mut c).unwrap();
            let other: Option<i64> =
                redis::cmd("GET").arg(if counter == "writers" { "readers" } else { "writers" }).query(&mut c).unwrap();
            match counter {
                "writers" => {
                    assert!(now == 1 && other.unwrap_or(0) == 0, "a writer with {now} writers, {other:?} readers")
                }
                "readers" => assert_eq!(other.unwrap_or(0), 0, "a reader while a writer holds the lock"),
                _ => assert!(now <= 4, "{now} permits in use of 4"),
            }
            let _: i64 = redis::cmd("INCRBY").arg(counter).arg(-add).query(&mut c).unwrap();
            assert_eq!(release(&mut c, key, &owner).unwrap(), 0);
        }
        tokens
    })
}

#[test]
fn many_clients_never_see_a_writer_with_anyone_else_or_more_permits_than_the_limit() {
    let s = Server::start();
    let mut threads = Vec::new();
    for t in 0..6 {
        threads.push(rounds(&s, "rw", format!("rw{t}"), 40, move |i| {
            if (i + t) % 4 == 0 {
                (vec![], "writers", 1)
            } else {
                (vec!["SHARED".into()], "readers", 1)
            }
        }));
    }
    for t in 0..6 {
        threads.push(rounds(&s, "pool", format!("p{t}"), 40, move |i| {
            let n = 1 + (i + t) % 3;
            (vec!["PERMITS".into(), n.to_string(), "LIMIT".into(), "4".into()], "permits", n as i64)
        }));
    }
    let mut tokens: Vec<i64> = threads.into_iter().flat_map(|h| h.join().expect("client thread")).collect();
    let n = tokens.len();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), n, "every grant had its own token");
    let mut c = s.conn();
    assert!(!exists(&mut c, "rw") && !exists(&mut c, "pool"), "nothing is left held");
    assert_eq!(s.stat("waiters"), 0);
}

// ------------------------------------------------------- FLOCK.HOLDER

#[test]
fn flock_holder_and_flock_free_from_a_client_are_refused_and_change_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    shared(&mut c, "rw", "a").unwrap();
    let before = info_still(&mut c, "rw");
    let far = (u64::MAX / 2).to_string();
    for args in [
        &["rw", "shared", "0", "a"][..],
        &["rw", "shared", "0", "x", "1", "5", &far, "0", "0"],
        &["new", "semaphore", "3"],
        &["rw", "shared", "0", "a", "ID", "i", "1", "1", &far],
    ] {
        let e = expect_err(redis::cmd("FLOCK.HOLDER").arg(args).query::<Value>(&mut c), "FLOCK.HOLDER from a client");
        assert!(e.to_string().contains("internal"), "{e}");
    }
    for args in [&["rw"][..], &["rw", "ID", "i", "1", "1", &far]] {
        let e = expect_err(redis::cmd("FLOCK.FREE").arg(args).query::<Value>(&mut c), "FLOCK.FREE from a client");
        assert!(e.to_string().contains("internal"), "{e}");
    }
    assert_eq!(info_still(&mut c, "rw"), before);
    assert!(!exists(&mut c, "new"));
}

#[test]
fn an_aof_holder_no_command_could_have_made_is_refused_and_the_valid_ones_load() {
    let dir = temp_dir("aofholder");
    let far = (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
        + 600_000)
        .to_string();
    let aof = resp(&["SELECT", "0"])
        + &resp(&["FLOCK.HOLDER", "sem", "semaphore", "3", "a", "1", "5", &far, "0", "2"])
        + &resp(&["FLOCK.HOLDER", "sem", "semaphore", "3", "b", "1", "6", &far, "0", "4"])
        + &resp(&["FLOCK.HOLDER", "rw", "shared", "0", "r", "2", "7", &far, "1", "0"])
        + &resp(&["FLOCK.HOLDER", "rw", "shared", "0", "x", "1", "8", &far, "0", "1"])
        + &resp(&["FLOCK.HOLDER", "gone", "shared", "0", "g", "1", "9", &far, "0", "0"])
        + &resp(&["FLOCK.HOLDER", "gone", "shared", "0", "g"]);
    std::fs::write(dir.path().join("appendonly.aof"), aof).unwrap();
    let s = Server::start_in(dir, &["--appendonly", "yes"]);
    let mut c = s.conn();
    assert_eq!(holders(&mut c, "sem"), [Held { owner: "a".into(), holds: 1, token: 5, session: 0, permits: 2 }]);
    assert_eq!(holders(&mut c, "rw"), [Held { owner: "r".into(), holds: 2, token: 7, session: 1, permits: 0 }]);
    assert!(!exists(&mut c, "gone"), "a holder set and then unset leaves no key");
    assert_eq!(sem(&mut c, "sem", "c", 1, 3).map(|t| t > 8), Some(true), "one permit is free; tokens rise");
}
