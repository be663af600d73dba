"""ReadWriteLock and Semaphore against the server: readers share, FIFO with
writers (no writer starvation), a writer may read, a reader cannot upgrade,
semaphore limits and a big request at the head, WRONGMODE. The watchdog and
lost-reply tests run on every kind in test_flock.py."""

import threading

import pytest
from helpers import holding, info, queue_in_thread, wait_until
from redis.exceptions import LockError, ResponseError

from redis_flock import Lock, ReadWriteLock, Semaphore, UpgradeError, WrongModeError


def rw(r, name="rw"):
    """A read-write lock whose owner is the object's (thread_local=False), so
    that a thread can acquire for it and the test read its owner."""
    return ReadWriteLock(r, name, timeout=10, thread_local=False)


# FLOCK.INFO's fields that run on between calls: leases left, times held and waited.
MOVING = {"ttl-ms", "held-ms", "oldest-wait-ms", "contended-ms", "longest-wait-ms", "longest-hold-ms"}


def unchanging(fields):
    """FLOCK.INFO without the fields that change with time alone."""
    holders = [{k: v for k, v in h.items() if k not in MOVING} for h in fields["holders"]]
    return {**{k: v for k, v in fields.items() if k not in MOVING}, "holders": holders}


def test_readers_share_with_tokens_of_their_own(r):
    first, second = rw(r).read_lock(), rw(r).read_lock()
    assert first.acquire(blocking=False) and second.acquire(blocking=False)
    fields = info(r, "rw")
    assert fields["mode"] in ("shared", b"shared") and len(fields["holders"]) == 2
    assert first.fencing_token != second.fencing_token
    assert first.owned() and second.owned()
    first.release()
    assert not first.owned() and second.owned()
    second.release()
    assert info(r, "rw") is None


def test_queued_writer_blocks_later_readers_and_gets_the_lock_when_the_last_reader_leaves(r):
    readers = [rw(r).read_lock() for _ in range(2)]
    assert all(reader.acquire(blocking=False) for reader in readers)
    writer = rw(r).write_lock()
    writer_thread, writer_result = queue_in_thread(r, writer)
    late = rw(r).read_lock()
    assert not late.acquire(blocking=False)  # a try never passes the waiting writer
    late_thread, late_result = queue_in_thread(r, late, waiters=2)
    readers[0].release()
    assert holding(r, "rw", writer.local.token) is None and info(r, "rw")["waiters"] == 2
    readers[1].release()
    writer_thread.join()
    assert writer_result == [True] and writer.owned()
    fields = info(r, "rw")
    assert fields["mode"] in ("exclusive", b"exclusive") and fields["waiters"] == 1
    writer_token = writer.fencing_token
    writer.release()
    late_thread.join()
    assert late_result == [True] and late.owned() and late.fencing_token > writer_token
    late.release()


def test_writer_may_read_as_one_more_hold_of_its_grant(r):
    lock = ReadWriteLock(r, "rw", timeout=10)
    write, read = lock.write_lock(), lock.read_lock()
    assert write.acquire(blocking=False)
    assert read.acquire(blocking=False)
    assert read.fencing_token == write.fencing_token
    fields = info(r, "rw")
    assert fields["holds"] == 2 and fields["mode"] in ("exclusive", b"exclusive")
    assert not rw(r).read_lock().acquire(blocking=False)
    read.release()
    assert read.fencing_token is None and write.owned() and info(r, "rw")["holds"] == 1
    write.release()
    assert info(r, "rw") is None


def test_reader_asking_to_write_gets_upgrade_error_and_changes_nothing(r):
    lock = ReadWriteLock(r, "rw", timeout=10)
    assert lock.read_lock().acquire(blocking=False)
    before = unchanging(info(r, "rw"))
    # Blocking too: the try answers UPGRADE before any wait.
    with pytest.raises(UpgradeError, match="UPGRADE") as raised:
        lock.write_lock().acquire()
    assert isinstance(raised.value, LockError) and isinstance(raised.value, ResponseError)
    assert raised.value.lock_name == "rw" and lock.write_lock().fencing_token is None
    assert unchanging(info(r, "rw")) == before
    lock.read_lock().release()
    assert lock.write_lock().acquire(blocking=False)
    lock.write_lock().release()


def test_semaphore_limit_holds_for_many_concurrent_holders(r):
    limit, workers = 3, 12
    semaphore = Semaphore(r, "pool", limit, timeout=10)  # thread-local: one owner per thread
    blockers = [Semaphore(r, "pool", limit, timeout=10, thread_local=False) for _ in range(limit)]
    assert all(b.acquire(blocking=False) for b in blockers)
    inside, peak, done = [0], [0], []
    count = threading.Lock()

    def work():
        assert semaphore.acquire(blocking_timeout=10)
        with count:
            inside[0] += 1
            peak[0] = max(peak[0], inside[0])
        assert sum(h["permits"] for h in info(r, "pool")["holders"]) <= limit
        with count:
            inside[0] -= 1
            done.append(semaphore.fencing_token)
        semaphore.release()

    threads = [threading.Thread(target=work) for _ in range(workers)]
    for t in threads:
        t.start()
    wait_until(lambda: info(r, "pool")["waiters"] == workers, what="every worker to queue")
    for b in blockers:
        b.release()
    for t in threads:
        t.join()
    assert len(done) == workers and len(set(done)) == workers
    assert 1 <= peak[0] <= limit
    assert info(r, "pool") is None


def test_big_request_at_the_head_is_not_overtaken(r):
    holder = Semaphore(r, "pool", 3, timeout=10, permits=2, thread_local=False)
    assert holder.acquire(blocking=False)
    big = Semaphore(r, "pool", 3, timeout=10, permits=2, thread_local=False)
    big_thread, big_result = queue_in_thread(r, big)
    small = Semaphore(r, "pool", 3, timeout=10, thread_local=False)
    assert not small.acquire(blocking=False)  # one permit is free, but the big one waits first
    small_thread, small_result = queue_in_thread(r, small, waiters=2)
    assert [h["permits"] for h in info(r, "pool")["holders"]] == [2]
    holder.release()
    big_thread.join()
    small_thread.join()
    assert big_result == small_result == [True]
    assert big.fencing_token < small.fencing_token
    assert sorted(h["permits"] for h in info(r, "pool")["holders"]) == [1, 2]
    big.release()
    small.release()


def test_semaphore_holder_reenters_with_the_same_permits(r):
    semaphore = Semaphore(r, "pool", 3, timeout=10, permits=2, reentrant=True)
    assert semaphore.acquire(blocking=False) and semaphore.acquire(blocking=False)
    assert holding(r, "pool", semaphore.local.token)["holds"] == 2
    semaphore.release()
    semaphore.release()
    assert info(r, "pool") is None


@pytest.mark.parametrize(
    "held, asked",
    [
        (lambda r: Lock(r, "k", timeout=10), lambda r: Semaphore(r, "k", 3, timeout=10)),
        (lambda r: Semaphore(r, "k", 3, timeout=10), lambda r: Semaphore(r, "k", 5, timeout=10)),
        (lambda r: Semaphore(r, "k", 3, timeout=10), lambda r: Lock(r, "k", timeout=10)),
        (lambda r: Semaphore(r, "k", 3, timeout=10), lambda r: ReadWriteLock(r, "k", timeout=10).read_lock()),
    ],
    ids=["permits-on-a-lock", "another-limit", "lock-on-a-semaphore", "shared-on-a-semaphore"],
)
def test_wrong_mode_is_wrong_mode_error_and_changes_nothing(r, held, asked):
    assert held(r).acquire(blocking=False)
    before = unchanging(info(r, "k"))
    with pytest.raises(WrongModeError, match="WRONGMODE") as raised:
        asked(r).acquire()
    assert isinstance(raised.value, ResponseError) and raised.value.lock_name == "k"
    assert unchanging(info(r, "k")) == before


def test_semaphore_rejects_bad_permits_with_the_servers_error(r):
    with pytest.raises(ResponseError, match="PERMITS"):
        Semaphore(r, "pool", 3, permits=4).acquire(blocking=False)
    assert info(r, "pool") is None
