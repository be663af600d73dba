//! FLOCK on a real local Redis Cluster: 3 masters with 1 replica each on
//! loopback, module loaded on every node, created with `redis-cli --cluster
//! create`; the tests share one cluster, one test at a time (each turn
//! begins with a healthy cluster without keys):
//! 1. a cluster-aware client takes and releases thousands of locks over all
//!    masters, and hash-tagged related locks land on one slot;
//! 2. a plain connection to the wrong node gets MOVED (the key is declared);
//! 3. moving a slot with held locks (SETSLOT + MIGRATE) keeps owner, holds,
//!    lease and token; the lease still ends on time on the new master and
//!    its next grant has a larger token;
//! 4. CLUSTER FAILOVER keeps a held lock (owner, token) on the promoted
//!    replica; the old holder releases it there; tokens keep increasing;
//!    every waiter blocked on the old master (WAIT 0 or 20000, on two locks)
//!    gets UNBLOCKED at once and leaves its queue;
//! 5. CLUSTER FAILOVER while leases end every few ms on the master, which
//!    pauses writes until it is demoted: every node stays up, no lease ends
//!    early, and both nodes end up without the locks;
//! 6. ACL key patterns apply to FLOCK commands (a plain server).
use crate::common::cluster::*;
use crate::common::shared::Shared;
use crate::common::*;

use std::collections::HashSet;
use std::time::{Duration, Instant};

/// A FLOCK.INFO field that must be there (`what` names it), as an integer.
fn present_int(v: Option<Value>, what: &str) -> i64 {
    redis::from_redis_value(&v.unwrap_or_else(|| panic!("{what}: missing"))).unwrap_or_else(|e| panic!("{what}: {e}"))
}

fn cluster_cmd(c: &mut Connection, args: &[&str]) -> String {
    let mut cmd = redis::cmd("CLUSTER");
    for a in args {
        cmd.arg(*a);
    }
    cmd.query(c).unwrap_or_else(|e| panic!("CLUSTER {args:?}: {e}"))
}

/// The port a MOVED or ASK error points at (`MOVED <slot> <host>:<port>`).
fn redirect_port(e: &redis::RedisError) -> Option<u16> {
    e.redirect_node()?.0.rsplit(':').next()?.parse().ok()
}

static CLUSTER: Shared<Cluster> = Shared::new();

/// Runs `scenario` on this module's cluster when its turn comes, and
/// reports the times.
fn on_cluster(name: &str, scenario: impl FnOnce(&Cluster)) {
    let t0 = Instant::now();
    let cl = CLUSTER.turn();
    let up = t0.elapsed();
    let t = Instant::now();
    scenario(&cl);
    eprintln!("{name}: cluster ready (started, or its turn came) in {up:?}, scenario {:?}", t.elapsed());
}

#[test]
fn routing_and_bulk_locks() {
    on_cluster("routing_and_bulk_locks", |cl| {
        bulk_locks_over_all_slots(cl);
        wrong_node_gets_moved(cl);
        fenced_writes_route_by_the_lock_and_the_commands_keys(cl);
    });
}

#[test]
fn slot_migration() {
    on_cluster("slot_migration", slot_migration_keeps_locks);
}

/// About 6 s: CLUSTER FAILOVER, then the deposed master's resync as the new
/// replica, which the next test's turn waits for anyway.
#[test]
fn failover() {
    on_cluster("failover", failover_keeps_locks);
}

#[test]
fn failover_while_leases_end() {
    on_cluster("failover_while_leases_end", failover_while_leases_end_keeps_every_node_up);
}

/// Scenario 1: thousands of locks through the cluster-aware client, spread
/// over every master; hash-tagged locks share a slot (and so can be used
/// together in one MULTI); afterwards no lock key remains anywhere.
fn bulk_locks_over_all_slots(cl: &Cluster) {
    const N: usize = 3000;
    let mut cc = cl.client();
    let masters = cl.masters();
    assert_eq!(masters.len(), 3, "3 masters expected");

    let mut slots = HashSet::new();
    let mut c0 = cl.conn(0);
    for i in 0..N {
        let key = format!("lock:{i}");
        let slot: u16 = redis::cmd("CLUSTER").arg("KEYSLOT").arg(&key).query(&mut c0).expect("KEYSLOT");
        slots.insert(slot);
        let token: Option<i64> = redis::cmd("FLOCK.ACQUIRE")
            .arg(&key)
            .arg(format!("owner-{i}"))
            .arg(60_000)
            .query(&mut cc)
            .unwrap_or_else(|e| panic!("cluster client FLOCK.ACQUIRE {key}: {e}"));
        assert!(
            matches!(token, Some(t) if t > 0),
            "FLOCK.ACQUIRE {key} through the cluster client must grant a token, got {token:?}"
        );
    }
    assert!(slots.len() > N * 8 / 10, "the {N} keys should spread over many slots, got {}", slots.len());

    // Related locks with one hash tag: one slot, one master.
    let (a, b) = ("{order:42}:a", "{order:42}:b");
    assert_eq!(cl.keyslot(a), cl.keyslot(b), "hash-tagged keys must share a slot");
    let ta: Option<i64> =
        redis::cmd("FLOCK.ACQUIRE").arg(a).arg("order-worker").arg(60_000).query(&mut cc).expect("acquire a");
    let tb: Option<i64> =
        redis::cmd("FLOCK.ACQUIRE").arg(b).arg("order-worker").arg(60_000).query(&mut cc).expect("acquire b");
    let (ta, tb) = (ta.expect("token for {order:42}:a"), tb.expect("token for {order:42}:b"));
    assert!(tb > ta, "two grants on one master: later token {tb} must be larger than {ta}");
    let home = cl.owner_of_key(a);
    let mut hc = cl.conn(home);
    assert_eq!(owner_of(&mut hc, a).as_deref(), Some("order-worker"), "{a} must live on the master of its slot");
    assert_eq!(owner_of(&mut hc, b).as_deref(), Some("order-worker"), "{b} must live on the same master as {a}");
    // Same slot: both locks can be renewed in one transaction on that node.
    let renewed: (i64, i64) = redis::pipe()
        .atomic()
        .cmd("FLOCK.RENEW")
        .arg(a)
        .arg("order-worker")
        .arg(60_000)
        .cmd("FLOCK.RENEW")
        .arg(b)
        .arg("order-worker")
        .arg(60_000)
        .query(&mut hc)
        .expect("MULTI/EXEC of FLOCK.RENEW on both hash-tagged locks");
    assert_eq!(renewed, (ta, tb), "RENEW in MULTI returns each lock's current token");

    // Every master holds a share of the locks.
    let sizes: Vec<i64> = masters.iter().map(|&m| cl.dbsize(m)).collect();
    assert!(sizes.iter().all(|&s| s > 0), "locks must spread over all masters, DBSIZE per master = {sizes:?}");
    assert_eq!(
        sizes.iter().sum::<i64>(),
        N as i64 + 2,
        "every lock is one key on one master, DBSIZE per master = {sizes:?}"
    );

    for i in 0..N {
        let key = format!("lock:{i}");
        let left: i64 = redis::cmd("FLOCK.RELEASE")
            .arg(&key)
            .arg(format!("owner-{i}"))
            .query(&mut cc)
            .unwrap_or_else(|e| panic!("cluster client FLOCK.RELEASE {key}: {e}"));
        assert_eq!(left, 0, "FLOCK.RELEASE {key} must fully release");
    }
    for k in [a, b] {
        let left: i64 =
            redis::cmd("FLOCK.RELEASE").arg(k).arg("order-worker").query(&mut cc).expect("release hash-tagged");
        assert_eq!(left, 0, "FLOCK.RELEASE {k} must fully release");
    }
    for &m in &masters {
        assert_eq!(cl.dbsize(m), 0, "no lock key may remain on master {} after releasing everything", cl.nodes[m].port);
    }
}

/// Scenario 2: FLOCK commands declare their key: a node that does not serve
/// the slot answers MOVED with the right node, and creates nothing.
fn wrong_node_gets_moved(cl: &Cluster) {
    let key = "moved:probe";
    let owner = cl.owner_of_key(key);
    let wrong = *cl.masters().iter().find(|&&m| m != owner).expect("another master");
    let mut c = cl.conn(wrong);
    let before = cl.dbsize(wrong);

    let e = expect_err(acquire(&mut c, key, "alice", 10_000), "FLOCK.ACQUIRE on a node that does not serve the slot");
    assert_eq!(error_code(&e), "MOVED", "FLOCK.ACQUIRE on the wrong node must answer MOVED, got {e}");
    assert_eq!(
        redirect_port(&e),
        Some(cl.nodes[owner].port),
        "MOVED must point at the master serving slot {}: {e}",
        cl.keyslot(key)
    );
    let e = expect_err(acquire_wait(&mut c, key, "alice", 10_000, 1000), "FLOCK.ACQUIRE WAIT on the wrong node");
    assert_eq!(error_code(&e), "MOVED", "FLOCK.ACQUIRE WAIT on the wrong node must answer MOVED (not block), got {e}");
    let e = expect_err(release(&mut c, key, "alice"), "FLOCK.RELEASE on the wrong node");
    assert_eq!(error_code(&e), "MOVED", "FLOCK.RELEASE on the wrong node must answer MOVED, got {e}");
    let e = expect_err(renew(&mut c, key, "alice", 1000), "FLOCK.RENEW on the wrong node");
    assert_eq!(error_code(&e), "MOVED", "FLOCK.RENEW on the wrong node must answer MOVED, got {e}");
    let e = expect_err(force_release(&mut c, key), "FLOCK.FORCERELEASE on the wrong node");
    assert_eq!(error_code(&e), "MOVED", "FLOCK.FORCERELEASE on the wrong node must answer MOVED, got {e}");
    let e = expect_err(redis::cmd("FLOCK.INFO").arg(key).query::<Value>(&mut c), "FLOCK.INFO on the wrong node");
    assert_eq!(error_code(&e), "MOVED", "FLOCK.INFO on the wrong node must answer MOVED, got {e}");
    assert_eq!(cl.dbsize(wrong), before, "the wrong node must not create the lock");

    // The right node grants it.
    let mut oc = cl.conn(owner);
    assert!(
        acquire(&mut oc, key, "alice", 10_000).expect("acquire on the owner").is_some(),
        "the slot's master grants"
    );
    assert_eq!(release(&mut oc, key, "alice").expect("release"), 0);
}

/// FLOCK.FENCED through the cluster client: data that shares the lock's
/// hash tag is written on the lock's node; data of another slot is refused
/// with CROSSSLOT, and a node that serves neither answers MOVED, before
/// anything runs.
fn fenced_writes_route_by_the_lock_and_the_commands_keys(cl: &Cluster) {
    let (lock, row) = ("{fence}:lock", "{fence}:row");
    let mut cc = cl.client();
    let token: i64 =
        redis::cmd("FLOCK.ACQUIRE").arg(lock).arg("w").arg(60_000).query::<Option<i64>>(&mut cc).unwrap().unwrap();
    let fenced = |c: &mut dyn redis::ConnectionLike, key: &str| {
        redis::cmd("FLOCK.FENCED").arg(lock).arg(token).arg(&["SET", key, "v"][..]).query::<Value>(c)
    };
    assert_eq!(fenced(&mut cc, row).unwrap(), Value::Okay, "through the cluster client");
    let owner = cl.owner_of_key(lock);
    let mut oc = cl.conn(owner);
    let other = (0..).map(|i| format!("other:{i}")).find(|k| cl.keyslot(k) != cl.keyslot(lock)).unwrap();
    let e = expect_err(fenced(&mut oc, &other), "data of another slot");
    assert_eq!(error_code(&e), "CROSSSLOT", "{e}");
    let wrong = *cl.masters().iter().find(|&&m| m != owner).expect("another master");
    let e = expect_err(fenced(&mut cl.conn(wrong), row), "the wrong node");
    assert_eq!(error_code(&e), "MOVED", "{e}");
    let got: Option<String> = redis::cmd("GET").arg(row).query(&mut oc).unwrap();
    assert_eq!(got.as_deref(), Some("v"));
    assert!(!redis::cmd("EXISTS").arg(&other).query::<bool>(&mut cc).unwrap(), "the refused write did not run");
    release(&mut oc, lock, "w").unwrap();
}

/// Scenario 3: CLUSTER SETSLOT IMPORTING/MIGRATING + MIGRATE + SETSLOT NODE
/// moves a slot with two held locks to another master.
fn slot_migration_keeps_locks(cl: &Cluster) {
    let (held, short) = ("{mig}:held", "{mig}:short");
    let slot = cl.keyslot(held);
    assert_eq!(slot, cl.keyslot(short));
    let src = cl.owner_of_slot(slot);
    let dst = *cl.masters().iter().find(|&&m| m != src).expect("another master");
    let mut sc = cl.conn(src);

    // alice holds `held` twice with a long lease; carol holds `short` for 2.5 s.
    let t_held = acquire(&mut sc, held, "alice", 20_000).expect("acquire held").expect("granted");
    assert_eq!(acquire(&mut sc, held, "alice", 20_000).expect("reentrant acquire"), Some(t_held));
    let short_lease = 2500u64;
    let short_start = Instant::now();
    let t_short = acquire(&mut sc, short, "carol", short_lease).expect("acquire short").expect("granted");
    let short_granted = Instant::now();

    // A waiter queued on the source: waiters are connection state and do not
    // move with the key; MIGRATE deletes the source key, which ends its wait.
    let waiter = {
        let mut c = cl.conn(src);
        std::thread::spawn(move || acquire_wait(&mut c, "{mig}:held", "bob", 5000, 15_000))
    };
    wait_for("bob queued on the source", 5 * SECOND, || queue_of(&mut sc, held) == ["bob"]);

    let ttl_before = present_int(info_field(&mut sc, held, "ttl-ms"), "ttl-ms before");
    let measured = Instant::now();

    let mut dc = cl.conn(dst);
    cl.migrate_keys(slot, src, dst, &[held, short]);

    // While the slot is migrating: the source redirects with ASK, the target
    // serves the key to an ASKING client.
    let e =
        expect_err(redis::cmd("FLOCK.INFO").arg(held).query::<Value>(&mut sc), "FLOCK.INFO on the migrating source");
    assert_eq!(error_code(&e), "ASK", "the migrating source must answer ASK for a moved lock key, got {e}");
    let e = expect_err(
        redis::cmd("FLOCK.INFO").arg(held).query::<Value>(&mut dc),
        "FLOCK.INFO on the importing target without ASKING",
    );
    assert_eq!(error_code(&e), "MOVED", "the importing target must answer MOVED without ASKING, got {e}");
    let _: () = redis::cmd("ASKING").query(&mut dc).expect("ASKING");
    assert_eq!(owner_of(&mut dc, held).as_deref(), Some("alice"), "the importing target serves the lock after ASKING");

    cl.assign_slot(slot, src, dst);

    // The queued waiter got an answer (its key left the node), not a hang.
    let w = waiter.join().expect("waiter thread");
    match &w {
        Err(e) => assert!(
            error_code(e) == "LOCKDELETED",
            "a waiter on the source of a migrated lock should get LOCKDELETED, got {e}"
        ),
        Ok(v) => panic!("a waiter on the source of a migrated lock must not be granted there, got {v:?}"),
    }

    // Same owner, holds, token and remaining lease on the new master.
    let moved = info(&mut dc, held).expect("lock present on the new master after migration");
    let field = |name: &str| moved.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    assert_eq!(redis::from_redis_value::<String>(&field("owner").unwrap()).unwrap(), "alice", "owner after migration");
    assert_eq!(present_int(field("holds"), "holds"), 2, "holds after migration");
    assert_eq!(present_int(field("token"), "token"), t_held, "token after migration");
    let ttl_after = present_int(field("ttl-ms"), "ttl-ms");
    let elapsed = measured.elapsed().as_millis() as i64;
    assert!(
        ttl_after <= ttl_before && ttl_after >= ttl_before - elapsed - 50,
        "the lease must keep its deadline across migration: ttl {ttl_before} ms before, {ttl_after} ms after {elapsed} ms"
    );
    assert_eq!(present_int(field("waiters"), "waiters"), 0, "waiters do not move with the key");
    // The new master's replica gets the migrated lock too (a later failover keeps it).
    let mut drc = cl.conn(cl.replica_of(dst));
    let _: () = redis::cmd("READONLY").query(&mut drc).expect("READONLY");
    wait_for("the new master's replica to have the migrated lock", 5 * SECOND, || {
        owner_of(&mut drc, held).as_deref() == Some("alice")
    });
    assert_eq!(
        present_int(info_field(&mut drc, held, "token"), "replica token"),
        t_held,
        "the replica has the migrated token"
    );
    let e = expect_err(redis::cmd("FLOCK.INFO").arg(held).query::<Value>(&mut sc), "FLOCK.INFO on the old master");
    assert_eq!(error_code(&e), "MOVED", "the old master must redirect after SETSLOT NODE, got {e}");
    assert_eq!(redirect_port(&e), Some(cl.nodes[dst].port), "MOVED must point at the new master");

    // The short lease still ends on time on the new master: a waiter there
    // is granted when carol's lease runs out, with a larger token.
    if short_granted.elapsed() < Duration::from_millis(short_lease - 300) {
        assert_eq!(owner_of(&mut dc, short).as_deref(), Some("carol"), "carol's lock moved with its lease");
    }
    let mut wc = cl.conn(dst);
    let t_erin = acquire_wait(&mut wc, short, "erin", 5000, 10_000).expect("erin waits on the new master");
    let waited = short_start.elapsed().as_millis() as u64;
    let t_erin =
        t_erin.unwrap_or_else(|| panic!("erin must be granted when carol's migrated lease ends ({waited} ms)"));
    assert!(
        waited + SERVER_CLOCK_GRAIN_MS >= short_lease,
        "the migrated lease ended early: after {waited} ms, lease {short_lease} ms"
    );
    assert!(
        waited <= short_lease + 700,
        "the migrated lease must end on time on the new master: {waited} ms for a {short_lease} ms lease"
    );
    assert!(
        t_erin > t_short,
        "grant after expiry on the new master: token {t_erin} must exceed the migrated token {t_short}"
    );
    assert_eq!(release(&mut dc, short, "erin").expect("erin releases"), 0);

    // The old holder releases on the new master; the next grant has a larger token.
    assert_eq!(release(&mut dc, held, "alice").expect("alice releases on the new master"), 1);
    assert_eq!(release(&mut dc, held, "alice").expect("alice releases again"), 0);
    assert!(info(&mut dc, held).is_none(), "fully released lock key is removed");
    let t_next = acquire(&mut dc, held, "dave", 10_000).expect("acquire on the new master").expect("granted");
    assert!(t_next > t_held, "next grant on the new master: token {t_next} must exceed the migrated token {t_held}");
    assert_eq!(release(&mut dc, held, "dave").expect("release"), 0);

    // The cluster-aware client follows the slot to its new master.
    cl.wait_slot_owner(slot, dst);
    let mut cc = cl.client();
    let t_cc: Option<i64> =
        redis::cmd("FLOCK.ACQUIRE").arg(held).arg("frank").arg(10_000).query(&mut cc).expect("cluster client acquire");
    assert!(
        matches!(t_cc, Some(t) if t > t_next),
        "cluster client grant after migration: {t_cc:?} must exceed {t_next}"
    );
    assert_eq!(owner_of(&mut dc, held).as_deref(), Some("frank"), "the cluster client's grant lives on the new master");
    let left: i64 = redis::cmd("FLOCK.RELEASE").arg(held).arg("frank").query(&mut cc).expect("release");
    assert_eq!(left, 0);
}

/// Scenario 4: CLUSTER FAILOVER on the replica of the master holding locks.
fn failover_keeps_locks(cl: &Cluster) {
    let (key, short, other) = ("{fo}:lock", "{fo}:short", "{fo}:other");
    let slot = cl.keyslot(key);
    let m = cl.owner_of_slot(slot);
    let r = cl.replica_of(m);
    let mut mc = cl.conn(m);

    let token = acquire(&mut mc, key, "alice", 30_000).expect("acquire").expect("granted");
    let short_lease = 3000u64;
    let short_start = Instant::now();
    let t_short = acquire(&mut mc, short, "carol", short_lease).expect("acquire short").expect("granted");
    acquire(&mut mc, other, "gus", 30_000).expect("acquire other").expect("granted");
    // WAIT makes the grants survive failover: the replica has them.
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(2000).query(&mut mc).expect("WAIT");
    assert_eq!(acked, 1, "WAIT 1 after the grants: the replica must acknowledge");

    let mut rc = cl.conn(r);
    let _: () = redis::cmd("READONLY").query(&mut rc).expect("READONLY");
    assert_eq!(owner_of(&mut rc, key).as_deref(), Some("alice"), "FLOCK.INFO on the replica shows the master's lock");
    assert_eq!(
        present_int(info_field(&mut rc, key, "token"), "replica token"),
        token,
        "the replica has the master's token"
    );

    // Waiters blocked on the old master: waiters are connection state, so
    // the failover must end each wait with an error (they retry), not strand it.
    let mut queued = Vec::new();
    for (lock, owners) in [(key, ["bob", "dan"]), (other, ["hal", "ivy"])] {
        for (i, wait_ms) in [20_000, 0].into_iter().enumerate() {
            let owner = owners[i];
            queued.push((format!("{owner} (WAIT {wait_ms})"), spawn_timed_waiter(cl.conn(m), lock, owner, wait_ms)));
            wait_for(&format!("{owner} queued on the old master"), 5 * SECOND, || {
                queue_of(&mut mc, lock) == owners[..=i]
            });
        }
    }

    let failover_start = Instant::now();
    assert_eq!(cluster_cmd(&mut rc, &["FAILOVER"]), "OK");
    wait_for("the replica to become master and the old master a replica", 20 * SECOND, || {
        cl.role(r) == "master" && cl.role(m) == "slave"
    });
    eprintln!("   failover took {:?}", failover_start.elapsed());
    let replies = demoted_replies(queued, failover_start);
    eprintln!(
        "   waiters on the old master answered after {:?}",
        replies.iter().map(|(e, t)| (t, e)).collect::<Vec<_>>()
    );
    assert_demotion_counted(&mut mc, 4, &replies);
    let mut ro = cl.conn(m);
    let _: () = redis::cmd("READONLY").query(&mut ro).expect("READONLY");
    for (lock, holder) in [(key, "alice"), (other, "gus")] {
        assert_eq!(owner_of(&mut ro, lock).as_deref(), Some(holder), "{lock} keeps its holder on the demoted master");
        assert!(queue_of(&mut ro, lock).is_empty(), "{lock}: no waiter left in the queue of the demoted master");
    }

    // The lock is on the new master, with its owner and token.
    let mut nc = cl.conn(r);
    assert_eq!(owner_of(&mut nc, key).as_deref(), Some("alice"), "the promoted replica keeps the held lock's owner");
    assert_eq!(present_int(info_field(&mut nc, key, "token"), "token"), token, "the promoted replica keeps the token");
    let ttl = present_int(info_field(&mut nc, key, "ttl-ms"), "ttl-ms");
    assert!(ttl > 0 && ttl <= 30_000, "the lease is kept on the promoted replica, ttl-ms {ttl}");
    if short_start.elapsed() < Duration::from_millis(short_lease - 300) {
        assert_eq!(
            owner_of(&mut nc, short).as_deref(),
            Some("carol"),
            "the short lock is kept on the promoted replica"
        );
    }

    // The old master now redirects to the new one.
    let e = expect_err(acquire(&mut mc, key, "mallory", 1000), "FLOCK.ACQUIRE on the demoted master");
    assert_eq!(error_code(&e), "MOVED", "the demoted master must redirect, got {e}");
    assert_eq!(redirect_port(&e), Some(cl.nodes[r].port), "MOVED must point at the promoted replica");

    // The promoted replica enforces the remaining lease of the short lock.
    wait_for("carol's lease to end on the promoted replica", 10 * SECOND, || info(&mut nc, short).is_none());
    let ended = short_start.elapsed().as_millis() as u64;
    assert!(
        ended + SERVER_CLOCK_GRAIN_MS >= short_lease,
        "the lease ended early on the promoted replica: {ended} ms for {short_lease} ms"
    );
    assert!(
        ended <= short_lease + 1000,
        "the promoted replica must end the lease on time: {ended} ms for {short_lease} ms"
    );
    let t_short2 = acquire(&mut nc, short, "dave", 10_000).expect("acquire short").expect("granted after expiry");
    assert!(t_short2 > t_short, "token after failover {t_short2} must exceed {t_short}");
    assert_eq!(release(&mut nc, short, "dave").expect("release"), 0);

    // The old holder releases on the new master; the next grant is larger.
    assert_eq!(release(&mut nc, key, "alice").expect("alice releases on the promoted replica"), 0);
    let next = acquire(&mut nc, key, "bob", 30_000).expect("acquire").expect("granted");
    assert!(next > token, "next token after failover {next} must exceed {token}");

    // Replication now runs the other way: the demoted master shows bob.
    let _: () = redis::cmd("READONLY").query(&mut mc).expect("READONLY");
    wait_for("the demoted master (now a replica) to show bob's grant", 10 * SECOND, || {
        owner_of(&mut mc, key).as_deref() == Some("bob")
    });
    assert_eq!(present_int(info_field(&mut mc, key, "token"), "token on the new replica"), next);

    // The cluster-aware client finds the lock on the new master.
    cl.wait_slot_owner(slot, r);
    let mut cc = cl.client();
    let left: i64 =
        redis::cmd("FLOCK.RELEASE").arg(key).arg("bob").query(&mut cc).expect("release through the cluster client");
    assert_eq!(left, 0);
    assert!(info(&mut nc, key).is_none(), "released lock is gone from the new master");
}

/// Scenario 5: CLUSTER FAILOVER while a lease ends every few ms on the
/// master, some with a waiter to hand on to. From the replica's request
/// until it is demoted, the master pauses writes, and a lease end or a
/// hand-off in that window must wait: Redis aborts on anything replicated
/// during the pause (it did, in the Java suite's CLUSTER FAILOVER test).
fn failover_while_leases_end_keeps_every_node_up(cl: &Cluster) {
    const LOCKS: u64 = 400;
    const FIRST_MS: u64 = 300;
    const STEP_MS: u64 = 5;
    let keys: Vec<String> = (0..LOCKS).map(|i| format!("{{pf}}:{i}")).collect();
    let slot = cl.keyslot(&keys[0]);
    let m = cl.owner_of_slot(slot);
    let r = cl.replica_of(m);
    let mut mc = cl.conn(m);
    let mut pipe = redis::pipe();
    for (i, key) in keys.iter().enumerate() {
        pipe.cmd("FLOCK.ACQUIRE").arg(key).arg("o").arg(FIRST_MS + STEP_MS * i as u64);
    }
    let start = Instant::now();
    let tokens: Vec<Option<i64>> = pipe.query(&mut mc).expect("the acquires");
    assert!(tokens.iter().all(Option::is_some), "every lock granted");
    let deadline = |i: u64| start + Duration::from_millis(FIRST_MS + STEP_MS * i);
    // Waiters, granted short leases of their own before the failover, or
    // answered UNBLOCKED by it.
    let waiters: Vec<_> = (0..LOCKS)
        .step_by(20)
        .map(|i| {
            let mut c = cl.conn(m);
            let key = keys[i as usize].clone();
            std::thread::spawn(move || {
                redis::cmd("FLOCK.ACQUIRE")
                    .arg(&key)
                    .arg("w")
                    .arg(300)
                    .arg("WAIT")
                    .arg(20_000)
                    .query::<Option<i64>>(&mut c)
            })
        })
        .collect();
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(2000).query(&mut mc).expect("WAIT");
    assert_eq!(acked, 1, "the replica has the grants");
    std::thread::sleep(deadline(LOCKS / 4).saturating_duration_since(Instant::now()));
    let mut rc = cl.conn(r);
    assert_eq!(cluster_cmd(&mut rc, &["FAILOVER"]), "OK");
    wait_for("the replica to become master and the old master a replica", 20 * SECOND, || {
        cl.role(r) == "master" && cl.role(m) == "slave"
    });
    let switched = Instant::now();
    for node in [m, r] {
        let pong: RedisResult<String> = redis::cmd("PING").query(&mut cl.conn(node));
        assert_eq!(pong.as_deref().ok(), Some("PONG"), "node {node} is up after the failover");
    }
    // No lease ended early on the new master (a margin for the check's own time).
    let mut nc = cl.conn(r);
    for (i, key) in keys.iter().enumerate() {
        if deadline(i as u64) > Instant::now() + Duration::from_millis(100) {
            assert!(
                exists(&mut nc, key),
                "{key} ended early on the new master (switched {:?} ago)",
                switched.elapsed()
            );
        }
    }
    for (n, h) in waiters.into_iter().enumerate() {
        match h.join().expect("waiter thread") {
            Ok(Some(_)) => {}
            Ok(None) => panic!("waiter {n}: nil"),
            Err(e) => assert_eq!(error_code(&e), "UNBLOCKED", "waiter {n}: {e}"),
        }
    }
    wait_for("every lease to end on the new master and its replica", 20 * SECOND, || {
        cl.dbsize(r) == 0 && cl.dbsize(m) == 0
    });
}

/// The declared key also makes ACL key patterns apply (no cluster needed):
/// `~lock:*` allows FLOCK on `lock:*` only; `%R~ro:*` allows FLOCK.INFO
/// (read-only) but not ACQUIRE on `ro:*`.
#[test]
fn acl_key_patterns_apply() {
    let s = Server::start();
    let mut admin = s.conn();
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "worker", "on", ">pw", "resetkeys", "~lock:*", "%R~ro:*", "+@all"][..])
        .query(&mut admin)
        .expect("ACL SETUSER");
    assert!(acquire(&mut admin, "ro:x", "someone", 60_000).unwrap().is_some());
    let mut c = redis::Client::open(format!("redis://worker:pw@127.0.0.1:{}/", s.port))
        .unwrap()
        .get_connection()
        .expect("AUTH as worker");

    assert!(
        acquire(&mut c, "lock:a", "alice", 10_000).expect("allowed key").is_some(),
        "~lock:* allows FLOCK.ACQUIRE lock:a"
    );
    assert_eq!(owner_of(&mut c, "lock:a").as_deref(), Some("alice"));
    assert_eq!(release(&mut c, "lock:a", "alice").unwrap(), 0);
    for (what, r) in [
        ("FLOCK.ACQUIRE other:a", acquire(&mut c, "other:a", "alice", 10_000).map(|_| ())),
        ("FLOCK.INFO other:a", redis::cmd("FLOCK.INFO").arg("other:a").query::<Value>(&mut c).map(|_| ())),
        ("FLOCK.ACQUIRE ro:x", acquire(&mut c, "ro:x", "alice", 10_000).map(|_| ())),
        ("FLOCK.RELEASE ro:x", release(&mut c, "ro:x", "someone").map(|_| ())),
        ("FLOCK.FORCERELEASE ro:x", force_release(&mut c, "ro:x").map(|_| ())),
    ] {
        let e = r.expect_err(&format!("{what} must be refused by the key patterns"));
        assert_eq!(error_code(&e), "NOPERM", "{what}: {e}");
    }
    assert_eq!(owner_of(&mut c, "ro:x").as_deref(), Some("someone"), "%R~ro:* allows the read-only FLOCK.INFO");
    let keys: i64 = redis::cmd("DBSIZE").query(&mut admin).expect("DBSIZE");
    assert_eq!(keys, 1, "refused commands created nothing");
}
