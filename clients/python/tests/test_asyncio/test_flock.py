"""What redis_flock.asyncio.Lock adds to redis-py's asyncio Lock: FIFO waits
(through the session, cancellable), fencing tokens, the watchdog as a task,
request IDs."""

import asyncio
import time

import pytest
import redis.asyncio
import redis_flock.asyncio
from helpers import ReplyDropper, calls, holding, info, lock_kinds, until, until_read
from redis.backoff import NoBackoff
from redis.exceptions import LockNotOwnedError
from redis.retry import Retry

from redis_flock.asyncio import Lock


async def test_waiters_are_granted_in_fifo_order(r, inspect):
    holder = Lock(r, "fifo", timeout=10)
    assert await holder.acquire(blocking=False)
    granted = []

    async def worker(i):
        lock = Lock(r, "fifo", timeout=10)
        assert await lock.acquire(blocking_timeout=10)
        granted.append((i, lock.fencing_token))
        await lock.release()

    tasks = []
    for i in range(5):
        tasks.append(asyncio.create_task(worker(i)))
        await until(lambda: info(inspect, "fifo")["waiters"] == i + 1, what=f"worker {i} to queue")
    await holder.release()
    await asyncio.gather(*tasks)
    assert [i for i, _ in granted] == list(range(5))
    tokens = [token for _, token in granted]
    assert tokens == sorted(set(tokens))


async def test_cancelled_wait_leaves_the_queue(r, inspect):
    holder = Lock(r, "cancel", timeout=10)
    assert await holder.acquire(blocking=False)
    waiter = asyncio.create_task(Lock(r, "cancel", timeout=10).acquire())
    await until(lambda: info(inspect, "cancel")["waiters"] == 1, what="the waiter to queue")
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await until(lambda: info(inspect, "cancel")["waiters"] == 0, what="the waiter to leave")
    await holder.release()
    assert info(inspect, "cancel") is None


KINDS = lock_kinds(redis_flock.asyncio)


@pytest.fixture(params=list(KINDS))
def kind(request):
    """Lock, ReadLock or a Semaphore of 2: each runs the tests that take it."""
    return KINDS[request.param]


async def test_a_lock_without_timeout_holds_a_session_grant_renewed_by_nothing(r, inspect, kind):
    lock = kind(r, "sg", session_timeout=2.0)
    renewals = calls(inspect, "flock.renew")
    assert await lock.acquire(blocking=False)
    mine = holding(inspect, "sg", lock.local.token)
    assert mine["session"] == 1 and 0 < mine["ttl-ms"] <= 2000
    # Held past its session's timeout twice over by the heartbeat alone.
    await asyncio.sleep(4.1)
    assert await lock.owned() and not lock.lost and calls(inspect, "flock.renew") == renewals
    assert lock.local.grant.renewal_timer is None and lock.local.grant.deadline_timer is None
    await lock.release()
    assert info(inspect, "sg") is None


async def test_watchdog_keeps_a_short_lease_alive(r, inspect, kind):
    # Without a session: a lease, renewed.
    lock = kind(r, "wd", watchdog_timeout=1.2, use_session=False)
    renewals = calls(inspect, "flock.renew")
    assert await lock.acquire(blocking=False)
    start = info(inspect, "wd")["token"]
    acquired = time.monotonic()
    # Four renewals and more than a lease: without them the lock would be gone.
    await until_read(
        lambda: calls(inspect, "flock.renew") >= renewals + 4 and time.monotonic() - acquired > 1.2,
        what="four renewals",
    )
    assert await lock.owned() and not lock.lost
    assert holding(inspect, "wd", lock.local.token)["token"] == start
    await lock.release()
    assert info(inspect, "wd") is None


async def test_watchdog_reports_loss_after_forcerelease(r, inspect):
    lock = Lock(r, "wd", watchdog_timeout=0.3, use_session=False)
    assert await lock.acquire(blocking=False)
    inspect.execute_command("FLOCK.FORCERELEASE", "wd")
    await until(lambda: lock.lost, what="the watchdog to report the loss")
    assert lock.lost_reason == "notowner" and lock.lost_detail.startswith("NOTOWNER")
    assert not await lock.owned()
    with pytest.raises(LockNotOwnedError, match="NOTOWNER"):
        await lock.release()


async def test_lost_release_reply_is_resent_and_applied_once(server, inspect, kind):
    proxy = ReplyDropper(server.port)
    client = redis.asyncio.Redis(port=proxy.port, retry=Retry(NoBackoff(), 0))
    lock = kind(client, "resend", timeout=10, reentrant=True)
    assert await lock.acquire(blocking=False) and await lock.acquire(blocking=False)
    proxy.drop_reply_to(b"FLOCK.RELEASE")
    await lock.release()
    assert proxy.dropped.is_set()
    assert holding(inspect, "resend", lock.local.token)["holds"] == 1 and await lock.owned()
    await lock.release()
    await client.aclose()
    proxy.close()


async def test_fenced_runs_the_command_while_the_grant_holds_and_refuses_it_once_the_grant_ended(r):
    lock = Lock(r, "fenced", timeout=30, use_session=False)
    assert await lock.acquire(blocking=False)
    assert await lock.fenced("SET", "fenced:data", "held") in (b"OK", "OK", True)
    assert await r.execute_command("FLOCK.FORCERELEASE", "fenced") == 1
    with pytest.raises(redis_flock.StaleTokenError):
        await lock.fenced("SET", "fenced:data", "late")
    assert lock.lost and await r.get("fenced:data") == b"held"
    with pytest.raises(LockNotOwnedError):
        await lock.release()
