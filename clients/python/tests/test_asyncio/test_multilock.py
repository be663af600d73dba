"""redis_flock.asyncio.MultiLock: the cases of tests/test_multilock.py with
tasks, and what asyncio adds (a cancelled task, a cancelled release())."""

import asyncio
import time

import pytest
import redis.asyncio
from redis.backoff import NoBackoff
from redis.exceptions import ClusterCrossSlotError, LockError, LockNotOwnedError
from redis.retry import Retry

from helpers import ReplyDropper, calls, cancel_while_paused, holding, info, until, until_read
from redis_flock import CrossSlotError, DeadlockError
from redis_flock.asyncio import Lock, MultiLock


def waiters(r, key) -> int:
    fields = info(r, key)
    return 0 if fields is None else fields["waiters"]


async def hold(r, name, owner):
    """``name`` held by ``owner`` (another caller), for 30 s."""
    lock = Lock(r, name, timeout=30)
    assert await lock.acquire(blocking=False, token=owner)
    return lock


async def test_a_try_takes_every_lock_or_none(r, inspect):
    other = await hold(r, "b", "other")
    multi = MultiLock(r, ["a", "b", "c"], timeout=10)
    assert await multi.acquire(blocking=False) is False
    assert info(inspect, "a") is None and info(inspect, "c") is None and waiters(inspect, "b") == 0
    assert multi.fencing_tokens is None and not await multi.owned() and await multi.locked()
    await other.release()
    assert await multi.acquire(blocking=False)
    assert [info(inspect, key)["token"] for key in ("a", "b", "c")] == multi.fencing_tokens
    assert await multi.owned()
    await multi.release()


async def test_a_wait_is_granted_when_the_last_lock_frees(r, inspect):
    first, second = await hold(r, "a", "one"), await hold(r, "b", "two")
    multi = MultiLock(r, ["a", "b"], timeout=10)
    task = asyncio.create_task(multi.acquire(blocking_timeout=10))
    await until(lambda: waiters(inspect, "a") == 1 and waiters(inspect, "b") == 1, what="the MultiLock to queue")
    await first.release()
    assert info(inspect, "a")["owner"] is None and waiters(inspect, "a") == 1
    assert not task.done()
    await second.release()
    assert await asyncio.wait_for(task, 10)
    assert [info(inspect, key)["token"] for key in ("a", "b")] == multi.fencing_tokens
    await multi.release()


async def test_a_waiting_multilock_is_served_before_a_single_waiter_behind_it(r, inspect):
    holder = await hold(r, "b", "holder")
    granted = []

    async def take(lock, what):
        assert await lock.acquire(blocking_timeout=10)
        granted.append((what, info(inspect, "a")["token"]))
        await lock.release()

    multi_task = asyncio.create_task(take(MultiLock(r, ["a", "b"], timeout=10), "multi"))
    await until(lambda: waiters(inspect, "a") == 1 and waiters(inspect, "b") == 1, what="the MultiLock to queue")
    assert await Lock(r, "a", timeout=10).acquire(blocking=False) is False
    single_task = asyncio.create_task(take(Lock(r, "a", timeout=10), "single"))
    await until(lambda: waiters(inspect, "a") == 2, what="the single waiter to queue behind it")
    await holder.release()
    await asyncio.wait_for(asyncio.gather(multi_task, single_task), 10)
    assert [what for what, _ in granted] == ["multi", "single"]
    assert granted[0][1] < granted[1][1]


async def test_a_lock_its_owner_holds_is_reentered(r, inspect):
    single = Lock(r, "a", timeout=30)
    assert await single.acquire(blocking=False, token="me")
    other = await hold(r, "b", "other")
    multi = MultiLock(r, ["a", "b"], timeout=30)
    task = asyncio.create_task(multi.acquire(blocking_timeout=10, token="me"))
    await until(lambda: waiters(inspect, "b") == 1, what="the MultiLock to queue for b")
    assert waiters(inspect, "a") == 0
    await other.release()
    assert await asyncio.wait_for(task, 10)
    assert multi.fencing_tokens[0] == single.fencing_token
    assert holding(inspect, "a", b"me")["holds"] == 2 and holding(inspect, "b", b"me")["holds"] == 1
    await multi.release()
    assert holding(inspect, "a", b"me")["holds"] == 1 and info(inspect, "b") is None
    await single.release()


async def test_a_reentrant_multilock_reenters_every_lock(r, inspect):
    multi = MultiLock(r, ["a", "b"], timeout=10, reentrant=True)
    assert await multi.acquire(blocking=False)
    tokens = multi.fencing_tokens
    assert await multi.acquire(blocking=False)
    assert multi.fencing_tokens == tokens and info(inspect, "a")["holds"] == 2 and info(inspect, "b")["holds"] == 2
    await multi.release()
    assert info(inspect, "a")["holds"] == 1 and await multi.owned()
    await multi.release()
    assert info(inspect, "a") is None and info(inspect, "b") is None and multi.fencing_tokens is None


async def test_release_frees_every_lock_for_its_waiters(r, inspect):
    multi = MultiLock(r, ["a", "b", "c"], timeout=10)
    assert await multi.acquire(blocking=False)
    waiting = [Lock(r, key, timeout=10) for key in ("a", "c")]
    tasks = [asyncio.create_task(lock.acquire(blocking_timeout=10)) for lock in waiting]
    await until(lambda: waiters(inspect, "a") == 1 and waiters(inspect, "c") == 1, what="a waiter at a and c")
    await multi.release()
    assert await asyncio.wait_for(asyncio.gather(*tasks), 10) == [True, True]
    assert info(inspect, "b") is None and multi.fencing_tokens is None
    for lock in waiting:
        await lock.release()
    with pytest.raises(LockError, match="not owned"):
        await multi.release()


async def test_a_wait_that_would_deadlock_raises_deadlock_error_and_queues_nothing(r, inspect):
    a = await hold(r, "x", "A")
    await hold(r, "y", "B")
    b = asyncio.create_task(Lock(r, "x", timeout=30).acquire(blocking_timeout=10, token="B"))
    await until(lambda: waiters(inspect, "x") == 1, what="B to queue for x")
    with pytest.raises(DeadlockError, match="'A' -> 'B' -> 'A'"):
        await MultiLock(r, ["y", "z"], timeout=30).acquire(blocking_timeout=5, token="A")
    assert waiters(inspect, "y") == 0 and info(inspect, "z") is None
    await a.release()
    assert await asyncio.wait_for(b, 10)


async def test_blocking_timeout_returns_false_and_leaves_every_queue(r, inspect):
    await hold(r, "b", "other")
    multi = MultiLock(r, ["a", "b"], timeout=10, blocking_timeout=0.2)
    started = time.monotonic()
    assert await multi.acquire() is False
    assert time.monotonic() - started >= 0.2
    assert info(inspect, "a") is None
    # See tests/test_multilock.py: the queue of b is left a moment later.
    await until(lambda: waiters(inspect, "b") == 0, what="the timed-out wait to leave b's queue")
    with pytest.raises(LockError, match="Unable to acquire"):
        async with multi:
            pass


async def test_context_manager_holds_every_lock(r, inspect):
    async with MultiLock(r, ["a", "b"], timeout=10) as multi:
        assert await multi.owned()
    assert info(inspect, "a") is None and info(inspect, "b") is None


async def test_a_cancelled_task_leaves_every_queue(r, inspect):
    await hold(r, "b", "other")
    task = asyncio.create_task(MultiLock(r, ["a", "b"], timeout=10).acquire(blocking_timeout=10))
    await until(lambda: waiters(inspect, "b") == 1, what="the MultiLock to queue")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await until(lambda: waiters(inspect, "b") == 0 and info(inspect, "a") is None, what="the wait to leave the queues")


@pytest.mark.parametrize("kind", ["multilock", "lock-without-session", "lock"])
async def test_a_cancel_as_the_wait_is_written_is_not_lost(r, inspect, kind):
    # redis-py writes through asyncio.wait_for, which before Python 3.12
    # loses a cancel that comes as the write completes: the task waited on
    # (about one round in ten here). Cancelled the moment the server has
    # the wait, every round must raise.
    await hold(r, "b", "other")
    make = {
        "multilock": lambda: MultiLock(r, ["a", "b"], timeout=10),
        "lock-without-session": lambda: Lock(r, "b", timeout=10, use_session=False),
        "lock": lambda: Lock(r, "b", timeout=10),
    }[kind]
    for _ in range(40):
        task = asyncio.create_task(make().acquire(blocking_timeout=2))
        deadline = time.monotonic() + 5
        while waiters(inspect, "b") == 0:
            assert time.monotonic() < deadline, "the wait did not queue"
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await until(lambda: waiters(inspect, "b") == 0, what="the wait to leave the queue")
    assert info(inspect, "a") is None


async def test_extend_and_reacquire_renew_every_lease(r, inspect):
    multi = MultiLock(r, ["a", "b"], timeout=1)
    assert await multi.acquire(blocking=False)
    assert await multi.extend(10)
    assert all(1000 < info(inspect, key)["ttl-ms"] <= 11000 for key in ("a", "b"))
    assert await multi.reacquire()
    assert all(0 < info(inspect, key)["ttl-ms"] <= 1000 for key in ("a", "b"))
    await multi.release()
    with pytest.raises(LockError, match="unlocked"):
        multi.extend(1)


async def test_watchdog_keeps_every_lease_alive_and_reports_one_loss(r, inspect):
    losses = []
    multi = MultiLock(r, ["a", "b"], watchdog_timeout=1.2, on_lost=lambda lock, why: losses.append((lock, why)))
    renewals = calls(inspect, "flock.renew")
    assert await multi.acquire(blocking=False)
    acquired = time.monotonic()
    await until_read(lambda: calls(inspect, "flock.renew") >= renewals + 4 and time.monotonic() - acquired > 1.6,
                     what="two renewals of each key")
    assert await multi.owned() and not multi.lost
    for key in ("a", "b"):
        inspect.execute_command("FLOCK.FORCERELEASE", key)
    grants = multi._grants()
    await until(lambda: all(grant.lost for grant in grants), what="the watchdog to find both losses")
    await until(lambda: losses, what="on_lost (called after lost is set)")
    assert len(losses) == 1 and losses[0][0] is multi and losses[0][1] == "notowner"
    with pytest.raises(LockNotOwnedError, match="NOTOWNER"):
        await multi.release()


@pytest.fixture()
def proxy(server):
    proxy = ReplyDropper(server.port)
    yield proxy
    proxy.close()


async def test_lost_acquire_and_release_replies_are_resent_and_applied_once(proxy, inspect):
    client = redis.asyncio.Redis(port=proxy.port, retry=Retry(NoBackoff(), 0))
    multi = MultiLock(client, ["a", "b"], timeout=10, reentrant=True)
    assert await multi.acquire(blocking=False)
    proxy.drop_reply_to(b"FLOCK.ACQUIREALL")
    assert await multi.acquire(blocking_timeout=5)
    assert proxy.drops == 1 and info(inspect, "a")["holds"] == 2 and info(inspect, "b")["holds"] == 2
    proxy.drop_reply_to(b"FLOCK.RELEASEALL")
    await multi.release()
    assert proxy.drops == 2 and info(inspect, "a")["holds"] == 1 and info(inspect, "b")["holds"] == 1
    await multi.release()
    assert info(inspect, "a") is None
    await client.aclose()


async def test_a_wait_whose_every_reply_was_lost_gives_its_grant_back(proxy, inspect):
    client = redis.asyncio.Redis(port=proxy.port, retry=Retry(NoBackoff(), 0))
    multi = MultiLock(client, ["a", "b"], timeout=10)
    # The first send and its three resends.
    proxy.drop_reply_to(b"WAIT", times=4)
    with pytest.raises(redis.exceptions.ConnectionError):
        await multi.acquire(blocking_timeout=5)
    assert proxy.drops == 4
    assert info(inspect, "a") is None and info(inspect, "b") is None and multi.fencing_tokens is None
    await client.aclose()


async def test_a_release_whose_every_reply_was_lost_counts_as_done(proxy, inspect):
    """As the blocking flavour's: the hold counts as released (a reentrant
    owner's next grant would give it back if the server kept it)."""
    client = redis.asyncio.Redis(port=proxy.port, retry=Retry(NoBackoff(), 0))
    multi = MultiLock(client, ["a", "b"], timeout=10)
    assert await multi.acquire(blocking=False)
    # The first send and its three resends: applied, never answered.
    proxy.drop_reply_to(b"FLOCK.RELEASEALL", times=4)
    with pytest.raises(redis.exceptions.ConnectionError):
        await multi.release()
    assert info(inspect, "a") is None and info(inspect, "b") is None
    assert multi.fencing_tokens is None
    with pytest.raises(LockError):
        await multi.release()
    await client.aclose()


async def test_a_cancelled_release_is_resent_by_the_next(r, inspect):
    """A release() cancelled while its reply is awaited (the server paused:
    the command is dropped with its connection, which redis-py closes) keeps
    the grant, as redis-py's asyncio lock keeps its token: the next release()
    sends the same request, applied once."""
    multi = MultiLock(r, ["a", "b"], timeout=10)
    assert await multi.acquire(blocking=False)
    await cancel_while_paused(inspect, multi.release(), "flock.releaseall")
    assert multi.fencing_tokens is not None
    assert info(inspect, "a")["holds"] == 1 and info(inspect, "b")["holds"] == 1
    await multi.release()
    assert multi.fencing_tokens is None
    assert info(inspect, "a") is None and info(inspect, "b") is None


async def test_cluster_hash_tagged_keys_and_cross_slot_error(cluster, rc):
    keys = ["{account:42}:from", "{account:42}:to"]
    node = cluster.clients[cluster.index_of_key(keys[0])]
    holder = await hold(rc, keys[1], "holder")
    multi = MultiLock(rc, keys, timeout=10)
    task = asyncio.create_task(multi.acquire(blocking_timeout=10))
    await until(lambda: waiters(node, keys[1]) == 1, what="the MultiLock to queue on the keys' node")
    await holder.release()
    assert await asyncio.wait_for(task, 10)
    assert [info(node, key)["token"] for key in keys] == multi.fencing_tokens
    await multi.release()
    apart = [cluster.key_on(0, "apart"), cluster.key_on(1, "apart")]
    with pytest.raises(CrossSlotError, match="hash tag") as raised:
        await MultiLock(rc, apart, timeout=10).acquire(blocking=False)
    assert isinstance(raised.value, ClusterCrossSlotError)
    assert info(cluster.clients[0], apart[0]) is None and info(cluster.clients[1], apart[1]) is None
