//! The Rust client (crate `flock-client`) on a real Redis Cluster (3 masters
//! with a replica each, see common/cluster.rs) and on Sentinel (a master, its
//! replica and 3 sentinels): waits through one session per node, FIFO, hash
//! tags, the watchdog, pushed losses, a slot moved under a held lock and a
//! waiter, and a Sentinel failover; and the `redis` crate's own cluster and
//! sentinel clients' connections given to `acquire`.

use crate::common::cluster::{wait_for, Cluster};
use crate::common::sentinel::{named_master, sentinel_conn, sentinel_field, Sentinels};
use crate::common::shared::Shared;
use crate::common::*;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flock_client::{key_slot, LeaseLost, Lock, SentinelMaster};

const MS: Duration = Duration::from_millis(1);

/// The cluster of this module's tests, one test at a time.
static CLUSTER: Shared<Cluster> = Shared::new();

fn client_cluster(cl: &Cluster) -> flock_client::Cluster {
    flock_client::Cluster::new(cl.nodes.iter().map(|n| n.url()).collect()).expect("cluster client")
}

/// A key (`prefix` and a number) on each of the cluster's masters, in the
/// order of `cl.masters()`.
fn key_per_master(cl: &Cluster, prefix: &str) -> Vec<(usize, String)> {
    cl.masters()
        .into_iter()
        .map(|m| {
            let key = (0..).map(|i| format!("{prefix}{i}")).find(|k| cl.owner_of_key(k) == m).expect("a key");
            (m, key)
        })
        .collect()
}

/// Waits until node `node` queues exactly `owners` on `key`.
fn wait_queued(cl: &Cluster, node: usize, key: &str, owners: &[&str]) {
    wait_for(&format!("{owners:?} queued on {key} at node {node}"), 10 * SECOND, || {
        queue_of(&mut cl.conn(node), key) == owners
    });
}

#[test]
fn cluster_waits_are_fifo_one_session_per_node_and_hash_tags_share_a_node() {
    let cl = CLUSTER.turn();
    let cluster = client_cluster(&cl);

    // Slots as the server computes them, hash tags included.
    for key in ["orders:42", "{orders:42}:a", "{orders:42}:b", "a{}b", "{}x{y}", "x{{y}}", "é{ü}"] {
        assert_eq!(key_slot(key.as_bytes()), cl.keyslot(key), "slot of {key}");
    }
    let (a, b) = (Lock::new("{orders:42}:a", 10 * SECOND), Lock::new("{orders:42}:b", 10 * SECOND));
    let (ga, gb) =
        (a.acquire_in(&cluster, None).unwrap().expect("a"), b.acquire_in(&cluster, None).unwrap().expect("b"));
    let node = cl.owner_of_key("{orders:42}:a");
    assert_eq!(owner_of(&mut cl.conn(node), "{orders:42}:a").as_deref(), Some(ga.owner()));
    assert_eq!(owner_of(&mut cl.conn(node), "{orders:42}:b").as_deref(), Some(gb.owner()));
    ga.release().unwrap();
    gb.release().unwrap();

    // FIFO: waiters queued one after another are granted in that order.
    const N: usize = 5;
    let key = "fifo";
    let node = cl.owner_of_key(key);
    let lock = Lock::new(key, 10 * SECOND);
    let holder = lock.clone().with_owner("holder").acquire_in(&cluster, None).unwrap().expect("holder");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut owners = Vec::new();
    let threads: Vec<_> = (0..N)
        .map(|i| {
            let owner = format!("w{i}");
            let (lock, cluster, order) = (lock.clone().with_owner(&owner), cluster.clone(), order.clone());
            let t = std::thread::spawn(move || {
                let guard = lock.acquire_in(&cluster, Some(20 * SECOND)).unwrap().expect("granted");
                order.lock().unwrap().push(i);
                guard.release().unwrap();
            });
            owners.push(owner);
            let queued: Vec<&str> = owners.iter().map(String::as_str).collect();
            wait_queued(&cl, node, key, &queued);
            t
        })
        .collect();
    holder.release().unwrap();
    threads.into_iter().for_each(|t| t.join().unwrap());
    assert_eq!(*order.lock().unwrap(), (0..N).collect::<Vec<_>>());

    // A wait on each node at once: each goes through that node's session.
    let keys = key_per_master(&cl, "per-node:");
    let holders: Vec<_> = keys
        .iter()
        .map(|(_, k)| Lock::new(k, 10 * SECOND).with_owner("holder").acquire_in(&cluster, None).unwrap().expect("held"))
        .collect();
    let waiters: Vec<_> = keys
        .iter()
        .map(|(m, k)| {
            let (lock, cluster) = (Lock::new(k, 10 * SECOND).with_owner("waiter"), cluster.clone());
            let t =
                std::thread::spawn(move || lock.acquire_in(&cluster, Some(20 * SECOND)).unwrap().map(|g| g.token()));
            wait_queued(&cl, *m, k, &["waiter"]);
            t
        })
        .collect();
    for (m, _) in &keys {
        assert_eq!(flock_stats(&mut cl.conn(*m))["sessions"], 1, "one session on master {m}");
    }
    let tokens: Vec<u64> = holders.iter().map(|h| h.token()).collect();
    holders.into_iter().for_each(|h| assert_eq!(h.release().unwrap(), 0));
    for ((waiter, token), (m, k)) in waiters.into_iter().zip(tokens).zip(&keys) {
        assert!(waiter.join().unwrap().expect("granted") > token, "next token on {k}");
        assert_eq!(info(&mut cl.conn(*m), k), None, "{k} released on drop");
    }
}

/// About 9 s: three leases of 1 s on each of the three masters, so that only
/// renewals on the key's node can have kept each lock.
#[test]
fn cluster_watchdog_renews_on_the_keys_node_and_a_forcerelease_is_pushed() {
    let cl = CLUSTER.turn();
    let cluster = client_cluster(&cl);
    let lease = SECOND;
    for (m, key) in key_per_master(&cl, "dog:") {
        let mut guard = Lock::new(&key, lease).acquire_in(&cluster, None).unwrap().expect("granted");
        let lost = guard.start_watchdog().unwrap();
        let owner = guard.owner().to_string();
        // Held past three leases: only renewals on node `m` keep it.
        let until = Instant::now() + 3 * lease;
        while Instant::now() < until {
            assert_eq!(owner_of(&mut cl.conn(m), &key).as_deref(), Some(owner.as_str()), "{key} still held");
            std::thread::sleep(50 * MS);
        }
        assert!(!guard.lost());
        // Right after a renewal, so that the next one (a third of a lease
        // later) cannot meet the released lock first and report NotOwner
        // before the session's push is read.
        wait_for(&format!("{key} renewed"), 5 * SECOND, || ttl_ms(&mut cl.conn(m), &key) > 900);
        force_release(&mut cl.conn(m), &key).unwrap();
        assert_eq!(lost.recv_timeout(5 * SECOND), Ok(LeaseLost::ForceReleased), "{key}: loss pushed");
        assert_eq!(guard.lost_reason(), Some(LeaseLost::ForceReleased));
        assert!(is_notowner(guard.release().expect_err("released after the loss")));
    }
}

/// A Rust user who already has the `redis` crate's own cluster client hands
/// its connection to `acquire` as a bare connection: each command goes to
/// its key's node (the key is the first argument), a try, a blocking wait
/// on every master, the guard's renewal and release included.
#[test]
fn the_redis_crates_cluster_connection_is_a_bare_connection_for_every_node() {
    let cl = CLUSTER.turn();
    for (m, key) in key_per_master(&cl, "rs-cluster:") {
        let lock = Lock::new(&key, 10 * SECOND);
        let mut holder = lock.clone().with_owner("holder").acquire(cl.client(), None).unwrap().expect("free");
        assert_eq!(owner_of(&mut cl.conn(m), &key).as_deref(), Some("holder"), "{key} held on its node {m}");
        assert!(lock.clone().with_owner("other").acquire(cl.client(), None).unwrap().is_none(), "{key}: a try");
        assert_eq!(holder.renew().unwrap(), holder.token());
        let waiter = {
            let (lock, conn) = (lock.clone().with_owner("waiter"), cl.client());
            // The cluster client's response timeout (5 s) outlasts the wait.
            std::thread::spawn(move || lock.acquire(conn, Some(3 * SECOND)).unwrap().map(|g| g.release().unwrap()))
        };
        wait_queued(&cl, m, &key, &["waiter"]);
        assert_eq!(holder.release().unwrap(), 0);
        assert_eq!(waiter.join().unwrap(), Some(0), "{key}: the blocked waiter was granted on node {m}");
        assert_eq!(info(&mut cl.conn(m), &key), None);
    }
}

fn is_notowner(e: redis::RedisError) -> bool {
    e.code() == Some("NOTOWNER")
}

#[test]
fn cluster_slot_move_keeps_a_held_lock_and_its_waiter_follows_the_key() {
    let cl = CLUSTER.turn();
    let cluster = client_cluster(&cl);
    let key = "moving";
    let slot = cl.keyslot(key);
    let src = cl.owner_of_key(key);
    let dst = cl.masters().into_iter().find(|&m| m != src).expect("another master");

    let lock = Lock::new(key, 30 * SECOND);
    let holder = lock.clone().with_owner("holder").acquire_in(&cluster, None).unwrap().expect("held");
    let waiter = {
        let (lock, cluster) = (lock.clone().with_owner("waiter"), cluster.clone());
        std::thread::spawn(move || lock.acquire_in(&cluster, Some(20 * SECOND)).unwrap().map(|g| g.token()))
    };
    wait_queued(&cl, src, key, &["waiter"]);

    cl.migrate_keys(slot, src, dst, &[key]);
    cl.assign_slot(slot, src, dst);
    cl.wait_slot_owner(slot, dst);
    // The grant went with the key: same owner and token on the new node,
    // not lost; the waiter queued again there.
    let mut d = cl.conn(dst);
    assert_eq!(owner_of(&mut d, key).as_deref(), Some("holder"));
    assert_eq!(token_of(&mut d, key) as u64, holder.token());
    wait_queued(&cl, dst, key, &["waiter"]);
    assert!(!holder.lost(), "a moved grant is not lost");

    // The release reaches the new node and hands the lock to the waiter.
    let token = holder.token();
    assert_eq!(holder.release().unwrap(), 0);
    assert!(waiter.join().unwrap().expect("granted on the new node") > token);
    assert_eq!(info(&mut d, key), None, "the waiter's guard released it on the new node");
}

fn role(s: &Server) -> String {
    let text: RedisResult<String> = redis::Client::open(s.url())
        .and_then(|c| c.get_connection_with_timeout(SECOND))
        .and_then(|mut c| redis::cmd("INFO").arg("replication").query(&mut c));
    let text = text.unwrap_or_default();
    text.lines().find_map(|l| l.strip_prefix("role:")).map(|r| r.trim().to_string()).unwrap_or_default()
}

/// About 7 s: Sentinel's own pace (the replica seen fit to promote, the
/// vote, the deposed master demoted after 4 hello periods of 1 s).
#[test]
fn sentinel_lock_and_wait_survive_a_failover_and_new_locks_go_to_the_new_master() {
    let master = Server::start();
    let replica = Server::replica_of(&master);
    let dir = temp_dir("sentinel");
    let sentinels = Sentinels::start(&dir, master.port, 3);
    let ports = sentinels.ports();
    wait_until("the sentinels to know the replica and each other", 20 * SECOND, || {
        ports.iter().all(|&p| sentinel_field(p, "num-slaves") >= 1 && sentinel_field(p, "num-other-sentinels") >= 2)
    });
    let urls: Vec<String> = ports.iter().map(|p| format!("redis://127.0.0.1:{p}/")).collect();
    let found = SentinelMaster::new(urls.clone(), "flock", None).expect("the sentinels name the master");
    assert_eq!(found.client().get_connection_info().addr.to_string(), format!("127.0.0.1:{}", master.port));

    // A wait through the session on the master the sentinels named.
    let lock = Lock::new("s:wait", 10 * SECOND);
    let holder = lock.clone().with_owner("holder").acquire_in(&found, None).unwrap().expect("held");
    let waiter = {
        let (lock, found) = (lock.clone().with_owner("waiter"), found.clone());
        std::thread::spawn(move || lock.acquire_in(&found, Some(10 * SECOND)).unwrap().map(|g| g.release().unwrap()))
    };
    wait_queue(&mut master.conn(), "s:wait", &["waiter"]);
    assert_eq!(flock_stats(&mut master.conn())["sessions"], 1);
    assert_eq!(holder.release().unwrap(), 0);
    assert_eq!(waiter.join().unwrap(), Some(0), "the waiter was granted");

    // The redis crate's own sentinel client: its master connection is a
    // bare connection for `acquire`.
    let mut own = redis::sentinel::SentinelClient::build(
        urls.clone(),
        "flock".to_string(),
        None,
        redis::sentinel::SentinelServerType::Master,
    )
    .expect("the redis crate's sentinel client");
    let guard = lock.clone().acquire(own.get_connection().unwrap(), None).unwrap().expect("free again");
    assert_eq!(owner_of(&mut master.conn(), "s:wait").as_deref(), Some(guard.owner()), "held on the named master");
    assert_eq!(guard.release().unwrap(), 0);

    // A grant replicated before SENTINEL FAILOVER is kept on the new master.
    // A fixed lease: a session grant ends with its session on the old master.
    let kept = Lock::new("s:kept", 60 * SECOND).lease(60 * SECOND).acquire_in(&found, None).unwrap().expect("kept");
    wait_replica_applied(&mut master.conn(), &mut replica.conn());
    // Refused (NOGOODSLAVE) until the sentinel has seen the replica fit to promote.
    wait_until("SENTINEL FAILOVER to be accepted", 10 * SECOND, || {
        sentinel_conn(ports[0])
            .and_then(|mut c| redis::cmd("SENTINEL").arg("FAILOVER").arg("flock").query::<String>(&mut c))
            .is_ok()
    });
    wait_until("the sentinels to name the replica", 20 * SECOND, || {
        ports.iter().all(|&p| named_master(p) == Some(replica.port))
    });
    // Sentinel demotes the old master (closing its clients) once its INFO
    // has shown it a master for 4 greeting periods (about 4 s at test pace):
    // until then the session stays there.
    wait_until("the old master to be demoted", 40 * SECOND, || role(&master) == "slave");
    wait_until("the session to reopen on the new master", 10 * SECOND, || {
        flock_stats(&mut replica.conn())["sessions"] == 1
    });
    assert!(!kept.lost(), "a replicated grant survives the failover");
    assert_eq!(token_of(&mut replica.conn(), "s:kept") as u64, kept.token());

    // A new lock goes to the new master; the kept one is released there.
    let fresh = Lock::new("s:new", 10 * SECOND).acquire_in(&found, Some(5 * SECOND)).unwrap().expect("fresh");
    assert_eq!(owner_of(&mut replica.conn(), "s:new").as_deref(), Some(fresh.owner()));
    assert_eq!(found.client().get_connection_info().addr.to_string(), format!("127.0.0.1:{}", replica.port));
    assert_eq!(fresh.release().unwrap(), 0);
    assert_eq!(kept.release().unwrap(), 0);
    assert_eq!(info(&mut replica.conn(), "s:kept"), None, "released on the new master");
}

/// The sentinels name another master while the one they named before still
/// answers (a failover, before they demote it): once the process's session
/// is on the master named now, its commands go there too. Before, the kept
/// command connections still reached the old master, which answered every
/// wait `NOSESSION`, and each such answer made the client end its live session.
#[test]
fn sentinel_once_the_session_moved_to_the_master_named_now_the_commands_follow_it() {
    let (old, new) = (Server::start(), Server::start());
    let dir = temp_dir("sentinel-names-another");
    let sentinels = Sentinels::start(&dir, old.port, 1);
    let port = sentinels.ports()[0];
    let found = SentinelMaster::new(vec![format!("redis://127.0.0.1:{port}/")], "flock", None).expect("named");
    let lock = Lock::new("named", 10 * SECOND);
    // A session and command connections on the old master.
    let first = lock.clone().with_owner("first").acquire_in(&found, Some(SECOND)).unwrap().expect("free");
    assert_eq!(first.release().unwrap(), 0);

    let mut sentinel = sentinel_conn(port).unwrap();
    redis::cmd("SENTINEL").arg("REMOVE").arg("flock").query::<()>(&mut sentinel).unwrap();
    redis::cmd("SENTINEL")
        .arg("MONITOR")
        .arg("flock")
        .arg("127.0.0.1")
        .arg(new.port)
        .arg(1)
        .query::<()>(&mut sentinel)
        .unwrap();
    // The session's connection breaks; the next wait opens one where the
    // sentinel points now.
    let clients: String = redis::cmd("CLIENT").arg("LIST").query(&mut old.conn()).unwrap();
    let reader = clients.lines().find(|l| l.contains("cmd=flock.inbox")).expect("the session's reader");
    let id = reader.split_whitespace().find_map(|f| f.strip_prefix("id=")).unwrap();
    let _: i64 = redis::cmd("CLIENT").arg("KILL").arg("ID").arg(id).query(&mut old.conn()).unwrap();
    wait_until("the session to end on the old master", 5 * SECOND, || flock_stats(&mut old.conn())["sessions"] == 0);

    let next = lock.clone().with_owner("next").acquire_in(&found, Some(SECOND)).unwrap().expect("granted");
    assert_eq!(owner_of(&mut new.conn(), "named").as_deref(), Some("next"), "held on the master named now");
    assert_eq!(info(&mut old.conn(), "named"), None);
    assert_eq!(flock_stats(&mut new.conn())["sessions"], 1);
    assert_eq!(next.release().unwrap(), 0);
    assert_eq!(info(&mut new.conn(), "named"), None, "released there");
}

/// A connection to replica `i` that may read (`READONLY`).
fn replica_conn(cl: &Cluster, i: usize) -> Connection {
    let mut c = cl.conn(i);
    let _: () = redis::cmd("READONLY").query(&mut c).expect("READONLY");
    c
}

#[test]
fn cluster_failover_mid_wait_the_waiter_is_granted_by_the_new_master_and_durable_grants_wait_for_the_replica() {
    let cl = CLUSTER.turn();
    let cluster = client_cluster(&cl);

    // A durable grant on each node: WAIT counts the replica of the key's node.
    for (m, key) in key_per_master(&cl, "durable:") {
        let guard = Lock::new(&key, 10 * SECOND)
            .durable(1, 5 * SECOND)
            .acquire_in(&cluster, Some(5 * SECOND))
            .unwrap()
            .expect("a durable grant");
        let r = cl.replica_of(m);
        // Acknowledged by the replica: it has the grant already.
        assert_eq!(owner_of(&mut replica_conn(&cl, r), &key).as_deref(), Some(guard.owner()), "{key} on replica {r}");
        assert_eq!(guard.release().unwrap(), 0);
    }

    // A waiter (durable too) queued on the key's node through the session
    // when that node's replica takes over (CLUSTER FAILOVER).
    let key = "failover";
    let m = cl.owner_of_key(key);
    let r = cl.replica_of(m);
    let lock = Lock::new(key, 30 * SECOND);
    // A fixed lease: a session grant would end with the demoted node's session.
    let holder =
        lock.clone().with_owner("holder").lease(30 * SECOND).acquire_in(&cluster, None).unwrap().expect("held");
    let (tx, rx) = std::sync::mpsc::channel();
    let waiting = {
        let (lock, cluster) = (lock.clone().with_owner("waiter").durable(1, 5 * SECOND), cluster.clone());
        std::thread::spawn(move || {
            let result = lock.acquire_in(&cluster, Some(30 * SECOND)).map(|g| {
                g.map(|g| {
                    let token = g.token();
                    (token, g)
                })
            });
            let _ = tx.send(result);
        })
    };
    wait_queued(&cl, m, key, &["waiter"]);
    wait_for("the replica has the holder's grant", 10 * SECOND, || {
        owner_of(&mut replica_conn(&cl, r), key).as_deref() == Some("holder")
    });
    let failover = Instant::now();
    let ok: String = redis::cmd("CLUSTER").arg("FAILOVER").query(&mut cl.conn(r)).expect("CLUSTER FAILOVER");
    assert_eq!(ok, "OK");
    wait_for("the replica to be master and the old master a replica", 20 * SECOND, || {
        cl.role(r) == "master" && cl.role(m) == "slave"
    });
    // The waiter's wait, dropped by the demoted node, is sent again to the
    // key's master now and queues there.
    wait_queued(&cl, r, key, &["waiter"]);
    eprintln!("   the waiter queued on the new master {:?} after CLUSTER FAILOVER", failover.elapsed());
    assert!(!waiting.is_finished(), "the waiter still waits");
    // Valkey 9.1 pushes the old node's `lost ... demoted` (it can no longer
    // vouch for the grant); Redis 7.0 and 8.2 close that session first.
    let demoted = holder.lost_reason();
    assert!(matches!(demoted, None | Some(LeaseLost::Demoted)), "{demoted:?}");

    // The holder's release goes to the new master and hands it the lock;
    // a guard told it was lost still gives its hold back, and says it was lost.
    let token = holder.token();
    assert_eq!(token_of(&mut cl.conn(r), key) as u64, token, "the new master keeps the held grant");
    match (demoted, holder.release()) {
        (None, released) => assert_eq!(released.unwrap(), 0, "released on the new master"),
        (Some(_), Err(e)) => assert!(e.to_string().contains("given back"), "{e}"),
        (Some(_), Ok(left)) => panic!("a lost guard's release answered {left}"),
    }
    let (granted, guard) = rx
        .recv_timeout(20 * SECOND)
        .expect("the waiter answered in time")
        .expect("the waiter's acquire")
        .expect("the waiter was granted");
    assert!(granted > token, "a later token: {granted} > {token}");
    assert_eq!(owner_of(&mut cl.conn(r), key).as_deref(), Some("waiter"), "granted by the new master");
    // Durable: the old master, now the new master's replica, has it.
    assert_eq!(owner_of(&mut replica_conn(&cl, m), key).as_deref(), Some("waiter"), "on the new replica");
    assert_eq!(guard.release().unwrap(), 0);
    waiting.join().unwrap();
    assert_eq!(info(&mut cl.conn(r), key), None, "released on the new master");
}

#[test]
fn cluster_commands_follow_ask_to_the_importing_node_while_a_slot_is_migrating() {
    let cl = CLUSTER.turn();
    let cluster = client_cluster(&cl);
    let key = "asked";
    let slot = cl.keyslot(key);
    let src = cl.owner_of_key(key);
    let dst = cl.masters().into_iter().find(|&m| m != src).expect("another master");
    let lock = Lock::new(key, 30 * SECOND);
    let holder = lock.clone().with_owner("holder").acquire_in(&cluster, None).unwrap().expect("held");
    // The key moved to `dst`, the slot not yet: `src` answers ASK for it.
    cl.migrate_keys(slot, src, dst, &[key]);

    // A release, a try and a wait go to the importing node (ASKING) at once.
    let t = Instant::now();
    assert_eq!(holder.release().unwrap(), 0, "released on the importing node");
    let next = lock.clone().with_owner("next").acquire_in(&cluster, None).unwrap().expect("a try granted there");
    let waiter = {
        let (lock, cluster) = (lock.clone().with_owner("waiter"), cluster.clone());
        std::thread::spawn(move || lock.acquire_in(&cluster, Some(10 * SECOND)).map(|g| g.map(|g| g.release())))
    };
    let mut asking = cl.conn(dst);
    let _: () = redis::cmd("ASKING").query(&mut asking).unwrap();
    wait_for("the waiter queued on the importing node", 5 * SECOND, || {
        let _: RedisResult<()> = redis::cmd("ASKING").query(&mut asking);
        queue_of(&mut asking, key) == ["waiter"]
    });
    assert_eq!(next.release().unwrap(), 0);
    let released = waiter.join().unwrap().expect("the waiter's acquire").expect("granted on the importing node");
    assert_eq!(released.expect("released"), 0);
    let took = t.elapsed();
    eprintln!("   release, try, wait and grant during the migration took {took:?}");
    assert!(took < 2 * SECOND, "no pause per ASK: {took:?}");

    // Held across the end of the move: its release, answered MOVED by the
    // node the client's slot map still names, follows it to the new node.
    let last = lock.clone().with_owner("last").acquire_in(&cluster, None).unwrap().expect("granted there");
    cl.assign_slot(slot, src, dst);
    cl.wait_slot_owner(slot, dst);
    assert_eq!(last.release().unwrap(), 0, "released on the new node");
    assert_eq!(info(&mut cl.conn(dst), key), None, "nothing left on the new node");
}
