"""Stale holds (docs/client-protocol.md, "Durable grants", last paragraph):
a release refused (NOREPLICAS, as a master with min-replicas-to-write and no
replica answers) or lost (answered by a master a failover deposes, its
replica promoted with the hold: here the key's DUMP from before the release
RESTOREd) leaves the hold on the server. The same thread's next acquire
reenters it with the same token; the client gives the stale holds back, so
the caller holds one hold and one release frees the lock for a waiter."""

import pytest
import redis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError, ResponseError
from redis.retry import Retry

from helpers import ReplyDropper, holding, info, queue_in_thread
from redis_flock import Lock, ReadWriteLock
from redis_flock._core import RESENDS

KEY = "stale"


def refused_release(m, lock):
    """lock.release() refused with NOREPLICAS; the server keeps the hold."""
    m.config_set("min-replicas-to-write", 1)
    try:
        with pytest.raises(ResponseError, match="NOREPLICAS"):
            lock.release()
    finally:
        m.config_set("min-replicas-to-write", 0)


def lost_release(m, lock):
    """lock.release() answered 0, then lost: the key as it was before it."""
    before = m.dump(KEY)
    lock.release()
    assert info(m, KEY) is None
    m.restore(KEY, 0, before, replace=True)


def one_release_frees_it_for_a_waiter(m, lock):
    waiter = Lock(m, KEY, timeout=30, thread_local=False)
    thread, result = queue_in_thread(m, waiter)
    lock.release()
    thread.join(10)
    assert result == [True]
    assert info(m, KEY)["token"] == waiter.fencing_token
    waiter.release()


@pytest.mark.parametrize("use_session", [True, False], ids=["session", "blocking"])
@pytest.mark.parametrize("lose", [refused_release, lost_release], ids=["refused", "lost"])
def test_a_reentered_stale_hold_is_given_back(m, use_session, lose):
    lock = Lock(m, KEY, timeout=30, reentrant=True, use_session=use_session)
    assert lock.acquire()
    token = lock.fencing_token
    lose(m, lock)
    assert holding(m, KEY, lock.local.token or _owner(lock))["holds"] == 1
    assert lock.fencing_token is None
    for _ in range(3):
        # The loop that kept the lock from everyone: each acquire reenters.
        assert lock.acquire(blocking_timeout=5)
        assert lock.fencing_token == token
        assert info(m, KEY)["holds"] == 1
        lose(m, lock)
    assert lock.acquire(blocking_timeout=5)
    assert info(m, KEY)["holds"] == 1
    one_release_frees_it_for_a_waiter(m, lock)


def test_a_grant_whose_replies_were_all_lost_is_given_back_by_the_next_grant(m, solo):
    """An acquire whose every reply was lost (a failover ended the resends)
    may have been granted: a hold its thread does not know of. The owner's
    next grant, a reentry of it, gives that hold back, so that one release
    frees the lock (before, each acquire and release of the thread left it,
    and the Java client's Sentinel failover test saw such a thread keep the
    lock from the others)."""
    proxy = ReplyDropper(solo.port)
    client = redis.Redis(port=proxy.port, retry=Retry(NoBackoff(), 0))
    try:
        lock = Lock(client, KEY, timeout=30, reentrant=True)
        proxy.drop_reply_to(b"FLOCK.ACQUIRE", RESENDS + 1)
        with pytest.raises(ConnectionError):
            lock.acquire(blocking=False)
        assert proxy.drops == RESENDS + 1
        assert info(m, KEY)["holds"] == 1, "granted by the first send, unknown to the thread"
        assert lock.acquire(blocking=False), "a reentry of that grant"
        assert info(m, KEY)["holds"] == 1, "the hold the thread did not know of was given back"
        lock.release()
        assert info(m, KEY) is None, "one release frees the lock"
    finally:
        client.close()
        proxy.close()


def test_a_reentry_of_a_held_grant_keeps_its_holds(m):
    """Not stale: the thread still holds the grant (a reentry it counts)."""
    lock = Lock(m, KEY, timeout=30, reentrant=True)
    assert lock.acquire() and lock.acquire()
    assert info(m, KEY)["holds"] == 2
    lock.release()
    assert lock.acquire()
    assert info(m, KEY)["holds"] == 2
    lock.release()
    lock.release()
    assert info(m, KEY) is None


def test_a_released_grant_is_not_stale_for_a_new_one(m):
    lock = Lock(m, KEY, timeout=30, reentrant=True)
    assert lock.acquire()
    token = lock.fencing_token
    lock.release()
    assert lock.acquire()
    assert lock.fencing_token != token
    assert info(m, KEY)["holds"] == 1
    lock.release()


def test_the_other_side_of_a_read_write_lock_keeps_its_holds(m):
    """A writer that also reads: the read side's release refused, its next
    read reenters; the stale read hold goes back, the write hold stays."""
    rw = ReadWriteLock(m, KEY, timeout=30)
    write, read = rw.write_lock(), rw.read_lock()
    assert write.acquire()
    assert read.acquire()
    assert info(m, KEY)["holds"] == 2
    refused_release(m, read)
    assert info(m, KEY)["holds"] == 2
    assert read.acquire()
    assert info(m, KEY)["holds"] == 2
    read.release()
    write.release()
    assert info(m, KEY) is None


def test_a_lost_release_of_the_other_side_of_a_read_write_lock_is_given_back(m):
    """The read side's release answered 1 (the write hold) and was lost: the
    next read reenters, the stale read hold goes back, the write one stays."""
    rw = ReadWriteLock(m, KEY, timeout=30)
    write, read = rw.write_lock(), rw.read_lock()
    assert write.acquire()
    assert read.acquire()
    before = m.dump(KEY)
    read.release()
    assert info(m, KEY)["holds"] == 1
    m.restore(KEY, 0, before, replace=True)
    assert read.acquire()
    assert info(m, KEY)["holds"] == 2
    read.release()
    write.release()
    assert info(m, KEY) is None
    # And the write side released first (the read hold left) is no stale hold.
    assert write.acquire()
    assert read.acquire()
    write.release()
    assert write.acquire()
    assert info(m, KEY)["holds"] == 2
    write.release()
    read.release()
    assert info(m, KEY) is None


def test_only_owners_that_acquire_again_are_remembered(m):
    """A lock that makes a new owner per acquire (not reentrant, no token=)
    never reenters: its releases are not remembered. With token=, the owner
    comes back, and a lost release is given back as above."""
    from redis_flock._core import RELEASED

    before = len(RELEASED.tokens)
    lock = Lock(m, KEY, timeout=30)
    for _ in range(3):
        assert lock.acquire()
        lock.release()
    assert len(RELEASED.tokens) == before
    assert lock.acquire(token="mine")
    lost_release(m, lock)
    assert lock.acquire(token="mine")
    assert info(m, KEY)["holds"] == 1
    lock.release()
    assert info(m, KEY) is None


def _owner(lock):
    import threading

    return f"{lock._object_id}:{threading.get_ident()}".encode()
