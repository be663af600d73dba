//! A real local Redis Cluster for tests: 3 masters with 1 replica each, all
//! with the module loaded, on loopback ports that leave room for the
//! cluster bus (port + 10000). Created with `redis-cli --cluster create`;
//! every node is stopped when the `Cluster` is dropped. The tests of a module
//! share one (`static CLUSTER: Shared<Cluster>`, see common/shared.rs).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::shared::Fixture;
use super::{flock_stats, fresh_port, module_path, server_program, temp_dir, Connection, RedisResult, TempDir, SECOND};

impl Fixture for Cluster {
    fn start() -> Cluster {
        Cluster::start()
    }

    /// Healthy again (the test before may have failed over or moved a
    /// slot: which node is a master is not fixed), no key anywhere, and no
    /// waiter left by the clients of the test before (their connections
    /// may still be closing). The Rust client's sessions stay open, as
    /// they do in any process: one per node for the whole test process.
    fn reset(&self) {
        self.wait_healthy();
        for m in self.masters() {
            let _: () = redis::cmd("FLUSHALL").query(&mut self.conn(m)).expect("FLUSHALL");
        }
        let left = || -> Vec<(u16, i64, Option<i64>)> {
            self.nodes
                .iter()
                .map(|n| {
                    let mut c = n.conn();
                    let keys: i64 = redis::cmd("DBSIZE").query(&mut c).unwrap_or(-1);
                    (n.port, keys, flock_stats(&mut c).get("waiters").copied())
                })
                .filter(|&(_, keys, waiters)| keys != 0 || waiters != Some(0))
                .collect()
        };
        let deadline = Instant::now() + 10 * SECOND;
        while !left().is_empty() {
            assert!(Instant::now() < deadline, "keys or waiters left on (port, keys, waiters): {:?}", left());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone)]
pub struct NodeLine {
    pub id: String,
    pub port: u16,
    pub flags: Vec<String>,
    /// The master's id, for a replica.
    pub master_id: Option<String>,
    /// Slot ranges served (inclusive), without migration annotations.
    pub slots: Vec<(u16, u16)>,
}

impl NodeLine {
    pub fn is_master(&self) -> bool {
        self.flags.iter().any(|f| f == "master")
    }

    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| a <= slot && slot <= b)
    }
}

pub fn parse_nodes(text: &str) -> Vec<NodeLine> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // ip:port@cport[,hostname]
            let port =
                f[1].split('@').next().and_then(|a| a.rsplit(':').next()).and_then(|p| p.parse().ok()).unwrap_or(0);
            let slots = f[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|n| (n, n)),
                })
                .collect();
            NodeLine {
                id: f[0].to_string(),
                port,
                flags: f[2].split(',').map(str::to_string).collect(),
                master_id: (f[3] != "-").then(|| f[3].to_string()),
                slots,
            }
        })
        .collect()
}

/// One cluster node: a redis-server with the module, stopped when dropped.
pub struct Node {
    pub port: u16,
    child: Child,
    pub dir: TempDir,
}

impl Node {
    /// Starts one cluster-enabled node in its own directory.
    fn start() -> Node {
        for _ in 0..5 {
            // The node's bus listens on port + 10000.
            let port = fresh_port(&[0, 10_000]);
            let dir = temp_dir("cluster");
            let child = Command::new(server_program())
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args([
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ])
                .args(["--save", "", "--appendonly", "no"])
                // Replicas sync at once instead of after the default 5 s delay.
                .args(["--repl-diskless-sync-delay", "0"])
                .args(["--enable-debug-command", "local"])
                .arg("--dir")
                .arg(dir.path())
                .arg("--loadmodule")
                .arg(module_path())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("spawn {} (is it installed? `make deps`): {e}", server_program()));
            let mut node = Node { port, child, dir };
            if node.wait_ready() {
                return node;
            }
        }
        panic!("cluster node did not start");
    }

    fn wait_ready(&mut self) -> bool {
        let url = self.url();
        super::wait_ready(&mut self.child, &url, Duration::from_secs(10))
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn try_conn(&self) -> RedisResult<Connection> {
        redis::Client::open(self.url())?.get_connection_with_timeout(Duration::from_secs(5))
    }

    /// A plain (not cluster-aware) connection.
    pub fn conn(&self) -> Connection {
        self.try_conn().expect("connect")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Cluster {
    pub nodes: Vec<Node>,
}

impl Cluster {
    /// 6 nodes, `redis-cli --cluster create ... --cluster-replicas 1`, then
    /// waits until every node reports `cluster_state:ok`, knows all 6 nodes
    /// and every replica's link to its master is up.
    pub fn start() -> Cluster {
        let nodes: Vec<Node> = (0..6).map(|_| Node::start()).collect();
        let cluster = Cluster { nodes };
        let addrs: Vec<String> = cluster.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        cluster.wait_healthy();
        cluster
    }

    /// Every node: cluster_state:ok, 6 known nodes, all slots assigned, the
    /// same 3 masters serving all slots; every replica linked and in sync.
    pub fn wait_healthy(&self) {
        wait_for("cluster_state:ok, 6 known nodes and a linked replica per master on every node", 30 * SECOND, || {
            self.nodes.iter().all(|n| {
                let mut c = n.conn();
                let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut c).unwrap_or_default();
                let ok = info.contains("cluster_state:ok")
                    && info.contains("cluster_known_nodes:6")
                    && info.contains("cluster_slots_ok:16384");
                let nodes = self.nodes_seen_by(n);
                let masters = nodes.iter().filter(|l| l.is_master() && !l.slots.is_empty()).count();
                let replicas = nodes.iter().filter(|l| l.master_id.is_some()).count();
                let repl: String = redis::cmd("INFO").arg("replication").query(&mut c).unwrap_or_default();
                let linked = repl.contains("role:master") || repl.contains("master_link_status:up");
                ok && masters == 3 && replicas == 3 && linked
            })
        });
    }

    /// `CLUSTER NODES` as seen by `node`.
    pub fn nodes_seen_by(&self, node: &Node) -> Vec<NodeLine> {
        let text: String = redis::cmd("CLUSTER").arg("NODES").query(&mut node.conn()).unwrap_or_default();
        parse_nodes(&text)
    }

    pub fn index_of_port(&self, port: u16) -> usize {
        self.nodes.iter().position(|n| n.port == port).unwrap_or_else(|| panic!("no node on port {port}"))
    }

    pub fn node_id(&self, i: usize) -> String {
        redis::cmd("CLUSTER").arg("MYID").query(&mut self.nodes[i].conn()).expect("CLUSTER MYID")
    }

    /// Indexes of the nodes whose `ROLE` is master.
    pub fn masters(&self) -> Vec<usize> {
        (0..self.nodes.len()).filter(|&i| self.role(i) == "master").collect()
    }

    /// `ROLE` of node `i`: "master" or "slave".
    pub fn role(&self, i: usize) -> String {
        let v: redis::Value = redis::cmd("ROLE").query(&mut self.nodes[i].conn()).expect("ROLE");
        match v {
            redis::Value::Array(items) => redis::from_redis_value(&items[0]).expect("role name"),
            other => panic!("unexpected ROLE reply {other:?}"),
        }
    }

    pub fn keyslot(&self, key: &str) -> u16 {
        redis::cmd("CLUSTER").arg("KEYSLOT").arg(key).query(&mut self.nodes[0].conn()).expect("CLUSTER KEYSLOT")
    }

    /// Index of the master serving `slot`, as node `viewer` sees it.
    pub fn owner_of_slot_seen_by(&self, viewer: usize, slot: u16) -> usize {
        let nodes = self.nodes_seen_by(&self.nodes[viewer]);
        let line = nodes
            .iter()
            .find(|l| l.is_master() && l.serves(slot))
            .unwrap_or_else(|| panic!("no master serves slot {slot}"));
        self.index_of_port(line.port)
    }

    /// Index of the master serving `slot` (as node 0 sees it).
    pub fn owner_of_slot(&self, slot: u16) -> usize {
        self.owner_of_slot_seen_by(0, slot)
    }

    /// Index of the master serving `key`.
    pub fn owner_of_key(&self, key: &str) -> usize {
        self.owner_of_slot(self.keyslot(key))
    }

    /// Index of a replica of master `m`.
    pub fn replica_of(&self, m: usize) -> usize {
        let id = self.node_id(m);
        let nodes = self.nodes_seen_by(&self.nodes[m]);
        let line = nodes.iter().find(|l| l.master_id.as_deref() == Some(id.as_str())).expect("master has a replica");
        self.index_of_port(line.port)
    }

    /// Waits until every node agrees that `slot` is served by node `owner`.
    pub fn wait_slot_owner(&self, slot: u16, owner: usize) {
        wait_for(&format!("all nodes see slot {slot} on node {owner}"), 20 * SECOND, || {
            (0..self.nodes.len()).all(|v| {
                let nodes = self.nodes_seen_by(&self.nodes[v]);
                nodes.iter().any(|l| l.is_master() && l.serves(slot) && l.port == self.nodes[owner].port)
            })
        });
    }

    /// The first half of moving `slot` from master `src` to master `dst`,
    /// as `redis-cli --cluster reshard` does it: SETSLOT IMPORTING on the
    /// target, MIGRATING on the source, then MIGRATE of `keys` (all of
    /// the slot's). `assign_slot` ends the move.
    pub fn migrate_keys(&self, slot: u16, src: usize, dst: usize, keys: &[&str]) {
        let (src_id, dst_id) = (self.node_id(src), self.node_id(dst));
        setslot(&mut self.conn(dst), slot, &["IMPORTING", &src_id]);
        setslot(&mut self.conn(src), slot, &["MIGRATING", &dst_id]);
        let migrated: String = redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(self.nodes[dst].port)
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(keys)
            .query(&mut self.conn(src))
            .unwrap_or_else(|e| panic!("MIGRATE {keys:?}: {e}"));
        assert_eq!(migrated, "OK", "MIGRATE {keys:?}");
    }

    /// SETSLOT NODE on every master, the target and the source first.
    pub fn assign_slot(&self, slot: u16, src: usize, dst: usize) {
        let dst_id = self.node_id(dst);
        let others = self.masters().into_iter().filter(|&m| m != src && m != dst);
        for node in [dst, src].into_iter().chain(others) {
            setslot(&mut self.conn(node), slot, &["NODE", &dst_id]);
        }
    }

    /// A plain (not cluster-aware) connection to node `i`.
    pub fn conn(&self, i: usize) -> Connection {
        self.nodes[i].conn()
    }

    /// A cluster-aware connection (the `redis` crate's cluster client).
    pub fn client(&self) -> redis::cluster::ClusterConnection {
        let urls: Vec<String> = self.nodes.iter().map(|n| n.url()).collect();
        redis::cluster::ClusterClient::builder(urls)
            .response_timeout(Duration::from_secs(5))
            .connection_timeout(Duration::from_secs(5))
            .build()
            .expect("cluster client")
            .get_connection()
            .expect("cluster connection")
    }

    /// `DBSIZE` of node `i`.
    pub fn dbsize(&self, i: usize) -> i64 {
        redis::cmd("DBSIZE").query(&mut self.conn(i)).expect("DBSIZE")
    }
}

fn setslot(c: &mut Connection, slot: u16, args: &[&str]) {
    let ok: String = redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg(args)
        .query(c)
        .unwrap_or_else(|e| panic!("CLUSTER SETSLOT {slot} {args:?}: {e}"));
    assert_eq!(ok, "OK", "CLUSTER SETSLOT {slot} {args:?}");
}

/// Polls `cond` every 50 ms until it holds or `timeout` passes; panics with
/// `what`. (Cluster checks open several connections, so poll gently.)
pub fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Milliseconds elapsed since `t`.
pub fn ms_since(t: Instant) -> u64 {
    t.elapsed().as_millis() as u64
}
