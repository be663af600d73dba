"""A wait that would deadlock raises DeadlockError at once, through
redis_flock.asyncio.Lock."""

import asyncio

import pytest
from helpers import info, until

from redis_flock import DeadlockError
from redis_flock.asyncio import Lock


async def test_a_wait_that_would_deadlock_raises_deadlock_error(r, inspect):
    a1 = Lock(r, "dl:1", timeout=30)
    assert await a1.acquire(blocking=False, token="A")
    assert await Lock(r, "dl:2", timeout=30).acquire(blocking=False, token="B")
    b = asyncio.create_task(Lock(r, "dl:1", timeout=30).acquire(blocking_timeout=10, token="B"))
    await until(lambda: info(inspect, "dl:1")["waiters"] == 1, what="B to queue for dl:1")
    with pytest.raises(DeadlockError, match="'A' -> 'B' -> 'A'"):
        await Lock(r, "dl:2", timeout=30).acquire(blocking_timeout=5, token="A")
    assert info(inspect, "dl:2")["waiters"] == 0
    await a1.release()
    assert await asyncio.wait_for(b, 10)
