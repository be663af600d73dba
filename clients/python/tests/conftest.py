"""A redis-server with the FLOCK module for the whole session, on a free
loopback port, and redis-py clients to it (RESP2 and RESP3); a 3-master
Redis Cluster and a Sentinel-watched master and 2 replicas for the topology
tests, started by the first test that asks for them."""

import os
import random
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import redis_flock._core

from helpers import wait_until

REPO = Path(__file__).resolve().parents[3]
MODULE = os.environ.get("FLOCK_MODULE") or str(REPO / "target/release/libredis_flock.so")
SERVER = os.environ.get("FLOCK_SERVER") or "redis-server"
# The servers' files (a cluster node's nodes.conf, a sentinel's config, a
# replica's RDB), each written and fsynced as the topology changes, go to
# memory: on a busy disk, a sentinel's config flush took 0.5 s.
RUN_DIR = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


def free_port() -> int:
    """A free port at random below the kernel's ephemeral range: a port the
    kernel hands out (bind to 0) is soon handed out again once free, and a
    client of a server a test killed, still reconnecting, reached another
    worker's server started on it."""
    while True:
        port = random.randint(10000, 19999)
        if _bindable(port):
            return port


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too, both below the
    kernel's ephemeral range (32768 and up), so that no connection's own end
    takes either between this check and the node's bind (a node whose bus
    port is taken does not start)."""
    while True:
        port = random.randint(20000, 22767)
        if _bindable(port) and _bindable(port + 10000):
            return port


class PortTaken(AssertionError):
    """The server could not listen: another process took its port (or its
    cluster bus port) between the test picking it and the server binding it
    (the other suites start servers on this machine at the same time)."""


class Server:
    """One redis-server process with the module (``module=False``: without,
    for a sentinel); ``args`` go after the common ones, ``config`` is a
    config file's text written to its directory and given first (a
    sentinel's, which Sentinel rewrites), ``env`` more environment
    variables (libfaketime's). Its port is ``pick_port()``'s, picked again
    if taken before the server could listen. ``stop()`` kills it."""

    PICKS = 5

    def __init__(self, *args, module=True, config=None, pick_port=free_port, env=None):
        if not Path(MODULE).is_file():
            pytest.exit(f"FLOCK module not found at {MODULE} (build it, or set FLOCK_MODULE)", 2)
        self.dir = tempfile.mkdtemp(prefix="flock-py-", dir=RUN_DIR)
        self.args = list(args) + (["--loadmodule", MODULE] if module else [])
        self.env = {**os.environ, **env} if env else None
        self.config = []
        if config is not None:
            path = Path(self.dir) / "server.conf"
            path.write_text(config)
            self.config = [str(path)]
        self.log_path = Path(self.dir) / "server.log"
        self.log = open(self.log_path, "wb")
        for pick in range(1, self.PICKS + 1):
            self.port = pick_port()
            try:
                self.start()
                break
            except PortTaken:
                if pick == self.PICKS:
                    self.stop()
                    raise

    def start(self):
        """Starts the server on its port (again, after kill())."""
        logged = self.log_path.stat().st_size
        self.process = subprocess.Popen(
            [SERVER, *self.config, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.dir, *self.args],
            stdout=self.log, stderr=subprocess.STDOUT, env=self.env,
        )
        # Without redis-py's retries: each poll sees the process first.
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2, socket_timeout=1, retry=Retry(NoBackoff(), 0))
        try:
            wait_until(lambda: self._answers(client, logged), timeout=10, what=f"redis-server on port {self.port}")
        except PortTaken:
            raise
        except AssertionError:
            self.stop()
            raise
        finally:
            client.close()

    def kill(self):
        """Kills the server (no persistence: a new one starts empty)."""
        self.process.kill()
        self.process.wait()

    def _answers(self, client, logged: int) -> bool:
        if self.process.poll() is not None:
            log = self.log_path.read_bytes()[logged:].decode(errors="replace")
            if "Address already in use" in log:
                raise PortTaken(log)
            raise AssertionError(f"redis-server exited: {log}")
        try:
            # This process's, not another one's that has the port.
            return client.info("server")["process_id"] == self.process.pid
        except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
            return False

    def stop(self):
        self.process.kill()
        self.process.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def streams_to_replicas(master, key, replicas: int) -> bool:
    """Whether ``master`` streams its writes to its ``replicas`` (a count): a
    write to ``key`` that they acknowledge. A replica whose link is up gets
    the stream only once the master has its first acknowledgement: 1-3 s
    later on a busy machine, when a durable grant's WAIT found none."""
    master.incr(key)
    acknowledged = master.execute_command("WAIT", replicas, 100)
    master.delete(key)
    return acknowledged >= replicas


@pytest.fixture()
def forgotten():
    """Nothing remembered or counted for stale holds when the test starts:
    the tables are the process's (redis_flock._core)."""
    redis_flock._core.RELEASED.tokens.clear()
    for counts in (redis_flock._core.HELD.counts, redis_flock._core.HELD.owners, redis_flock._core.HELD.acquiring):
        counts.clear()


@pytest.fixture(scope="session")
def server():
    s = Server()
    yield s
    s.stop()


@pytest.fixture()
def own_server():
    """A server of the test's own, to kill and start again."""
    s = Server()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def solo():
    """A server of its own for tests that change its config (test_stale.py:
    min-replicas-to-write, which makes it refuse writes with NOREPLICAS)."""
    s = Server()
    yield s
    s.stop()


@pytest.fixture()
def m(solo):
    """A connection to ``solo``; afterwards its min-replicas-to-write is 0
    again and its data gone."""
    c = redis.Redis(port=solo.port)
    yield c
    c.config_set("min-replicas-to-write", 0)
    c.flushall()
    c.close()


@pytest.fixture()
def short_local_deadline(monkeypatch):
    """A session wait's own deadline 0.2 s after the server's, not
    LOCAL_DEADLINE_MARGIN's 2 s: for a test whose server is gone, where only
    that deadline can end the wait."""
    monkeypatch.setattr(redis_flock._core, "LOCAL_DEADLINE_MARGIN", 0.2)


@pytest.fixture(params=[2, 3], ids=["resp2", "resp3"])
def protocol(request):
    return request.param


def client(server, protocol, **kwargs):
    return redis.Redis(port=server.port, protocol=protocol, **kwargs)


@pytest.fixture()
def r(server, protocol):
    c = client(server, protocol)
    yield c
    c.flushall()
    c.close()


@pytest.fixture()
def r_decoded(server, protocol):
    c = client(server, protocol, decode_responses=True)
    yield c
    c.flushall()
    c.close()


CLUSTER_NODE = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000")
# The slots of master i: SHARDS[i] to SHARDS[i + 1] - 1.
SHARDS = [0, 5461, 10923, 16384]


def make_cluster(masters, others=()):
    """Gives each of ``masters`` (clients) its third of the slots, and makes
    every node meet every other: none waits for gossip to introduce them (a
    node turns cluster_state:ok 2 s after its start at the earliest)."""
    for i, c in enumerate(masters):
        c.execute_command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
        c.execute_command("CLUSTER", "ADDSLOTSRANGE", SHARDS[i], SHARDS[i + 1] - 1)
    everyone = [*masters, *others]
    for c in everyone:
        for other in everyone:
            if other is not c:
                c.execute_command("CLUSTER", "MEET", "127.0.0.1", other.connection_pool.connection_kwargs["port"])


class Cluster:
    """Three masters (no replicas), each with every third of the slots, made
    by hand as tests/cluster.rs does: ADDSLOTSRANGE, MEET, then waiting until
    every node says cluster_state:ok and knows the slots of the others."""

    def __init__(self):
        self.nodes = []
        try:
            for _ in range(3):
                self.nodes.append(Server(*CLUSTER_NODE, pick_port=cluster_port))
            self.clients = [redis.Redis(port=node.port) for node in self.nodes]
            make_cluster(self.clients)
            wait_until(self._ok, timeout=20, what="the cluster to be ok on every node")
        except BaseException:
            self.stop()
            raise

    def _ok(self) -> bool:
        for c in self.clients:
            info = c.execute_command("CLUSTER", "INFO").decode()
            if "cluster_state:ok" not in info or "cluster_known_nodes:3" not in info:
                return False
            if len(c.execute_command("CLUSTER", "SLOTS")) != 3:
                return False
        return True

    def ports(self):
        return [node.port for node in self.nodes]

    def index_of_key(self, key) -> int:
        """Which node (0, 1, 2) serves ``key``'s slot now."""
        slot = self.clients[0].execute_command("CLUSTER", "KEYSLOT", key)
        for start, end, (_, port, *_), *_ in self.clients[0].execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return self.ports().index(port)
        raise AssertionError(f"slot {slot} is not served")

    def key_on(self, index: int, prefix: str) -> str:
        """A key named ``prefix:<n>`` served by node ``index``."""
        return next(f"{prefix}:{n}" for n in range(1000) if self.index_of_key(f"{prefix}:{n}") == index)

    def sessions(self) -> list:
        """FLOCK's open sessions on each node."""
        return [c.info("flock")["flock_sessions"] for c in self.clients]

    def flushall(self):
        for c in self.clients:
            c.flushall()

    def stop(self):
        for c in getattr(self, "clients", ()):
            c.close()
        for node in self.nodes:
            node.stop()


class ReplicatedCluster(Cluster):
    """Three masters with the slots as Cluster has them, each with a replica
    (in sync, known to every node): for CLUSTER FAILOVER. Made at once, not
    on top of a Cluster: the gossip that introduces the nodes takes seconds."""

    def __init__(self):
        self.nodes, self.replicas = [], []
        try:
            for servers in (self.nodes, self.replicas):
                for _ in range(3):
                    # Replicas sync at once, not after the default 5 s delay.
                    servers.append(Server(*CLUSTER_NODE, "--repl-diskless-sync-delay", "0", pick_port=cluster_port))
            self.clients = [redis.Redis(port=node.port) for node in self.nodes]
            self.replica_clients = [redis.Redis(port=node.port) for node in self.replicas]
            make_cluster(self.clients, self.replica_clients)
            ids = [c.execute_command("CLUSTER", "MYID").decode() for c in self.clients]
            wait_until(lambda: all(self._known(c, 6) for c in self.clients + self.replica_clients), timeout=20,
                       what="every node to know the others")
            for c, master_id in zip(self.replica_clients, ids):
                # Known by its ID once the handshake is over.
                wait_until(lambda: master_id in c.execute_command("CLUSTER", "NODES").decode(), timeout=20,
                           what="the replica to know its master")
                c.execute_command("CLUSTER", "REPLICATE", master_id)
            wait_until(self._replicated, timeout=20, what="every replica to sync and be known")
        except BaseException:
            self.stop()
            raise

    @staticmethod
    def _known(c, n) -> bool:
        return f"cluster_known_nodes:{n}" in c.execute_command("CLUSTER", "INFO").decode()

    def _replicated(self) -> bool:
        for c in self.replica_clients:
            if c.info("replication").get("master_link_status") != "up":
                return False
        # Every node knows each replica's role (the masters vote in a
        # failover). (CLUSTER SLOTS lists a replica only once gossip brought
        # its replication offset, 10 s later on Redis 7.0: not needed here.)
        for c in self.clients + self.replica_clients:
            if "cluster_state:ok" not in c.execute_command("CLUSTER", "INFO").decode():
                return False
            nodes = c.execute_command("CLUSTER", "NODES").decode().splitlines()
            if sum(1 for line in nodes if "slave" in line.split()[2]) != 3:
                return False
        return True

    def master_and_replica_of(self, key):
        """(the client of the master serving ``key``'s slot now, that of its
        replica), once that replica is in sync and acknowledges the master's
        writes: failovers swap them (the demoted master syncs from the new
        one)."""
        found = []

        def settled() -> bool:
            everyone = self.clients + self.replica_clients
            slot = everyone[0].execute_command("CLUSTER", "KEYSLOT", key)
            for start, end, (_, port, *_), *_ in everyone[0].execute_command("CLUSTER", "SLOTS"):
                if start <= slot <= end:
                    master = next(c for c in everyone if c.connection_pool.connection_kwargs["port"] == port)
                    for c in everyone:
                        info = c.info("replication")
                        if info.get("master_port") == port and info.get("master_link_status") == "up":
                            found[:] = [master, c]
                            try:
                                # In the key's slot (its hash tag: the whole key).
                                return streams_to_replicas(master, f"{{{key}}}:streaming", 1)
                            except redis.ResponseError:  # MOVED: a failover moved on since CLUSTER SLOTS
                                return False
            return False

        wait_until(settled, timeout=20, what=f"the master of {key!r} to stream to a replica in sync")
        return tuple(found)

    def key_in_shard(self, shard: int, prefix: str) -> str:
        """A key named ``prefix:<n>`` in the slots of master ``shard`` (0, 1,
        2) as made, whichever node serves them now. A shard fails over once
        per run: its masters vote for a replica of one master at most once
        in twice the node timeout (10 s)."""
        slot = self.clients[0]
        return next(f"{prefix}:{n}" for n in range(1000)
                    if SHARDS[shard] <= slot.execute_command("CLUSTER", "KEYSLOT", f"{prefix}:{n}") < SHARDS[shard + 1])

    def stop(self):
        for c in getattr(self, "replica_clients", ()):
            c.close()
        for node in getattr(self, "replicas", ()):
            node.stop()
        super().stop()


class SentinelSetup:
    """A master and two replicas (in sync) with the module, and three
    sentinels watching them as ``flock`` (down after 1 s), started after the
    replicas synced so that they learn them at once. ``replica`` is the
    first replica as started; after a failover, ``master_port()`` names the
    master. ``env``: more environment variables of the servers with the
    module (not of the sentinels)."""

    NAME = "flock"
    REPLICAS = 2

    def __init__(self, env=None):
        self.servers = []
        try:
            # Replicas sync at once, not after the default 5 s delay (every
            # server may be a master after a failover).
            fast = ("--repl-diskless-sync-delay", "0")
            self.master = Server(*fast, env=env)
            self.servers.append(self.master)
            self.replicas = []
            for _ in range(self.REPLICAS):
                replica = Server(*fast, "--replicaof", "127.0.0.1", str(self.master.port), env=env)
                self.servers.append(replica)
                self.replicas.append(replica)
            self.replica = self.replicas[0]
            self.data = [self.master, *self.replicas]
            wait_until(lambda: all(self.master_of(r) == self.master.port and self._synced(r) for r in self.replicas),
                       timeout=10, what="the replicas to sync")
            with redis.Redis(port=self.master.port) as c:
                wait_until(lambda: streams_to_replicas(c, "flock-test:streaming", self.REPLICAS), timeout=10,
                           what="the replicas to acknowledge the master's writes")
            config = (f"sentinel monitor {self.NAME} 127.0.0.1 {self.master.port} 2\n"
                      f"sentinel down-after-milliseconds {self.NAME} 1000\n"
                      f"sentinel failover-timeout {self.NAME} 10000\n")
            self.sentinels = []
            for _ in range(3):
                sentinel = Server("--sentinel", module=False, config=config)
                self.servers.append(sentinel)
                self.sentinels.append(sentinel)
                # INFO every 0.5 s (10 s by default) and hellos every 1 s
                # (2 s): an old master is demoted 4 hello periods after an
                # INFO showed it a master, 4-5 s after the failover instead
                # of 10-20 s. Not shorter: a sentinel picks a replica to
                # promote only if its last INFO of it is at most 3 INFO
                # periods old (with 0.2 s, a stalled sentinel aborted a
                # failover: no good replica); and a sentinel that is not the
                # failover's leader turns the replica being promoted back
                # into a replica once it has seen it a master for 4 hello
                # periods, unless the leader's hellos named it the new master
                # by then, and the leader sees the promotion by an INFO every
                # 1 s (with 0.2 s hellos, one did so 0.8 s after the SLAVEOF
                # NO ONE, and a second failover followed).
                with redis.Redis(port=sentinel.port) as c:
                    c.execute_command("SENTINEL", "DEBUG", "info-period", 500, "publish-period", 1000)
            wait_until(self._watching, timeout=15, what="the sentinels to know the replicas and each other")
        except BaseException:
            self.stop()
            raise

    def sentinel_addresses(self):
        return [("127.0.0.1", s.port) for s in self.sentinels]

    @staticmethod
    def master_of(server):
        with redis.Redis(port=server.port) as c:
            return c.info("replication").get("master_port")

    @staticmethod
    def _synced(server) -> bool:
        with redis.Redis(port=server.port) as c:
            return c.info("replication").get("master_link_status") == "up"

    def _settled(self) -> bool:
        """Every sentinel's last INFO of every replica shows a replica, linked
        and up. A sentinel reads INFO every 0.5 s and can miss a demoted master's
        short spell as a replica: if the next failover promotes that server, the
        sentinel still counts it a master since the last failover, more than 4
        hello periods, and turns it back into a replica at once, aborting the
        failover (Redis 8.2 in CI: -failover-abort-slave-timeout)."""
        for s in self.sentinels:
            with redis.Redis(port=s.port) as c:
                replicas = c.sentinel_slaves(self.NAME)
            if len(replicas) < self.REPLICAS:
                return False
            for r in replicas:
                # A string or a set, by redis-py's version and protocol.
                flags = r["flags"]
                flags = set(flags.split(",")) if isinstance(flags, str) else set(flags)
                if r.get("role-reported") != "slave" or r.get("master-link-status") != "ok" or flags != {"slave"}:
                    return False
        return True

    def _watching(self) -> bool:
        for s in self.sentinels:
            with redis.Redis(port=s.port) as c:
                master = c.sentinel_master(self.NAME)
                if master["num-slaves"] < self.REPLICAS or master["num-other-sentinels"] < 2:
                    return False
        return True

    def master_port(self):
        """The master's port as every sentinel names it now (None while they
        disagree)."""
        ports = set()
        for s in self.sentinels:
            with redis.Redis(port=s.port) as c:
                ports.add(int(c.sentinel_get_master_addr_by_name(self.NAME)[1]))
        return ports.pop() if len(ports) == 1 else None

    def current_master(self):
        port = self.master_port()
        return next(s for s in self.data if s.port == port)

    def role(self, server) -> str:
        with redis.Redis(port=server.port) as c:
            return c.execute_command("ROLE")[0].decode()

    def start_failover(self):
        """Sends SENTINEL FAILOVER once every sentinel sees every replica as
        one (`_settled`); returns the master it fails over from."""
        self._wait(self._settled, timeout=20, what="every sentinel to see every replica as a replica")
        old = self.current_master()

        def sent() -> bool:
            try:
                c.execute_command("SENTINEL", "FAILOVER", self.NAME)
                return True
            except redis.ResponseError as e:
                # A replica is a candidate while the sentinel's last INFO of
                # it is at most 3 INFO periods old (1.5 s here): a busy
                # machine can delay one past that for a moment.
                if "NOGOODSLAVE" not in str(e):
                    raise
                return False

        with redis.Redis(port=self.sentinels[0].port) as c:
            wait_until(sent, timeout=10, what="the sentinel to accept SENTINEL FAILOVER")
        return old

    def failover_done(self, old):
        """Waits until the sentinels name a new master, the old master is its
        replica, and every replica replicates the new master in sync:
        (new, old). Sentinel turns the old master into a replica once its
        INFO has shown it a master for 4 hello periods (4-5 s with the
        periods set above), closing its clients."""
        self._wait(lambda: self.master_port() not in (None, old.port), timeout=15,
                   what="the sentinels to name the new master")
        new = self.current_master()
        self._wait(lambda: self.role(old) == "slave" and self._synced(old), timeout=45,
                   what="the old master to become a replica")
        self._wait(lambda: all(self.master_of(s) == new.port and self._synced(s) for s in self.data if s is not new),
                   timeout=20, what="every replica to replicate the new master")
        return new, old

    def _wait(self, condition, timeout, what):
        """wait_until(), telling on a timeout what each server and sentinel
        says."""
        try:
            wait_until(condition, timeout=timeout, what=what)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.state()}") from None

    def state(self) -> str:
        lines = []
        for s in self.data:
            with redis.Redis(port=s.port) as c:
                info = c.info("replication")
            fields = ("role", "master_port", "master_link_status", "master_sync_in_progress", "connected_slaves")
            lines.append(f"server {s.port}: " + ", ".join(f"{k}={info[k]}" for k in fields if k in info))
            lines += [f"  {line}" for line in s.log_path.read_text(errors="replace").splitlines()[-15:]]
        for s in self.sentinels:
            lines.append(f"sentinel {s.port}:")
            lines += [f"  {line}" for line in s.log_path.read_text(errors="replace").splitlines()[-40:]]
        return "\n".join(lines)

    def failover(self):
        """SENTINEL FAILOVER, then failover_done(): (new, old)."""
        return self.failover_done(self.start_failover())

    def stop(self):
        for server in reversed(self.servers):
            server.stop()


class Replicated:
    """A master with the module and one replica of it (in sync), without
    sentinels: for durable grants (WAIT counts the replica)."""

    def __init__(self):
        self.servers = []
        try:
            # A replica syncs at once, not after the default 5 s delay.
            self.master = Server("--repl-diskless-sync-delay", "0")
            self.servers.append(self.master)
            self.replica = Server("--replicaof", "127.0.0.1", str(self.master.port))
            self.servers.append(self.replica)
            wait_until(lambda: SentinelSetup._synced(self.replica), timeout=10, what="the replica to sync")
            with redis.Redis(port=self.master.port) as c:
                wait_until(lambda: streams_to_replicas(c, "flock-test:streaming", 1), timeout=10,
                           what="the replica to acknowledge the master's writes")
        except BaseException:
            self.stop()
            raise

    def caught_up(self) -> bool:
        """Whether the replica has everything the master wrote."""
        with redis.Redis(port=self.master.port) as m, redis.Redis(port=self.replica.port) as r:
            return (SentinelSetup._synced(self.replica)
                    and m.info("replication")["master_repl_offset"]
                    == r.info("replication")["slave_repl_offset"])

    def stop(self):
        for server in reversed(self.servers):
            server.stop()


@pytest.fixture(scope="session")
def replicated():
    s = Replicated()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def cluster():
    c = Cluster()
    yield c
    c.stop()


@pytest.fixture(scope="session")
def replicated_cluster():
    c = ReplicatedCluster()
    yield c
    c.stop()


@pytest.fixture(scope="session")
def sentinel_setup():
    s = SentinelSetup()
    yield s
    s.stop()
