"""redis_flock.Lock on a 3-master Redis Cluster (redis.cluster.RedisCluster)
and on a Sentinel-watched master (Sentinel.master_for): waits go through a
session on the key's node, the blocking form works too, a moved slot and a
failover are followed; durable grants through a failover never overlap.
The topologies are started once (conftest.py)."""

import threading
import time
from contextlib import contextmanager

import pytest
import redis
from redis.cluster import RedisCluster
from redis.exceptions import LockError, LockNotOwnedError
from redis.sentinel import Sentinel

from conftest import Server
from helpers import calls, holding, info, stat, wait_until
from redis_flock import Lock, LockNotDurableError
from redis_flock._session import session_of


@pytest.fixture()
def rc(cluster):
    c = RedisCluster(host="127.0.0.1", port=cluster.ports()[0])
    yield c
    c.close()
    # Sessions end with their connection: the next test starts with none.
    wait_until(lambda: cluster.sessions() == [0, 0, 0], what="the sessions of the last test to end")
    cluster.flushall()


def queued(node, key) -> int:
    fields = info(node, key)
    return 0 if fields is None else fields["waiters"]


def start_waiters(node, key, n, make_lock, blocking_timeout=10):
    """``n`` threads waiting for ``key`` one after the other (each seen
    queued on ``node`` before the next starts); each appends its index to
    the returned list when granted, then releases."""
    order, threads = [], []

    def wait(i):
        lock = make_lock()
        assert lock.acquire(blocking_timeout=blocking_timeout)
        order.append(i)
        lock.release()

    for i in range(n):
        before = queued(node, key)
        thread = threading.Thread(target=wait, args=(i,))
        thread.start()
        threads.append(thread)
        wait_until(lambda: queued(node, key) == before + 1, what=f"waiter {i} to queue")
    return order, threads


def join(threads):
    for thread in threads:
        thread.join(15)
        assert not thread.is_alive()


def test_cluster_waits_are_fifo_through_the_session_of_the_key_node(cluster, rc):
    key = cluster.key_on(1, "fifo")
    node = cluster.clients[1]
    holder = Lock(rc, key, timeout=10)
    assert holder.acquire()
    order, threads = start_waiters(node, key, 4, lambda: Lock(rc, key, timeout=10))
    # One session, on the node of the key, for the holder and every waiter.
    assert cluster.sessions() == [0, 1, 0]
    holder.release()
    join(threads)
    assert order == [0, 1, 2, 3]


def test_cluster_a_wait_on_each_node_at_once(cluster, rc):
    keys = [cluster.key_on(i, "each") for i in range(3)]
    holders = [Lock(rc, key, timeout=10) for key in keys]
    for lock in holders:
        assert lock.acquire()
    waits = [start_waiters(cluster.clients[i], key, 1, lambda key=key: Lock(rc, key, timeout=10))
             for i, key in enumerate(keys)]
    # A session per node: each wait went to the node of its key.
    assert cluster.sessions() == [1, 1, 1]
    for lock in holders:
        lock.release()
    for order, threads in waits:
        join(threads)
        assert order == [0]


def test_cluster_hash_tagged_keys_share_a_node_and_its_session(cluster, rc):
    a, b = "{order:42}:a", "{order:42}:b"
    home = cluster.index_of_key(a)
    assert cluster.index_of_key(b) == home
    node = cluster.clients[home]
    lock_a, lock_b = Lock(rc, a, timeout=10), Lock(rc, b, timeout=10)
    assert lock_a.acquire() and lock_b.acquire()
    assert lock_b.fencing_token > lock_a.fencing_token
    assert info(node, a)["token"] == lock_a.fencing_token and info(node, b)["token"] == lock_b.fencing_token
    order, threads = start_waiters(node, b, 1, lambda: Lock(rc, b, timeout=10))
    assert cluster.sessions() == [1 if i == home else 0 for i in range(3)]
    lock_b.release()
    join(threads)
    assert order == [0]
    lock_a.release()


def test_cluster_watchdog_renews_on_the_key_node(cluster, rc):
    key = cluster.key_on(2, "watchdog")
    node = cluster.clients[2]

    def renewals():
        return node.info("commandstats").get("cmdstat_flock.renew", {}).get("calls", 0)

    before = renewals()
    lock = Lock(rc, key, watchdog_timeout=1.2, use_session=False)  # without a session: a lease, renewed
    assert lock.acquire()
    token = lock.fencing_token
    # Three renewals (every 0.4 s) outlast the 1.2 s lease.
    wait_until(lambda: renewals() >= before + 3, what="three renewals on the key's node")
    assert info(node, key)["token"] == token and 0 < info(node, key)["ttl-ms"] <= 1200
    assert lock.owned() and not lock.lost
    lock.release()
    assert info(node, key) is None


def test_cluster_blocking_wait_without_a_session(cluster, rc):
    key = cluster.key_on(0, "blocking")
    node = cluster.clients[0]
    holder = Lock(rc, key, timeout=10, use_session=False)
    assert holder.acquire()
    order, threads = start_waiters(node, key, 2, lambda: Lock(rc, key, timeout=10, use_session=False))
    assert cluster.sessions() == [0, 0, 0]
    holder.release()
    join(threads)
    assert order == [0, 1]


def migrate_slot(cluster, key, to: int):
    """Moves ``key``'s slot, with its keys, to node ``to``: IMPORTING and
    MIGRATING, MIGRATE, then SETSLOT NODE on every node."""
    src = cluster.clients[cluster.index_of_key(key)]
    dst = cluster.clients[to]
    slot = src.execute_command("CLUSTER", "KEYSLOT", key)
    src_id, dst_id = (c.execute_command("CLUSTER", "MYID").decode() for c in (src, dst))
    dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
    src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
    keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
    src.execute_command("MIGRATE", "127.0.0.1", cluster.ports()[to], "", 0, 5000, "KEYS", *keys)
    for c in cluster.clients:
        c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)


def test_cluster_slot_migration_mid_wait(cluster, rc):
    key = cluster.key_on(0, "migrating")
    holder = Lock(rc, key, timeout=10)
    assert holder.acquire()
    token = holder.fencing_token
    # Held on the same node, through the same session: its loss, pushed
    # after the migration, comes after whatever the migration made it hear.
    marker_key = cluster.key_on(0, "marker")
    marker = Lock(rc, marker_key, timeout=10)
    assert marker.acquire()
    order, threads = start_waiters(cluster.clients[0], key, 1, lambda: Lock(rc, key, timeout=10))
    migrate_slot(cluster, key, 1)
    # The held lock moved with its key (owner, token) and the wait followed
    # it: queued again on the new node, through a session there.
    wait_until(lambda: queued(cluster.clients[1], key) == 1, what="the wait to queue on the new node")
    assert info(cluster.clients[1], key)["token"] == token
    assert cluster.sessions()[1] == 1
    # The old node's session heard `moved`, not a loss: the holder still
    # holds, and its release, through the cluster client, reaches the new node.
    cluster.clients[0].execute_command("FLOCK.FORCERELEASE", marker_key)
    wait_until(lambda: marker.lost, what="the marker's loss, after the migration's event")
    assert not holder.lost
    holder.release()
    join(threads)
    assert order == [0]
    # The next acquire goes to the new node at once.
    lock = Lock(rc, key, timeout=10)
    assert lock.acquire(blocking_timeout=1)
    assert info(cluster.clients[1], key)["token"] == lock.fencing_token > token
    lock.release()


def test_cluster_moved_grant_is_watched_on_the_new_node(cluster, rc):
    key = cluster.key_on(0, "rewatch")
    new = cluster.clients[2]
    # A fixed lease, no watchdog: only a pushed event can mark it lost.
    holder = Lock(rc, key, timeout=10)
    assert holder.acquire()
    before = calls(new, "flock.release")
    migrate_slot(cluster, key, 2)
    # The old node's session heard `moved`: the grant is watched again
    # through a session on the new node (a reentrant ACQUIRE ... INBOX
    # there, then the RELEASE of that extra hold).
    wait_until(lambda: cluster.sessions()[2] == 1 and calls(new, "flock.release") == before + 1,
               what="the grant to be watched again on the new node")
    assert holding(new, key, holder.local.token)["holds"] == 1 and not holder.lost
    new.execute_command("FLOCK.FORCERELEASE", key)
    wait_until(lambda: holder.lost, what="the loss pushed by the new node's session")
    assert holder.lost_reason == "forcereleased"
    with pytest.raises(LockNotOwnedError):
        holder.release()


# Over 5 s: a Sentinel failover, whose old master is demoted 4-5 s after
# it (conftest.SentinelSetup.failover_done).
def test_sentinel_wait_and_failover(sentinel_setup):
    sentinel = Sentinel(sentinel_setup.sentinel_addresses(), socket_timeout=5)
    r = sentinel.master_for(sentinel_setup.NAME, socket_timeout=5)
    master = redis.Redis(port=sentinel_setup.master_port())
    try:
        # A wait through the session, on a master found by the sentinels.
        holder = Lock(r, "sentinel:wait", timeout=10)
        assert holder.acquire()
        order, threads = start_waiters(master, "sentinel:wait", 1, lambda: Lock(r, "sentinel:wait", timeout=10))
        assert master.info("flock")["flock_sessions"] == 1
        holder.release()
        join(threads)
        assert order == [0]

        # A grant held across SENTINEL FAILOVER: durable (both replicas
        # acknowledged it before acquire() returned), so the promoted
        # replica has it (owner, token).
        kept = Lock(r, "sentinel:kept", timeout=60, durable_replicas=2, durable_timeout=5)
        assert kept.acquire()
        new, _ = sentinel_setup.failover()
        promoted = redis.Redis(port=new.port)
        try:
            # The demotion closed the session; it was opened again on the
            # new master, where the grant is watched again (before that, a
            # FORCERELEASE would be found by the re-watch's RENEW, not
            # pushed): not lost.
            session = session_of(r)
            wait_until(lambda: promoted.info("flock")["flock_sessions"] == 1
                       and session.sid is not None and session.rewatched == session.sid,
                       timeout=10, what="the session to reopen on the new master and watch the grant there")
            assert not kept.lost and kept.owned()
            assert info(promoted, "sentinel:kept")["token"] == kept.fencing_token
            # A new acquire goes to the new master.
            fresh = Lock(r, "sentinel:new", timeout=10)
            assert fresh.acquire(blocking_timeout=5)
            assert info(promoted, "sentinel:new")["token"] == fresh.fencing_token
            fresh.release()
            # Its losses are pushed from the new master.
            promoted.execute_command("FLOCK.FORCERELEASE", "sentinel:kept")
            wait_until(lambda: kept.lost, what="the loss pushed from the new master")
            assert kept.lost_reason == "forcereleased"
            with pytest.raises(LockNotOwnedError):
                kept.release()
        finally:
            promoted.flushall()
            promoted.close()
    finally:
        r.close()
        master.close()


@contextmanager
def two_masters_named_by_a_sentinel():
    """Two servers with the module and a sentinel that names the first as
    master ``moved``: (old, new, sentinel), stopped after."""
    old, new = Server(), Server()
    sentinel = Server("--sentinel", module=False, config=f"sentinel monitor moved 127.0.0.1 {old.port} 1\n")
    try:
        yield old, new, sentinel
    finally:
        for server in (sentinel, new, old):
            server.stop()


def name_new_and_end_the_session(old, new, sentinel) -> None:
    """The sentinel names ``new`` while ``old`` still answers (a failover,
    before the demotion), and the session's connection on ``old`` breaks: the
    next wait opens a session where the sentinel points now."""
    with redis.Redis(port=sentinel.port) as s:
        s.execute_command("SENTINEL", "REMOVE", "moved")
        s.execute_command("SENTINEL", "MONITOR", "moved", "127.0.0.1", new.port, 1)
    with redis.Redis(port=old.port) as o:
        reader = next(c for c in o.client_list() if c["cmd"] == "flock.inbox")
        o.client_kill_filter(_id=reader["id"])
        wait_until(lambda: stat(o, "sessions") == 0, what="the session to end on the old master")


def test_sentinel_a_nosession_from_the_master_the_sentinels_no_longer_name_does_not_end_the_session():
    """The sentinels name another master while the one they named before
    still answers (a failover, before they demote it): once the session is
    on the master named now, the commands go there too (redis-py's Sentinel
    pool drops its idle connections when the master's address changes), and
    no NOSESSION from the old one ends the live session."""
    with two_masters_named_by_a_sentinel() as (old, new, sentinel):
        r = Sentinel([("127.0.0.1", sentinel.port)], socket_timeout=5).master_for("moved", socket_timeout=5)
        first = Lock(r, "moved")
        assert first.acquire(blocking_timeout=1), "a session and command connections on the old master"
        first.release()
        name_new_and_end_the_session(old, new, sentinel)
        lock = Lock(r, "moved")
        assert lock.acquire(blocking_timeout=1), "granted on the master named now"
        with redis.Redis(port=new.port) as n, redis.Redis(port=old.port) as o:
            assert info(n, "moved") is not None
            assert info(o, "moved") is None
            lock.release()
            assert info(n, "moved") is None


# Both replicas: with fewer (or none), the old master, still serving after
# the promotion, and the new one both grant the lock (the test then fails).
DURABLE = dict(durable_replicas=2, durable_timeout=0.5)


# Over 5 s: a Sentinel failover, whose old master is demoted 4-5 s after
# it (conftest.SentinelSetup.failover_done).
def test_sentinel_failover_durable_grants_never_overlap_and_resume(sentinel_setup):
    """Four threads take one lock durably (both replicas) in a loop with
    short holds, three through one master_for() client, one through a new
    one each time; SENTINEL FAILOVER while waiters are queued. The durable grants' tokens only rise in grant order,
    no two durable holders' hold intervals (acquire()'s return to
    release()'s send) overlap, and durable grants resume on the new master
    once the old one is demoted."""
    sentinel = Sentinel(sentinel_setup.sentinel_addresses(), socket_timeout=5)
    r = sentinel.master_for(sentinel_setup.NAME, socket_timeout=5)
    key = "sentinel:durable"
    grants, refused, errors = [], [], []
    mutex, stop = threading.Lock(), threading.Event()

    def work(fresh=False):
        # fresh: a new master_for() client per acquire, which asks the
        # sentinels for the master, as a process started after the promotion
        # would: the new master while the others still reach the old one.
        client = r
        while not stop.is_set():
            if fresh:
                client = Sentinel(sentinel_setup.sentinel_addresses(), socket_timeout=5).master_for(
                    sentinel_setup.NAME, socket_timeout=5)
            lock = Lock(client, key, timeout=1, use_session=not fresh, **DURABLE)
            try:
                if not lock.acquire(blocking_timeout=2):
                    continue
            except LockNotDurableError:
                with mutex:
                    refused.append(time.monotonic())
                continue
            except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError) as e:
                # The demotion closes connections, and the old master answers
                # READONLY or UNBLOCKED meanwhile: tried again.
                with mutex:
                    errors.append(repr(e))
                time.sleep(0.02)
                continue
            acquired, token = time.monotonic(), lock.fencing_token
            time.sleep(0.005)
            released = time.monotonic()
            with mutex:
                grants.append((acquired, released, token))
            try:
                lock.release()
            except (LockError, redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
                pass
            finally:
                if fresh:
                    client.close()

    def count(since=0.0) -> int:
        with mutex:
            return sum(1 for acquired, _, _ in grants if acquired > since)

    threads = [threading.Thread(target=work, args=(i == 0,)) for i in range(4)]
    for thread in threads:
        thread.start()
    try:
        old_master = redis.Redis(port=sentinel_setup.master_port())
        wait_until(lambda: count() >= 20, timeout=10, what="durable grants before the failover")
        wait_until(lambda: (info(old_master, key) or {}).get("waiters", 0) >= 1, what="a waiter queued")
        old_master.close()
        old = sentinel_setup.start_failover()
        failover_sent = time.monotonic()
        new, _ = sentinel_setup.failover_done(old)
        # The old master is a replica now: any grant from here on is the new master's.
        demoted = time.monotonic()
        wait_until(lambda: count(demoted) >= 20, timeout=15, what="durable grants on the new master")
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
        r.close()
    assert not any(thread.is_alive() for thread in threads)
    ordered = sorted(grants)
    tokens = [token for _, _, token in ordered]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), "durable tokens rise in grant order"
    overlaps = [(a, b) for a, b in zip(ordered, ordered[1:]) if b[0] < a[1]]
    assert overlaps == [], "no two durable holders overlap"
    with redis.Redis(port=new.port) as promoted:
        promoted.flushall()
    resumed = min(acquired for acquired, _, _ in grants if acquired > demoted)
    gap = max(b[0] - a[1] for a, b in zip(ordered, ordered[1:]))
    print(f"durable grants {len(grants)}, refused (NOTDURABLE) {len(refused)}, other errors {len(errors)},"
          f" demotion {demoted - failover_sent:.1f} s and the first grant after it"
          f" {resumed - failover_sent:.1f} s after SENTINEL FAILOVER, longest gap {gap:.1f} s")


def on_replica(replica, key, owner):
    """``owner``'s entry in FLOCK.INFO as the Cluster replica ``replica`` has
    it (read with READONLY on a connection of its own)."""
    port = replica.connection_pool.connection_kwargs["port"]
    with redis.Redis(port=port, single_connection_client=True) as c:
        c.execute_command("READONLY")
        return holding(c, key, owner)


def test_cluster_durable_grant_waits_for_the_replica_of_the_key_node(replicated_cluster):
    cluster = replicated_cluster
    rc = RedisCluster(host="127.0.0.1", port=cluster.ports()[0])
    try:
        key = cluster.key_in_shard(1, "durable")
        master, replica = cluster.master_and_replica_of(key)
        lock = Lock(rc, key, timeout=10, durable_replicas=1)
        assert lock.acquire()
        # The RENEW and WAIT went to the key's node: its replica has the grant.
        assert on_replica(replica, key, lock.local.token)["token"] == lock.fencing_token
        lock.release()
        # Each master has one replica: asked for two, refused and given back.
        lock = Lock(rc, key, timeout=10, durable_replicas=2, durable_timeout=0.2)
        with pytest.raises(LockNotDurableError) as raised:
            lock.acquire()
        assert raised.value.reached == 1 and info(master, key) is None
    finally:
        rc.close()


@pytest.mark.parametrize("use_session", [True, False], ids=["session", "blocking"])
def test_cluster_failover_mid_wait_grants_on_the_new_master(replicated_cluster, use_session):
    """CLUSTER FAILOVER on the replica of a lock's node while a waiter of
    that lock waits through the cluster client: the wait does not hang; it
    is sent again (same request ID) to the new master, where the holder's
    release (through the cluster client, following MOVED) grants it."""
    cluster = replicated_cluster
    rc = RedisCluster(host="127.0.0.1", port=cluster.ports()[0])
    try:
        key = cluster.key_in_shard(0 if use_session else 1, "failover")
        old, new = cluster.master_and_replica_of(key)
        holder = Lock(rc, key, timeout=10)
        assert holder.acquire()
        outcome = []

        def wait():
            lock = Lock(rc, key, timeout=10, use_session=use_session)
            try:
                outcome.append(lock.acquire(blocking_timeout=15))
                outcome.append((lock.fencing_token, info(new, key)["token"]))
                lock.release()
            except Exception as e:
                outcome.append(e)

        thread = threading.Thread(target=wait)
        thread.start()
        wait_until(lambda: queued(old, key) == 1, what="the waiter to queue")
        # A manual CLUSTER FAILOVER waits for the replica to reach the master's
        # offset: the new master has the grant (not a WAIT here: it would count
        # this connection's writes, and the grant was another's).
        new.execute_command("CLUSTER", "FAILOVER")
        wait_until(lambda: new.execute_command("ROLE")[0] == b"master" and old.execute_command("ROLE")[0] == b"slave",
                   timeout=15, what="the replica to be the master")
        holder.release()
        thread.join(20)
        assert not thread.is_alive(), "the wait hung"
        assert outcome[0] is True, outcome
        # Granted by the new master: its token is the one the new master holds.
        token, on_new = outcome[1]
        assert token == on_new
    finally:
        rc.close()
