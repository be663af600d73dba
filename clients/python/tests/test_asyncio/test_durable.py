"""Durable grants with redis_flock.asyncio (tests/test_durable.py with
tasks): on a master with one replica, a durable grant is on the replica when
acquire() returns; asked for two replicas, acquire() raises
LockNotDurableError and the hold is given back."""

import asyncio
import time

import pytest
import pytest_asyncio
import redis
import redis.asyncio

from helpers import ReplyDropper, holding, info, lock_kinds, until
import redis_flock.asyncio
from redis_flock.asyncio import Lock, LockNotDurableError

KINDS = lock_kinds(redis_flock.asyncio)


@pytest_asyncio.fixture()
async def m(replicated):
    c = redis.asyncio.Redis(port=replicated.master.port)
    yield c
    await c.flushall()
    await c.aclose()


@pytest.fixture()
def inspect(replicated):
    """Blocking clients of the master and the replica, to read their side."""
    master, replica = redis.Redis(port=replicated.master.port), redis.Redis(port=replicated.replica.port)
    yield master, replica
    master.close()
    replica.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_durable_try_is_on_the_replica_when_it_returns(m, inspect, kind):
    _, replica = inspect
    lock = KINDS[kind](m, f"adurable:try:{kind}", timeout=10, durable_replicas=1)
    assert await lock.acquire(blocking=False)
    assert holding(replica, lock.name, lock.local.token)["token"] == lock.fencing_token
    await lock.release()


@pytest.mark.parametrize("use_session", [True, False], ids=["session", "blocking"])
async def test_durable_wait_is_on_the_replica_when_it_returns(m, inspect, use_session):
    master, replica = inspect
    key = f"adurable:wait:{use_session}"
    holder = Lock(m, key, timeout=10)
    assert await holder.acquire()
    waiter = Lock(m, key, timeout=10, durable_replicas=1, use_session=use_session)
    task = asyncio.create_task(waiter.acquire(blocking_timeout=10))
    await until(lambda: info(master, key)["waiters"] == 1, what="the waiter to queue")
    await holder.release()
    assert await asyncio.wait_for(task, 10)
    assert holding(replica, key, waiter.local.token)["token"] == waiter.fencing_token
    await waiter.release()


@pytest.mark.parametrize("kind", KINDS)
async def test_not_durable_try_fails_within_the_timeout_and_gives_the_hold_back(m, inspect, kind):
    master, _ = inspect
    lock = KINDS[kind](m, f"adurable:fail:{kind}", timeout=10, durable_replicas=2, durable_timeout=0.3)
    started = time.monotonic()
    with pytest.raises(LockNotDurableError) as raised:
        await lock.acquire(blocking=False)
    assert 0.3 <= time.monotonic() - started < 1.5
    assert (raised.value.reached, raised.value.asked) == (1, 2)
    assert "NOTDURABLE" in str(raised.value) and isinstance(raised.value, redis.exceptions.LockError)
    assert info(master, lock.name) is None and lock.fencing_token is None


@pytest.mark.parametrize("use_session", [True, False], ids=["session", "blocking"])
async def test_not_durable_wait_gives_the_grant_to_the_next_waiter(m, inspect, use_session):
    master, _ = inspect
    key = f"adurable:next:{use_session}"
    holder = Lock(m, key, timeout=10)
    assert await holder.acquire()
    durable = Lock(m, key, timeout=10, durable_replicas=2, durable_timeout=0.3, use_session=use_session)
    first = asyncio.create_task(durable.acquire(blocking_timeout=10))
    await until(lambda: info(master, key)["waiters"] == 1, what="the durable waiter to queue")
    nxt = Lock(m, key, timeout=10)
    second = asyncio.create_task(nxt.acquire(blocking_timeout=10))
    await until(lambda: info(master, key)["waiters"] == 2, what="the next waiter to queue")
    await holder.release()
    with pytest.raises(LockNotDurableError) as raised:
        await asyncio.wait_for(first, 10)
    assert raised.value.reached == 1
    assert await asyncio.wait_for(second, 10)
    assert info(master, key)["owner"] == nxt.local.token
    await nxt.release()


async def test_not_durable_reentry_gives_back_one_hold_and_the_first_stays(m, inspect):
    master, _ = inspect
    lock = Lock(m, "adurable:reentry", timeout=10, reentrant=True, durable_replicas=1)
    assert await lock.acquire()
    token = lock.fencing_token
    lock.durable_replicas, lock.durable_timeout = 2, 0.3
    with pytest.raises(LockNotDurableError):
        await lock.acquire()
    assert holding(master, lock.name, lock.local.token)["holds"] == 1
    assert lock.fencing_token == token and await lock.owned()
    await lock.release()
    assert info(master, lock.name) is None


@pytest.mark.parametrize("use_session", [True, False], ids=["session", "blocking"])
async def test_not_durable_when_the_renew_finds_another_grant_of_the_owner(replicated, m, inspect, use_session):
    """tests/test_durable.py's test of the same name, with a task."""
    master, _ = inspect
    key = f"adurable:replaced:{use_session}"
    proxy = ReplyDropper(replicated.master.port)
    client = redis.asyncio.Redis(port=proxy.port)
    holder = Lock(m, key, timeout=10)
    assert await holder.acquire()
    waiter = Lock(client, key, timeout=10, durable_replicas=1, durable_timeout=2, use_session=use_session)
    task = asyncio.create_task(waiter.acquire(blocking_timeout=10))
    try:
        await until(lambda: info(master, key)["waiters"] == 1, what="the waiter to queue")
        proxy.partition()
        await holder.release()
        granted = info(master, key)
        master.execute_command("FLOCK.FORCERELEASE", key)
        older = master.execute_command("FLOCK.ACQUIRE", key, granted["owner"], 10000)
        proxy.heal()
        with pytest.raises(LockNotDurableError) as raised:
            await asyncio.wait_for(task, 10)
    finally:
        proxy.heal()
        await client.aclose()
        proxy.close()
    assert f"grant (token {granted['token']}) was gone" in str(raised.value)
    assert f"another grant of this owner (token {older})" in str(raised.value)
    assert info(master, key) is None, "the hold was given back"
