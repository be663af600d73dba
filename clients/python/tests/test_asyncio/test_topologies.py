"""redis_flock.asyncio.Lock on a 3-master Redis Cluster
(redis.asyncio.cluster.RedisCluster) and on a Sentinel-watched master
(redis.asyncio.sentinel.Sentinel.master_for): the basic cases of
tests/test_topologies.py with tasks."""

import asyncio

import pytest
import redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import Sentinel
from redis.exceptions import LockNotOwnedError

from helpers import calls, holding, info, until, until_read, wait_until
from redis_flock._asyncio_session import session_of
from redis_flock.asyncio import Lock, LockNotDurableError
from test_topologies import (
    migrate_slot,
    name_new_and_end_the_session,
    on_replica,
    queued,
    two_masters_named_by_a_sentinel,
)


async def start_waiters(node, key, n, make_lock, blocking_timeout=10):
    """``n`` tasks waiting for ``key`` one after the other (each seen queued
    on ``node`` before the next starts); each appends its index to the
    returned list when granted, then releases."""
    order, tasks = [], []

    async def wait(i):
        lock = make_lock()
        assert await lock.acquire(blocking_timeout=blocking_timeout)
        order.append(i)
        await lock.release()

    for i in range(n):
        before = queued(node, key)
        tasks.append(asyncio.create_task(wait(i)))
        await until(lambda: queued(node, key) == before + 1, what=f"waiter {i} to queue")
    return order, tasks


async def test_cluster_waits_are_fifo_through_the_session_of_the_key_node(cluster, rc):
    key = cluster.key_on(1, "fifo")
    node = cluster.clients[1]
    holder = Lock(rc, key, timeout=10)
    assert await holder.acquire()
    order, tasks = await start_waiters(node, key, 4, lambda: Lock(rc, key, timeout=10))
    assert cluster.sessions() == [0, 1, 0]
    await holder.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 15)
    assert order == [0, 1, 2, 3]


async def test_cluster_a_wait_on_each_node_at_once(cluster, rc):
    keys = [cluster.key_on(i, "each") for i in range(3)]
    holders = [Lock(rc, key, timeout=10) for key in keys]
    for lock in holders:
        assert await lock.acquire()
    waits = [await start_waiters(cluster.clients[i], key, 1, lambda key=key: Lock(rc, key, timeout=10))
             for i, key in enumerate(keys)]
    assert cluster.sessions() == [1, 1, 1]
    for lock in holders:
        await lock.release()
    for order, tasks in waits:
        await asyncio.wait_for(asyncio.gather(*tasks), 15)
        assert order == [0]


async def test_cluster_watchdog_renews_on_the_key_node(cluster, rc):
    key = cluster.key_on(2, "watchdog")
    node = cluster.clients[2]

    def renewals():
        return node.info("commandstats").get("cmdstat_flock.renew", {}).get("calls", 0)

    before = renewals()
    lock = Lock(rc, key, watchdog_timeout=1.2, use_session=False)  # without a session: a lease, renewed
    assert await lock.acquire()
    await until_read(lambda: renewals() >= before + 3, what="three renewals on the key's node")
    assert info(node, key)["token"] == lock.fencing_token and 0 < info(node, key)["ttl-ms"] <= 1200
    assert await lock.owned() and not lock.lost
    await lock.release()
    assert info(node, key) is None


async def test_cluster_blocking_wait_without_a_session(cluster, rc):
    key = cluster.key_on(0, "blocking")
    node = cluster.clients[0]
    holder = Lock(rc, key, timeout=10, use_session=False)
    assert await holder.acquire()
    order, tasks = await start_waiters(node, key, 2, lambda: Lock(rc, key, timeout=10, use_session=False))
    assert cluster.sessions() == [0, 0, 0]
    await holder.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 15)
    assert order == [0, 1]


async def test_cluster_slot_migration_mid_wait(cluster, rc):
    key = cluster.key_on(0, "migrating")
    holder = Lock(rc, key, timeout=10)
    assert await holder.acquire()
    token = holder.fencing_token
    marker_key = cluster.key_on(0, "marker")
    marker = Lock(rc, marker_key, timeout=10)
    assert await marker.acquire()
    order, tasks = await start_waiters(cluster.clients[0], key, 1, lambda: Lock(rc, key, timeout=10))
    migrate_slot(cluster, key, 1)
    await until(lambda: queued(cluster.clients[1], key) == 1, what="the wait to queue on the new node")
    assert info(cluster.clients[1], key)["token"] == token
    # `moved`, not a loss (see the sync test): the marker's loss comes after it.
    cluster.clients[0].execute_command("FLOCK.FORCERELEASE", marker_key)
    await until(lambda: marker.lost, what="the marker's loss, after the migration's event")
    assert not holder.lost
    await holder.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 15)
    assert order == [0]
    lock = Lock(rc, key, timeout=10)
    assert await lock.acquire(blocking_timeout=1)
    assert info(cluster.clients[1], key)["token"] == lock.fencing_token > token
    await lock.release()


async def test_cluster_moved_grant_is_watched_on_the_new_node(cluster, rc):
    key = cluster.key_on(0, "rewatch")
    new = cluster.clients[2]
    holder = Lock(rc, key, timeout=10)
    assert await holder.acquire()
    before = calls(new, "flock.release")
    migrate_slot(cluster, key, 2)
    # Watched again through a session on the new node (see the sync test).
    await until(lambda: cluster.sessions()[2] == 1 and calls(new, "flock.release") == before + 1,
                what="the grant to be watched again on the new node")
    assert holding(new, key, holder.local.token)["holds"] == 1 and not holder.lost
    new.execute_command("FLOCK.FORCERELEASE", key)
    await until(lambda: holder.lost, what="the loss pushed by the new node's session")
    assert holder.lost_reason == "forcereleased"
    with pytest.raises(LockNotOwnedError):
        await holder.release()


async def test_sentinel_a_nosession_from_the_master_the_sentinels_no_longer_name_does_not_end_the_session():
    """As in the blocking flavour's test of this name."""
    with two_masters_named_by_a_sentinel() as (old, new, sentinel):
        r = Sentinel([("127.0.0.1", sentinel.port)], socket_timeout=5).master_for("moved", socket_timeout=5)
        first = Lock(r, "moved")
        assert await first.acquire(blocking_timeout=1), "a session and command connections on the old master"
        await first.release()
        name_new_and_end_the_session(old, new, sentinel)
        lock = Lock(r, "moved")
        assert await lock.acquire(blocking_timeout=1), "granted on the master named now"
        with redis.Redis(port=new.port) as n, redis.Redis(port=old.port) as o:
            assert info(n, "moved") is not None
            assert info(o, "moved") is None
            await lock.release()
            assert info(n, "moved") is None
        await r.aclose()


# Over 5 s: a Sentinel failover, whose old master is demoted 4-5 s after
# it (conftest.SentinelSetup.failover_done).
async def test_sentinel_wait_and_failover(sentinel_setup):
    sentinel = Sentinel(sentinel_setup.sentinel_addresses(), socket_timeout=5)
    r = sentinel.master_for(sentinel_setup.NAME, socket_timeout=5)
    master = redis.Redis(port=sentinel_setup.master_port())
    try:
        holder = Lock(r, "sentinel:wait", timeout=10)
        assert await holder.acquire()
        order, tasks = await start_waiters(master, "sentinel:wait", 1, lambda: Lock(r, "sentinel:wait", timeout=10))
        assert master.info("flock")["flock_sessions"] == 1
        await holder.release()
        await asyncio.wait_for(asyncio.gather(*tasks), 15)
        assert order == [0]

        # Durable: both replicas have it when acquire() returns.
        kept = Lock(r, "sentinel:kept", timeout=60, durable_replicas=2, durable_timeout=5)
        assert await kept.acquire()
        # The failover's waits block: in a thread, so that the session's
        # reader task runs meanwhile.
        new, _ = await asyncio.to_thread(sentinel_setup.failover)
        promoted = redis.Redis(port=new.port)
        try:
            # Watched again there (see the sync test).
            session = session_of(r)
            await until(lambda: promoted.info("flock")["flock_sessions"] == 1
                        and session.sid is not None and session.rewatched == session.sid,
                        timeout=10, what="the session to reopen on the new master and watch the grant there")
            assert not kept.lost and await kept.owned()
            assert info(promoted, "sentinel:kept")["token"] == kept.fencing_token
            fresh = Lock(r, "sentinel:new", timeout=10)
            assert await fresh.acquire(blocking_timeout=5)
            assert info(promoted, "sentinel:new")["token"] == fresh.fencing_token
            await fresh.release()
            promoted.execute_command("FLOCK.FORCERELEASE", "sentinel:kept")
            await until(lambda: kept.lost, what="the loss pushed from the new master")
            assert kept.lost_reason == "forcereleased"
            with pytest.raises(LockNotOwnedError):
                await kept.release()
        finally:
            promoted.flushall()
            promoted.close()
    finally:
        await r.aclose()
        master.close()


async def test_cluster_durable_grant_waits_for_the_replica_of_the_key_node(replicated_cluster):
    cluster = replicated_cluster
    rc = RedisCluster(host="127.0.0.1", port=cluster.ports()[0])
    try:
        key = cluster.key_in_shard(2, "adurable")
        master, replica = cluster.master_and_replica_of(key)
        lock = Lock(rc, key, timeout=10, durable_replicas=1)
        assert await lock.acquire()
        assert on_replica(replica, key, lock.local.token)["token"] == lock.fencing_token
        await lock.release()
        lock = Lock(rc, key, timeout=10, durable_replicas=2, durable_timeout=0.2)
        with pytest.raises(LockNotDurableError) as raised:
            await lock.acquire()
        assert raised.value.reached == 1 and info(master, key) is None
    finally:
        await rc.aclose()


async def test_cluster_failover_mid_wait_grants_on_the_new_master(replicated_cluster):
    """CLUSTER FAILOVER while a task waits through the session (see the sync
    test, which also does it without one): the wait is sent again to the
    new master, which grants it."""
    cluster = replicated_cluster
    rc = RedisCluster(host="127.0.0.1", port=cluster.ports()[0])
    try:
        # The third shard: the sync tests failed the other two over.
        key = cluster.key_in_shard(2, "afailover")
        old, new = cluster.master_and_replica_of(key)
        holder = Lock(rc, key, timeout=10)
        assert await holder.acquire()
        waiter = Lock(rc, key, timeout=10)
        task = asyncio.create_task(waiter.acquire(blocking_timeout=15))
        await until(lambda: queued(old, key) == 1, what="the waiter to queue")
        new.execute_command("CLUSTER", "FAILOVER")
        await until(lambda: new.execute_command("ROLE")[0] == b"master" and old.execute_command("ROLE")[0] == b"slave",
                    timeout=15, what="the replica to be the master")
        await holder.release()
        assert await asyncio.wait_for(task, 20)
        assert info(new, key)["token"] == waiter.fencing_token
        await waiter.release()
    finally:
        await rc.aclose()
