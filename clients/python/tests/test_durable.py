"""Durable grants (``durable_replicas``, docs/client-protocol.md "Durable
grants") on a master with one replica started for them (conftest.py): a
grant counts once the replica acknowledged it (RENEW then WAIT on the key's
node); asked for more replicas than answer, the acquire raises
LockNotDurableError within about ``durable_timeout`` and the hold is given
back, whichever way the grant came (a try, a wait through the session or
blocking, a reentry)."""

import os
import signal
import threading
import time

import pytest
import redis

from helpers import ReplyDropper, holding, info, lock_kinds, queue_in_thread, wait_until
import redis_flock
from redis_flock import Lock, LockNotDurableError

KINDS = lock_kinds(redis_flock)


@pytest.fixture()
def m(replicated):
    c = redis.Redis(port=replicated.master.port)
    yield c
    c.flushall()
    c.close()


@pytest.fixture()
def replica(replicated):
    c = redis.Redis(port=replicated.replica.port)
    yield c
    c.close()


def queue_not_durable(m, lock):
    """Starts ``lock.acquire`` (10 s) in a thread and returns once it
    queues: (the thread, the LockNotDurableErrors it raised)."""
    errors = []

    def run():
        try:
            lock.acquire(blocking_timeout=10)
        except LockNotDurableError as e:
            errors.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    wait_until(lambda: info(m, lock.name)["waiters"] == 1, what="the durable waiter to queue")
    return thread, errors


@pytest.mark.parametrize("kind", KINDS)
def test_durable_try_is_on_the_replica_when_it_returns(m, replica, kind):
    lock = KINDS[kind](m, f"durable:try:{kind}", timeout=10, durable_replicas=1)
    assert lock.acquire(blocking=False)
    # WAIT 1 answered 1: the replica has the grant, token and all, already.
    assert holding(replica, lock.name, lock.local.token)["token"] == lock.fencing_token
    lock.release()


@pytest.mark.parametrize("use_session", [True, False], ids=["session", "blocking"])
def test_durable_wait_is_on_the_replica_when_it_returns(m, replica, use_session):
    key = f"durable:wait:{use_session}"
    holder = Lock(m, key, timeout=10)
    assert holder.acquire()
    waiter = Lock(m, key, timeout=10, durable_replicas=1, use_session=use_session)
    seen = []

    def then(lock):
        # In the waiting thread, at once: the replica's entry and the token.
        seen.append((holding(replica, key, lock.local.token)["token"], lock.fencing_token))
        lock.release()

    thread, result = queue_in_thread(m, waiter, then=then)
    holder.release()
    thread.join(10)
    assert result == [True] and len(seen) == 1 and seen[0][0] == seen[0][1]


@pytest.mark.parametrize("kind", KINDS)
def test_not_durable_try_fails_within_the_timeout_and_gives_the_hold_back(m, kind):
    lock = KINDS[kind](m, f"durable:fail:{kind}", timeout=10, durable_replicas=2, durable_timeout=0.3)
    started = time.monotonic()
    with pytest.raises(LockNotDurableError) as raised:
        lock.acquire(blocking=False)
    assert 0.3 <= time.monotonic() - started < 1.5
    assert (raised.value.reached, raised.value.asked) == (1, 2)
    assert "NOTDURABLE" in str(raised.value) and lock.name in str(raised.value)
    assert isinstance(raised.value, redis.exceptions.LockError)
    assert info(m, lock.name) is None
    assert lock.fencing_token is None and not lock.owned()


@pytest.mark.parametrize("use_session", [True, False], ids=["session", "blocking"])
def test_not_durable_wait_gives_the_grant_to_the_next_waiter(m, use_session):
    key = f"durable:next:{use_session}"
    holder = Lock(m, key, timeout=10)
    assert holder.acquire()
    durable = Lock(m, key, timeout=10, durable_replicas=2, durable_timeout=0.3, use_session=use_session)
    first, errors = queue_not_durable(m, durable)
    nxt = Lock(m, key, timeout=10)
    held = []

    def then(lock):
        held.append(info(m, key)["owner"] == lock.local.token)
        lock.release()

    second, result = queue_in_thread(m, nxt, waiters=2, then=then)
    holder.release()
    first.join(10)
    second.join(10)
    assert len(errors) == 1 and errors[0].reached == 1
    # The durable waiter was granted, then gave the hold back: the next
    # waiter got the lock.
    assert result == [True] and held == [True]


def test_not_durable_reentry_gives_back_one_hold_and_the_first_stays(m, replica):
    lock = Lock(m, "durable:reentry", timeout=10, reentrant=True, durable_replicas=1)
    assert lock.acquire()
    token = lock.fencing_token
    lock.durable_replicas, lock.durable_timeout = 2, 0.3
    with pytest.raises(LockNotDurableError):
        lock.acquire()
    assert holding(m, lock.name, lock.local.token)["holds"] == 1
    assert lock.fencing_token == token and lock.owned()
    lock.release()
    assert info(m, lock.name) is None


def test_durable_pushed_grant_counts_the_replica_acknowledging_it_not_an_older_write(replicated, m):
    """A grant pushed to the session was written by the holder's RELEASE:
    WAIT on the waiter's connection alone would count the (stopped)
    replica's acknowledgement of an older write (it does on Redis 8.2 and
    Valkey 9.1, checked by hand: they answer 1). The RENEW before it makes
    the count the grant's."""
    key = "durable:pushed"
    # The holder on a client of its own: its RELEASE, which writes the
    # grant, is on none of the waiter's connections.
    other = redis.Redis(port=replicated.master.port)
    holder = Lock(other, key, timeout=10)
    assert holder.acquire()
    waiter = Lock(m, key, timeout=10, durable_replicas=1, durable_timeout=0.3)
    thread, errors = queue_not_durable(m, waiter)
    # Everything so far acknowledged, then the replica stops.
    assert m.execute_command("WAIT", 1, 5000) == 1
    os.kill(replicated.replica.process.pid, signal.SIGSTOP)
    try:
        holder.release()
        thread.join(10)
    finally:
        os.kill(replicated.replica.process.pid, signal.SIGCONT)
        other.close()
    assert len(errors) == 1 and errors[0].reached == 0
    assert info(m, key) is None
    wait_until(replicated.caught_up, timeout=10, what="the replica to catch up")


@pytest.mark.parametrize("use_session", [True, False], ids=["session", "blocking"])
def test_not_durable_when_the_renew_finds_another_grant_of_the_owner(replicated, m, use_session):
    """A promoted replica that never got the grant but kept an older grant
    of the same owner (its release was lost with the old master) answers
    the durable check's RENEW with that grant's token: this grant is gone.
    Here the grant is replaced while its reply waits behind a partition;
    the replica has every write, so WAIT alone would confirm it."""
    key = f"durable:replaced:{use_session}"
    proxy = ReplyDropper(replicated.master.port)
    client = redis.Redis(port=proxy.port)
    holder = Lock(m, key, timeout=10)
    assert holder.acquire()
    waiter = Lock(client, key, timeout=10, durable_replicas=1, durable_timeout=2, use_session=use_session)
    thread, errors = queue_not_durable(m, waiter)
    try:
        proxy.partition()
        holder.release()
        granted = info(m, key)
        m.execute_command("FLOCK.FORCERELEASE", key)
        older = m.execute_command("FLOCK.ACQUIRE", key, granted["owner"], 10000)
        proxy.heal()
        thread.join(10)
    finally:
        proxy.heal()
        client.close()
        proxy.close()
    assert len(errors) == 1, errors
    assert f"grant (token {granted['token']}) was gone" in str(errors[0])
    assert f"another grant of this owner (token {older})" in str(errors[0])
    assert info(m, key) is None, "the hold was given back"
