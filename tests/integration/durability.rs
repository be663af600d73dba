//! Durability and replication: locks survive DEBUG RELOAD, restarts from RDB
//! and AOF, DUMP/RESTORE, reach replicas change by change, and a promoted
//! replica enforces the remaining leases with ever larger fencing tokens.
use crate::common::*;

use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// Helpers local to this file.

/// How far apart two `ttl-ms` readings of the same absolute deadline may be
/// (the readings are taken a moment apart, on a busy machine).
const TTL_SLACK_MS: i64 = 100;

fn waiters(c: &mut Connection, key: &str) -> i64 {
    int_field(c, key, "waiters")
}

/// What a reload, a restart or a replica must keep exactly of a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    owner: String,
    holds: i64,
    token: i64,
    session: i64,
}

fn held(c: &mut Connection, key: &str) -> Option<Held> {
    let fields = info(c, key)?;
    let get = |name: &str| {
        fields.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()).unwrap_or_else(|| panic!("no field {name}"))
    };
    Some(Held {
        owner: redis::from_redis_value(&get("owner")).expect("owner"),
        holds: int(&get("holds")),
        token: int(&get("token")),
        session: int(&get("session")),
    })
}

fn held_by(c: &mut Connection, key: &str, owner: &str) -> Held {
    let h = held(c, key).unwrap_or_else(|| panic!("{key} is not held (expected {owner})"));
    assert_eq!(h.owner, owner, "holder of {key}");
    h
}

fn session_acquire(c: &mut Connection, key: &str, owner: &str, lease_ms: u64) -> i64 {
    redis::cmd("FLOCK.ACQUIRE")
        .arg(key)
        .arg(owner)
        .arg(lease_ms)
        .arg("SESSION")
        .query::<Option<i64>>(c)
        .unwrap()
        .expect("granted")
}

/// Tokens handed out so far, to check that later ones are larger.
#[derive(Default)]
struct Issued(Vec<i64>);

impl Issued {
    fn add(&mut self, token: i64) -> i64 {
        self.0.push(token);
        token
    }

    fn max(&self) -> i64 {
        self.0.iter().copied().max().expect("some tokens were issued")
    }

    fn assert_below(&self, token: i64, what: &str) {
        assert!(
            token > self.max(),
            "{what}: token {token} is not larger than every earlier token (max {})",
            self.max()
        );
    }
}

/// Grants `key` to `owner` and then releases it: the key is gone, its token
/// is remembered.
fn grant_and_delete(c: &mut Connection, issued: &mut Issued, key: &str) {
    issued.add(acquire(c, key, "gone", 60_000).unwrap().expect("granted"));
    assert_eq!(release(c, key, "gone").unwrap(), 0);
    assert!(!exists(c, key));
}

/// `now - then` in ms, for comparing ttl readings taken at two moments.
fn ms_since(then: Instant) -> i64 {
    then.elapsed().as_millis() as i64
}

/// `ttl` read `then` should have become `now_ttl` by now.
fn assert_ttl_counted_down(key: &str, before: i64, then: Instant, now_ttl: i64) {
    let expected = before - ms_since(then);
    assert!(now_ttl <= before, "{key}: ttl-ms {now_ttl} grew (was {before})");
    assert!(
        (now_ttl - expected).abs() <= TTL_SLACK_MS,
        "{key}: ttl-ms {now_ttl}, expected about {expected} (the same absolute deadline as before)"
    );
}

fn debug_reload(c: &mut Connection) {
    let ok: String = redis::cmd("DEBUG").arg("RELOAD").query(c).expect("DEBUG RELOAD");
    assert_eq!(ok, "OK");
}

/// Once the replica has applied the master's writes, it shows the master's owner/holds/token/session
/// and (nearly) the same ttl, with no waiters of its own.
fn assert_replicated(mc: &mut Connection, rc: &mut Connection, key: &str, what: &str) {
    wait_replica_applied(mc, rc);
    let on_master = held(mc, key);
    let master_ttl = on_master.as_ref().map(|_| ttl_ms(mc, key));
    let on_replica = held(rc, key);
    assert_eq!(on_replica, on_master, "{what}: FLOCK.INFO {key} on the replica vs the master");
    match master_ttl {
        Some(mt) => {
            let rt = ttl_ms(rc, key);
            assert!((mt - rt).abs() <= TTL_SLACK_MS, "{what}: ttl-ms on replica {rt}, on master {mt}");
            assert_eq!(waiters(rc, key), 0, "{what}: waiters are not replicated");
            assert!(queue_of(rc, key).is_empty(), "{what}: waiters are not replicated");
        }
        None => assert!(!exists(rc, key), "{what}: {key} should be gone on the replica"),
    }
}

fn replicaof_no_one(c: &mut Connection) {
    let ok: String = redis::cmd("REPLICAOF").arg("NO").arg("ONE").query(c).expect("REPLICAOF NO ONE");
    assert_eq!(ok, "OK");
}

// ---------------------------------------------------------------------------
// DEBUG RELOAD.

#[test]
fn debug_reload_keeps_owner_holds_token_and_the_running_lease() {
    let s = Server::start();
    let mut c = s.conn();
    let mut issued = Issued::default();
    let token = issued.add(acquire(&mut c, "L", "a", 60_000).unwrap().expect("granted"));
    acquire(&mut c, "L", "a", 60_000).unwrap().expect("reentered");
    let mut sc = s.conn();
    issued.add(session_acquire(&mut sc, "S", "s", 60_000));
    grant_and_delete(&mut c, &mut issued, "D");

    let (before_l, before_s) = (held_by(&mut c, "L", "a"), held_by(&mut c, "S", "s"));
    assert_eq!(before_l.holds, 2);
    assert_eq!(before_s.session, 1);
    // Held long while the rest is set up (a connection and several round
    // trips, slow on a loaded machine): the lease is cut to 1500 ms in the
    // packet that reads the ttl the reload must keep counting down.
    let sent = Instant::now();
    let (renewed, fields): (i64, Value) = renew_to("L", "a", 1_500).cmd("FLOCK.INFO").arg("L").query(&mut c).unwrap();
    assert_eq!(renewed, token);
    let ttl0 = int(&fields_of(&fields).into_iter().find(|(k, _)| k == "ttl-ms").expect("ttl-ms").1);
    let t0 = Instant::now();

    debug_reload(&mut c);

    assert_eq!(held(&mut c, "L"), Some(before_l), "owner/holds/token/session of L after DEBUG RELOAD");
    assert_eq!(held(&mut c, "S"), Some(before_s), "the SESSION lock keeps its session flag");
    let ttl1 = ttl_ms(&mut c, "L");
    assert!(ttl1 > 0, "the lease is still running after reload");
    assert_ttl_counted_down("L", ttl0, t0, ttl1);
    wait_until("ttl-ms of L to keep counting down", 2 * SECOND, || exists(&mut c, "L") && ttl_ms(&mut c, "L") < ttl1);
    assert_eq!(acquire(&mut c, "L", "b", 1_000).unwrap(), None, "L is still held after reload");

    wait_gone(&mut c, "L", sent + Duration::from_millis(1_500), 5 * SECOND);
    assert!(ms_since(sent) <= 1_500 + 1_000, "L expired {} ms after its grant, lease 1500", ms_since(sent));

    let t = acquire(&mut c, "L", "b", 10_000).unwrap().expect("granted after expiry");
    issued.assert_below(t, "grant of L after reload");
    let t = acquire(&mut c, "D", "b", 10_000).unwrap().expect("granted");
    issued.assert_below(t, "grant of D (deleted before the reload)");
}

#[test]
fn debug_reload_and_restore_arm_leases_of_locks_in_other_databases() {
    let s = Server::start();
    let (mut c0, mut c5) = (s.conn_db(0), s.conn_db(5));
    let sent = Instant::now();
    acquire(&mut c5, "L", "a", 1_000).unwrap().expect("granted");
    acquire(&mut c0, "R", "r", 1_000).unwrap().expect("granted");
    let payload: Vec<u8> = redis::cmd("DUMP").arg("R").query(&mut c0).expect("DUMP");
    let mut c7 = s.conn_db(7);
    let ok: String = redis::cmd("RESTORE").arg("R").arg(0).arg(&payload).query(&mut c7).expect("RESTORE into db 7");
    assert_eq!(ok, "OK");
    debug_reload(&mut c0);
    assert_eq!(owner_of(&mut c5, "L").as_deref(), Some("a"), "db 5 lock after DEBUG RELOAD");
    assert_eq!(owner_of(&mut c7, "R").as_deref(), Some("r"), "db 7 restored lock after DEBUG RELOAD");
    let deadline = sent + Duration::from_millis(1_000);
    wait_gone(&mut c5, "L", deadline, 5 * SECOND);
    wait_gone(&mut c7, "R", deadline, 5 * SECOND);
    wait_gone(&mut c0, "R", deadline, 5 * SECOND);
}

#[test]
fn debug_reload_strands_no_blocked_waiter() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "L", "a", 60_000).unwrap().expect("granted");
    // WAIT 0: a waiter the reload forgot would block for ever.
    let w = spawn_waiter(&s, "L", "b", 10_000, 0);
    wait_queue(&mut c, "L", &["b"]);
    debug_reload(&mut c);
    assert_eq!(owner_of(&mut c, "L").as_deref(), Some("a"), "the holder survives the reload");
    // Either the waiter was answered (it retries) or it is still queued and
    // is granted on release; it must not stay blocked on a lock that forgot it.
    let queued = queue_of(&mut c, "L");
    assert_eq!(release(&mut c, "L", "a").unwrap(), 0);
    wait_until("no client left blocked after DEBUG RELOAD and a release", 5 * SECOND, || s.blocked_clients() == 0);
    let reply = w.join().expect("waiter thread");
    if queued == ["b"] {
        assert!(matches!(reply, Ok(Some(_))), "b was still queued after the reload but got {reply:?} on release");
        assert_eq!(owner_of(&mut c, "L").as_deref(), Some("b"));
    } else {
        assert!(queued.is_empty(), "queue after reload: {queued:?}");
        eprintln!("the reload answered the waiter: {reply:?}");
    }
}

// ---------------------------------------------------------------------------
// Restart from RDB.

/// Locks made before a restart and what must come back.
struct Before {
    issued: Issued,
    long: Held,
    session: Held,
    /// ttl-ms of `long` and when it was read.
    ttl: (i64, Instant),
    /// When the `short` lease ends (it runs out while the server is down).
    short_deadline: Instant,
    /// The connection holding `session`, open until the server goes down.
    _session_conn: Connection,
}

/// `long` (holds 2, 60 s), `session` (SESSION), `short` (400 ms), and the
/// deleted keys `gone1`, `gone2`.
fn make_locks(s: &Server) -> Before {
    let mut c = s.conn();
    let mut issued = Issued::default();
    issued.add(acquire(&mut c, "long", "a", 60_000).unwrap().expect("granted"));
    acquire(&mut c, "long", "a", 60_000).unwrap().expect("reentered");
    let mut sc = s.conn();
    issued.add(session_acquire(&mut sc, "session", "s", 60_000));
    let sent = Instant::now();
    issued.add(acquire(&mut c, "short", "x", 400).unwrap().expect("granted"));
    grant_and_delete(&mut c, &mut issued, "gone1");
    grant_and_delete(&mut c, &mut issued, "gone2");
    let long = held_by(&mut c, "long", "a");
    assert_eq!(long.holds, 2);
    let session = held_by(&mut c, "session", "s");
    assert_eq!(session.session, 1);
    let ttl = (ttl_ms(&mut c, "long"), Instant::now());
    Before { issued, long, session, ttl, short_deadline: sent + Duration::from_millis(400), _session_conn: sc }
}

/// After the restart: held locks restored exactly, the lapsed lease ended
/// at load, new tokens larger than all before.
fn check_restored(s: &Server, before: &Before, how: &str) {
    let mut c = s.conn();
    wait_until(&format!("{how}: `short` (lease ran out while down) to be gone after load"), 2 * SECOND, || {
        !exists(&mut c, "short")
    });
    assert_eq!(held(&mut c, "long").as_ref(), Some(&before.long), "{how}: owner/holds/token/session of `long`");
    assert_ttl_counted_down("long", before.ttl.0, before.ttl.1, ttl_ms(&mut c, "long"));
    assert_eq!(held(&mut c, "session").as_ref(), Some(&before.session), "{how}: the SESSION lock and its flag");
    assert_eq!(acquire(&mut c, "long", "b", 1_000).unwrap(), None, "{how}: `long` is still held");
    assert_eq!(
        acquire(&mut c, "long", "a", 60_000).unwrap(),
        Some(before.long.token),
        "{how}: reentry by the holder returns its token"
    );
    assert_eq!(release(&mut c, "long", "a").unwrap(), 2, "{how}: three holds, one released");
    for key in ["gone1", "gone2", "short", "fresh"] {
        let t = acquire(&mut c, key, "n", 10_000).unwrap().expect("granted");
        before.issued.assert_below(t, &format!("{how}: first grant of {key} after the restart"));
    }
}

fn rdb_restart(how: Stop) {
    let mut s = Server::start();
    let before = make_locks(&s);
    if how == Stop::Kill {
        let ok: String = redis::cmd("SAVE").query(&mut s.conn()).unwrap();
        assert_eq!(ok, "OK");
    }
    s.stop(how);
    assert!(s.dir.path().join("dump.rdb").exists(), "no dump.rdb after {how:?}");
    wait_until("the `short` lease to run out while the server is down", 5 * SECOND, || {
        Instant::now() >= before.short_deadline + Duration::from_millis(20)
    });
    s.restart(Stop::Kill);
    check_restored(&s, &before, &format!("RDB ({how:?})"));
}

#[test]
fn restart_from_rdb_after_save_and_kill_restores_locks_expires_lapsed_leases_and_keeps_tokens_rising() {
    rdb_restart(Stop::Kill);
}

#[test]
fn restart_from_rdb_after_shutdown_save_restores_locks_expires_lapsed_leases_and_keeps_tokens_rising() {
    rdb_restart(Stop::ShutdownSave);
}

// ---------------------------------------------------------------------------
// Restart from AOF.

fn aof_files(s: &Server) -> String {
    let dir = s.dir.path().join("appendonlydir");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .map(|it| it.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    names.sort();
    names.join(", ")
}

/// One AOF scenario: locks changed by grant, reentry, renew, hand-off,
/// force release and deletion; optionally BGREWRITEAOF and more changes
/// after it; kill -9; restart from the AOF.
fn locks_survive_aof_restart(preamble: &str, rewrite: bool) {
    let how =
        format!("AOF (aof-use-rdb-preamble {preamble}, {} BGREWRITEAOF)", if rewrite { "after" } else { "before" });
    let mut s = Server::start_aof(preamble);
    let mut before = make_locks(&s);
    let mut c = s.conn();
    // Renewed, handed off on release and force-released locks.
    before.issued.add(acquire(&mut c, "renewed", "r", 10_000).unwrap().expect("granted"));
    renew(&mut c, "renewed", "r", 90_000).unwrap();
    before.issued.add(acquire(&mut c, "handed", "h", 60_000).unwrap().expect("granted"));
    let w = waiter(&s, "handed", "w", 70_000);
    wait_queue(&mut c, "handed", &["w"]);
    assert_eq!(release(&mut c, "handed", "h").unwrap(), 0);
    before.issued.add(granted(w, "w"));
    before.issued.add(acquire(&mut c, "forced", "f", 60_000).unwrap().expect("granted"));
    assert_eq!(force_release(&mut c, "forced").unwrap(), 1);
    // Handed on by the lease timer while the server is up.
    before.issued.add(acquire(&mut c, "expiring", "e", 200).unwrap().expect("granted"));
    let v = waiter(&s, "expiring", "v", 60_000);
    before.issued.add(granted(v, "v (granted when e's lease ran out)"));

    if rewrite {
        let _: Value = redis::cmd("BGREWRITEAOF").query(&mut c).expect("BGREWRITEAOF");
        s.wait_aof_rewrite();
    }
    // Changes after the rewrite (or simply more changes): they land in the
    // incremental AOF on top of the rewritten base.
    renew(&mut c, "renewed", "r", 120_000).unwrap();
    before.issued.add(acquire(&mut c, "later", "l", 60_000).unwrap().expect("granted"));
    acquire(&mut c, "later", "l", 80_000).unwrap().expect("reentered");
    grant_and_delete(&mut c, &mut before.issued, "gone3");

    let kept: Vec<(&str, Held, i64, Instant)> = ["renewed", "handed", "later", "expiring"]
        .into_iter()
        .map(|k| (k, held(&mut c, k).unwrap_or_else(|| panic!("{k} held")), ttl_ms(&mut c, k), Instant::now()))
        .collect();
    assert_eq!(kept[1].1.owner, "w", "`handed` was handed to w");
    assert_eq!(kept[2].1.holds, 2);
    assert_eq!(kept[3].1.owner, "v", "`expiring` was handed to v on expiry");
    drop(c);

    s.stop(Stop::Kill);
    let files = aof_files(&s);
    wait_until("the `short` lease to run out while the server is down", 5 * SECOND, || {
        Instant::now() >= before.short_deadline + Duration::from_millis(20)
    });
    s.restart(Stop::Kill);
    let mut c = s.conn();
    let loaded = s.info_section("persistence");
    assert_eq!(loaded.get("aof_enabled").map(String::as_str), Some("1"), "{how}: restarted with appendonly yes");

    for (key, h, ttl, at) in &kept {
        assert_eq!(
            held(&mut c, key).as_ref(),
            Some(h),
            "{how}: owner/holds/token/session of {key} (AOF files: {files})"
        );
        assert_ttl_counted_down(key, *ttl, *at, ttl_ms(&mut c, key));
    }
    assert!(!exists(&mut c, "forced"), "{how}: the force-released lock stays gone");
    for key in ["gone3", "forced"] {
        assert!(!exists(&mut c, key), "{how}: {key} was deleted before the restart");
        let t = acquire(&mut c, key, "n", 10_000).unwrap().expect("granted");
        before.issued.assert_below(t, &format!("{how}: first grant of {key} after the restart"));
    }
    drop(c);
    check_restored(&s, &before, &how);

    // What happened after the load (the lapsed lease ended, new grants) is
    // in the AOF too: a second restart shows the same locks.
    let mut c = s.conn();
    let keys = [
        "long", "session", "renewed", "handed", "later", "expiring", "gone1", "gone2", "gone3", "forced", "short",
        "fresh",
    ];
    let now: Vec<Option<Held>> = keys.iter().map(|k| held(&mut c, k)).collect();
    drop(c);
    s.restart(Stop::Kill);
    let mut c = s.conn();
    for (key, h) in keys.iter().zip(&now) {
        assert_eq!(&held(&mut c, key), h, "{how}: {key} after a second restart");
    }
}

#[test]
fn restart_from_aof_with_rdb_preamble_before_rewrite_restores_locks_exactly() {
    locks_survive_aof_restart("yes", false);
}

#[test]
fn restart_from_aof_with_rdb_preamble_after_rewrite_restores_locks_exactly() {
    locks_survive_aof_restart("yes", true);
}

#[test]
fn restart_from_aof_without_rdb_preamble_before_rewrite_restores_locks_exactly() {
    locks_survive_aof_restart("no", false);
}

#[test]
fn restart_from_aof_without_rdb_preamble_after_rewrite_restores_locks_exactly() {
    locks_survive_aof_restart("no", true);
}

// ---------------------------------------------------------------------------
// DUMP / RESTORE.

#[test]
fn dump_restore_carries_owner_holds_token_without_waiters_and_arms_the_lease() {
    let s = Server::start();
    let mut c = s.conn();
    let mut issued = Issued::default();
    let token = issued.add(acquire(&mut c, "L", "a", 60_000).unwrap().expect("granted"));
    acquire(&mut c, "L", "a", 60_000).unwrap().expect("reentered");
    let w = waiter(&s, "L", "b", 10_000);
    wait_queue(&mut c, "L", &["b"]);

    // Held long while b queues (slow on a loaded machine): the lease is cut
    // to 1500 ms in the packet that dumps the lock.
    let sent = Instant::now();
    let (renewed, payload): (i64, Vec<u8>) =
        renew_to("L", "a", 1_500).cmd("DUMP").arg("L").query(&mut c).expect("DUMP");
    assert_eq!(renewed, token);
    let ok: String = redis::cmd("RESTORE").arg("L2").arg(0).arg(&payload).query(&mut c).expect("RESTORE");
    assert_eq!(ok, "OK");

    let t: String = redis::cmd("TYPE").arg("L2").query(&mut c).unwrap();
    assert_eq!(t, "flocklock");
    let original = held_by(&mut c, "L", "a");
    assert_eq!(original.holds, 2);
    assert_eq!(held(&mut c, "L2"), Some(original), "owner/holds/token/session of the restored lock");
    assert_eq!(waiters(&mut c, "L2"), 0, "a restored lock has no waiters");
    assert!(queue_of(&mut c, "L2").is_empty());
    assert_eq!(queue_of(&mut c, "L"), ["b"], "the original keeps its waiter");
    let (tl, tl2) = (ttl_ms(&mut c, "L"), ttl_ms(&mut c, "L2"));
    assert!((tl - tl2).abs() <= TTL_SLACK_MS, "restored lease {tl2} ms left, original {tl} ms");
    assert_eq!(acquire(&mut c, "L2", "x", 1_000).unwrap(), None, "the restored lock is held");

    wait_gone(&mut c, "L2", sent + Duration::from_millis(1_500), 5 * SECOND);
    assert!(ms_since(sent) <= 1_500 + 1_000, "restored lock expired {} ms after the grant, lease 1500", ms_since(sent));
    issued.add(granted(w, "b (waiter on the original, granted at its expiry)"));
    let t = acquire(&mut c, "L2", "y", 10_000).unwrap().expect("granted");
    issued.assert_below(t, "grant of the restored key after its expiry");
}

#[test]
fn restore_of_a_lock_whose_lease_already_ran_out_ends_it_at_once() {
    let s = Server::start();
    let mut c = s.conn();
    let sent = Instant::now();
    // One packet: the 300 ms lease cannot run out before the DUMP.
    let (token, payload): (Option<i64>, Vec<u8>) =
        redis::pipe().cmd("FLOCK.ACQUIRE").arg("L").arg("a").arg(300).cmd("DUMP").arg("L").query(&mut c).expect("DUMP");
    token.expect("granted");
    wait_gone(&mut c, "L", sent + Duration::from_millis(300), 5 * SECOND);
    let ok: String = redis::cmd("RESTORE").arg("L2").arg(0).arg(&payload).query(&mut c).expect("RESTORE");
    assert_eq!(ok, "OK");
    wait_until("the restored lock with a lapsed lease to end", SECOND, || !exists(&mut c, "L2"));
}

/// A renamed lock carries its request IDs (they travel with a key in use),
/// and leaves no key under either name once free.
#[test]
fn a_renamed_lock_released_leaves_no_key_and_remembers_its_ids() {
    let s = Server::start();
    let mut c = s.conn();
    let _: i64 = redis::cmd("FLOCK.ACQUIRE").arg("L").arg("a").arg(10_000).arg("ID").arg("r1").query(&mut c).unwrap();
    let _: () = redis::cmd("RENAME").arg("L").arg("L2").query(&mut c).expect("RENAME");
    let again: i64 =
        redis::cmd("FLOCK.ACQUIRE").arg("L2").arg("a").arg(10_000).arg("ID").arg("r1").query(&mut c).unwrap();
    assert_eq!(
        info_field(&mut c, "L2", "holds"),
        Some(Value::Int(1)),
        "the resend under the new name added no hold: {again}"
    );
    let _: i64 = redis::cmd("FLOCK.RELEASE").arg("L2").arg("a").arg("ID").arg("r2").query(&mut c).unwrap();
    assert!(!exists(&mut c, "L") && !exists(&mut c, "L2"), "free means gone, under either name");
    let left: i64 = redis::cmd("FLOCK.RELEASE").arg("L2").arg("a").arg("ID").arg("r2").query(&mut c).unwrap();
    assert_eq!(left, 0, "the release's resend is answered as the first time");
    assert_eq!(s.stat("locks"), 0);
}

#[test]
fn restore_replace_over_a_lock_ends_its_waiters_and_installs_the_dumped_lock() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "B", "x", 60_000).unwrap().expect("granted");
    let w = waiter(&s, "B", "y", 10_000);
    wait_queue(&mut c, "B", &["y"]);
    // A's 1500 ms lease begins only now that y is queued (slow on a loaded
    // machine), in the packet that dumps it.
    let sent = Instant::now();
    let (ta, payload): (Option<i64>, Vec<u8>) = redis::pipe()
        .cmd("FLOCK.ACQUIRE")
        .arg("A")
        .arg("a")
        .arg(1_500)
        .cmd("DUMP")
        .arg("A")
        .query(&mut c)
        .expect("DUMP");
    let ta = ta.expect("granted");

    let ok: String =
        redis::cmd("RESTORE").arg("B").arg(0).arg(&payload).arg("REPLACE").query(&mut c).expect("RESTORE REPLACE");
    assert_eq!(ok, "OK");
    let e = w.join().expect("waiter thread").expect_err("the replaced lock's waiter");
    assert!(e.to_string().contains("LOCKDELETED"), "waiter of the replaced lock got {e}");
    assert_eq!(held(&mut c, "B"), held(&mut c, "A"), "B now holds A's dumped state");
    assert_eq!(held_by(&mut c, "B", "a").token, ta);
    assert_eq!(waiters(&mut c, "B"), 0);
    wait_gone(&mut c, "B", sent + Duration::from_millis(1_500), 5 * SECOND);
}

#[test]
fn migrate_carries_the_lock_to_another_server_with_its_lease_and_ends_the_source_waiters() {
    let (s1, s2) = (Server::start(), Server::start());
    let (mut c1, mut c2) = (s1.conn(), s2.conn());
    let t = acquire(&mut c1, "L", "a", 60_000).unwrap().expect("granted");
    acquire(&mut c1, "L", "a", 60_000).unwrap().expect("reentered");
    let before = held_by(&mut c1, "L", "a");
    let w = waiter(&s1, "L", "b", 10_000);
    wait_queue(&mut c1, "L", &["b"]);

    // Held long while b queues (slow on a loaded machine): the lease is cut
    // to 1500 ms in the packet that migrates the lock.
    let sent = Instant::now();
    let (renewed, ok): (i64, String) = renew_to("L", "a", 1_500)
        .cmd("MIGRATE")
        .arg("127.0.0.1")
        .arg(s2.port)
        .arg("L")
        .arg(0)
        .arg(5_000)
        .query(&mut c1)
        .expect("MIGRATE");
    assert_eq!((renewed, ok.as_str()), (t, "OK"));
    assert!(!exists(&mut c1, "L"), "the source key is gone");
    let e = w.join().expect("waiter thread").expect_err("the waiter on the source");
    assert!(e.to_string().contains("LOCKDELETED"), "waiter on the migrated-away lock got {e}");
    assert_eq!(held(&mut c2, "L"), Some(before), "owner/holds/token/session on the target");
    assert_eq!(waiters(&mut c2, "L"), 0);
    wait_gone(&mut c2, "L", sent + Duration::from_millis(1_500), 5 * SECOND);
    let t2 = acquire(&mut c2, "L", "c", 1_000).unwrap().expect("granted on the target");
    assert!(t2 > t, "token {t2} on the target after migration, {t} before");
}

// ---------------------------------------------------------------------------
// FLOCK.STATE is internal.

#[test]
fn flock_state_from_a_normal_client_is_refused_and_changes_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    let far = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64 + 600_000;
    let forged_token: i64 = i64::MAX / 4;

    let forge = |c: &mut Connection, key: &str| -> RedisResult<Value> {
        redis::cmd("FLOCK.STATE").arg(key).arg("evil").arg(1).arg(forged_token).arg(far).arg(0).query(c)
    };
    let e = forge(&mut c, "new").expect_err("FLOCK.STATE creating a lock");
    assert_eq!(error_code(&e), "ERR", "{e}");
    assert!(!exists(&mut c, "new"), "a refused FLOCK.STATE creates nothing");

    let t = acquire(&mut c, "L", "a", 60_000).unwrap().expect("granted");
    let before = held_by(&mut c, "L", "a");
    let e = forge(&mut c, "L").expect_err("FLOCK.STATE overwriting a holder");
    assert_eq!(error_code(&e), "ERR", "{e}");
    let e = redis::cmd("FLOCK.STATE").arg("L").query::<Value>(&mut c).expect_err("FLOCK.STATE clearing a lock");
    assert_eq!(error_code(&e), "ERR", "{e}");
    let e = redis::cmd("EVAL")
        .arg("return redis.call('FLOCK.STATE', KEYS[1])")
        .arg(1)
        .arg("L")
        .query::<Value>(&mut c)
        .expect_err("FLOCK.STATE from a script");
    assert_eq!(e.kind(), redis::ErrorKind::ResponseError, "{e}");
    assert_eq!(held(&mut c, "L"), Some(before), "the lock is unchanged");
    assert_eq!(release(&mut c, "L", "a").unwrap(), 0, "the real holder still holds it");

    let t2 = acquire(&mut c, "M", "b", 1_000).unwrap().expect("granted");
    assert!(t2 > t, "tokens keep rising");
    assert!(t2 < forged_token, "a refused FLOCK.STATE does not raise the token source ({t2} >= {forged_token})");
}

// ---------------------------------------------------------------------------
// Replication.

#[test]
fn replica_sees_grant_reentry_release_and_renew_and_serves_flock_info() {
    let m = Server::start();
    let mut mc = m.conn();
    acquire(&mut mc, "pre", "p", 60_000).unwrap().expect("granted");
    let r = Server::replica_of(&m);
    let mut rc = r.conn();
    assert_replicated(&mut mc, &mut rc, "pre", "a lock held before the replica attached (full sync)");

    acquire(&mut mc, "L", "a", 10_000).unwrap().expect("granted");
    assert_replicated(&mut mc, &mut rc, "L", "grant");

    acquire(&mut mc, "L", "a", 20_000).unwrap().expect("reentered");
    assert_replicated(&mut mc, &mut rc, "L", "reentrant acquire");
    assert_eq!(held_by(&mut rc, "L", "a").holds, 2);
    assert!(ttl_ms(&mut rc, "L") > 10_000, "the reentry reset the lease on the replica too");

    assert_eq!(release(&mut mc, "L", "a").unwrap(), 1);
    assert_replicated(&mut mc, &mut rc, "L", "release of one hold");
    assert_eq!(held_by(&mut rc, "L", "a").holds, 1);

    renew(&mut mc, "L", "a", 30_000).unwrap();
    assert_replicated(&mut mc, &mut rc, "L", "renew");
    assert!(ttl_ms(&mut rc, "L") > 20_000, "the renewed lease on the replica");

    assert_eq!(release(&mut mc, "L", "a").unwrap(), 0);
    assert_replicated(&mut mc, &mut rc, "L", "full release");

    let e = acquire(&mut rc, "X", "x", 1_000).expect_err("FLOCK.ACQUIRE on a read-only replica");
    assert_eq!(error_code(&e), "READONLY", "{e}");
    assert!(
        redis::cmd("FLOCK.STATE").arg("pre").query::<Value>(&mut rc).is_err(),
        "FLOCK.STATE from a client of the replica"
    );
    assert_eq!(held_by(&mut rc, "pre", "p"), held_by(&mut mc, "pre", "p"));
}

/// With no replica connected the master still keeps its backlog, and a
/// replica that resyncs partially from it must find there what happened
/// meanwhile: FLOCK propagates while a backlog is kept, replica or not.
///
/// The replica is kept away by freezing it (SIGSTOP), not by a wrong
/// `masterauth`: a Redis 8.2 replica pipelines its handshake, reads the
/// master's refusal of the password as the answer to the next step, and
/// resyncs all the same (twice: its reading is out of step once).
#[test]
fn a_replica_resyncing_from_the_backlog_gets_the_changes_made_while_none_was_connected() {
    let m = Server::start();
    let mut mc = m.conn();
    let r = Server::replica_of(&m);
    let mut rc = r.conn();
    acquire(&mut mc, "kept", "a", 60_000).unwrap().expect("granted");
    assert_replicated(&mut mc, &mut rc, "kept", "a grant before the link broke");
    let partial = || m.info_section("stats")["sync_partial_ok"].parse::<i64>().expect("sync_partial_ok");
    let partial_before = partial();
    let frozen = Stopped::new(&r);
    let killed: i64 = redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("replica").query(&mut mc).expect("CLIENT KILL");
    assert_eq!(killed, 1);
    wait_until("the replica to be gone", 5 * SECOND, || m.info_section("replication")["connected_slaves"] == "0");
    acquire(&mut mc, "while", "b", 60_000).unwrap().expect("granted with no replica connected");
    assert_eq!(release(&mut mc, "kept", "a").unwrap(), 0);
    assert_eq!(m.info_section("replication")["connected_slaves"], "0");
    drop(frozen);
    r.wait_master_link();
    m.wait_stream_to(1);
    assert_eq!(partial(), partial_before + 1, "a partial resync");
    assert_replicated(&mut mc, &mut rc, "while", "a grant made while no replica was connected");
    assert_replicated(&mut mc, &mut rc, "kept", "a release made while no replica was connected");
}

/// A master restarted from the RDB its SHUTDOWN wrote keeps a backlog (a
/// replica may resync partially), made once the load has ended: what it
/// does before its replica is back must reach the replica (kept away,
/// frozen, as above).
#[test]
fn a_replica_resyncing_with_a_restarted_master_gets_the_changes_made_before_it_was_back() {
    let mut m = Server::start();
    let mut mc = m.conn();
    let r = Server::replica_of(&m);
    let mut rc = r.conn();
    acquire(&mut mc, "kept", "a", 60_000).unwrap().expect("granted");
    assert_replicated(&mut mc, &mut rc, "kept", "a grant before the restart");
    // SHUTDOWN would wait 10 s for the frozen replica to catch up.
    config_set(&mut mc, &[("shutdown-timeout", "0")]);
    let frozen = Stopped::new(&r);
    m.restart(Stop::ShutdownSave);
    let mut mc = m.conn();
    assert_eq!(m.info_section("replication")["repl_backlog_active"], "1", "a backlog kept across the restart");
    acquire(&mut mc, "after", "b", 60_000).unwrap().expect("granted by the restarted master");
    assert_eq!(release(&mut mc, "kept", "a").unwrap(), 0);
    assert_eq!(m.info_section("replication")["connected_slaves"], "0");
    drop(frozen);
    r.wait_master_link();
    m.wait_stream_to(1);
    assert_eq!(m.info_section("stats")["sync_partial_ok"], "1", "a partial resync");
    assert_replicated(&mut mc, &mut rc, "after", "a grant of the restarted master");
    assert_replicated(&mut mc, &mut rc, "kept", "a release of the restarted master");
}

/// A master without an AOF propagates nothing while nothing reads it; once
/// `CONFIG SET appendonly yes` turned the AOF on, what follows is in it.
#[test]
fn locks_taken_after_the_aof_is_turned_on_are_in_it() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, "before", "a", 60_000).unwrap().expect("granted");
    let ok: String = redis::cmd("CONFIG").arg("SET").arg("appendonly").arg("yes").query(&mut c).expect("CONFIG SET");
    assert_eq!(ok, "OK");
    s.wait_aof_rewrite();
    acquire(&mut c, "after", "b", 60_000).unwrap().expect("granted");
    acquire(&mut c, "after", "b", 60_000).unwrap().expect("reentered");
    let before = (held(&mut c, "before"), held(&mut c, "after"));
    let ok: String = redis::cmd("DEBUG").arg("LOADAOF").query(&mut c).expect("DEBUG LOADAOF");
    assert_eq!(ok, "OK");
    assert_eq!((held(&mut c, "before"), held(&mut c, "after")), before, "the locks as the AOF has them");
    assert_eq!(held_by(&mut c, "after", "b").holds, 2);
}

#[test]
fn replica_sees_changes_made_inside_multi_exec_and_scripts() {
    let m = Server::start();
    let r = Server::replica_of(&m);
    let (mut mc, mut rc) = (m.conn(), r.conn());
    let _: Value = redis::pipe()
        .atomic()
        .cmd("FLOCK.ACQUIRE")
        .arg("T")
        .arg("a")
        .arg(30_000)
        .cmd("FLOCK.ACQUIRE")
        .arg("T")
        .arg("a")
        .arg(40_000)
        .cmd("FLOCK.ACQUIRE")
        .arg("U")
        .arg("u")
        .arg(30_000)
        .cmd("FLOCK.RELEASE")
        .arg("U")
        .arg("u")
        .query(&mut mc)
        .expect("MULTI/EXEC");
    assert_replicated(&mut mc, &mut rc, "T", "two acquires in MULTI/EXEC");
    assert_eq!(held_by(&mut rc, "T", "a").holds, 2);
    assert_replicated(&mut mc, &mut rc, "U", "acquire and release in MULTI/EXEC");

    let _: Value = redis::cmd("EVAL")
        .arg("redis.call('FLOCK.RELEASE', KEYS[1], 'a'); return redis.call('FLOCK.ACQUIRE', KEYS[2], 'v', 50000)")
        .arg(2)
        .arg("T")
        .arg("V")
        .query(&mut mc)
        .expect("EVAL");
    assert_replicated(&mut mc, &mut rc, "T", "release in a script");
    assert_eq!(held_by(&mut rc, "T", "a").holds, 1);
    assert_replicated(&mut mc, &mut rc, "V", "acquire in a script");
}

#[test]
fn replica_sees_hand_off_on_release_but_not_the_blocked_waiters() {
    let m = Server::start();
    let r = Server::replica_of(&m);
    let (mut mc, mut rc) = (m.conn(), r.conn());
    let t1 = acquire(&mut mc, "L", "a", 10_000).unwrap().expect("granted");
    let wb = waiter(&m, "L", "b", 20_000);
    wait_queue(&mut mc, "L", &["b"]);
    let wc = waiter(&m, "L", "c", 20_000);
    wait_queue(&mut mc, "L", &["b", "c"]);
    assert_replicated(&mut mc, &mut rc, "L", "waiters queued on the master");
    assert_eq!(waiters(&mut mc, "L"), 2);

    assert_eq!(release(&mut mc, "L", "a").unwrap(), 0);
    let tb = granted(wb, "b");
    assert!(tb > t1);
    assert_replicated(&mut mc, &mut rc, "L", "hand-off to b on release");
    assert_eq!(held_by(&mut rc, "L", "b").token, tb);

    assert_eq!(release(&mut mc, "L", "b").unwrap(), 0);
    let tc = granted(wc, "c");
    assert_replicated(&mut mc, &mut rc, "L", "hand-off to c on release");
    assert_eq!(held_by(&mut rc, "L", "c").token, tc);
}

#[test]
fn replica_sees_hand_off_on_lease_expiry_and_expiry_without_waiters() {
    let m = Server::start();
    let r = Server::replica_of(&m);
    let (mut mc, mut rc) = (m.conn(), r.conn());
    acquire(&mut mc, "L", "a", 60_000).unwrap().expect("granted");
    // b's lease outlasts the checks of its grant on the replica, however
    // busy the machine.
    let wb = waiter(&m, "L", "b", 1_500);
    wait_queue(&mut mc, "L", &["b"]);
    renew(&mut mc, "L", "a", 300).unwrap();
    let tb = granted(wb, "b (granted when a's lease ran out)");
    assert_replicated(&mut mc, &mut rc, "L", "hand-off on lease expiry");
    assert_eq!(held_by(&mut rc, "L", "b").token, tb);

    // b's lease runs out with nobody queued: the key goes, also on the replica.
    wait_until("b's lease to run out on the master", 5 * SECOND, || !exists(&mut mc, "L"));
    assert_replicated(&mut mc, &mut rc, "L", "expiry without waiters");
}

#[test]
fn replica_sees_force_release_with_and_without_waiters() {
    let m = Server::start();
    let r = Server::replica_of(&m);
    let (mut mc, mut rc) = (m.conn(), r.conn());
    acquire(&mut mc, "L", "a", 60_000).unwrap().expect("granted");
    let wd = waiter(&m, "L", "d", 60_000);
    wait_queue(&mut mc, "L", &["d"]);
    assert_eq!(force_release(&mut mc, "L").unwrap(), 1);
    let td = granted(wd, "d");
    assert_replicated(&mut mc, &mut rc, "L", "FORCERELEASE handing off to d");
    assert_eq!(held_by(&mut rc, "L", "d").token, td);

    assert_eq!(force_release(&mut mc, "L").unwrap(), 1);
    assert_replicated(&mut mc, &mut rc, "L", "FORCERELEASE with nobody queued");
}

#[test]
fn replica_sees_session_release_when_the_holders_connection_closes() {
    let m = Server::start();
    let r = Server::replica_of(&m);
    let (mut mc, mut rc) = (m.conn(), r.conn());

    let mut holder = m.conn();
    session_acquire(&mut holder, "S", "s", 60_000);
    assert_replicated(&mut mc, &mut rc, "S", "SESSION grant");
    assert_eq!(held_by(&mut rc, "S", "s").session, 1);
    let we = waiter(&m, "S", "e", 60_000);
    wait_queue(&mut mc, "S", &["e"]);
    drop(holder);
    let te = granted(we, "e (after the SESSION holder's connection closed)");
    assert_replicated(&mut mc, &mut rc, "S", "SESSION release handing off to e");
    assert_eq!(held_by(&mut rc, "S", "e").token, te);
    assert_eq!(held_by(&mut rc, "S", "e").session, 0);

    let mut holder2 = m.conn();
    session_acquire(&mut holder2, "S2", "s2", 60_000);
    assert_replicated(&mut mc, &mut rc, "S2", "SESSION grant");
    drop(holder2);
    wait_until("S2 to be released when its connection closed", 5 * SECOND, || !exists(&mut mc, "S2"));
    assert_replicated(&mut mc, &mut rc, "S2", "SESSION release with nobody queued");
}

#[test]
fn locks_in_other_databases_are_replicated_and_persisted_in_their_own_database() {
    let mut m = Server::start_aof("no");
    let r = Server::replica_of(&m);
    let (mut m0, mut m5, mut r0, mut r5) = (m.conn_db(0), m.conn_db(5), r.conn_db(0), r.conn_db(5));
    // Same names in db 0, held by others: a change meant for db 5 must not land here.
    for key in ["L", "S", "X"] {
        acquire(&mut m0, key, "db0", 60_000).unwrap().expect("granted");
    }
    wait_replica_applied(&mut m0, &mut r0);
    let db0: Vec<Option<Held>> = ["L", "S", "X"].iter().map(|k| held(&mut m0, k)).collect();
    let check_db0 = |r0: &mut Connection, what: &str| {
        let now: Vec<Option<Held>> = ["L", "S", "X"].iter().map(|k| held(r0, k)).collect();
        assert_eq!(now, db0, "{what}: db 0 of the replica changed");
    };

    // Grant, then a hand-off on lease expiry (lease timer) in db 5.
    acquire(&mut m5, "L", "a", 60_000).unwrap().expect("granted");
    assert_replicated(&mut m5, &mut r5, "L", "grant in db 5");
    let mut c5 = m.conn_db(5);
    let w = std::thread::spawn(move || acquire_wait(&mut c5, "L", "b", 60_000, LONG_WAIT_MS));
    wait_queue(&mut m5, "L", &["b"]);
    renew(&mut m5, "L", "a", 200).unwrap();
    let tb = granted(w, "b (granted on expiry in db 5)");
    assert_replicated(&mut m5, &mut r5, "L", "hand-off on expiry in db 5");
    assert_eq!(held_by(&mut r5, "L", "b").token, tb);
    check_db0(&mut r0, "hand-off on expiry in db 5");

    // SESSION release by a closed connection in db 5.
    let mut holder = m.conn_db(5);
    session_acquire(&mut holder, "S", "s", 60_000);
    assert_replicated(&mut m5, &mut r5, "S", "SESSION grant in db 5");
    drop(holder);
    wait_until("S in db 5 to be released", 5 * SECOND, || !exists(&mut m5, "S"));
    assert_replicated(&mut m5, &mut r5, "S", "SESSION release in db 5");
    check_db0(&mut r0, "SESSION release in db 5");

    // Expiry without waiters in db 5.
    acquire(&mut m5, "X", "x", 200).unwrap().expect("granted");
    assert_replicated(&mut m5, &mut r5, "X", "grant in db 5");
    wait_until("X in db 5 to expire", 5 * SECOND, || !exists(&mut m5, "X"));
    assert_replicated(&mut m5, &mut r5, "X", "expiry in db 5");
    check_db0(&mut r0, "expiry in db 5");

    // The AOF has all of it in the right database.
    let l5 = held_by(&mut m5, "L", "b");
    drop((m0, m5));
    m.restart(Stop::Kill);
    let (mut m0, mut m5) = (m.conn_db(0), m.conn_db(5));
    check_db0(&mut m0, "after restart from AOF (master)");
    assert_eq!(held(&mut m5, "L").as_ref(), Some(&l5), "db 5 L after restart from AOF");
    assert!(
        !exists(&mut m5, "S") && !exists(&mut m5, "X"),
        "released and expired locks of db 5 stay gone after restart"
    );

    // And once more from a rewritten AOF (no RDB preamble: FLOCK.STATE per key).
    let _: Value = redis::cmd("BGREWRITEAOF").query(&mut m0).expect("BGREWRITEAOF");
    m.wait_aof_rewrite();
    drop((m0, m5));
    m.restart(Stop::Kill);
    let (mut m0, mut m5) = (m.conn_db(0), m.conn_db(5));
    check_db0(&mut m0, "after restart from the rewritten AOF");
    assert_eq!(held(&mut m5, "L"), Some(l5), "db 5 L after restart from the rewritten AOF");
    assert!(!exists(&mut m5, "S") && !exists(&mut m5, "X"));
}

#[test]
fn replica_follows_rename_and_move_and_once_promoted_ends_the_lease_at_the_new_place() {
    let m = Server::start();
    let r = Server::replica_of(&m);
    let (mut mc, mut rc) = (m.conn(), r.conn());
    let (mut m3, mut r3) = (m.conn_db(3), r.conn_db(3));
    // Held long while the replica is followed (several waits, slow on a
    // loaded machine); cut to 1500 ms once the lock is in its place.
    let token = acquire(&mut mc, "A", "a", 60_000).unwrap().expect("granted");
    let before = held_by(&mut mc, "A", "a");
    let _: () = redis::cmd("RENAME").arg("A").arg("B").query(&mut mc).unwrap();
    assert_replicated(&mut mc, &mut rc, "B", "RENAME");
    assert!(!exists(&mut rc, "A"));
    let moved: i64 = redis::cmd("MOVE").arg("B").arg(3).query(&mut mc).unwrap();
    assert_eq!(moved, 1);
    wait_replica_applied(&mut mc, &mut rc);
    assert!(!exists(&mut rc, "B"), "MOVE took B out of db 0 on the replica");
    assert_eq!(held(&mut r3, "B"), Some(before), "the moved lock on the replica");

    // The cut reaches the replica before the master stops. Should the lease
    // end on the master first (a stall), its end is replicated or the
    // promoted replica ends it: gone, never before its end, either way.
    let sent = Instant::now();
    assert_eq!(renew(&mut m3, "B", "a", 1_500).unwrap(), token);
    wait_replica_applied(&mut m3, &mut r3);
    let _stopped = Stopped::new(&m);
    replicaof_no_one(&mut rc);
    wait_gone(&mut r3, "B", sent + Duration::from_millis(1_500), 5 * SECOND);
}

// ---------------------------------------------------------------------------
// Failover.

#[test]
fn replica_never_expires_a_lease_and_once_promoted_ends_the_overdue_lease_with_larger_tokens() {
    let m = Server::start();
    let r = Server::replica_of(&m);
    let (mut mc, mut rc) = (m.conn(), r.conn());
    let mut issued = Issued::default();
    issued.add(acquire(&mut mc, "K", "k", 60_000).unwrap().expect("granted"));
    let k_before = held_by(&mut mc, "K", "k");
    grant_and_delete(&mut mc, &mut issued, "gone");
    let sent = Instant::now();
    issued.add(acquire(&mut mc, "L", "a", 1_500).unwrap().expect("granted"));
    wait_replica_applied(&mut mc, &mut rc);
    let on_master = held_by(&mut mc, "L", "a");
    assert_eq!(held(&mut rc, "L").as_ref(), Some(&on_master));

    let _stopped = Stopped::new(&m);
    // Until well past the deadline the replica keeps showing the holder.
    let past = sent + Duration::from_millis(1_500 + 400);
    while Instant::now() < past {
        assert_eq!(
            held(&mut rc, "L").as_ref(),
            Some(&on_master),
            "the replica ended a lease on its own ({} ms after the grant)",
            ms_since(sent)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(ttl_ms(&mut rc, "L"), 0, "the replica's view of the overdue lease");

    replicaof_no_one(&mut rc);
    let promoted = Instant::now();
    wait_until("the promoted replica to end the overdue lease", 2 * SECOND, || !exists(&mut rc, "L"));
    eprintln!("overdue lease ended {} ms after promotion", ms_since(promoted));
    assert_eq!(held(&mut rc, "K"), Some(k_before), "a lease with time left stays after promotion");

    for key in ["L", "gone", "fresh"] {
        let t = acquire(&mut rc, key, "n", 10_000).unwrap().expect("granted on the promoted server");
        issued.assert_below(t, &format!("grant of {key} on the promoted replica"));
    }
}

#[test]
fn promoted_replica_keeps_the_old_holder_until_its_lease_ends_then_grants_waiters() {
    let m = Server::start();
    let r = Server::replica_of(&m);
    let (mut mc, mut rc) = (m.conn(), r.conn());
    let mut issued = Issued::default();
    issued.add(acquire(&mut mc, "L", "a", 60_000).unwrap().expect("granted"));
    let sent_k = Instant::now();
    issued.add(acquire(&mut mc, "K", "k", 3_000).unwrap().expect("granted"));
    wait_replica_applied(&mut mc, &mut rc);
    let (l_before, k_before) = (held_by(&mut mc, "L", "a"), held_by(&mut mc, "K", "k"));

    let _stopped = Stopped::new(&m);
    replicaof_no_one(&mut rc);

    // L: the old holder keeps it; a try fails; its RENEW and RELEASE work,
    // and the release hands L to the waiter queued on the promoted server.
    assert_eq!(held(&mut rc, "L").as_ref(), Some(&l_before));
    assert_eq!(acquire(&mut rc, "L", "b", 10_000).unwrap(), None, "L is still held after promotion");
    let wb = waiter(&r, "L", "b", 10_000);
    wait_queue(&mut rc, "L", &["b"]);
    assert_eq!(
        renew(&mut rc, "L", "a", 60_000).unwrap(),
        l_before.token,
        "RENEW by the old holder on the promoted server"
    );
    assert_eq!(release(&mut rc, "L", "a").unwrap(), 0, "RELEASE by the old holder on the promoted server");
    let tb = granted(wb, "b");
    issued.assert_below(tb, "hand-off of L on the promoted server");
    assert_eq!(held_by(&mut rc, "L", "b").token, tb);

    // K: the old holder keeps it until its lease ends, then the waiter gets it.
    let wc = waiter(&r, "K", "c", 10_000);
    wait_queue(&mut rc, "K", &["c"]);
    let k_now = held(&mut rc, "K");
    assert!(
        k_now.as_ref() == Some(&k_before) || sent_k.elapsed() >= Duration::from_millis(3_000),
        "K changed hands before its lease ended: {k_now:?}"
    );
    let tc = granted(wc, "c");
    let at = ms_since(sent_k);
    assert!(at >= 3_000 - 2, "c was granted K {at} ms after k's 3000 ms grant");
    issued.assert_below(tc, "hand-off of K on lease expiry on the promoted server");
    assert_eq!(held_by(&mut rc, "K", "c").token, tc);
}

#[test]
fn grant_confirmed_by_wait_survives_promotion_of_the_replica() {
    let mut m = Server::start();
    let r = Server::replica_of(&m);
    let (mut mc, mut rc) = (m.conn(), r.conn());
    let t = acquire(&mut mc, "L", "a", 60_000).unwrap().expect("granted");
    acquire(&mut mc, "L", "a", 60_000).unwrap().expect("reentered");
    let n: i64 = redis::cmd("WAIT").arg(1).arg(2_000).query(&mut mc).unwrap();
    assert_eq!(n, 1, "WAIT 1 after the grant: one replica has it");
    let before = held_by(&mut mc, "L", "a");
    drop(mc);
    m.stop(Stop::Kill);

    replicaof_no_one(&mut rc);
    assert_eq!(held(&mut rc, "L"), Some(before), "after promotion the grant is there: same owner, holds, token");
    assert_eq!(acquire(&mut rc, "L", "b", 1_000).unwrap(), None, "still held");
    assert_eq!(release(&mut rc, "L", "a").unwrap(), 1);
    assert_eq!(release(&mut rc, "L", "a").unwrap(), 0);
    let t2 = acquire(&mut rc, "L", "b", 1_000).unwrap().expect("granted");
    assert!(t2 > t, "token {t2} after promotion, {t} before");
}

/// REPLICAOF makes a master with waiters (WAIT 0 and WAIT 20000, on two
/// locks) a replica: each waiter gets `UNBLOCKED` at once and leaves its
/// queue, so when the node is promoted again a release frees the lock
/// instead of granting it to a client that is gone.
#[test]
fn a_master_made_a_replica_answers_its_waiters_unblocked_and_keeps_no_queue() {
    let m = Server::start();
    // Has the master's data, so the demoted master resyncs partially and keeps its locks.
    let n = Server::replica_of(&m);
    let (mut mc, mut nc) = (m.conn(), n.conn());
    let keys = ["L1", "L2"];
    let mut queued = Vec::new();
    for key in keys {
        acquire(&mut mc, key, "holder", 60_000).unwrap().expect("granted");
        let owners = [format!("{key}-wait-0"), format!("{key}-wait-20000")];
        for (i, wait_ms) in [0, 20_000].into_iter().enumerate() {
            queued.push((owners[i].clone(), spawn_timed_waiter(m.conn(), key, &owners[i], wait_ms)));
            wait_queue(&mut mc, key, &owners.iter().take(i + 1).map(String::as_str).collect::<Vec<_>>());
        }
    }
    wait_replica_applied(&mut mc, &mut nc);
    replicaof_no_one(&mut nc);

    let since = Instant::now();
    let ok: String = redis::cmd("REPLICAOF").arg("127.0.0.1").arg(n.port).query(&mut mc).expect("REPLICAOF");
    assert_eq!(ok, "OK");
    let replies = demoted_replies(queued, since);
    eprintln!(
        "waiters of the demoted master answered after {:?}",
        replies.iter().map(|(e, t)| (t, e)).collect::<Vec<_>>()
    );
    assert_demotion_counted(&mut mc, 4, &replies);
    assert_eq!(m.blocked_clients(), 0, "no client stays blocked on the demoted master");

    m.wait_master_link();
    let partial = n.info_section("stats").get("sync_partial_ok").cloned();
    assert_eq!(
        partial.as_deref(),
        Some("1"),
        "the demoted master resynced partially, keeping its own locks and queues"
    );
    for key in keys {
        assert_eq!(held_by(&mut mc, key, "holder").holds, 1, "{key} keeps its holder on the demoted master");
        assert_eq!(waiters(&mut mc, key), 0, "{key}: no waiter left in the queue of the demoted master");
        assert!(queue_of(&mut mc, key).is_empty(), "{key}: no waiter left in the queue of the demoted master");
    }
    replicaof_no_one(&mut mc);
    let handoffs = m.stat("handoffs");
    for key in keys {
        assert_eq!(release(&mut mc, key, "holder").unwrap(), 0);
        assert!(
            !exists(&mut mc, key),
            "{key}: released on the promoted node, it is free, not granted to a former waiter"
        );
    }
    assert_eq!(m.stat("handoffs"), handoffs, "no hand-off to a waiter answered at demotion");
}

#[test]
fn a_lock_loaded_at_the_most_holds_refuses_one_more_reentry_and_changes_nothing() {
    // An AOF of the old single-file kind, which Redis 7 loads and upgrades:
    // the only way to reach the hold limit without 2^32 commands.
    let dir = temp_dir("holds");
    let far =
        (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() + 600_000).to_string();
    let aof = resp(&["SELECT", "0"]) + &resp(&["FLOCK.STATE", "L", "a", "4294967295", "7", &far, "0"]);
    std::fs::write(dir.path().join("appendonly.aof"), aof).unwrap();
    let s = Server::start_in(dir, &["--appendonly", "yes"]);
    let mut c = s.conn();
    let before = held_by(&mut c, "L", "a");
    assert_eq!(before.holds, 4_294_967_295);

    let e = acquire(&mut c, "L", "a", 60_000).expect_err("a reentry beyond the most holds");
    assert_eq!(error_code(&e), "ERR", "{e}");
    assert!(e.to_string().contains("4294967295"), "{e}");
    assert_eq!(held(&mut c, "L"), Some(before), "the refused reentry changed nothing");
    assert_eq!(release(&mut c, "L", "a").unwrap(), 4_294_967_294, "one hold fewer");
}
