//! Writes paused on a master with a replica: `CLIENT PAUSE ... WRITE` (and
//! `ALL`), and `FAILOVER`, which pauses writes while its replica catches up
//! (the Cluster's `CLUSTER FAILOVER` is in tests/integration/cluster.rs).
//! The server aborts if anything is sent to replicas or the AOF during a
//! pause, and a lock changed without sending it would be lost in the
//! failover the pause is for; so every way FLOCK changes a lock outside a
//! command waits for the end of the pause (docs/internals.md, "Paused
//! writes"). Each test makes one of them fall in a pause and checks that the
//! master stays up, that nothing changed during the pause, that the work is
//! done right after it, and that the replica ends up with the master's state:
//! 1. a lease that ends, with a waiter (WRITE and ALL) and without;
//! 2. a SESSION holder's connection that closes;
//! 3. a session whose connection closes with an unread grant in its inbox;
//! 4. a waiter at the head that times out, is killed or is unblocked, with
//!    a shared holder and a shared waiter behind it;
//! 5. ACQUIREALL: a key freed by a lease end; a wait that times out with a
//!    queue behind it (and FLOCK.SESSION, not a write, run meanwhile);
//! 6. a lock of another client whose TTL ends, with a FLOCK waiter;
//! 7. FAILOVER that times out (the master stays one) and one that completes
//!    (the master, now a replica, leaves the work to the new master);
//! 8. which commands the server runs during a pause: FLOCK's reads at once,
//!    its writes (also in scripts and MULTI) after it, and a MULTI that
//!    pauses itself replicates what it does.
use crate::common::*;

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const LOG: &str = "server.log";

/// How long a pause lasts in these tests.
const PAUSE_MS: u64 = 1500;

/// The leases that end during a pause: it begins well before they end,
/// and the checks made during it come well after.
const LEASE_MS: u64 = 500;
const CHECK_AT: Duration = Duration::from_millis(850);

/// How late after the end of a pause its work may be done: FLOCK looks every
/// 10 ms, so this only tells work done at the end of the pause from work
/// left for some later event (a command, another lease); the rest is for a
/// busy machine.
const AFTER_PAUSE_SLACK: Duration = Duration::from_millis(3000);

/// A master (logging to `LOG`) and its replica, in sync.
fn pair() -> (Server, Server) {
    let m = Server::start_with(&["--logfile", LOG]);
    let r = Server::replica_of(&m);
    (m, r)
}

/// A pause of writes as the test's clock sees it: it began after `sent` and
/// ended before `by`.
struct Pause {
    sent: Instant,
    by: Instant,
}

impl Pause {
    /// `CLIENT PAUSE ms mode` on `c`.
    fn start(c: &mut Connection, ms: u64, mode: &str) -> Pause {
        let sent = Instant::now();
        let _: () = redis::cmd("CLIENT").arg("PAUSE").arg(ms).arg(mode).query(c).expect("CLIENT PAUSE");
        Pause { sent, by: Instant::now() + Duration::from_millis(ms) }
    }

    /// `CLIENT PAUSE ms mode` on `c`, in one pipeline after `first`: the
    /// commands that start the short timers the pause is to catch (held long
    /// until then), so that none can run out before the pause begins however
    /// slow the machine. The timers began after `sent`.
    fn after(first: &mut redis::Pipeline, c: &mut Connection, ms: u64, mode: &str) -> Pause {
        let sent = Instant::now();
        let _: Value =
            first.cmd("CLIENT").arg("PAUSE").arg(ms).arg(mode).query(c).expect("the timers and CLIENT PAUSE");
        Pause { sent, by: Instant::now() + Duration::from_millis(ms) }
    }

    /// The earliest the pause can have ended, with the server clock's grain.
    fn earliest_end(&self, ms: u64) -> Instant {
        self.sent + Duration::from_millis(ms) - Duration::from_millis(SERVER_CLOCK_GRAIN_MS)
    }

    /// True if an observation made before now was made during the pause
    /// (with a margin); a very slow machine may miss it, and then the checks
    /// of the pause are skipped with a note rather than failed.
    fn still_on(&self, what: &str) -> bool {
        let on = Instant::now() + Duration::from_millis(30) < self.by;
        if !on {
            eprintln!("note: {what}: observed after the pause ended (a slow machine); not checked");
        }
        on
    }

    /// Checks that `at` (when some work was seen done) is after the pause
    /// of `ms` and right after it.
    fn assert_right_after(&self, ms: u64, at: Instant, what: &str) {
        assert!(at >= self.earliest_end(ms), "{what}: done {:?} before the pause ended", self.earliest_end(ms) - at);
        assert!(
            at <= self.by + AFTER_PAUSE_SLACK,
            "{what}: done {:?} after the pause ended, not right after it",
            at - self.by
        );
    }
}

/// Fails with the master's log if it is no longer up.
fn assert_up(s: &mut Server, what: &str) {
    assert!(s.running(), "{what}: the master aborted; its log:\n{}", s.log_excerpt(LOG));
    s.assert_alive(what);
}

/// Runs `cmd` on its own connection to `s` in a thread.
fn spawn_cmd(s: &Server, cmd: redis::Cmd) -> JoinHandle<Timed> {
    let mut c = s.conn();
    std::thread::spawn(move || (cmd.query(&mut c), Instant::now()))
}

/// `FLOCK.ACQUIRE key owner 60000 WAIT wait_ms more...`.
fn wait_cmd(key: &str, owner: &str, wait_ms: u64, more: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd("FLOCK.ACQUIRE");
    cmd.arg(key).arg(owner).arg(60_000).arg("WAIT").arg(wait_ms).arg(more);
    cmd
}

/// The token a waiter was granted, and when.
fn granted_at(h: JoinHandle<Timed>, who: &str) -> (i64, Instant) {
    let (reply, at) = h.join().expect("waiter thread");
    let v = reply.unwrap_or_else(|e| panic!("{who}: {e}"));
    (redis::from_redis_value(&v).unwrap_or_else(|e| panic!("{who} was not granted ({v:?}): {e}")), at)
}

/// Waits until the replica has what the master wrote, then checks that it
/// shows each of `keys` as the master does (holders, tokens, mode; no
/// waiters, which are not replicated, and the master has none left).
fn assert_replica_same(m: &Server, r: &Server, keys: &[&str], what: &str) {
    let (mut mc, mut rc) = (m.conn(), r.conn());
    wait_replica_applied(&mut mc, &mut rc);
    for key in keys {
        assert_eq!(info_still(&mut rc, key), info_still(&mut mc, key), "{what}: {key} on the replica vs the master");
    }
    assert_eq!(dbsize(&mut rc), dbsize(&mut mc), "{what}: keys on the replica vs the master");
}

/// Waits until the server has closed the connection `id` (CLIENT LIST, no
/// write, runs during a pause).
fn wait_closed(c: &mut Connection, id: i64) {
    wait_until("the server to close the connection", 5 * SECOND, || {
        let listed: String = redis::cmd("CLIENT").arg("LIST").arg("ID").arg(id).query(c).expect("CLIENT LIST");
        listed.is_empty()
    });
}

/// A holds k on `c`'s server, and B waits behind it: A's token, B's wait.
/// A's lease is a long one, for B to queue in on a loaded machine: the test
/// cuts it to `LEASE_MS` right before the pause.
fn a_holds_k_and_b_waits(m: &Server, c: &mut Connection) -> (i64, JoinHandle<Timed>) {
    let a = acquire(c, "k", "A", 60_000).unwrap().expect("A holds k");
    let b = spawn_cmd(m, wait_cmd("k", "B", LONG_WAIT_MS, &[]));
    wait_queue(c, "k", &["B"]);
    (a, b)
}

fn lease_end_with_a_waiter(mode: &str) {
    let (mut m, r) = pair();
    let mut c = m.conn();
    let (a, b) = a_holds_k_and_b_waits(&m, &mut c);
    let pause = Pause::after(&mut renew_to("k", "A", LEASE_MS), &mut c, PAUSE_MS, mode);
    sleep_until(pause.sent + CHECK_AT);
    if mode == "WRITE" {
        // FLOCK.INFO is a read: it runs during a WRITE pause.
        let (owner, queue) = (owner_of(&mut c, "k"), queue_of(&mut c, "k"));
        if pause.still_on("the lease end put off") {
            assert_eq!(owner.as_deref(), Some("A"), "{mode}: A's lease ended during the pause");
            assert_eq!(queue, ["B"], "{mode}: B was granted during the pause");
        }
    }
    let (t, at) = granted_at(b, "B");
    pause.assert_right_after(PAUSE_MS, at, &format!("{mode}: B's grant"));
    assert!(t > a, "{mode}: B's token {t} is above A's {a}");
    assert_up(&mut m, mode);
    assert_eq!(owner_of(&mut c, "k").as_deref(), Some("B"));
    assert_eq!(m.stat("lease_expiries"), 1, "{mode}: A's lease ended once");
    assert_replica_same(&m, &r, &["k"], mode);
}

#[test]
fn a_lease_that_ends_during_a_write_pause_goes_to_the_waiter_right_after_it() {
    lease_end_with_a_waiter("WRITE");
}

#[test]
fn a_lease_that_ends_during_a_pause_of_all_clients_goes_to_the_waiter_right_after_it() {
    lease_end_with_a_waiter("ALL");
}

#[test]
fn a_lease_that_ends_during_a_pause_without_waiters_leaves_the_key_right_after_it() {
    let (mut m, r) = pair();
    let mut c = m.conn();
    acquire(&mut c, "k", "A", 60_000).unwrap().expect("A holds k");
    acquire(&mut c, "later", "L", 60_000).unwrap().expect("L holds later");
    // Both cut with the pause; later to a lease that ends after the pause:
    // not early, not late.
    let mut leases = renew_to("k", "A", LEASE_MS);
    leases.cmd("FLOCK.RENEW").arg("later").arg("L").arg(PAUSE_MS + 1000);
    let pause = Pause::after(&mut leases, &mut c, PAUSE_MS, "WRITE");
    let renewed = pause.sent;
    sleep_until(renewed + CHECK_AT);
    let (held, ttl) = (exists(&mut c, "k"), ttl_ms(&mut c, "k"));
    if pause.still_on("the lease end put off") {
        assert!(held, "k went during the pause");
        assert_eq!(ttl, 0, "an overdue lease shows ttl-ms 0 during the pause");
    }
    wait_until("k to go", 5 * SECOND, || !exists(&mut c, "k"));
    pause.assert_right_after(PAUSE_MS, Instant::now(), "k's removal");
    assert_up(&mut m, "after the pause");
    assert_eq!(owner_of(&mut c, "later").as_deref(), Some("L"), "a lease due after the pause is still running");
    wait_gone(&mut c, "later", renewed + Duration::from_millis(PAUSE_MS + 1000), 5 * SECOND);
    assert_replica_same(&m, &r, &["k", "later"], "after both leases");
}

/// Closes `conn` during a WRITE pause while `holder` holds k through it and
/// `next` waits behind: `holder` keeps k until the pause ends, then `next`
/// gets it with a token above `token`, and the close counts once in `stat`.
fn close_during_pause(
    (m, r): (&mut Server, &Server),
    mut conn: Connection,
    (holder, token): (&str, i64),
    (next, waiter): (&str, JoinHandle<Timed>),
    stat: &str,
) {
    let mut c = m.conn();
    let id = client_id(&mut conn);
    let pause = Pause::start(&mut c, PAUSE_MS, "WRITE");
    drop(conn);
    wait_closed(&mut c, id);
    let (owner, queue) = (owner_of(&mut c, "k"), queue_of(&mut c, "k"));
    if pause.still_on(&format!("{stat} put off")) {
        assert_eq!(owner.as_deref(), Some(holder), "{holder}'s grant ended during the pause");
        assert_eq!(queue, [next]);
    }
    let (t, at) = granted_at(waiter, next);
    pause.assert_right_after(PAUSE_MS, at, &format!("{next}'s grant"));
    assert!(t > token, "{next}'s token {t} is above {holder}'s {token}");
    assert_up(m, "after the pause");
    assert_eq!(m.stat(stat), 1);
    assert_replica_same(m, r, &["k"], stat);
}

#[test]
fn a_session_holder_whose_connection_closes_during_a_pause_lets_go_right_after_it() {
    let (mut m, r) = pair();
    let mut c = m.conn();
    let mut holder = m.conn();
    let a: i64 =
        redis::cmd("FLOCK.ACQUIRE").arg("k").arg("A").arg(60_000).arg("SESSION").query(&mut holder).expect("A");
    let b = spawn_cmd(&m, wait_cmd("k", "B", LONG_WAIT_MS, &[]));
    wait_queue(&mut c, "k", &["B"]);
    close_during_pause((&mut m, &r), holder, ("A", a), ("B", b), "session_releases");
}

#[test]
fn an_unread_grant_of_a_session_that_closes_during_a_pause_passes_on_right_after_it() {
    let (mut m, r) = pair();
    let mut c = m.conn();
    let mut session = m.conn();
    let sid: String = redis::cmd("FLOCK.SESSION").query(&mut session).expect("FLOCK.SESSION");
    acquire(&mut c, "k", "A", 60_000).unwrap().expect("A holds k");
    let waiting: String = wait_cmd("k", "B", 0, &["INBOX", &sid]).query(&mut c).expect("B waits for its session");
    assert_eq!(waiting, "WAITING");
    let d = spawn_cmd(&m, wait_cmd("k", "D", LONG_WAIT_MS, &[]));
    wait_queue(&mut c, "k", &["B", "D"]);
    // B is granted into the inbox, which its session never reads.
    assert_eq!(release(&mut c, "k", "A").unwrap(), 0);
    assert_eq!(owner_of(&mut c, "k").as_deref(), Some("B"));
    let b = token_of(&mut c, "k");
    close_during_pause((&mut m, &r), session, ("B", b), ("D", d), "undelivered_grants");
}

/// A shared holder; an exclusive waiter at the head that leaves during the
/// pause by `how`; a shared waiter behind it, which could join the holder
/// as soon as the head left, and does right after the pause.
fn head_leaves_during_pause(how: &str) {
    let (mut m, r) = pair();
    let mut c = m.conn();
    let a = acquire_shared(&mut c, "k", "A");
    let mut head = m.conn();
    let head_id = client_id(&mut head);
    let wait_ms = if how == "timeout" { LEASE_MS } else { LONG_WAIT_MS };
    // S is ready before B's wait (LEASE_MS, for "timeout") starts: it must
    // queue, and the pause begin, before that wait ends.
    let (s_go, s) = spawn_cmd_on_signal(&m, wait_cmd("k", "S", LONG_WAIT_MS, &["SHARED"]));
    let b = std::thread::spawn(move || (wait_cmd("k", "B", wait_ms, &[]).query::<Value>(&mut head), Instant::now()));
    wait_queue(&mut c, "k", &["B"]);
    s_go.send(()).expect("S's thread");
    wait_queue(&mut c, "k", &["B", "S"]);
    let pause = Pause::start(&mut c, PAUSE_MS, "WRITE");
    std::thread::sleep(CHECK_AT);
    match how {
        "timeout" => {}
        // CLIENT is no write command: it runs during the pause.
        "kill" => {
            let killed: i64 =
                redis::cmd("CLIENT").arg("KILL").arg("ID").arg(head_id).query(&mut c).expect("CLIENT KILL");
            assert_eq!(killed, 1);
        }
        "unblock" => {
            let unblocked: i64 =
                redis::cmd("CLIENT").arg("UNBLOCK").arg(head_id).query(&mut c).expect("CLIENT UNBLOCK");
            assert_eq!(unblocked, 1);
        }
        other => panic!("{other}?"),
    }
    let (reply, left_at) = b.join().expect("B's thread");
    let queue = queue_of(&mut c, "k");
    if pause.still_on(&format!("{how}: S put off")) {
        assert!(left_at < pause.by, "{how}: B's wait ended at once, during the pause");
        assert_eq!(queue, ["S"], "{how}: S was granted during the pause");
    }
    match how {
        "kill" => assert!(reply.is_err(), "{how}: B's connection was closed"),
        _ => assert_eq!(reply.ok(), Some(Value::Nil), "{how}: B's wait ends with nil"),
    }
    let (t, at) = granted_at(s, "S");
    pause.assert_right_after(PAUSE_MS, at, &format!("{how}: S's grant"));
    assert!(t > a);
    assert_up(&mut m, how);
    assert_eq!(holders_of(&mut c, "k"), ["A", "S"], "{how}: S shares k with A");
    assert_replica_same(&m, &r, &["k"], how);
}

fn acquire_shared(c: &mut Connection, key: &str, owner: &str) -> i64 {
    redis::cmd("FLOCK.ACQUIRE").arg(key).arg(owner).arg(60_000).arg("SHARED").query(c).expect("a shared grant")
}

/// The owners of every holder of `key`, earliest grant first.
fn holders_of(c: &mut Connection, key: &str) -> Vec<String> {
    let Some(Value::Array(holders)) = info_field(c, key, "holders") else { return Vec::new() };
    holders
        .iter()
        .filter_map(|h| fields_of(h).into_iter().find(|(k, _)| k == "owner"))
        .map(|(_, v)| redis::from_redis_value(&v).expect("owner"))
        .collect()
}

#[test]
fn a_waiter_that_times_out_at_the_head_during_a_pause_lets_the_next_in_right_after_it() {
    head_leaves_during_pause("timeout");
}

#[test]
fn a_waiter_killed_at_the_head_during_a_pause_lets_the_next_in_right_after_it() {
    head_leaves_during_pause("kill");
}

#[test]
fn a_waiter_unblocked_at_the_head_during_a_pause_lets_the_next_in_right_after_it() {
    head_leaves_during_pause("unblock");
}

fn acquire_all_cmd(keys: &[&str], owner: &str, wait_ms: u64) -> redis::Cmd {
    let mut cmd = redis::cmd("FLOCK.ACQUIREALL");
    cmd.arg(keys.len()).arg(keys).arg(owner).arg(60_000).arg("WAIT").arg(wait_ms);
    cmd
}

#[test]
fn an_acquireall_whose_last_key_frees_during_a_pause_gets_every_key_right_after_it() {
    let (mut m, r) = pair();
    let mut c = m.conn();
    // Held long while X queues; cut to LEASE_MS with the pause.
    let a = acquire(&mut c, "k1", "A", 60_000).unwrap().expect("A holds k1");
    let x = spawn_cmd(&m, acquire_all_cmd(&["k1", "k2"], "X", LONG_WAIT_MS));
    wait_queue(&mut c, "k1", &["X"]);
    let pause = Pause::after(&mut renew_to("k1", "A", LEASE_MS), &mut c, PAUSE_MS, "WRITE");
    sleep_until(pause.sent + CHECK_AT);
    let (owner, queue) = (owner_of(&mut c, "k1"), queue_of(&mut c, "k2"));
    if pause.still_on("the lease end put off") {
        assert_eq!(owner.as_deref(), Some("A"), "A's lease ended during the pause");
        assert_eq!(queue, ["X"], "X was granted during the pause");
    }
    let (reply, at) = x.join().expect("X's thread");
    let tokens: Vec<i64> = redis::from_redis_value(&reply.expect("X")).expect("X's tokens");
    pause.assert_right_after(PAUSE_MS, at, "X's grant");
    assert!(tokens.len() == 2 && tokens[0] > a, "X's tokens {tokens:?} after A's {a}");
    assert_up(&mut m, "after the pause");
    assert_eq!((owner_of(&mut c, "k1"), owner_of(&mut c, "k2")), (Some("X".into()), Some("X".into())));
    assert_replica_same(&m, &r, &["k1", "k2"], "after the grant of both keys");
}

#[test]
fn an_acquireall_that_times_out_during_a_pause_lets_the_queue_behind_it_in_right_after_it() {
    let (mut m, r) = pair();
    let mut c = m.conn();
    acquire(&mut c, "k1", "A", 60_000).unwrap().expect("A holds k1");
    // X holds a place at k2 too, free as it is: Y queues behind it. Y is
    // ready before X's wait starts: it must queue, and the pause begin,
    // before that wait ends.
    let (y_go, y) = spawn_cmd_on_signal(&m, wait_cmd("k2", "Y", LONG_WAIT_MS, &[]));
    let x = spawn_cmd(&m, acquire_all_cmd(&["k1", "k2"], "X", LEASE_MS));
    wait_queue(&mut c, "k2", &["X"]);
    y_go.send(()).expect("Y's thread");
    wait_queue(&mut c, "k2", &["X", "Y"]);
    let pause = Pause::start(&mut c, PAUSE_MS, "WRITE");
    let (reply, left_at) = x.join().expect("X's thread");
    assert_eq!(reply.expect("X"), Value::Nil, "X's wait timed out");
    // A command that is no write runs during the pause, and it must not
    // take X's places out of the queues then (which lets Y in).
    let mut other = m.conn();
    let _: String = redis::cmd("FLOCK.SESSION").query(&mut other).expect("FLOCK.SESSION during the pause");
    let queue = queue_of(&mut c, "k2");
    if pause.still_on("the queue behind X put off") {
        assert!(left_at < pause.by, "X timed out during the pause");
        assert!(!y.is_finished(), "Y was granted during the pause");
        assert!(queue.contains(&"Y".to_string()), "Y left the queue during the pause: {queue:?}");
    }
    let (_, at) = granted_at(y, "Y");
    pause.assert_right_after(PAUSE_MS, at, "Y's grant");
    assert_up(&mut m, "after the pause");
    assert_eq!(owner_of(&mut c, "k2").as_deref(), Some("Y"));
    assert!(queue_of(&mut c, "k1").is_empty(), "X left k1's queue");
    assert_replica_same(&m, &r, &["k1", "k2"], "after Y's grant");
}

#[test]
fn a_lock_of_another_client_whose_ttl_ends_during_a_pause_goes_to_the_flock_waiter_right_after_it() {
    let (mut m, r) = pair();
    let mut c = m.conn();
    // B is ready before the string's TTL starts: it must queue, and the
    // pause begin, before the TTL ends. (The TTL cannot be cut later as a
    // lease is: FLOCK watches the one it saw when B queued.)
    let (b_go, b) = spawn_cmd_on_signal(&m, wait_cmd("k", "B", LONG_WAIT_MS, &[]));
    let set = Instant::now();
    let ok: String =
        redis::cmd("SET").arg("k").arg("old-client").arg("NX").arg("PX").arg(LEASE_MS).query(&mut c).unwrap();
    assert_eq!(ok, "OK");
    b_go.send(()).expect("B's thread");
    wait_queue(&mut c, "k", &["B"]);
    let pause = Pause::start(&mut c, PAUSE_MS, "WRITE");
    sleep_until(set + CHECK_AT);
    // FLOCK.INFO shows nothing now: the server no longer shows the expired
    // string, but keeps it until the pause ends.
    if pause.still_on("the foreign lock's end put off") {
        assert!(!b.is_finished(), "B was granted during the pause");
    }
    let (_, at) = granted_at(b, "B");
    pause.assert_right_after(PAUSE_MS, at, "B's grant");
    assert_up(&mut m, "after the pause");
    assert_eq!(owner_of(&mut c, "k").as_deref(), Some("B"));
    assert_replica_same(&m, &r, &["k"], "after B's grant");
}

/// `FAILOVER TIMEOUT timeout_ms` on `c`'s master to its replica `r`, which
/// is stopped first and so acknowledges nothing: the failover waits for
/// it (with writes paused) until `r` is let go or the timeout. `leases`
/// (key, owner, ms), held long until then, are cut to their short leases
/// in the same pipeline, so that none can end before writes pause however
/// slow the machine. Also when the failover (and those leases) was sent.
fn failover_waiting_for(
    c: &mut Connection,
    r: &Server,
    timeout_ms: u64,
    leases: &[(&str, &str, u64)],
) -> (Stopped, Instant) {
    let stopped = Stopped::new(r);
    // A write the replica has not acknowledged: the failover waits for it.
    let mut first = redis::pipe();
    first.cmd("SET").arg("unacknowledged").arg(1).ignore();
    for (key, owner, ms) in leases {
        first.cmd("FLOCK.RENEW").arg(*key).arg(*owner).arg(*ms).ignore();
    }
    let sent = Instant::now();
    let (ok,): (String,) = first.cmd("FAILOVER").arg("TIMEOUT").arg(timeout_ms).query(c).expect("FAILOVER");
    assert_eq!(ok, "OK");
    (stopped, sent)
}

fn role(s: &Server) -> String {
    s.info_section("replication").get("role").cloned().unwrap_or_default()
}

fn failover_state(s: &Server) -> String {
    s.info_section("replication").get("master_failover_state").cloned().unwrap_or_default()
}

/// `FAILOVER TIMEOUT ms` on a master whose replica is stopped: writes are
/// paused until the timeout, then the master aborts the failover and stays
/// one. Its work goes on right after.
#[test]
fn a_lease_that_ends_while_a_failover_waits_for_its_replica_goes_to_the_waiter_when_the_failover_gives_up() {
    let (mut m, r) = pair();
    let mut c = m.conn();
    let (a, b) = a_holds_k_and_b_waits(&m, &mut c);
    let (stopped, sent) = failover_waiting_for(&mut c, &r, PAUSE_MS, &[("k", "A", LEASE_MS)]);
    let pause = Pause { sent, by: Instant::now() + Duration::from_millis(PAUSE_MS) };
    sleep_until(sent + CHECK_AT);
    let (owner, state) = (owner_of(&mut c, "k"), failover_state(&m));
    if pause.still_on("the lease end put off") {
        assert_eq!(state, "waiting-for-sync", "the failover waits for the stopped replica");
        assert_eq!(owner.as_deref(), Some("A"), "A's lease ended while writes were paused");
    }
    let (t, at) = granted_at(b, "B");
    pause.assert_right_after(PAUSE_MS, at, "B's grant");
    assert!(t > a);
    assert_up(&mut m, "after the failover gave up");
    assert_eq!((role(&m), failover_state(&m)), ("master".into(), "no-failover".into()));
    drop(stopped);
    assert_replica_same(&m, &r, &["k"], "after the replica caught up");
}

/// FAILOVER that completes while work is put off: a lease end (with a
/// waiter) and the release of a SESSION grant whose connection closed. The
/// old master is a replica when its pause ends, so it leaves both to the
/// new master, which has the grants and ends each with its lease (late,
/// never early), and tells its replica, the old master.
#[test]
fn work_put_off_by_a_failover_that_completes_is_left_to_the_new_master() {
    let (mut m, mut r) = pair();
    let mut c = m.conn();
    let session_lease = 2500;
    let mut holder = m.conn();
    let _: i64 =
        redis::cmd("FLOCK.ACQUIRE").arg("s").arg("S").arg(60_000).arg("SESSION").query(&mut holder).expect("S holds s");
    let (_, b) = a_holds_k_and_b_waits(&m, &mut c);
    let leases = [("s", "S", session_lease), ("k", "A", LEASE_MS)];
    let (stopped, renewed) = failover_waiting_for(&mut c, &r, 20_000, &leases);
    drop(holder);
    sleep_until(renewed + CHECK_AT);
    assert_eq!(failover_state(&m), "waiting-for-sync", "the failover waits for the stopped replica");
    assert_eq!(owner_of(&mut c, "k").as_deref(), Some("A"), "A's lease ended while writes were paused");
    assert_eq!(owner_of(&mut c, "s").as_deref(), Some("S"), "S's SESSION grant ended while writes were paused");
    drop(stopped);
    wait_until("the replica to take over", 20 * SECOND, || role(&r) == "master" && role(&m) == "slave");
    let (reply, _) = b.join().expect("B's thread");
    let e = reply.expect_err("B, waiting on a master that became a replica");
    assert_eq!(error_code(&e), "UNBLOCKED", "B: {e}");
    assert_up(&mut m, "the old master after the failover");
    r.assert_alive("the new master");
    // The new master ends both leases; the old one, its replica now, follows.
    let mut rc = r.conn();
    wait_until("the new master to end A's lease", 10 * SECOND, || !exists(&mut rc, "k"));
    assert!(exists(&mut rc, "s"), "S's grant ended early on the new master");
    wait_gone(&mut rc, "s", renewed + Duration::from_millis(session_lease), 10 * SECOND);
    wait_until("the old master to follow", 10 * SECOND, || !exists(&mut c, "k") && !exists(&mut c, "s"));
    assert_eq!(dbsize(&mut c), dbsize(&mut rc));
    let log = std::fs::read_to_string(m.dir.path().join(LOG)).unwrap_or_default();
    assert!(
        log.contains("became a replica while writes were paused"),
        "the old master says it left the put-off release to its new master; its log:\n{}",
        m.log_excerpt(LOG)
    );
}

/// What the server itself does with commands during a WRITE pause, which
/// the design relies on: FLOCK's reads run at once; its writes wait for the
/// end of the pause, also inside EVAL and MULTI; a MULTI that pauses writes
/// itself still runs and replicates the FLOCK writes queued after the pause.
#[test]
fn during_a_pause_flock_reads_run_writes_wait_and_a_multi_that_pauses_itself_replicates() {
    let (mut m, r) = pair();
    let mut c = m.conn();
    acquire(&mut c, "k", "A", 60_000).unwrap().expect("A holds k");
    let mut session = m.conn();
    let pause = Pause::start(&mut c, PAUSE_MS, "WRITE");
    let renew = spawn_cmd(&m, redis::cmd("FLOCK.RENEW").arg("k").arg("A").arg(60_000).clone());
    let script = "return redis.call('FLOCK.ACQUIRE', KEYS[1], 'E', 60000)";
    let eval = spawn_cmd(&m, redis::cmd("EVAL").arg(script).arg(1).arg("e").clone());
    let multi = {
        let mut mc = m.conn();
        std::thread::spawn(move || {
            let r: RedisResult<Value> =
                redis::pipe().atomic().cmd("FLOCK.ACQUIRE").arg("t").arg("T").arg(60_000).query(&mut mc);
            (r, Instant::now())
        })
    };
    // Reads answer at once.
    let _: String = redis::cmd("FLOCK.SESSION").query(&mut session).expect("FLOCK.SESSION");
    let read: Value = redis::cmd("FLOCK.INBOX").arg(10).query(&mut session).expect("FLOCK.INBOX");
    assert_eq!(read, Value::Nil);
    assert_eq!(owner_of(&mut c, "k").as_deref(), Some("A"));
    if pause.still_on("writes held back") {
        assert!(!renew.is_finished() && !eval.is_finished() && !multi.is_finished(), "a write ran during the pause");
    }
    for (what, h) in [("FLOCK.RENEW", renew), ("EVAL", eval), ("MULTI", multi)] {
        let (reply, at) = h.join().expect("thread");
        reply.unwrap_or_else(|e| panic!("{what}: {e}"));
        pause.assert_right_after(PAUSE_MS, at, what);
    }
    assert_up(&mut m, "after the pause");
    // MULTI; CLIENT PAUSE; FLOCK.RELEASE; EXEC: the release hands k to B,
    // replicated with the transaction, while the pause that follows is on.
    let b = spawn_cmd(&m, wait_cmd("k", "B", LONG_WAIT_MS, &[]));
    wait_queue(&mut c, "k", &["B"]);
    let sent = Instant::now();
    let (_, left): ((), i64) = redis::pipe()
        .atomic()
        .cmd("CLIENT")
        .arg("PAUSE")
        .arg(PAUSE_MS)
        .arg("WRITE")
        .cmd("FLOCK.RELEASE")
        .arg("k")
        .arg("A")
        .query(&mut c)
        .expect("MULTI with CLIENT PAUSE and FLOCK.RELEASE");
    assert_eq!(left, 0);
    let (_, at) = granted_at(b, "B");
    assert!(at < sent + Duration::from_millis(PAUSE_MS), "B was granted by the transaction, before its pause ended");
    assert_up(&mut m, "after the MULTI that paused itself");
    let mut rc = r.conn();
    wait_until("the replica to show B's grant", 5 * SECOND, || owner_of(&mut rc, "k").as_deref() == Some("B"));
    std::thread::sleep(Duration::from_millis(PAUSE_MS).saturating_sub(sent.elapsed()));
    assert_replica_same(&m, &r, &["k", "e", "t"], "after both pauses");
}
