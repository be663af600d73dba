"""Deadlines through redis_flock.asyncio.Lock (tests/test_deadlines.py has
the blocking flavour's, and a paused child process of each flavour): a
holder cut off from the server reports its grant lost before the next waiter
is granted it, whatever keeps the grant; a loop held up past a deadline (its
timers and reader with it) sees ``lost`` at its first check."""

import asyncio
import time

import pytest
import pytest_asyncio
import redis
import redis.asyncio
from helpers import ReplyDropper, info, until_read
from redis.backoff import NoBackoff
from redis.retry import Retry

from redis_flock.asyncio import Lock

T = 1.0

KEEPERS = {
    "session": (dict(session_timeout=T), "unconfirmed"),
    "fixed-lease": (dict(timeout=0.5, session_timeout=5), "expired"),
    "watchdog": (dict(use_session=False, watchdog_timeout=T), "unconfirmed"),
}


@pytest_asyncio.fixture()
async def cut_off(server):
    proxy = ReplyDropper(server.port)
    client = redis.asyncio.Redis(port=proxy.port, retry=Retry(NoBackoff(), 0))
    yield proxy, client
    proxy.heal()
    await client.aclose()
    proxy.kill()


@pytest_asyncio.fixture()
async def c(server):
    client = redis.asyncio.Redis(port=server.port)
    yield client
    await client.aclose()


@pytest.mark.parametrize("keeper", list(KEEPERS))
async def test_a_cut_off_holder_reports_the_loss_before_the_next_waiter_is_granted(inspect, c, cut_off, keeper):
    proxy, client = cut_off
    kwargs, reason = KEEPERS[keeper]
    lost_at = []
    holder = Lock(client, "cut", on_lost=lambda lock, why: lost_at.append((time.monotonic(), why)), **kwargs)
    waiter = Lock(c, "cut")

    async def wait():
        granted = await waiter.acquire(blocking_timeout=10)
        return granted, time.monotonic()

    def queued(n):
        return until_read(lambda: (info(inspect, "cut") or {}).get("waiters") == n, what=f"waiter {n} to queue")

    # The holder's turn comes with the next waiter queued behind it already:
    # however late a loaded machine runs the loop, nobody else can be granted
    # the lock before the holder's lease runs out.
    assert inspect.execute_command("FLOCK.ACQUIRE", "cut", "first", 60000) is not None
    taking = asyncio.create_task(holder.acquire(blocking_timeout=10))
    await queued(1)
    task = asyncio.create_task(wait())
    await queued(2)
    assert inspect.execute_command("FLOCK.RELEASE", "cut", "first") == 0
    assert await asyncio.wait_for(taking, 10)
    proxy.partition()
    granted, granted_at = await asyncio.wait_for(task, 10)
    assert granted
    assert lost_at and lost_at[0][1] == reason and holder.lost_reason == reason
    assert lost_at[0][0] < granted_at, f"lost {1000 * (lost_at[0][0] - granted_at):.1f} ms after the next grant"
    print(f"\n{keeper}: loss reported before the next grant by {1000 * (granted_at - lost_at[0][0]):.1f} ms")
    await waiter.release()


@pytest.mark.parametrize("keeper", ["session", "fixed-lease"])
async def test_a_loop_held_up_past_the_deadline_sees_lost_at_its_first_check(inspect, c, keeper):
    kwargs, reason = KEEPERS[keeper]
    seen = []
    lock = Lock(c, "held-up", on_lost=lambda lock, why: seen.append(why), **kwargs)
    assert await lock.acquire()
    # Nothing of the loop runs meanwhile: its timers, its session's reader.
    time.sleep(T + 0.2)  # the pause tested: past both kinds of deadline
    assert lock.lost and lock.lost_reason == reason and seen == [reason]
