"""Sessions through redis_flock.asyncio.Lock: the reader is a task on the
client's loop, waiting tasks share its connection and the pool's, a cancelled
task sends FLOCK.CANCEL, losses are pushed, a killed session connection is
reopened and its waits sent again, aclose() closes it."""

import asyncio
import time

import pytest
import pytest_asyncio
import redis.asyncio
from helpers import calls, info, until
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError, LockNotOwnedError
from redis.retry import Retry

from redis_flock import UpgradeError, WrongModeError
from redis_flock._asyncio_session import session_of
from redis_flock.asyncio import Lock, ReadWriteLock, Semaphore


def connected(inspect) -> int:
    return int(inspect.info("clients")["connected_clients"])


def session_entry(inspect, client):
    """CLIENT LIST's entry for ``client``'s session connection, or None."""
    connection = session_of(client).connection
    if connection is None or connection._writer is None:
        return None
    host, port = connection._writer.get_extra_info("sockname")[:2]
    return next((c for c in inspect.client_list() if c["addr"] == f"{host}:{port}"), None)


async def parked_session_entry(inspect, client):
    """``session_entry`` once the session connection waits in FLOCK.INBOX:
    right after FLOCK.SESSION its reader has not sent the INBOX yet."""
    found = []
    await until(
        lambda: found.append(session_entry(inspect, client)) or (found[-1] or {}).get("cmd") == "flock.inbox",
        what="the session connection to wait in FLOCK.INBOX",
    )
    return found[-1]


@pytest_asyncio.fixture()
async def c(server, protocol):
    client = redis.asyncio.Redis(port=server.port, protocol=protocol)
    yield client
    await client.aclose()


async def test_200_waiting_tasks_add_the_sessions_3_connections_in_queue_order(server, inspect, protocol):
    c = redis.asyncio.Redis(port=server.port, protocol=protocol, max_connections=4)
    before = connected(inspect)
    holder = Lock(c, "many", timeout=30)
    assert await holder.acquire(blocking=False)
    assert any(t.get_name() == "flock-session" for t in asyncio.all_tasks())  # the reader: a task on this loop
    order = []

    async def run(lock):
        assert await lock.acquire(blocking_timeout=60)
        order.append(lock.local.token)
        await lock.release()

    # thread_local=False: each lock its own owner (the tasks share a thread).
    waiters = [Lock(c, "many", timeout=30, thread_local=False) for _ in range(200)]
    tasks = [asyncio.create_task(run(lock)) for lock in waiters]
    await until(lambda: info(inspect, "many")["waiters"] == 200, timeout=30, what="200 waiters to queue")
    assert connected(inspect) <= before + 3, inspect.client_list()
    queue = [owner if isinstance(owner, bytes) else owner.encode() for owner in info(inspect, "many")["queue"]]
    await holder.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 60)
    assert order == queue and info(inspect, "many") is None
    await c.aclose()


async def test_cancelled_task_sends_cancel_and_leaves_the_queue(c, inspect):
    holder = Lock(c, "cancel", timeout=10)
    assert await holder.acquire(blocking=False)
    cancels = calls(inspect, "flock.cancel")
    waiter = Lock(c, "cancel", timeout=10, thread_local=False)
    task = asyncio.create_task(waiter.acquire())
    await until(lambda: info(inspect, "cancel")["waiters"] == 1, what="the waiter to queue")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert calls(inspect, "flock.cancel") == cancels + 1
    assert info(inspect, "cancel")["waiters"] == 0 and waiter.local.token is None
    await holder.release()
    assert info(inspect, "cancel") is None


async def test_cancel_racing_a_grant_gives_the_grant_back(c, inspect):
    holder = Lock(c, "race", timeout=10)
    assert await holder.acquire(blocking=False)
    waiter = Lock(c, "race", timeout=10, thread_local=False)
    task = asyncio.create_task(waiter.acquire())
    await until(lambda: info(inspect, "race")["waiters"] == 1, what="the waiter to queue")
    # The grant is on its way to the inbox when the task is cancelled.
    inspect.execute_command("FLOCK.RELEASE", "race", holder.local.token)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await until(lambda: info(inspect, "race") is None, what="the raced grant to be released")
    assert waiter.local.token is None


async def test_asyncio_timeout_cancels_the_wait(c, inspect):
    holder = Lock(c, "tmo", timeout=10)
    assert await holder.acquire(blocking=False)
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(Lock(c, "tmo", timeout=10).acquire(), 0.2)
    await until(lambda: info(inspect, "tmo")["waiters"] == 0, what="the wait to be cancelled")
    await holder.release()


@pytest.mark.parametrize("watchdog", [False, True], ids=["fixed-lease", "watchdog"])
async def test_forcerelease_is_pushed_lost_at_once_with_on_lost(c, inspect, watchdog):
    seen = []

    async def on_lost(lock, reason):  # a coroutine: scheduled on the loop
        seen.append(reason)

    kwargs = {} if watchdog else {"timeout": 30}
    lock = Lock(c, "pushed", on_lost=on_lost, **kwargs)
    assert await lock.acquire(blocking=False)
    inspect.execute_command("FLOCK.FORCERELEASE", "pushed")
    await until(lambda: lock.lost, timeout=3, what="the pushed loss")
    await until(lambda: seen, what="on_lost")
    assert seen == ["forcereleased"] and lock.lost_reason == "forcereleased"
    with pytest.raises(LockNotOwnedError, match="force-released"):
        await lock.release()


async def test_a_fixed_lease_running_out_is_pushed_lost(c, inspect):
    seen = []
    lock = Lock(c, "expires", timeout=0.2, on_lost=lambda lock, reason: seen.append(reason))
    assert await lock.acquire()
    await until(lambda: lock.lost, timeout=5, what="the pushed loss")
    assert seen == ["expired"]
    with pytest.raises(LockNotOwnedError, match="lease"):
        await lock.release()


async def test_killed_session_connection_is_reopened_and_waits_are_sent_again(c, inspect):
    holder = Lock(c, "kill", timeout=30)
    assert await holder.acquire(blocking=False)
    waiters = [Lock(c, "kill", timeout=30, thread_local=False) for _ in range(5)]
    tasks = [asyncio.create_task(lock.acquire(blocking_timeout=30)) for lock in waiters]
    await until(lambda: info(inspect, "kill")["waiters"] == 5, what="5 waiters to queue")
    old, sid = await parked_session_entry(inspect, c), session_of(c).sid
    inspect.client_kill_filter(_id=old["id"])
    await until(lambda: session_of(c).sid not in (None, sid), what="a new session")
    await until(lambda: info(inspect, "kill")["waiters"] == 5, what="the waits to be sent again")
    await holder.release()
    for _ in waiters:  # granted in the order they queued again: release each
        await until(lambda: any(lock.local.token for lock in waiters), timeout=10, what="the next grant")
        await next(lock for lock in waiters if lock.local.token).release()
    assert [await task for task in tasks] == [True] * 5


async def test_variants_through_the_session(c, inspect):
    rw = ReadWriteLock(c, "modes", timeout=10)
    assert await rw.read_lock().acquire()
    with pytest.raises(UpgradeError):
        await rw.write_lock().acquire(blocking_timeout=5)
    with pytest.raises(WrongModeError):
        await Semaphore(c, "modes", 2, timeout=10).acquire(blocking_timeout=5)
    await rw.read_lock().release()
    reentrant = Lock(c, "re", timeout=10, reentrant=True)
    assert await reentrant.acquire() and await reentrant.acquire(blocking_timeout=5)
    assert info(inspect, "re")["holds"] == 2
    await reentrant.release()
    await reentrant.release()


async def test_aclose_closes_the_session_connection_and_ends_waits(server, inspect, protocol):
    c = redis.asyncio.Redis(port=server.port, protocol=protocol)
    holder = Lock(c, "close", timeout=10)
    assert await holder.acquire(blocking=False)
    task = asyncio.create_task(Lock(c, "close", timeout=10, thread_local=False).acquire(blocking_timeout=10))
    await until(lambda: info(inspect, "close")["waiters"] == 1, what="the waiter to queue")
    entry = session_entry(inspect, c)
    assert entry is not None
    await c.aclose()
    with pytest.raises(ConnectionError):
        await task
    await until(lambda: all(e["id"] != entry["id"] for e in inspect.client_list()), what="the session to close")
    await until(lambda: info(inspect, "close")["waiters"] == 0, what="its waiter to leave")
    assert not any(t.get_name() == "flock-session" for t in asyncio.all_tasks())


async def kill_session(inspect, c) -> str:
    """CLIENT KILLs ``c``'s session connection; returns its old session ID
    once the grants it held are re-watched on a new one."""
    session = session_of(c)
    old, sid = await parked_session_entry(inspect, c), session.sid
    inspect.client_kill_filter(_id=old["id"])
    await until(lambda: session.sid not in (None, sid) and session.rewatched == session.sid, what="a re-watch")
    return sid


@pytest.mark.parametrize("kind", ["lock", "read", "semaphore"])
async def test_after_a_killed_session_a_fixed_lease_grant_is_re_watched_and_its_loss_pushed(c, inspect, kind):
    seen = []
    on_lost = lambda lock, reason: seen.append(reason)  # noqa: E731
    if kind == "lock":
        lock = Lock(c, "rewatch", timeout=30, reentrant=True, on_lost=on_lost)
    elif kind == "read":
        lock = ReadWriteLock(c, "rewatch", timeout=30, on_lost=on_lost).read_lock()
    else:
        lock = Semaphore(c, "rewatch", 3, timeout=30, permits=2, reentrant=True, on_lost=on_lost)
    assert await lock.acquire(blocking=False) and await lock.acquire(blocking=False)  # two holds
    token = lock.fencing_token
    lock.local.grant.lease_from -= 20  # 20 s of its 30 s lease are gone, as this process counts
    counts = [calls(inspect, f"flock.{command}") for command in ("renew", "acquire", "release")]
    await kill_session(inspect, c)
    # One RENEW, one reentrant ACQUIRE ... INBOX and one RELEASE of that hold.
    assert [calls(inspect, f"flock.{command}") for command in ("renew", "acquire", "release")] == [
        n + 1 for n in counts
    ]
    (holder,) = info(inspect, "rewatch")["holders"]
    assert holder["holds"] == 2 and holder["token"] == token
    assert 5000 < holder["ttl-ms"] <= 10000  # what was left of the lease, never more
    assert not lock.lost
    inspect.execute_command("FLOCK.FORCERELEASE", "rewatch")
    await until(lambda: lock.lost, timeout=2, what="the pushed loss, on the new session")
    assert seen == ["forcereleased"]


async def test_a_grant_force_released_while_the_session_was_down_is_reported_lost_after_the_reconnect(c, inspect):
    seen = []
    lock = Lock(c, "gone", timeout=30, on_lost=lambda lock, reason: seen.append(reason))
    assert await lock.acquire(blocking=False)
    session = session_of(c)
    old = session_entry(inspect, c)

    async def unreachable():
        raise ConnectionError("the session cannot reopen (test)")

    session.open = unreachable  # the session cannot be reopened for now
    try:
        inspect.client_kill_filter(_id=old["id"])
        await until(lambda: session.sid is None, what="the session to break")
        inspect.execute_command("FLOCK.FORCERELEASE", "gone")  # its push has no session to go to
        await asyncio.sleep(0.3)
        assert not lock.lost
    finally:
        del session.open
    await until(lambda: lock.lost, timeout=5, what="the RENEW after the reconnect")
    assert seen == ["notowner"] and lock.lost_reason == "notowner" and lock.lost_detail.startswith("NOTOWNER")
    with pytest.raises(LockNotOwnedError):
        await lock.release()


async def test_a_fixed_lease_that_ran_out_while_the_session_was_down_is_lost_as_expired(c, inspect):
    lock = Lock(c, "ran-out", timeout=30)
    assert await lock.acquire(blocking=False)
    lock.local.grant.lease_from -= 31  # its lease is over, as this process counts it
    await kill_session(inspect, c)
    assert lock.lost and lock.lost_reason == "expired"


async def test_a_re_watch_waits_for_the_holders_release_and_the_holds_stay_right(c, inspect):
    lock = Lock(c, "serial", timeout=30, reentrant=True)
    assert await lock.acquire(blocking=False) and await lock.acquire(blocking=False)
    grant, session = lock.local.grant, session_of(c)
    async with grant.mutex:  # as the holder's release() does: the re-watch waits
        old, sid = session_entry(inspect, c), session.sid
        inspect.client_kill_filter(_id=old["id"])
        await until(lambda: session.sid not in (None, sid), what="a new session")
        await asyncio.sleep(0.3)
        assert session.rewatched != session.sid
        assert info(inspect, "serial")["holders"][0]["holds"] == 2
    await until(lambda: session.rewatched == session.sid, what="the re-watch")
    assert info(inspect, "serial")["holders"][0]["holds"] == 2
    await lock.release()
    assert info(inspect, "serial")["holders"][0]["holds"] == 1
    await lock.release()
    assert info(inspect, "serial") is None


async def test_server_down_past_the_deadline_ends_the_wait_as_a_timeout(own_server, protocol, short_local_deadline):
    # redis-py's own retry off: its backoff would lengthen the wait's end.
    c = redis.asyncio.Redis(port=own_server.port, protocol=protocol, retry=Retry(NoBackoff(), 0))
    holder = Lock(c, "down", timeout=30)
    assert await holder.acquire(blocking=False)
    task = asyncio.create_task(Lock(c, "down", timeout=30).acquire(blocking_timeout=0.5))
    inspect = redis.Redis(port=own_server.port)
    await until(lambda: info(inspect, "down")["waiters"] == 1, what="the waiter to queue")
    inspect.close()
    loop = asyncio.get_running_loop()
    began = time.monotonic()
    await loop.run_in_executor(None, own_server.kill)
    # A timed-out wait: False, as when the server's timeout ends it.
    assert await asyncio.wait_for(task, 20) is False
    assert time.monotonic() - began < 10
    await c.aclose()
