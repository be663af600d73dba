"""Stale holds with redis_flock.asyncio (tests/test_stale.py with tasks): a
release refused with NOREPLICAS, one whose every reply was lost (both count
as released, their token remembered in the process's table) or answered and
then lost (the key's DUMP from before it RESTOREd, as a promoted replica has
it); the same owner's next acquire reenters the grant, and the caller holds
one hold more than before: its release frees the lock for a waiter."""

import asyncio

import pytest
import pytest_asyncio
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError, LockError, LockNotOwnedError, ResponseError

from helpers import ReplyDropper, cancel_while_paused, info, remembered, until
from redis_flock._core import ANY_TOKEN, HELD, RESENDS
from redis_flock.asyncio import Lock, MultiLock, ReadWriteLock

KEY = "stale"
pytestmark = pytest.mark.usefixtures("forgotten")


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


async def test_a_refused_release_of_one_of_several_holds_keeps_the_others(r, m):
    """See the sync test of the same name."""
    lock = Lock(r, KEY, timeout=30, reentrant=True)
    assert await lock.acquire() and await lock.acquire()
    token = lock.fencing_token
    await refused_release(m, lock)
    assert lock.fencing_token == token, "one hold is left"
    assert remembered(KEY) == {lock.local.token: token}
    assert info(m, KEY)["holds"] == 2
    assert await lock.acquire()
    assert info(m, KEY)["holds"] == 2, "the refused hold given back, the two unreleased kept"
    await lock.release()
    assert info(m, KEY)["holds"] == 1
    await lock.release()
    assert info(m, KEY) is None
    with pytest.raises(LockError):
        await lock.release()


def lost_replies(proxy):
    async def lose(m, lock):
        before = m.dump(KEY)
        proxy.drop_reply_to(b"FLOCK.RELEASE", RESENDS + 1)
        with pytest.raises(ConnectionError):
            await lock.release()
        assert proxy.drops == RESENDS + 1
        m.restore(KEY, 0, before, replace=True)

    return lose


@pytest.mark.parametrize("how", ["refused", "replies lost"])
async def test_a_failed_release_is_given_back_by_another_lock_object_of_the_owner(m, solo, how):
    """See the sync test of the same name: the failed release is no longer
    kept by its lock object for its next release() to send."""
    proxy = ReplyDropper(solo.port)
    client = redis.asyncio.Redis(port=proxy.port, retry=Retry(NoBackoff(), 0))
    try:
        first = Lock(client, KEY, timeout=30, use_session=False)
        assert await first.acquire(token="mine")
        await (refused_release if how == "refused" else lost_replies(proxy))(m, first)
        assert first.fencing_token is None, "the failed release counts as released"
        assert info(m, KEY)["holds"] == 1
        second = Lock(client, KEY, timeout=30, use_session=False)
        assert await second.acquire(token="mine")
        assert info(m, KEY)["holds"] == 1, "the first object's hold was given back"
        await second.release()
        assert info(m, KEY) is None
    finally:
        await client.aclose()
        proxy.close()


async def test_the_give_back_leaves_the_holds_of_other_lock_objects_of_the_owner(r, m):
    first, second = Lock(r, KEY, timeout=30), Lock(r, KEY, timeout=30)
    assert await first.acquire(token="mine") and await second.acquire(token="mine")
    await refused_release(m, second)
    assert info(m, KEY)["holds"] == 2
    assert await second.acquire(token="mine")
    assert info(m, KEY)["holds"] == 2
    await first.release()
    assert info(m, KEY)["holds"] == 1
    await second.release()
    assert info(m, KEY) is None


async def test_a_notowner_release_is_not_remembered(r, m):
    lock = Lock(r, KEY, timeout=30, reentrant=True)
    assert await lock.acquire()
    m.execute_command("FLOCK.FORCERELEASE", KEY)
    with pytest.raises(LockNotOwnedError):
        await lock.release()
    assert remembered(KEY) == {}


async def test_an_acquire_whose_replies_were_all_lost_is_remembered_for_a_named_owner(m, solo):
    proxy = ReplyDropper(solo.port)
    client = redis.asyncio.Redis(port=proxy.port, retry=Retry(NoBackoff(), 0))
    try:
        lock = Lock(client, KEY, timeout=30)
        proxy.drop_reply_to(b"FLOCK.ACQUIRE", RESENDS + 1)
        with pytest.raises(ConnectionError):
            await lock.acquire(blocking=False, token="mine")
        assert remembered(KEY) == {b"mine": ANY_TOKEN}
        assert info(m, KEY)["holds"] == 1, "granted by the first send"
        assert await Lock(client, KEY, timeout=30).acquire(blocking=False, token="mine")
        assert info(m, KEY)["holds"] == 1, "the unknown hold was given back"
    finally:
        await client.aclose()
        proxy.close()


async def test_an_acquire_the_server_answered_with_an_error_is_not_remembered(r, m):
    m.set(KEY, "a string")
    lock = Lock(r, KEY, timeout=30, reentrant=True)
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        await lock.acquire(blocking=False)
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        await lock.acquire(blocking=False, token="mine")
    assert remembered(KEY) == {}


@pytest.mark.parametrize("use_session", [True, False], ids=["session", "blocking"])
async def test_a_cancelled_release_is_resent_before_a_reentry(r, m, use_session):
    """A release() cancelled while its reply is awaited (the server paused:
    the command is dropped with its connection, which redis-py closes)
    keeps the grant and its RELEASE, as redis-py's asyncio lock keeps its
    token; the next acquire, a reentry, sends that RELEASE again first (its
    request ID: applied once), so the caller holds one hold."""
    lock = Lock(r, KEY, timeout=30, reentrant=True, use_session=use_session)
    assert await lock.acquire()
    await cancel_while_paused(m, lock.release(), "flock.release")
    assert lock.fencing_token is not None, "kept"
    assert info(m, KEY)["holds"] == 1
    assert await lock.acquire(blocking_timeout=5)
    assert info(m, KEY)["holds"] == 1
    await lock.release()
    assert info(m, KEY) is None


def unknown_hold(m, lock_name, owner):
    """One more hold of ``owner``'s grant that no lock object knows of (see
    the sync test's helper of the same name)."""
    assert m.execute_command("FLOCK.ACQUIRE", lock_name, owner, 10000) is not None


@pytest.mark.parametrize("use_session", [True, False], ids=["session", "blocking"])
@pytest.mark.parametrize("owner", ["reentrant", "token", "per acquire"])
async def test_the_last_release_of_an_owner_gives_back_the_holds_left(r, m, use_session, owner):
    """See the sync test of the same name."""
    lock = Lock(r, KEY, timeout=30, reentrant=owner == "reentrant", use_session=use_session)
    assert await lock.acquire(token="mine" if owner == "token" else None)
    unknown_hold(m, KEY, lock.local.token)
    assert info(m, KEY)["holds"] == 2
    await lock.release()
    assert info(m, KEY) is None, "the hold the process never knew of was given back"
    assert lock.fencing_token is None


async def test_a_release_leaves_the_holds_of_another_lock_object_of_the_owner(r, m):
    first, second = Lock(r, KEY, timeout=30), Lock(r, KEY, timeout=30)
    assert await first.acquire(token="mine") and await second.acquire(token="mine")
    unknown_hold(m, KEY, "mine")
    await first.release()
    assert info(m, KEY)["holds"] == 2, "the second object's hold and the unknown one"
    await second.release()
    assert info(m, KEY) is None


async def test_the_last_release_of_a_multilock_gives_back_each_keys_holds_left(r, m):
    locks = MultiLock(r, ["{s}a", "{s}b"], timeout=30)
    assert await locks.acquire(token="mine")
    unknown_hold(m, "{s}b", "mine")
    await locks.release()
    assert info(m, "{s}a") is None and info(m, "{s}b") is None


class HoldsAcquireReplies(redis.asyncio.Redis):
    """A client whose FLOCK.ACQUIRE runs on the server and whose reply then
    waits for ``answer``: an acquire granted and not yet answered."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.granted = asyncio.Event()
        self.answer = asyncio.Event()

    async def execute_command(self, *args, **options):
        reply = await super().execute_command(*args, **options)
        if args[0] == "FLOCK.ACQUIRE":
            self.granted.set()
            await asyncio.wait_for(self.answer.wait(), 10)
        return reply


async def test_a_release_leaves_the_hold_of_an_acquire_of_the_owner_in_flight(r, m, solo):
    """See the sync test of the same name: the other lock object's acquire
    is a task, its reply held back."""
    first = Lock(r, KEY, timeout=30)
    assert await first.acquire(token="mine")
    client = HoldsAcquireReplies(port=solo.port)
    second = Lock(client, KEY, timeout=30, use_session=False)
    try:
        acquiring = asyncio.create_task(second.acquire(blocking=False, token="mine"))
        try:
            await asyncio.wait_for(client.granted.wait(), 10)
            assert info(m, KEY)["holds"] == 2, "the second object's reentry, not yet answered"
            await first.release()
            assert info(m, KEY)["holds"] == 1, "left to the acquire in flight"
        finally:
            client.answer.set()
            granted = await asyncio.wait_for(acquiring, 10)
        assert granted
        assert info(m, KEY)["holds"] == 1
        await second.release()
        assert info(m, KEY) is None
    finally:
        await client.aclose()


async def test_an_acquire_that_ends_without_a_grant_is_no_longer_counted(r, m):
    """See the sync test of the same name; and a cancelled one."""
    assert await Lock(r, KEY, timeout=30).acquire(token="other")
    lock = Lock(r, KEY, timeout=30)
    assert not await lock.acquire(blocking=False, token="mine")
    waiting = asyncio.create_task(lock.acquire(blocking_timeout=10, token="mine"))
    await until(lambda: info(m, KEY)["waiters"] == 1, what="the waiter to queue")
    assert HELD.held(KEY, b"mine") == 1, "counted while it waits"
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert HELD.held(KEY, b"mine") == 0
    m.execute_command("FLOCK.FORCERELEASE", KEY)
    assert await lock.acquire(token="mine")
    unknown_hold(m, KEY, "mine")
    await lock.release()
    assert info(m, KEY) is None
