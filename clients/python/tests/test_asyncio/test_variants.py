"""redis_flock.asyncio's ReadWriteLock and Semaphore: the rules of
tests/test_variants.py through the asyncio flavour, with tasks as waiters."""

import asyncio

import pytest
from helpers import info, until

from redis_flock import UpgradeError, WrongModeError
from redis_flock.asyncio import Lock, ReadWriteLock, Semaphore


async def queue(inspect, lock, waiters):
    """``lock.acquire()`` as a task, returned once it is the ``waiters``-th in
    the queue."""
    task = asyncio.create_task(lock.acquire(blocking_timeout=10))
    await until(lambda: info(inspect, lock.name)["waiters"] == waiters, what=f"waiter {waiters} to queue")
    return task


async def test_queued_writer_blocks_later_readers_then_writer_may_read(r, inspect):
    reader = ReadWriteLock(r, "rw", timeout=10).read_lock()
    assert await reader.acquire(blocking=False)
    other = ReadWriteLock(r, "rw", timeout=10).read_lock()
    assert await other.acquire(blocking=False)
    lock = ReadWriteLock(r, "rw", timeout=10)
    writer = await queue(inspect, lock.write_lock(), 1)
    late_reader = ReadWriteLock(r, "rw", timeout=10).read_lock()
    late = await queue(inspect, late_reader, 2)
    await reader.release()
    await other.release()
    assert await writer and await lock.write_lock().owned() and not late.done()
    assert await lock.read_lock().acquire(blocking=False)
    assert lock.read_lock().fencing_token == lock.write_lock().fencing_token
    await lock.read_lock().release()
    await lock.write_lock().release()
    assert await late and await late_reader.owned()
    await late_reader.release()


async def test_reader_asking_to_write_gets_upgrade_error(r, inspect):
    lock = ReadWriteLock(r, "rw", timeout=10)
    assert await lock.read_lock().acquire(blocking=False)
    with pytest.raises(UpgradeError, match="UPGRADE"):
        await lock.write_lock().acquire()
    assert info(inspect, "rw")["waiters"] == 0 and await lock.read_lock().owned()
    await lock.read_lock().release()


async def test_semaphore_limit_and_big_request_at_the_head(r, inspect):
    holder = Semaphore(r, "pool", 3, timeout=10, permits=2)
    assert await holder.acquire(blocking=False)
    big = Semaphore(r, "pool", 3, timeout=10, permits=2)
    big_task = await queue(inspect, big, 1)
    small = Semaphore(r, "pool", 3, timeout=10)
    assert not await small.acquire(blocking=False)
    small_task = await queue(inspect, small, 2)
    await holder.release()
    assert await big_task and await small_task
    assert big.fencing_token < small.fencing_token
    assert sum(h["permits"] for h in info(inspect, "pool")["holders"]) == 3
    with pytest.raises(WrongModeError, match="WRONGMODE"):
        await Lock(r, "pool", timeout=10).acquire(blocking=False)
    await big.release()
    await small.release()
