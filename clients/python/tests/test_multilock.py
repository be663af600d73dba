"""redis_flock.MultiLock: several locks for one owner, all or none, through
FLOCK.ACQUIREALL and FLOCK.RELEASEALL; on one server, through lost
replies, on a Redis Cluster (hash-tagged keys) and a Sentinel master."""

import threading
import time

import pytest
import redis
from redis.exceptions import ClusterCrossSlotError, ConnectionError, LockError, LockNotOwnedError
from redis.sentinel import Sentinel

from helpers import calls, holding, info, wait_until
from redis_flock import AcquireCancelled, CancelToken, CrossSlotError, DeadlockError, Lock, MultiLock
from test_flock import via_proxy  # noqa: F401 (a fixture)
from test_topologies import rc  # noqa: F401 (a fixture)


def waiters(r, key) -> int:
    fields = info(r, key)
    return 0 if fields is None else fields["waiters"]


def in_thread(target):
    """Runs ``target()`` in a thread: (the thread, [its result])."""
    result = []
    thread = threading.Thread(target=lambda: result.append(target()))
    thread.start()
    return thread, result


def hold(r, name, owner):
    """``name`` held by ``owner`` (another caller), for 30 s."""
    lock = Lock(r, name, timeout=30, thread_local=False)
    assert lock.acquire(blocking=False, token=owner)
    return lock


def test_a_try_takes_every_lock_or_none(r):
    other = hold(r, "b", "other")
    multi = MultiLock(r, ["a", "b", "c"], timeout=10)
    assert multi.acquire(blocking=False) is False
    # Nothing taken, nothing queued: a and c are as free as before.
    assert info(r, "a") is None and info(r, "c") is None and info(r, "b")["waiters"] == 0
    assert multi.fencing_tokens is None and not multi.owned() and multi.locked()
    other.release()
    assert multi.acquire(blocking=False)
    tokens = multi.fencing_tokens
    assert [info(r, key)["token"] for key in ("a", "b", "c")] == tokens
    assert all(info(r, key)["holds"] == 1 for key in ("a", "b", "c"))
    assert multi.owned()


def test_a_wait_is_granted_when_the_last_lock_frees(r):
    first, second = hold(r, "a", "one"), hold(r, "b", "two")
    multi = MultiLock(r, ["a", "b"], timeout=10, thread_local=False)
    thread, result = in_thread(lambda: multi.acquire(blocking_timeout=10))
    wait_until(lambda: waiters(r, "a") == 1 and waiters(r, "b") == 1, what="the MultiLock to queue at both keys")
    first.release()
    # a is free, and kept for the MultiLock: nobody holds it, it waits on.
    assert info(r, "a")["owner"] is None and info(r, "a")["waiters"] == 1
    assert thread.is_alive() and result == []
    second.release()
    thread.join(10)
    assert result == [True]
    assert [info(r, key)["token"] for key in ("a", "b")] == multi.fencing_tokens
    multi.release()


def test_a_waiting_multilock_is_served_before_a_single_waiter_behind_it(r):
    holder = hold(r, "b", "holder")
    granted = []

    def take(lock, what):
        assert lock.acquire(blocking_timeout=10)
        granted.append((what, info(r, "a")["token"]))
        lock.release()

    multi = MultiLock(r, ["a", "b"], timeout=10)
    multi_thread, _ = in_thread(lambda: take(multi, "multi"))
    wait_until(lambda: waiters(r, "a") == 1 and waiters(r, "b") == 1, what="the MultiLock to queue")
    # a is free but the MultiLock has its place: a try does not cut in.
    assert Lock(r, "a", timeout=10).acquire(blocking=False) is False
    single = Lock(r, "a", timeout=10)
    single_thread, _ = in_thread(lambda: take(single, "single"))
    wait_until(lambda: waiters(r, "a") == 2, what="the single waiter to queue behind it")
    holder.release()
    multi_thread.join(10)
    single_thread.join(10)
    assert [what for what, _ in granted] == ["multi", "single"]
    assert granted[0][1] < granted[1][1]


def test_a_lock_its_owner_holds_is_reentered(r):
    # One owner across a single lock and a MultiLock: acquire(token=...).
    single = Lock(r, "a", timeout=30, thread_local=False)
    assert single.acquire(blocking=False, token="me")
    other = hold(r, "b", "other")
    multi = MultiLock(r, ["a", "b"], timeout=30, thread_local=False)
    thread, result = in_thread(lambda: multi.acquire(blocking_timeout=10, token="me"))
    wait_until(lambda: waiters(r, "b") == 1, what="the MultiLock to queue for b")
    # It holds a already: it does not queue there.
    assert waiters(r, "a") == 0
    other.release()
    thread.join(10)
    assert result == [True]
    assert multi.fencing_tokens[0] == single.fencing_token
    assert holding(r, "a", b"me")["holds"] == 2 and holding(r, "b", b"me")["holds"] == 1
    multi.release()
    assert holding(r, "a", b"me")["holds"] == 1 and info(r, "b") is None
    single.release()
    assert info(r, "a") is None


def test_a_reentrant_multilock_reenters_every_lock_in_its_thread(r):
    multi = MultiLock(r, ["a", "b"], timeout=10, reentrant=True)
    assert multi.acquire(blocking=False)
    tokens = multi.fencing_tokens
    assert multi.acquire(blocking=False)
    assert multi.fencing_tokens == tokens
    assert info(r, "a")["holds"] == 2 and info(r, "b")["holds"] == 2
    # Another thread is another owner.
    thread, result = in_thread(lambda: multi.acquire(blocking=False))
    thread.join()
    assert result == [False]
    multi.release()
    assert info(r, "a")["holds"] == 1 and info(r, "b")["holds"] == 1 and multi.owned()
    multi.release()
    assert info(r, "a") is None and info(r, "b") is None and multi.fencing_tokens is None


def test_a_default_multilock_is_a_new_owner_per_acquire_as_redis_py(r):
    multi = MultiLock(r, ["a", "b"], timeout=10)
    assert multi.acquire(blocking=False)
    assert multi.acquire(blocking=False) is False
    assert info(r, "a")["holds"] == 1
    multi.release()


def test_release_frees_every_lock_for_its_waiters(r):
    multi = MultiLock(r, ["a", "b", "c"], timeout=10)
    assert multi.acquire(blocking=False)
    waiting = [Lock(r, key, timeout=10, thread_local=False) for key in ("a", "c")]
    threads = [in_thread(lambda lock=lock: lock.acquire(blocking_timeout=10)) for lock in waiting]
    wait_until(lambda: waiters(r, "a") == 1 and waiters(r, "c") == 1, what="a waiter at a and c")
    multi.release()
    for thread, result in threads:
        thread.join(10)
        assert result == [True]
    assert info(r, "b") is None and not multi.owned() and multi.fencing_tokens is None
    for lock in waiting:
        assert lock.owned()
        lock.release()
    with pytest.raises(LockError, match="not owned"):
        multi.release()


def test_a_wait_that_would_deadlock_raises_deadlock_error_and_queues_nothing(r):
    a = hold(r, "x", "A")
    hold(r, "y", "B")
    b_thread, b_result = in_thread(lambda: Lock(r, "x", timeout=30).acquire(blocking_timeout=10, token="B"))
    wait_until(lambda: waiters(r, "x") == 1, what="B to queue for x")
    with pytest.raises(DeadlockError, match="'A' -> 'B' -> 'A'") as raised:
        MultiLock(r, ["y", "z"], timeout=30).acquire(blocking_timeout=5, token="A")
    assert isinstance(raised.value, LockError)
    assert waiters(r, "y") == 0 and info(r, "z") is None
    a.release()
    b_thread.join(10)
    assert b_result == [True]


def test_blocking_timeout_returns_false_and_leaves_every_queue(r):
    hold(r, "b", "other")
    multi = MultiLock(r, ["a", "b"], timeout=10, blocking_timeout=0.2)
    started = time.monotonic()
    assert multi.acquire() is False
    assert time.monotonic() - started >= 0.2
    assert info(r, "a") is None
    # The server answers the timeout a moment (about a millisecond) before
    # the wait leaves the queue of a key other than its first.
    wait_until(lambda: waiters(r, "b") == 0, what="the timed-out wait to leave b's queue")
    with pytest.raises(LockError, match="Unable to acquire") as raised:
        with multi:
            pass
    assert raised.value.lock_name == ["a", "b"]


def test_context_manager_holds_every_lock(r):
    with MultiLock(r, ["a", "b"], timeout=10) as multi:
        assert multi.owned() and info(r, "a")["token"] == multi.fencing_tokens[0]
    assert info(r, "a") is None and info(r, "b") is None


def test_a_cancelled_wait_leaves_every_queue(r):
    hold(r, "b", "other")
    token = CancelToken()
    multi = MultiLock(r, ["a", "b"], timeout=10)

    def wait():
        with pytest.raises(AcquireCancelled):
            multi.acquire(blocking_timeout=10, cancel=token)
        return "cancelled"

    thread, result = in_thread(wait)
    wait_until(lambda: waiters(r, "b") == 1, what="the MultiLock to queue")
    token.cancel()
    thread.join(10)
    assert result == ["cancelled"]
    wait_until(lambda: waiters(r, "b") == 0 and info(r, "a") is None, what="the wait to leave the queues")


def test_extend_and_reacquire_renew_every_lease(r):
    multi = MultiLock(r, ["a", "b"], timeout=1)
    assert multi.acquire(blocking=False)
    assert multi.extend(10)
    assert all(1000 < info(r, key)["ttl-ms"] <= 11000 for key in ("a", "b"))
    assert multi.reacquire()
    assert all(0 < info(r, key)["ttl-ms"] <= 1000 for key in ("a", "b"))
    multi.release()
    with pytest.raises(LockError, match="unlocked"):
        multi.extend(1)


def test_watchdog_keeps_every_lease_alive_and_reports_one_loss(r):
    losses = []
    multi = MultiLock(r, ["a", "b"], watchdog_timeout=1.2, on_lost=lambda lock, why: losses.append((lock, why)))
    renewals = calls(r, "flock.renew")
    assert multi.acquire(blocking=False)
    grants = multi._grants()
    assert all(grant.renewal_timer is not None for grant in grants)
    acquired = time.monotonic()
    # Two rounds for each key and more than a lease: without them both would be gone.
    wait_until(lambda: calls(r, "flock.renew") >= renewals + 4 and time.monotonic() - acquired > 1.6,
               what="two renewals of each key")
    assert multi.owned() and not multi.lost
    for key in ("a", "b"):
        r.execute_command("FLOCK.FORCERELEASE", key)
    wait_until(lambda: all(grant.lost for grant in grants), what="the watchdog to find both losses")
    wait_until(lambda: losses, what="on_lost (called after lost is set)")
    # One call for the MultiLock, not one per key.
    assert len(losses) == 1 and losses[0][0] is multi and losses[0][1] == "notowner"
    assert multi.lost and multi.lost_reason == "notowner" and multi.lost_detail.startswith("NOTOWNER")
    with pytest.raises(LockNotOwnedError, match="NOTOWNER"):
        multi.release()
    assert all(grant.renewal_timer.cancelled for grant in grants)


def test_every_command_carries_a_request_id(r):
    multi = MultiLock(r, ["ids:a", "ids:b"], timeout=10)
    with r.monitor() as monitor:
        assert multi.acquire()
        multi.release()
        sent = []
        while not sent or sent[-1][0] != "FLOCK.RELEASEALL":
            words = monitor.next_command()["command"].split()
            if words[0] in ("FLOCK.ACQUIREALL", "FLOCK.RELEASEALL"):
                sent.append(words)
    assert [words[:4] for words in sent] == [["FLOCK.ACQUIREALL", "2", "ids:a", "ids:b"],
                                              ["FLOCK.RELEASEALL", "2", "ids:a", "ids:b"]]
    assert "WAIT" in sent[0] and all(words[-2] == "ID" for words in sent) and sent[0][-1] != sent[1][-1]


def test_lost_acquire_reply_is_resent_without_an_extra_hold(r, via_proxy):
    proxy, client = via_proxy
    multi = MultiLock(client, ["a", "b"], timeout=10, reentrant=True)
    assert multi.acquire(blocking=False)
    proxy.drop_reply_to(b"FLOCK.ACQUIREALL")
    assert multi.acquire(blocking=False)
    assert proxy.dropped.is_set()
    assert info(r, "a")["holds"] == 2 and info(r, "b")["holds"] == 2
    multi.release()
    multi.release()


def test_lost_wait_reply_is_resent_and_answers_the_same_grant(r, via_proxy):
    proxy, client = via_proxy
    multi = MultiLock(client, ["a", "b"], timeout=10)
    proxy.drop_reply_to(b"WAIT")
    assert multi.acquire(blocking_timeout=5)
    assert proxy.dropped.is_set()
    assert info(r, "a")["holds"] == 1 and [info(r, key)["token"] for key in ("a", "b")] == multi.fencing_tokens
    multi.release()


def test_a_wait_whose_every_reply_was_lost_gives_its_grant_back(r, via_proxy):
    proxy, client = via_proxy
    multi = MultiLock(client, ["a", "b"], timeout=10)
    # The first send and its three resends.
    proxy.drop_reply_to(b"WAIT", times=4)
    with pytest.raises(ConnectionError):
        multi.acquire(blocking_timeout=5)
    assert proxy.drops == 4
    assert info(r, "a") is None and info(r, "b") is None and multi.fencing_tokens is None


def test_lost_release_reply_is_resent_and_applied_once(r, via_proxy):
    proxy, client = via_proxy
    multi = MultiLock(client, ["a", "b"], timeout=10, reentrant=True)
    assert multi.acquire(blocking=False) and multi.acquire(blocking=False)
    proxy.drop_reply_to(b"FLOCK.RELEASEALL")
    multi.release()
    assert proxy.dropped.is_set()
    assert info(r, "a")["holds"] == 1 and info(r, "b")["holds"] == 1 and multi.owned()
    multi.release()
    assert info(r, "a") is None


def test_names_are_a_list_of_distinct_names(r):
    with pytest.raises(TypeError):
        MultiLock(r, "ab")
    with pytest.raises(ValueError):
        MultiLock(r, [])
    with pytest.raises(ValueError):
        MultiLock(r, ["a", b"a"])


def test_cluster_hash_tagged_keys_are_taken_on_their_node(cluster, rc):  # noqa: F811
    keys = ["{account:42}:from", "{account:42}:to"]
    node = cluster.clients[cluster.index_of_key(keys[0])]
    holder = Lock(rc, keys[1], timeout=10)
    assert holder.acquire()
    multi = MultiLock(rc, keys, timeout=10, thread_local=False)
    thread, result = in_thread(lambda: multi.acquire(blocking_timeout=10))
    wait_until(lambda: waiters(node, keys[1]) == 1, what="the MultiLock to queue on the keys' node")
    holder.release()
    thread.join(10)
    assert result == [True]
    assert [info(node, key)["token"] for key in keys] == multi.fencing_tokens
    multi.release()
    assert info(node, keys[0]) is None and info(node, keys[1]) is None


def test_cluster_keys_of_different_slots_raise_cross_slot_error(cluster, rc):  # noqa: F811
    keys = [cluster.key_on(0, "apart"), cluster.key_on(1, "apart")]
    multi = MultiLock(rc, keys, timeout=10)
    with pytest.raises(CrossSlotError, match="hash tag") as raised:
        multi.acquire(blocking=False)
    assert isinstance(raised.value, LockError) and isinstance(raised.value, ClusterCrossSlotError)
    assert raised.value.lock_name == keys
    assert info(cluster.clients[0], keys[0]) is None and info(cluster.clients[1], keys[1]) is None


def test_sentinel_master_for(sentinel_setup):
    sentinel = Sentinel(sentinel_setup.sentinel_addresses(), socket_timeout=5)
    r = sentinel.master_for(sentinel_setup.NAME, socket_timeout=5)
    master = redis.Redis(port=sentinel_setup.master_port())
    keys = ["sentinel:multi:a", "sentinel:multi:b"]
    try:
        holder = Lock(r, keys[0], timeout=10)
        assert holder.acquire()
        multi = MultiLock(r, keys, timeout=10, thread_local=False)
        thread, result = in_thread(lambda: multi.acquire(blocking_timeout=10))
        wait_until(lambda: waiters(master, keys[0]) == 1, what="the MultiLock to queue on the master")
        holder.release()
        thread.join(10)
        assert result == [True]
        assert [info(master, key)["token"] for key in keys] == multi.fencing_tokens
        multi.release()
        assert info(master, keys[1]) is None
    finally:
        master.close()
        r.close()
