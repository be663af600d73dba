"""Stale holds with redis_flock.asyncio (tests/test_stale.py with tasks): a
release refused with NOREPLICAS (release() keeps the grant and its RELEASE,
as after a lost reply) or answered and then lost (the key's DUMP from
before it RESTOREd, as a promoted replica has it); the same task's next
acquire reenters the grant, and the caller holds one hold: one release
frees the lock for a waiter."""

import asyncio

import pytest
import pytest_asyncio
import redis.asyncio
from redis.exceptions import ResponseError

from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError

from helpers import ReplyDropper, info, until
from redis_flock._core import RESENDS
from redis_flock.asyncio import Lock, ReadWriteLock

KEY = "stale"


@pytest_asyncio.fixture()
async def r(solo):
    c = redis.asyncio.Redis(port=solo.port)
    yield c
    await c.aclose()


async def refused_release(m, lock):
    m.config_set("min-replicas-to-write", 1)
    try:
        with pytest.raises(ResponseError, match="NOREPLICAS"):
            await lock.release()
    finally:
        m.config_set("min-replicas-to-write", 0)


async def lost_release(m, lock):
    before = m.dump(KEY)
    await lock.release()
    assert info(m, KEY) is None
    m.restore(KEY, 0, before, replace=True)


@pytest.mark.parametrize("use_session", [True, False], ids=["session", "blocking"])
@pytest.mark.parametrize("lose", [refused_release, lost_release], ids=["refused", "lost"])
async def test_a_reentered_stale_hold_is_given_back(r, m, use_session, lose):
    lock = Lock(r, KEY, timeout=30, reentrant=True, use_session=use_session)
    assert await lock.acquire()
    token = lock.fencing_token
    await lose(m, lock)
    assert info(m, KEY)["holds"] == 1
    for _ in range(3):
        assert await lock.acquire(blocking_timeout=5)
        assert lock.fencing_token == token
        assert info(m, KEY)["holds"] == 1
        await lose(m, lock)
    assert await lock.acquire(blocking_timeout=5)
    assert info(m, KEY)["holds"] == 1
    waiter = Lock(r, KEY, timeout=30, thread_local=False)
    waiting = asyncio.create_task(waiter.acquire(blocking_timeout=10))
    await until(lambda: info(m, KEY)["waiters"] == 1, what="the waiter to queue")
    await lock.release()
    assert await asyncio.wait_for(waiting, 10)
    assert info(m, KEY)["token"] == waiter.fencing_token
    await waiter.release()


async def test_a_grant_whose_replies_were_all_lost_is_given_back_by_the_next_grant(m, solo):
    """See the sync test of the same name."""
    proxy = ReplyDropper(solo.port)
    client = redis.asyncio.Redis(port=proxy.port, retry=Retry(NoBackoff(), 0))
    try:
        lock = Lock(client, KEY, timeout=30, reentrant=True)
        proxy.drop_reply_to(b"FLOCK.ACQUIRE", RESENDS + 1)
        with pytest.raises(ConnectionError):
            await lock.acquire(blocking=False)
        assert proxy.drops == RESENDS + 1
        assert info(m, KEY)["holds"] == 1, "granted by the first send, unknown to the task"
        assert await lock.acquire(blocking=False), "a reentry of that grant"
        assert info(m, KEY)["holds"] == 1, "the hold the task did not know of was given back"
        await lock.release()
        assert info(m, KEY) is None, "one release frees the lock"
    finally:
        await client.aclose()
        proxy.close()


async def test_a_reentry_of_a_held_grant_keeps_its_holds(r, m):
    lock = Lock(r, KEY, timeout=30, reentrant=True)
    assert await lock.acquire() and await lock.acquire()
    await lock.release()
    assert await lock.acquire()
    assert info(m, KEY)["holds"] == 2
    await lock.release()
    await lock.release()
    assert info(m, KEY) is None


async def test_the_other_side_of_a_read_write_lock_keeps_its_holds(r, m):
    rw = ReadWriteLock(r, KEY, timeout=30)
    write, read = rw.write_lock(), rw.read_lock()
    assert await write.acquire()
    assert await read.acquire()
    await refused_release(m, read)
    assert info(m, KEY)["holds"] == 2
    assert await read.acquire()
    assert info(m, KEY)["holds"] == 2
    await read.release()
    await write.release()
    assert info(m, KEY) is None


async def test_a_lost_release_of_the_other_side_of_a_read_write_lock_is_given_back(r, m):
    """The read side's release answered 1 (the write hold) and was lost: the
    next read reenters, the stale read hold goes back, the write one stays."""
    rw = ReadWriteLock(r, KEY, timeout=30)
    write, read = rw.write_lock(), rw.read_lock()
    assert await write.acquire()
    assert await read.acquire()
    before = m.dump(KEY)
    await read.release()
    assert info(m, KEY)["holds"] == 1
    m.restore(KEY, 0, before, replace=True)
    assert await read.acquire()
    assert info(m, KEY)["holds"] == 2
    await read.release()
    await write.release()
    assert info(m, KEY) is None
    # And the write side released first (the read hold left) is no stale hold.
    assert await write.acquire()
    assert await read.acquire()
    await write.release()
    assert await write.acquire()
    assert info(m, KEY)["holds"] == 2
    await write.release()
    await read.release()
    assert info(m, KEY) is None
