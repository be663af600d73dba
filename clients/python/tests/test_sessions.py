"""Sessions (docs/commands.md, "Sessions") through redis_flock.Lock: every
thread's waits share one session connection and the pool's connections,
losses are pushed (lock.lost at once, on_lost), a killed session connection
is reopened and its waits sent again, close() closes it."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import redis
from helpers import calls, holding, info, stat, wait_until
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError, LockNotOwnedError, ResponseError
from redis.retry import Retry

from redis_flock import AcquireCancelled, CancelToken, Lock, ReadWriteLock, Semaphore, UpgradeError, WrongModeError
from redis_flock._session import session_of


def connected(r) -> int:
    return int(r.info("clients")["connected_clients"])


def session_entry(r, client):
    """CLIENT LIST's entry for ``client``'s session connection, or None."""
    connection = session_of(client).connection
    if connection is None or connection._sock is None:
        return None
    host, port = connection._sock.getsockname()[:2]
    return next((c for c in r.client_list() if c["addr"] == f"{host}:{port}"), None)


def parked_session_entry(r, client):
    """``session_entry`` once the session connection waits in FLOCK.INBOX:
    right after FLOCK.SESSION its reader has not sent the INBOX yet."""
    found = []
    wait_until(
        lambda: found.append(session_entry(r, client)) or (found[-1] or {}).get("cmd") == "flock.inbox",
        what="the session connection to wait in FLOCK.INBOX",
    )
    return found[-1]


@pytest.fixture()
def c(server, protocol):
    """A client of its own for the locks (``r`` inspects)."""
    client = redis.Redis(port=server.port, protocol=protocol)
    yield client
    client.close()


def start(target, *args):
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


def test_200_waiting_threads_add_the_sessions_3_connections_and_are_granted_in_queue_order(server, r, protocol):
    # A pool of 4 connections: a wait that took one of its own would leave
    # the fifth waiter without one (not queued, an error after 20 s). It
    # makes a thread wait for a connection rather than refusing it. The
    # session's own (reading, and two for sending) are all the waits add.
    pool = redis.BlockingConnectionPool(port=server.port, protocol=protocol, max_connections=4, timeout=20)
    c = redis.Redis(connection_pool=pool)
    before = connected(r)
    holder = Lock(c, "many", timeout=30, thread_local=False)
    assert holder.acquire(blocking=False)
    order, errors = [], []
    waiters = [Lock(c, "many", timeout=30, thread_local=False) for _ in range(200)]

    def run(lock):
        try:
            assert lock.acquire(blocking_timeout=60)
            order.append(lock.local.token)
            lock.release()
        except Exception as e:  # reported below
            errors.append(e)

    threads = [start(run, lock) for lock in waiters]
    wait_until(lambda: info(r, "many")["waiters"] == 200, timeout=30, what="200 waiters to queue")
    assert connected(r) <= before + 3, r.client_list()
    assert not errors
    queue = [owner.encode() if isinstance(owner, str) else owner for owner in info(r, "many")["queue"]]
    holder.release()
    for t in threads:
        t.join(60)
    assert not errors and order == queue
    assert info(r, "many") is None
    c.close()


def test_a_free_lock_is_granted_by_the_reply_and_a_busy_one_by_the_inbox(r, c):
    holder = Lock(c, "inbox", timeout=10, thread_local=False)
    inboxes = calls(r, "flock.inbox")
    assert holder.acquire()  # free: the ACQUIRE's reply is the token
    waiter = Lock(c, "inbox", timeout=10, thread_local=False)
    result = []
    t = start(lambda: result.append(waiter.acquire(blocking_timeout=10)))
    wait_until(lambda: info(r, "inbox")["waiters"] == 1, what="the waiter to queue")
    holder.release()
    t.join(10)
    assert result == [True] and waiter.owned()
    assert calls(r, "flock.inbox") > inboxes
    waiter.release()


def test_server_timeout_ends_a_session_wait(r, c):
    holder = Lock(c, "late", timeout=10)
    assert holder.acquire(blocking=False)
    timeouts = stat(r, "wait_timeouts")
    began = time.monotonic()
    assert not Lock(c, "late", timeout=10).acquire(blocking_timeout=0.3)
    assert 0.25 < time.monotonic() - began < 2
    assert stat(r, "wait_timeouts") == timeouts + 1 and info(r, "late")["waiters"] == 0
    holder.release()


@pytest.mark.parametrize("watchdog", [False, True], ids=["fixed-lease", "watchdog"])
def test_forcerelease_is_pushed_lost_at_once_with_on_lost(r, c, watchdog):
    seen = []
    # A 30 s watchdog lease: its renewal (10 s) is not what reports the loss.
    kwargs = {} if watchdog else {"timeout": 30}
    lock = Lock(c, "pushed", on_lost=lambda lock, reason: seen.append((lock, reason)), **kwargs)
    assert lock.acquire(blocking=False) and not lock.lost
    r.execute_command("FLOCK.FORCERELEASE", "pushed")
    wait_until(lambda: lock.lost, timeout=3, what="the pushed loss")
    wait_until(lambda: seen, what="on_lost (called after lost is set)")
    assert seen == [(lock, "forcereleased")] and lock.lost_reason == "forcereleased"
    with pytest.raises(LockNotOwnedError, match="force-released") as raised:
        lock.release()
    assert "NOTOWNER" in str(raised.value)


def test_a_fixed_lease_running_out_is_lost_at_its_deadline(r, c):
    seen = []
    lock = Lock(c, "expires", timeout=0.2, on_lost=lambda lock, reason: seen.append(reason))
    assert lock.acquire()
    # The deadline timer marks it lost a margin before the server ends it
    # (and pushes `expired`, which finds it lost already).
    wait_until(lambda: lock.lost, timeout=5, what="the lease's deadline")
    wait_until(lambda: seen, what="on_lost")
    assert seen == ["expired"] and lock.lost_reason == "expired"
    wait_until(lambda: info(r, "expires") is None, what="the server to end the lease")
    with pytest.raises(LockNotOwnedError, match="lease"):
        lock.release()


def test_deleted_key_is_pushed_lost_and_ends_waits_with_lockdeleted(r, c):
    lock = Lock(c, "deleted", timeout=10)
    assert lock.acquire(blocking=False)
    waiter, raised = Lock(c, "deleted", timeout=10), []

    def wait():
        try:
            waiter.acquire(blocking_timeout=10)
        except ResponseError as e:
            raised.append(e)

    t = start(wait)
    wait_until(lambda: info(r, "deleted")["waiters"] == 1, what="the waiter to queue")
    r.delete("deleted")
    t.join(5)
    wait_until(lambda: lock.lost, what="the pushed loss")
    assert lock.lost_reason == "deleted"
    assert len(raised) == 1 and str(raised[0]).startswith("LOCKDELETED")


def test_a_loss_is_known_before_the_next_waiter_of_the_process_is_granted(r, c):
    first = Lock(c, "order", timeout=0.3, thread_local=False)
    assert first.acquire(blocking=False)
    second = Lock(c, "order", timeout=10, thread_local=False)
    seen = []

    def wait():
        assert second.acquire(blocking_timeout=10)
        seen.append(first.lost)  # the same reader read `lost` before `granted`
        second.release()

    t = start(wait)
    t.join(10)
    assert seen == [True] and first.lost_reason == "expired"


def test_interrupted_wait_is_cancelled_and_leaves_the_queue(r, c):
    holder = Lock(c, "intr", timeout=10)
    assert holder.acquire(blocking=False)
    cancels = calls(r, "flock.cancel")

    class Interrupted(Exception):
        pass

    def interrupt(*_):
        raise Interrupted()

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(Interrupted):
            Lock(c, "intr", timeout=10).acquire(blocking_timeout=10)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert calls(r, "flock.cancel") == cancels + 1
    wait_until(lambda: info(r, "intr")["waiters"] == 0, what="the wait to be cancelled")
    holder.release()
    assert info(r, "intr") is None


@pytest.mark.parametrize("use_session", [True, False], ids=["session", "own-connection"])
def test_a_cancel_token_cancels_a_waiting_thread(r, c, use_session):
    holder = Lock(c, "ctok", timeout=10)
    assert holder.acquire(blocking=False)
    cancels = calls(r, "flock.cancel")
    token, result = CancelToken(), []

    def wait():
        try:
            result.append(Lock(c, "ctok", timeout=10, use_session=use_session).acquire(blocking_timeout=10, cancel=token))
        except AcquireCancelled as e:
            result.append(e)

    t = start(wait)
    wait_until(lambda: info(r, "ctok")["waiters"] == 1, what="the waiter to queue")
    token.cancel()
    t.join(5)
    assert len(result) == 1 and isinstance(result[0], AcquireCancelled) and result[0].lock_name == "ctok"
    # Through the session, FLOCK.CANCEL; on a connection of its own, closing it.
    assert calls(r, "flock.cancel") == cancels + (1 if use_session else 0)
    wait_until(lambda: info(r, "ctok")["waiters"] == 0, what="the wait to leave the queue")
    holder.release()
    assert info(r, "ctok") is None
    # Cancelled stays cancelled: the next acquire with it raises at once, unsent.
    acquires = calls(r, "flock.acquire")
    with pytest.raises(AcquireCancelled):
        Lock(c, "ctok", timeout=10, use_session=use_session).acquire(blocking_timeout=10, cancel=token)
    assert calls(r, "flock.acquire") == acquires


def test_a_cancel_that_loses_the_race_to_a_grant_releases_it(r, c):
    holder = Lock(c, "ctok-race", timeout=10)
    assert holder.acquire(blocking=False)
    token, result = CancelToken(), []
    waiter = Lock(c, "ctok-race", timeout=10)

    def wait():
        try:
            result.append(waiter.acquire(blocking_timeout=10, cancel=token))
            waiter.release()  # granted before the cancel was seen
        except AcquireCancelled as e:
            result.append(e)

    t = start(wait)
    wait_until(lambda: info(r, "ctok-race")["waiters"] == 1, what="the waiter to queue")
    holder.release()  # the grant is pushed while the cancel goes out
    token.cancel()
    t.join(5)
    assert len(result) == 1 and (result[0] is True or isinstance(result[0], AcquireCancelled))
    wait_until(lambda: info(r, "ctok-race") is None, what="the grant to be released")


def reading_threads(client, timeout):
    """The names of the threads that read the inbox of ``client``'s session
    with ``timeout`` from now on (its reads wrapped)."""
    session = session_of(client, timeout)
    names, read = [], session._inbox

    def inbox(*args):
        names.append(threading.current_thread().name)
        return read(*args)

    session._inbox = inbox
    return names


# The session timeout of the tests of whose turn it is to read the inbox:
# short, so that the reader's heartbeat (T/4) ends soon and passes the turn
# to a waiting thread then, yet long enough that the heartbeats of a process
# of several threads on a loaded machine (CI's four test workers on two
# cores) come in time: with 0.4 s, a read sent 0.3 s late loses the session.
TURN_T = 2.0


def test_a_waiting_thread_reads_the_inbox_and_so_its_own_grant(r, c):
    holder = Lock(c, "turn", session_timeout=TURN_T, thread_local=False)
    assert holder.acquire(blocking=False)
    readers = reading_threads(c, TURN_T)
    waiter = Lock(c, "turn", session_timeout=TURN_T, thread_local=False)
    result = []
    t = threading.Thread(target=lambda: result.append(waiter.acquire(blocking_timeout=10)), name="waiting", daemon=True)
    t.start()
    wait_until(lambda: "waiting" in readers, what="the waiting thread to read the inbox")
    holder.release()
    t.join(10)
    assert result == [True] and waiter.owned()
    # Its turn ended with its wait: the reader reads again, and pushes a loss.
    reads = len(readers)
    wait_until(lambda: readers[reads:] and readers[-1] == "flock-session", what="the reader's turn")
    r.execute_command("FLOCK.FORCERELEASE", "turn")
    wait_until(lambda: waiter.lost, what="the pushed loss")


def test_a_waiting_thread_whose_wait_ends_passes_the_turn_to_the_next(r, c):
    holder = Lock(c, "pass", session_timeout=TURN_T, thread_local=False)
    assert holder.acquire(blocking=False)
    readers = reading_threads(c, TURN_T)
    results = {}

    def wait(name, seconds):
        lock = Lock(c, "pass", session_timeout=TURN_T, thread_local=False)
        results[name] = lock.acquire(blocking_timeout=seconds)

    # Its wait spans six of the reader's reads (T/4 each), each ending in a
    # turn for it: on a loaded machine (CI's four test workers on two cores)
    # a 1 s wait once ended before its turn came.
    first = threading.Thread(target=wait, args=("first", 3), name="first", daemon=True)
    first.start()
    wait_until(lambda: info(r, "pass")["waiters"] == 1, what="the first waiter to queue")
    second = threading.Thread(target=wait, args=("second", 30), name="second", daemon=True)
    second.start()
    wait_until(lambda: "first" in readers, what="the first waiter to read the inbox")
    first.join(10)
    assert results == {"first": False}
    # Nobody else reads for the second now: only its turn brings its grant.
    wait_until(lambda: readers[-1] == "second", what="the turn to pass to the second waiter")
    holder.release()
    second.join(10)
    assert results == {"first": False, "second": True}


def test_killed_session_connection_is_reopened_and_waits_are_sent_again(r, c):
    holder = Lock(c, "kill", timeout=30, thread_local=False)
    assert holder.acquire(blocking=False)
    waiters = [Lock(c, "kill", timeout=30, thread_local=False) for _ in range(5)]
    results = []
    threads = [start(lambda lock=lock: results.append(lock.acquire(blocking_timeout=30))) for lock in waiters]
    wait_until(lambda: info(r, "kill")["waiters"] == 5, what="5 waiters to queue")
    old = parked_session_entry(r, c)
    sid = session_of(c).sid
    r.client_kill_filter(_id=old["id"])
    wait_until(lambda: session_of(c).sid not in (None, sid), what="a new session")
    wait_until(lambda: info(r, "kill")["waiters"] == 5, what="the waits to be sent again")
    holder.release()
    for _ in waiters:  # granted in the order they queued again: release each
        wait_until(lambda: any(lock.local.token for lock in waiters), timeout=10, what="the next grant")
        next(lock for lock in waiters if lock.local.token).release()
    for t in threads:
        t.join(10)
    assert results == [True] * 5
    assert session_entry(r, c)["id"] != old["id"]


def test_nosession_reply_reopens_the_session(r, c):
    lock = Lock(c, "nosession", timeout=10)
    assert lock.acquire(blocking=False)
    lock.release()
    session = session_of(c)
    sid = session.sid
    session.sid = "0" * 32  # a session the server does not know: NOSESSION
    assert lock.acquire(blocking=False)
    assert session.sid not in (None, sid, "0" * 32)
    lock.release()


def test_blocking_reentry_goes_through_the_session_without_waiting(r, c):
    lock = Lock(c, "reenter", timeout=10, reentrant=True)
    assert lock.acquire()
    other = Lock(c, "reenter", timeout=10, thread_local=False)
    t = start(lambda: other.acquire(blocking_timeout=10))
    wait_until(lambda: info(r, "reenter")["waiters"] == 1, what="another owner to queue")
    token = lock.fencing_token
    assert lock.acquire(blocking_timeout=5)  # held: one more hold at once
    assert lock.fencing_token == token and info(r, "reenter")["holds"] == 2
    lock.release()
    lock.release()
    t.join(10)
    assert other.owned()
    other.release()


def test_upgrade_and_wrongmode_are_answered_through_the_session(r, c):
    rw = ReadWriteLock(c, "modes", timeout=10)
    assert rw.read_lock().acquire()
    with pytest.raises(UpgradeError):
        rw.write_lock().acquire(blocking_timeout=5)
    with pytest.raises(WrongModeError):
        Semaphore(c, "modes", 2, timeout=10).acquire(blocking_timeout=5)
    assert info(r, "modes")["waiters"] == 0
    rw.read_lock().release()


def test_semaphore_waiters_through_the_session_respect_the_limit(r, c):
    limit, holders = 2, []
    blockers = [Semaphore(c, "sem", limit, timeout=30, thread_local=False) for _ in range(limit)]
    assert all(b.acquire(blocking=False) for b in blockers)
    waiters = [Semaphore(c, "sem", limit, timeout=30, thread_local=False) for _ in range(6)]
    threads = [start(lambda s=s: s.acquire(blocking_timeout=30) and holders.append(s)) for s in waiters]
    wait_until(lambda: info(r, "sem")["waiters"] == 6, what="6 waiters")
    for b in blockers:
        b.release()
    wait_until(lambda: len(holders) == limit, what="two waiters to hold")
    while holders or info(r, "sem") is not None:
        assert len(info(r, "sem")["holders"]) <= limit
        if holders:
            holders.pop(0).release()
        time.sleep(0.01)
    for t in threads:
        t.join(10)


def test_watchdogs_share_one_deadline_thread_and_the_pool(server, r, protocol):
    c = redis.Redis(port=server.port, protocol=protocol, max_connections=3)
    before = connected(r)
    renewals = calls(r, "flock.renew")
    # Without a session: leases renewed every 0.4 s, all due at once, each
    # renewal waiting its turn for one of the pool's 3 connections.
    locks = [Lock(c, f"wd{i}", watchdog_timeout=1.2, use_session=False) for i in range(20)]
    assert all(lock.acquire(blocking=False) for lock in locks)
    wait_until(lambda: calls(r, "flock.renew") >= renewals + 60, what="three renewals of each")
    assert [t.name for t in threading.enumerate()].count("flock-deadlines") == 1
    assert connected(r) <= before + 3
    assert all(lock.owned() and not lock.lost for lock in locks)
    for lock in locks:
        lock.release()
    c.close()


def test_close_closes_the_session_connection_and_ends_waits(server, r, protocol):
    c = redis.Redis(port=server.port, protocol=protocol)
    holder = Lock(r, "close", timeout=10)
    assert holder.acquire(blocking=False)
    raised = []

    def wait():
        try:
            Lock(c, "close", timeout=10).acquire(blocking_timeout=10)
        except ConnectionError as e:
            raised.append(e)

    t = start(wait)
    wait_until(lambda: info(r, "close")["waiters"] == 1, what="the waiter to queue")
    entry = session_entry(r, c)
    assert entry is not None
    c.close()
    t.join(5)
    assert len(raised) == 1
    wait_until(lambda: all(e["id"] != entry["id"] for e in r.client_list()), what="the session connection to close")
    wait_until(lambda: info(r, "close")["waiters"] == 0, what="the session's waiter to leave")
    holder.release()


def test_use_session_false_waits_on_a_connection_of_its_own(r, c):
    holder = Lock(c, "own", timeout=10, use_session=False)
    assert holder.acquire(blocking=False)
    result = []
    t = start(lambda: result.append(Lock(c, "own", timeout=10, use_session=False).acquire(blocking_timeout=10)))
    wait_until(lambda: info(r, "own")["waiters"] == 1, what="the waiter to queue")
    assert any(e["cmd"] == "flock.acquire" for e in r.client_list())  # blocked on its own connection
    assert session_of(c).sid is None  # no session opened
    holder.release()
    t.join(10)
    assert result == [True]


SCRIPT = """
import sys, threading, redis
from redis_flock import Lock
r = redis.Redis(port=int(sys.argv[1]))
held = Lock(r, "exit")                     # watchdog
assert held.acquire()
waiter = Lock(r, "exit", timeout=10)
threading.Thread(target=waiter.acquire, daemon=True).start()   # waits through the session
print("ready", flush=True)
"""


def test_nothing_keeps_the_process_alive(server, r):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(server.port)], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ready"


def test_server_restart_mid_wait_the_wait_is_sent_again_and_granted_and_the_grants_are_lost(own_server, protocol):
    # The documented behaviour: a waiter keeps trying until its own deadline.
    # The new server starts empty, so the wait sent again is granted at once.
    c = redis.Redis(port=own_server.port, protocol=protocol)
    holder = Lock(c, "restart", timeout=30, thread_local=False)
    held = Lock(c, "held", thread_local=False)  # a session grant
    assert holder.acquire(blocking=False) and held.acquire(blocking=False)
    waiter, result = Lock(c, "restart", timeout=30, thread_local=False), []
    t = start(lambda: result.append(waiter.acquire(blocking_timeout=30)))
    wait_until(lambda: info(c, "restart")["waiters"] == 1, what="the waiter to queue")
    own_server.kill()
    own_server.start()
    t.join(20)
    assert result == [True] and waiter.owned()
    # The session grant ended with its session; the fixed lease's check on
    # the new session (a RENEW) found it gone. Neither was taken again.
    wait_until(lambda: holder.lost and held.lost, what="both losses")
    assert held.lost_reason == "sessionended" and holder.lost_reason == "notowner"
    assert info(c, "held") is None and holding(c, "restart", holder.local.token) is None
    waiter.release()
    c.close()


def test_server_down_past_the_deadline_ends_the_wait_as_a_timeout(own_server, protocol, short_local_deadline):
    # redis-py's own retry off: its backoff would lengthen the wait's end.
    c = redis.Redis(port=own_server.port, protocol=protocol, retry=Retry(NoBackoff(), 0))
    holder = Lock(c, "down", timeout=30)
    assert holder.acquire(blocking=False)
    result = []

    def wait():
        try:
            result.append(Lock(c, "down", timeout=30).acquire(blocking_timeout=0.5))
        except Exception as e:
            result.append(e)

    t = start(wait)
    wait_until(lambda: info(c, "down")["waiters"] == 1, what="the waiter to queue")
    own_server.kill()
    began = time.monotonic()
    t.join(20)
    # A timed-out wait: False, as when the server's timeout ends it.
    assert result == [False] and time.monotonic() - began < 10
    c.close()


def kill_session(r, c) -> str:
    """CLIENT KILLs ``c``'s session connection; returns its old session ID
    once the grants it held are re-watched on a new one."""
    session = session_of(c)
    old, sid = parked_session_entry(r, c), session.sid
    r.client_kill_filter(_id=old["id"])
    wait_until(lambda: session.sid not in (None, sid) and session.rewatched == session.sid, what="a re-watch")
    return sid


@pytest.mark.parametrize("kind", ["lock", "read", "semaphore"])
def test_after_a_killed_session_a_fixed_lease_grant_is_re_watched_and_its_loss_pushed(r, c, kind):
    seen = []
    on_lost = lambda lock, reason: seen.append(reason)  # noqa: E731
    if kind == "lock":
        lock = Lock(c, "rewatch", timeout=30, reentrant=True, on_lost=on_lost)
    elif kind == "read":
        lock = ReadWriteLock(c, "rewatch", timeout=30, on_lost=on_lost).read_lock()
    else:
        lock = Semaphore(c, "rewatch", 3, timeout=30, permits=2, reentrant=True, on_lost=on_lost)
    assert lock.acquire(blocking=False) and lock.acquire(blocking=False)  # two holds
    token = lock.fencing_token
    lock.local.grant.lease_from -= 20  # 20 s of its 30 s lease are gone, as this process counts
    renews, acquires, releases = calls(r, "flock.renew"), calls(r, "flock.acquire"), calls(r, "flock.release")
    kill_session(r, c)
    # One RENEW, one reentrant ACQUIRE ... INBOX and one RELEASE of that hold.
    assert (calls(r, "flock.renew"), calls(r, "flock.acquire"), calls(r, "flock.release")) == (
        renews + 1,
        acquires + 1,
        releases + 1,
    )
    (holder,) = info(r, "rewatch")["holders"]
    assert holder["holds"] == 2 and holder["token"] == token
    assert 5000 < holder["ttl-ms"] <= 10000  # what was left of the lease, never more
    assert not lock.lost and lock.local.grant.renewal_timer is None  # no watchdog: only the pushed loss tells
    r.execute_command("FLOCK.FORCERELEASE", "rewatch")
    wait_until(lambda: lock.lost, timeout=2, what="the pushed loss, on the new session")
    wait_until(lambda: seen, what="on_lost (called after lost is set)")
    assert seen == ["forcereleased"]


def test_a_grant_force_released_while_the_session_was_down_is_reported_lost_after_the_reconnect(r, c):
    seen = []
    lock = Lock(c, "gone", timeout=30, on_lost=lambda lock, reason: seen.append(reason))
    assert lock.acquire(blocking=False)
    session = session_of(c)
    old = session_entry(r, c)

    def unreachable():
        raise ConnectionError("the session cannot reopen (test)")

    session.open = unreachable  # the reader cannot reopen the session for now
    try:
        r.client_kill_filter(_id=old["id"])
        wait_until(lambda: session.sid is None, what="the session to break")
        r.execute_command("FLOCK.FORCERELEASE", "gone")  # its push has no session to go to
        time.sleep(0.3)
        assert not lock.lost
    finally:
        del session.open
    wait_until(lambda: lock.lost, timeout=5, what="the RENEW after the reconnect")
    wait_until(lambda: seen, what="on_lost (called after lost is set)")
    assert seen == ["notowner"] and lock.lost_reason == "notowner" and lock.lost_detail.startswith("NOTOWNER")
    with pytest.raises(LockNotOwnedError):
        lock.release()


def test_a_fixed_lease_that_ran_out_while_the_session_was_down_is_lost_as_expired(r, c):
    lock = Lock(c, "ran-out", timeout=30)
    assert lock.acquire(blocking=False)
    lock.local.grant.lease_from -= 31  # its lease is over, as this process counts it
    kill_session(r, c)
    assert lock.lost and lock.lost_reason == "expired"


def test_a_re_watch_waits_for_the_holders_release_and_the_holds_stay_right(r, c):
    lock = Lock(c, "serial", timeout=30, reentrant=True)
    assert lock.acquire(blocking=False) and lock.acquire(blocking=False)
    grant, session = lock.local.grant, session_of(c)
    with grant.mutex:  # as the holder's release() does: the re-watch waits
        old, sid = session_entry(r, c), session.sid
        r.client_kill_filter(_id=old["id"])
        wait_until(lambda: session.sid not in (None, sid), what="a new session")
        time.sleep(0.3)
        assert session.rewatched != session.sid
        assert info(r, "serial")["holders"][0]["holds"] == 2
    wait_until(lambda: session_of(c).rewatched == session_of(c).sid, what="the re-watch")
    assert info(r, "serial")["holders"][0]["holds"] == 2
    lock.release()
    assert info(r, "serial")["holders"][0]["holds"] == 1
    lock.release()
    assert info(r, "serial") is None


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_forked_child_waits_through_a_session_of_its_own(r, c):
    held = Lock(c, "fork", timeout=10, thread_local=False)
    assert held.acquire(blocking=False)  # the parent's session is open
    pid = os.fork()
    if pid == 0:
        try:
            code = 0 if Lock(c, "fork", timeout=10).acquire(blocking_timeout=10) else 3
        finally:
            os._exit(locals().get("code", 4))
    wait_until(lambda: info(r, "fork")["waiters"] == 1, what="the child's wait")
    held.release()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_demotion_marks_grants_lost_and_ends_waits_with_unblocked(own_server, protocol):
    c = redis.Redis(port=own_server.port, protocol=protocol)
    holder = Lock(c, "demote", timeout=30, thread_local=False)
    assert holder.acquire(blocking=False)
    raised = []

    def wait():
        try:
            Lock(c, "demote", timeout=30).acquire(blocking_timeout=10)
        except ResponseError as e:
            raised.append(e)

    t = start(wait)
    wait_until(lambda: info(c, "demote")["waiters"] == 1, what="the waiter to queue")
    admin = redis.Redis(port=own_server.port)
    admin.execute_command("REPLICAOF", "127.0.0.1", "1")  # no such master: stays a replica
    try:
        t.join(10)
        wait_until(lambda: holder.lost, what="the grant's loss")
        assert holder.lost_reason == "demoted"
        assert len(raised) == 1 and str(raised[0]).startswith("UNBLOCKED")
    finally:
        admin.execute_command("REPLICAOF", "NO", "ONE")
        admin.close()
        c.close()


def test_a_grant_told_twice_is_neither_given_back_nor_handed_to_the_owners_next_wait():
    """docs/client-protocol.md, "grants told": a wait sent again with its
    request ID was answered with its grant, whose event was on its way."""
    from redis_flock._core import GRANTED, SessionState, Wait

    class Waiting(Wait):
        def wake(self):
            pass

    state = SessionState()
    first = Waiting(None, b"k", b"o", [], 1000, "r1")
    state.register(first)
    state.queued(first, "s1", (GRANTED, 7, ""), time.monotonic())
    assert first.outcome[:2] == (GRANTED, 7)
    event = [b"granted", b"k", b"o", 7, b""]
    assert state.dispatch(event) is None, "not a grant nobody waits for"
    following = Waiting(None, b"k", b"o", [], 1000, "r2")
    state.register(following)
    assert state.dispatch(event) is None
    assert following.outcome is None, "the grant told before is not the next wait's"
    assert state.dispatch([b"granted", b"k", b"o", 8, b""]) is None
    assert following.outcome[:2] == (GRANTED, 8)
    # A grant of a wait that gave up, never told: given back.
    assert state.dispatch([b"granted", b"k", b"o", 9, b""])[1:] == (b"k", b"o")
