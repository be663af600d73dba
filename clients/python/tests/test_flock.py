"""What redis_flock.Lock adds to redis-py's Lock: FIFO waits (through the
session: tests/test_sessions.py), fencing tokens, session grants and the
watchdog (without a session), reentrancy, request IDs."""

import threading
import time

import pytest
import redis
import redis_flock
from helpers import ReplyDropper, calls, holding, info, lock_kinds, owner_of, queue_in_thread, wait_until
from redis.backoff import NoBackoff
from redis.exceptions import LockNotOwnedError
from redis.retry import Retry

from redis_flock import Lock
from redis_flock._backend import TIMERS


def test_waiters_are_granted_in_fifo_order(r):
    holder = Lock(r, "fifo", timeout=10)
    assert holder.acquire(blocking=False)
    granted = []

    def record(lock):
        granted.append((lock, lock.fencing_token))
        lock.release()

    locks = [Lock(r, "fifo", timeout=10) for _ in range(5)]
    # Each one is queued before the next one starts: the queue order is known.
    threads = [queue_in_thread(r, lock, i + 1, then=record)[0] for i, lock in enumerate(locks)]
    holder.release()
    for t in threads:
        t.join()
    assert [lock for lock, _ in granted] == locks
    tokens = [token for _, token in granted]
    assert tokens == sorted(set(tokens))


def test_fencing_token_increases_with_every_grant_and_stays_on_reentry(r):
    lock = Lock(r, "fence", timeout=10, reentrant=True)
    assert lock.fencing_token is None
    assert lock.acquire(blocking=False)
    first = lock.fencing_token
    assert isinstance(first, int) and first > 0
    assert lock.acquire(blocking=False)
    assert lock.fencing_token == first
    lock.release()
    lock.release()
    assert lock.fencing_token is None
    other = Lock(r, "fence", timeout=10)
    assert other.acquire(blocking=False)
    assert other.fencing_token > first
    other.release()


def test_reentrant_lock_counts_holds_per_thread(r):
    lock = Lock(r, "re", timeout=10, reentrant=True)
    assert lock.acquire(blocking=False)
    assert lock.acquire(blocking=False)
    assert info(r, "re")["holds"] == 2
    # Another thread is another owner: it does not reenter.
    elsewhere = []
    t = threading.Thread(target=lambda: elsewhere.append(lock.acquire(blocking=False)))
    t.start()
    t.join()
    assert elsewhere == [False]
    lock.release()
    assert lock.owned() and info(r, "re")["holds"] == 1
    lock.release()
    assert info(r, "re") is None


def test_default_lock_does_not_reenter_as_redis_py(r):
    lock = Lock(r, "nore", timeout=10)
    assert lock.acquire(blocking=False)
    token = lock.local.token
    assert not lock.acquire(blocking=False)
    assert lock.local.token == token and info(r, "nore")["holds"] == 1
    lock.release()


def test_a_wait_holds_no_pool_connection(server, r):
    # A pool of one connection: a wait holding it would starve every other
    # command (it is answered WAITING at once; the session hears the grant).
    pool = redis.BlockingConnectionPool(port=server.port, max_connections=1, timeout=2)
    client = redis.Redis(connection_pool=pool)
    holder = Lock(client, "own", timeout=10)
    assert holder.acquire(blocking=False)
    waiter = Lock(client, "own", timeout=10, thread_local=False)
    t, result = queue_in_thread(r, waiter)
    assert client.ping()
    holder.release()
    t.join()
    assert result == [True]
    waiter.release()
    client.close()


KINDS = lock_kinds(redis_flock)


@pytest.fixture(params=list(KINDS))
def kind(request):
    """Lock, ReadLock or a Semaphore of 2: each runs the tests that take it."""
    return KINDS[request.param]


def test_a_lock_without_timeout_holds_a_session_grant_renewed_by_nothing(r, kind):
    lock = kind(r, "sg", session_timeout=2.0)
    renewals = calls(r, "flock.renew")
    assert lock.acquire(blocking=False)
    mine = holding(r, "sg", lock.local.token)
    # FLOCK.INFO shows the session's timeout as its lease, and its session.
    assert mine["session"] == 1 and 0 < mine["ttl-ms"] <= 2000
    acquired = time.monotonic()
    # Held past its session's timeout twice over by the heartbeat alone.
    wait_until(lambda: time.monotonic() - acquired > 4.1, what="4.1 s")
    assert lock.owned() and not lock.lost and calls(r, "flock.renew") == renewals
    assert lock.local.grant.renewal_timer is None and lock.local.grant.deadline_timer is None
    lock.release()
    assert info(r, "sg") is None


def test_watchdog_keeps_a_short_lease_alive(r, kind):
    # Without a session: a lease, renewed.
    lock = kind(r, "wd", watchdog_timeout=1.2, use_session=False)
    renewals = calls(r, "flock.renew")
    assert lock.acquire(blocking=False)
    acquired = time.monotonic()
    # Four renewals and more than a lease: without them the lock would be gone.
    wait_until(
        lambda: calls(r, "flock.renew") >= renewals + 4 and time.monotonic() - acquired > 1.2, what="four renewals"
    )
    assert lock.owned() and not lock.lost
    assert 0 < holding(r, "wd", lock.local.token)["ttl-ms"] <= 1200
    lock.release()
    assert info(r, "wd") is None


def test_watchdog_reports_loss_after_forcerelease(r):
    lock = Lock(r, "wd", watchdog_timeout=0.3, use_session=False)
    assert lock.acquire(blocking=False)
    r.execute_command("FLOCK.FORCERELEASE", "wd")
    wait_until(lambda: lock.lost, what="the watchdog to report the loss")
    assert lock.lost_reason == "notowner" and lock.lost_detail.startswith("NOTOWNER")
    assert not lock.owned()
    with pytest.raises(LockNotOwnedError, match="NOTOWNER"):
        lock.release()


def test_watchdog_stops_on_release(r):
    # One deadline thread per process times every grant's renewal and
    # deadline (it was a thread per grant): the released grant leaves its
    # schedule.
    lock = Lock(r, "wd-stop", watchdog_timeout=0.3, use_session=False)
    assert lock.acquire(blocking=False)
    grant = lock.local.grant
    assert any(args == (grant,) for _, args in TIMERS.pending())
    assert [t.name for t in threading.enumerate()].count("flock-deadlines") == 1
    lock.release()
    assert not any(grant in args for _, args in TIMERS.pending())


def test_notowner_is_lock_not_owned_error(r):
    lock = Lock(r, "gone", timeout=0.05)
    assert lock.acquire(blocking=False)
    wait_until(lambda: info(r, "gone") is None, what="the lease to end")
    with pytest.raises(LockNotOwnedError, match="NOTOWNER") as raised:
        lock.release()
    assert raised.value.lock_name == "gone"


def test_every_command_carries_a_request_id(r):
    lock = Lock(r, "ids", timeout=10)
    with r.monitor() as monitor:
        lock.acquire(blocking=False)
        lock.extend(1)
        lock.release()
        sent = []
        while not sent or sent[-1][0] != "FLOCK.RELEASE":
            words = monitor.next_command()["command"].split()
            # FLOCK.SESSION and FLOCK.INBOX (the session's) name no key.
            if words[0].startswith("FLOCK.") and words[0] != "FLOCK.INFO" and words[1:2] == ["ids"]:
                sent.append(words)
    assert [words[0] for words in sent] == ["FLOCK.ACQUIRE", "FLOCK.RENEW", "FLOCK.RELEASE"]
    assert all(words[-2] == "ID" for words in sent)
    assert len({words[-1] for words in sent}) == 3


@pytest.fixture(params=[0, 3], ids=["redis-py-no-retry", "redis-py-retry"])
def via_proxy(request, server):
    """A client behind a proxy that can lose a reply; with redis-py's own
    retry off (redis_flock resends) or on (redis-py resends the same args)."""
    proxy = ReplyDropper(server.port)
    client = redis.Redis(port=proxy.port, retry=Retry(NoBackoff(), request.param))
    yield proxy, client
    client.close()
    proxy.close()


def test_lost_release_reply_is_resent_and_applied_once(r, via_proxy, kind):
    proxy, client = via_proxy
    lock = kind(client, "resend", timeout=10, reentrant=True)
    assert lock.acquire(blocking=False) and lock.acquire(blocking=False)
    proxy.drop_reply_to(b"FLOCK.RELEASE")
    lock.release()
    assert proxy.dropped.is_set()
    # Applied once: one hold left, not none.
    assert holding(r, "resend", lock.local.token)["holds"] == 1 and lock.owned()
    lock.release()
    assert info(r, "resend") is None


def test_lost_release_reply_after_handoff_is_not_notowner(r, via_proxy):
    proxy, client = via_proxy
    lock = Lock(client, "handoff", timeout=10)
    assert lock.acquire(blocking=False)
    waiter = Lock(r, "handoff", timeout=10, thread_local=False)
    t, result = queue_in_thread(r, waiter)
    proxy.drop_reply_to(b"FLOCK.RELEASE")
    lock.release()  # the resend answers the first reply, not NOTOWNER
    t.join()
    assert proxy.dropped.is_set() and result == [True]
    assert owner_of(r, "handoff") == waiter.local.token
    waiter.release()


def test_lost_acquire_reply_is_resent_without_an_extra_hold(r, via_proxy):
    proxy, client = via_proxy
    lock = Lock(client, "acq", timeout=10, reentrant=True)
    assert lock.acquire(blocking=False)
    proxy.drop_reply_to(b"FLOCK.ACQUIRE")
    assert lock.acquire(blocking=False)
    assert proxy.dropped.is_set()
    assert info(r, "acq")["holds"] == 2
    lock.release()
    lock.release()


def test_lost_waiting_reply_is_resent_and_the_wait_keeps_its_place(r, via_proxy):
    proxy, client = via_proxy
    holder = Lock(r, "waiting", timeout=10)
    assert holder.acquire(blocking=False)
    waiter = Lock(client, "waiting", timeout=10, thread_local=False)
    assert waiter.acquire(blocking=False) is False  # opens the session first
    proxy.drop_reply_to(b"WAIT")
    t, result = queue_in_thread(r, waiter)
    wait_until(proxy.dropped.is_set, what="the WAITING reply to be dropped")
    # The resend (same request ID) took the first one's place: one waiter.
    assert info(r, "waiting")["waiters"] == 1
    holder.release()
    t.join(10)
    assert result == [True] and waiter.owned()
    waiter.release()


def test_fenced_runs_the_command_while_the_grant_holds_and_refuses_it_once_the_grant_ended(r):
    # No session: nothing tells this process of the force-release, so the server refuses.
    lock = Lock(r, "fenced", timeout=30, use_session=False)
    with pytest.raises(LockNotOwnedError):
        lock.fenced("SET", "fenced:data", "unheld")
    assert lock.acquire(blocking=False)
    assert lock.fenced("SET", "fenced:data", "held") in (b"OK", "OK", True)
    assert lock.fenced("GET", "fenced:data") in (b"held", "held")
    with pytest.raises(redis.ResponseError) as own:
        lock.fenced("INCR", "fenced:data")
    assert not isinstance(own.value, LockNotOwnedError) and not lock.lost, "the command's own error passes"
    assert r.execute_command("FLOCK.FORCERELEASE", "fenced") == 1
    with pytest.raises(redis_flock.StaleTokenError) as stale:
        lock.fenced("SET", "fenced:data", "late")
    assert "STALE" in str(stale.value) and lock.lost and lock.lost_reason == "notowner"
    with pytest.raises(redis_flock.StaleTokenError):
        lock.fenced("SET", "fenced:data", "later")
    assert r.get("fenced:data") == b"held"
    with pytest.raises(LockNotOwnedError):
        lock.release()


def test_lock_delay_is_asked_with_every_acquire_and_keeps_the_lock_closed_after_a_lease_runs_out(r):
    with pytest.raises(ValueError):
        Lock(r, "delayed", lock_delay=61)
    # A long lease, cut short once the holder is read: a loaded machine
    # cannot let it run out before.
    lock = Lock(r, "delayed", timeout=60, lock_delay=0.4)
    assert lock.acquire(blocking=False)
    (holder,) = info(r, "delayed")["holders"]
    assert holder["lock-delay-ms"] == 400
    assert r.execute_command("FLOCK.RENEW", "delayed", holder["owner"], 100)
    wait_until(lambda: (info(r, "delayed") or {}).get("delayed-ms", 0) > 0, timeout=5)
    assert not Lock(r, "delayed", timeout=10).acquire(blocking=False), "closed during the delay"
    wait_until(lambda: info(r, "delayed") is None, timeout=5)
    assert Lock(r, "delayed", timeout=10, lock_delay=0).acquire(blocking=False), "open once it ended"
