"""A wait that would deadlock (two owners taking two locks in opposite
orders) raises DeadlockError at once and queues nothing."""

import threading

import pytest
from helpers import info, wait_until
from redis.exceptions import LockError

from redis_flock import DeadlockError
from redis_flock.lock import Lock


def test_a_wait_that_would_deadlock_raises_deadlock_error_and_queues_nothing(r):
    # One owner per caller across locks: the token (redis-py's acquire(token=)).
    a1 = Lock(r, "dl:1", timeout=30)
    assert a1.acquire(blocking=False, token="A")
    assert Lock(r, "dl:2", timeout=30).acquire(blocking=False, token="B")
    b_waits = []
    b = threading.Thread(target=lambda: b_waits.append(Lock(r, "dl:1", timeout=30).acquire(blocking_timeout=10, token="B")))
    b.start()
    wait_until(lambda: info(r, "dl:1")["waiters"] == 1, what="B to queue for dl:1")
    with pytest.raises(DeadlockError, match="'A' -> 'B' -> 'A'") as raised:
        Lock(r, "dl:2", timeout=30).acquire(blocking_timeout=5, token="A")
    assert isinstance(raised.value, LockError)
    assert info(r, "dl:2")["waiters"] == 0
    a1.release()  # A gives up what it holds: B goes on
    b.join(10)
    assert b_waits == [True]
