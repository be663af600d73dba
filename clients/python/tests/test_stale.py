"""Stale holds (docs/client-protocol.md, the rule "stale holds"): a release
refused (NOREPLICAS, as a master with min-replicas-to-write and no replica
answers) or lost (answered by a master a failover deposes, its replica
promoted with the hold: here the key's DUMP from before the release
RESTOREd; or every reply lost) leaves the hold on the server, and so may an
acquire whose every reply was lost. The same owner's next acquire reenters
it with the same token; the client gives back the holds beyond those of the
process's unreleased handles of that owner, so the caller holds one hold
more than before and its release frees the lock for a waiter."""

import threading

import pytest
import redis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError, LockError, LockNotOwnedError, ResponseError
from redis.retry import Retry

from helpers import ReplyDropper, holding, info, queue_in_thread, remembered
from redis_flock import Lock, MultiLock, ReadWriteLock
from redis_flock._core import ANY_TOKEN, HELD, RELEASED, RESENDS

KEY = "stale"
pytestmark = pytest.mark.usefixtures("forgotten")


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


def test_a_refused_release_of_one_of_several_holds_keeps_the_others(m):
    """Two reentrant holds, one release refused: that hold counts as
    released (its token remembered), the other stays the caller's. The next
    acquire gives back the refused one: two holds, two releases."""
    lock = Lock(m, KEY, timeout=30, reentrant=True)
    assert lock.acquire() and lock.acquire()
    token = lock.fencing_token
    refused_release(m, lock)
    assert lock.fencing_token == token, "one hold is left"
    assert remembered(KEY) == {lock.local.token: token}
    assert info(m, KEY)["holds"] == 2
    assert lock.acquire()
    assert info(m, KEY)["holds"] == 2, "the refused hold given back, the two unreleased kept"
    lock.release()
    assert info(m, KEY)["holds"] == 1
    lock.release()
    assert info(m, KEY) is None
    with pytest.raises(LockError):
        lock.release()


def lost_replies(proxy):
    """A release whose every reply is lost (its first send applied), and
    then lost itself (the key as it was before it): a hold the server
    keeps though the release did not answer."""

    def lose(m, lock):
        before = m.dump(KEY)
        proxy.drop_reply_to(b"FLOCK.RELEASE", RESENDS + 1)
        with pytest.raises(ConnectionError):
            lock.release()
        assert proxy.drops == RESENDS + 1
        m.restore(KEY, 0, before, replace=True)

    return lose


@pytest.mark.parametrize("how", ["refused", "replies lost"])
def test_a_failed_release_is_given_back_by_another_lock_object_of_the_owner(m, solo, how):
    """A caller-named owner used again through another lock object: the
    failed release was remembered in the process's table, not kept by the
    lock object that made it."""
    proxy = ReplyDropper(solo.port)
    client = redis.Redis(port=proxy.port, retry=Retry(NoBackoff(), 0))
    try:
        first = Lock(client, KEY, timeout=30, use_session=False)
        assert first.acquire(token="mine")
        (refused_release if how == "refused" else lost_replies(proxy))(m, first)
        assert first.fencing_token is None, "the failed release counts as released"
        assert info(m, KEY)["holds"] == 1
        second = Lock(client, KEY, timeout=30, use_session=False)
        assert second.acquire(token="mine")
        assert info(m, KEY)["holds"] == 1, "the first object's hold was given back"
        second.release()
        assert info(m, KEY) is None
    finally:
        client.close()
        proxy.close()


def test_the_give_back_leaves_the_holds_of_other_lock_objects_of_the_owner(m):
    """Two lock objects share a caller-named owner: one's release refused,
    its next grant gives back that hold only, not the other object's."""
    first, second = Lock(m, KEY, timeout=30), Lock(m, KEY, timeout=30)
    assert first.acquire(token="mine") and second.acquire(token="mine")
    refused_release(m, second)
    assert info(m, KEY)["holds"] == 2
    assert second.acquire(token="mine")
    assert info(m, KEY)["holds"] == 2
    first.release()
    assert info(m, KEY)["holds"] == 1
    second.release()
    assert info(m, KEY) is None


def test_a_notowner_release_is_not_remembered(m):
    lock = Lock(m, KEY, timeout=30, reentrant=True)
    assert lock.acquire()
    m.execute_command("FLOCK.FORCERELEASE", KEY)
    with pytest.raises(LockNotOwnedError):
        lock.release()
    assert remembered(KEY) == {}


def test_an_acquire_whose_replies_were_all_lost_is_remembered_for_a_named_owner(m, solo):
    """As for a reentrant lock's own owner: the next grant to the caller's
    owner gives back the hold the lost acquire may have taken."""
    proxy = ReplyDropper(solo.port)
    client = redis.Redis(port=proxy.port, retry=Retry(NoBackoff(), 0))
    try:
        lock = Lock(client, KEY, timeout=30)
        proxy.drop_reply_to(b"FLOCK.ACQUIRE", RESENDS + 1)
        with pytest.raises(ConnectionError):
            lock.acquire(blocking=False, token="mine")
        assert remembered(KEY) == {b"mine": ANY_TOKEN}
        assert info(m, KEY)["holds"] == 1, "granted by the first send"
        assert Lock(client, KEY, timeout=30).acquire(blocking=False, token="mine")
        assert info(m, KEY)["holds"] == 1, "the unknown hold was given back"
    finally:
        client.close()
        proxy.close()


def test_an_acquire_the_server_answered_with_an_error_is_not_remembered(m):
    m.set(KEY, "a string")
    lock = Lock(m, KEY, timeout=30, reentrant=True)
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        lock.acquire(blocking=False)
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        lock.acquire(blocking=False, token="mine")
    assert remembered(KEY) == {}


def _owner(lock):
    import threading

    return f"{lock._object_id}:{threading.get_ident()}".encode()


def unknown_hold(m, lock_name, owner):
    """One more hold of ``owner``'s grant that no lock object knows of, as a
    failover's churn leaves one: the reentry of a hold whose release a
    promoted replica lost, after a grant elsewhere replaced its memory."""
    assert m.execute_command("FLOCK.ACQUIRE", lock_name, owner, 10000) is not None


@pytest.mark.parametrize("use_session", [True, False], ids=["session", "blocking"])
@pytest.mark.parametrize("owner", ["reentrant", "token", "per acquire"])
def test_the_last_release_of_an_owner_gives_back_the_holds_left(m, use_session, owner):
    """A release of the process's last hold of (lock, owner) that answers
    holds left: nobody in the process knows of them, so they are given back
    at once and the lock is free (rule "stale holds"). A new owner per
    acquire is never used again: a hold it did not take is stale too."""
    lock = Lock(m, KEY, timeout=30, reentrant=owner == "reentrant", use_session=use_session)
    assert lock.acquire(token="mine" if owner == "token" else None)
    unknown_hold(m, KEY, lock.local.token)
    assert info(m, KEY)["holds"] == 2
    lock.release()
    assert info(m, KEY) is None, "the hold the process never knew of was given back"
    assert lock.fencing_token is None


def test_a_release_leaves_the_holds_of_another_lock_object_of_the_owner(m):
    """Not the process's last hold: another lock object of the owner holds
    one, and the holds left are not given back; its release is the last,
    and gives back the one nobody knows of."""
    first, second = Lock(m, KEY, timeout=30), Lock(m, KEY, timeout=30)
    assert first.acquire(token="mine") and second.acquire(token="mine")
    unknown_hold(m, KEY, "mine")
    first.release()
    assert info(m, KEY)["holds"] == 2, "the second object's hold and the unknown one"
    second.release()
    assert info(m, KEY) is None


def test_the_last_release_of_a_multilock_gives_back_each_keys_holds_left(m):
    locks = MultiLock(m, ["{s}a", "{s}b"], timeout=30)
    assert locks.acquire(token="mine")
    unknown_hold(m, "{s}b", "mine")
    locks.release()
    assert info(m, "{s}a") is None and info(m, "{s}b") is None


class HoldsAcquireReplies(redis.Redis):
    """A client whose FLOCK.ACQUIRE runs on the server and whose reply then
    waits for ``answer``: an acquire granted and not yet answered."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.granted = threading.Event()
        self.answer = threading.Event()

    def execute_command(self, *args, **options):
        reply = super().execute_command(*args, **options)
        if args[0] == "FLOCK.ACQUIRE":
            self.granted.set()
            assert self.answer.wait(10)
        return reply


def test_a_release_leaves_the_hold_of_an_acquire_of_the_owner_in_flight(m, solo):
    """Holds are counted from before the acquire is sent: while another lock
    object's acquire of the owner is granted and not yet answered, a release
    of the process's last counted hold answers 1 (that grant), and leaves it."""
    first = Lock(m, KEY, timeout=30)
    assert first.acquire(token="mine")
    client = HoldsAcquireReplies(port=solo.port)
    second = Lock(client, KEY, timeout=30, use_session=False, thread_local=False)
    result = []
    thread = threading.Thread(target=lambda: result.append(second.acquire(blocking=False, token="mine")))
    thread.start()
    try:
        assert client.granted.wait(10)
        assert info(m, KEY)["holds"] == 2, "the second object's reentry, not yet answered"
        first.release()
        assert info(m, KEY)["holds"] == 1, "left to the acquire in flight"
    finally:
        client.answer.set()
        thread.join(10)
    try:
        assert result == [True]
        assert info(m, KEY)["holds"] == 1
        second.release()
        assert info(m, KEY) is None
    finally:
        client.close()


def test_an_acquire_that_ends_without_a_grant_is_no_longer_counted(m):
    """Busy, a wait's timeout (and any other end without a grant): its count
    is undone, so that the owner's last release still gives back what is
    left."""
    assert Lock(m, KEY, timeout=30).acquire(token="other")
    lock = Lock(m, KEY, timeout=30)
    assert not lock.acquire(blocking=False, token="mine")
    assert HELD.held(KEY, b"mine") == 0
    assert not lock.acquire(blocking_timeout=0.2, token="mine")
    assert HELD.held(KEY, b"mine") == 0
    m.execute_command("FLOCK.FORCERELEASE", KEY)
    assert lock.acquire(token="mine")
    unknown_hold(m, KEY, "mine")
    lock.release()
    assert info(m, KEY) is None
