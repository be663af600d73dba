"""Deadlines (docs/client-protocol.md, "The rules every client shares"),
through redis_flock.Lock: a holder cut off from the server (the suite's proxy
stops carrying its bytes, keeping its sockets open) reports its grant lost
before anyone else is granted it, whatever keeps the grant (its session, a
fixed lease, the watchdog); a process paused past its deadline sees ``lost``
at its first check; a process cut off holds nobody up for longer than its
timeout; a short silence loses nothing (tests/test_sessions.py has a server
restart: session grants lost, waits sent again). Short timeouts (a few hundred ms); waits
end on conditions, with deadlines; nothing asserts a duration but the order
of a loss and the next grant. Run with -s to see the gaps measured."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import redis
from helpers import ReplyDropper, holding, info, queue_in_thread, wait_until
from redis.backoff import NoBackoff
from redis.retry import Retry

from redis_flock import Lock
from redis_flock._backend import TIMERS
from redis_flock._session import session_of

# The session timeout of the processes cut off (seconds).
T = 1.0

# What keeps the cut-off holder's grant, and the reason it is lost for.
KEEPERS = {
    "session": (dict(session_timeout=T), "unconfirmed"),
    "fixed-lease": (dict(timeout=0.5, session_timeout=5), "expired"),
    "watchdog": (dict(use_session=False, watchdog_timeout=T), "unconfirmed"),
}


def start(target, *args):
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


def quietly(call) -> None:
    """``call()`` in a thread whose end does not matter to the test."""
    try:
        call()
    except redis.RedisError:
        pass


@pytest.fixture()
def cut_off(server):
    """(proxy, client): a process of its own behind a proxy that partition()
    cuts off; healed and closed afterwards."""
    proxy = ReplyDropper(server.port)
    client = redis.Redis(port=proxy.port, retry=Retry(NoBackoff(), 0))
    yield proxy, client
    proxy.heal()
    client.close()
    proxy.kill()


@pytest.fixture()
def c(server):
    """Another process's client, reaching the server directly."""
    client = redis.Redis(port=server.port)
    yield client
    client.close()


@pytest.fixture()
def r(server):
    """The test's own connection, to read the server (one protocol: what is
    tested here does not depend on it)."""
    client = redis.Redis(port=server.port)
    yield client
    client.flushall()
    client.close()


def report(what: str, ms: float) -> None:
    print(f"\n{what}: {ms:.1f} ms", flush=True)


class Losses:
    """An on_lost that notes when (time.monotonic()) and why."""

    def __init__(self):
        self.seen: list = []

    def __call__(self, lock, reason):
        self.seen.append((time.monotonic(), reason))


@pytest.mark.parametrize("keeper", list(KEEPERS))
def test_a_cut_off_holder_reports_the_loss_before_the_next_waiter_is_granted(r, c, cut_off, keeper):
    proxy, client = cut_off
    kwargs, reason = KEEPERS[keeper]
    losses = Losses()
    holder = Lock(client, "cut", on_lost=losses, thread_local=False, **kwargs)
    # The holder's turn comes with the next waiter queued behind it already:
    # however late a loaded machine runs the threads, nobody else can be
    # granted the lock before the holder's lease runs out.
    assert r.execute_command("FLOCK.ACQUIRE", "cut", "first", 60000) is not None
    taking, taken = queue_in_thread(r, holder)
    waiter, granted_at = Lock(c, "cut", thread_local=False), []
    t = start(lambda: waiter.acquire(blocking_timeout=10) and granted_at.append(time.monotonic()))
    wait_until(lambda: info(r, "cut")["waiters"] == 2, what="the waiter to queue")
    assert r.execute_command("FLOCK.RELEASE", "cut", "first") == 0
    taking.join(10)
    assert taken == [True]
    proxy.partition()
    t.join(10)
    assert granted_at, "the waiter was not granted"
    assert losses.seen and losses.seen[0][1] == reason and holder.lost_reason == reason
    lost_at = losses.seen[0][0]
    assert lost_at < granted_at[0], f"lost {1000 * (lost_at - granted_at[0]):.1f} ms after the next grant"
    report(f"{keeper}: loss reported before the next grant by", 1000 * (granted_at[0] - lost_at))
    waiter.release()


def test_a_waiter_cut_off_at_its_turn_holds_the_next_one_up_about_its_session_timeout(r, c, cut_off):
    proxy, client = cut_off
    holder = Lock(c, "turn")
    assert holder.acquire()
    cut = Lock(client, "turn", session_timeout=T)
    start(quietly, lambda: cut.acquire(blocking_timeout=30))  # ends when its client closes
    wait_until(lambda: info(r, "turn")["waiters"] == 1, what="the cut-off waiter to queue")
    following, granted_at = Lock(c, "turn", thread_local=False), []
    t = start(lambda: following.acquire(blocking_timeout=30) and granted_at.append(time.monotonic()))
    wait_until(lambda: info(r, "turn")["waiters"] == 2, what="the next waiter to queue")
    proxy.partition()
    released_at = time.monotonic()
    holder.release()  # the grant goes to the cut-off waiter, which never hears of it
    t.join(10)
    assert granted_at, "the next waiter was not granted"
    report("the next waiter granted after the release by", 1000 * (granted_at[0] - released_at))
    following.release()


# The holder's session timeout with 100 waiting threads in its process: their
# start holds up its heartbeats (one GIL), which T (three quarters of it
# between two reads) would not always outlast on a loaded machine. Only the
# order of the loss and the grants is asserted, whatever the timeout.
HUNDRED_T = 3.0


def test_a_cut_off_holder_with_100_waiters_behind_it_passes_the_lock_on_in_their_order(r, c, cut_off):
    proxy, client = cut_off
    losses = Losses()
    holder = Lock(client, "hundred", session_timeout=HUNDRED_T, on_lost=losses)
    assert holder.acquire()
    order, granted_at = [], []

    def wait(lock):
        assert lock.acquire(blocking_timeout=30)
        granted_at.append(time.monotonic())
        order.append(lock.local.token)
        lock.release()

    threads = [start(wait, Lock(c, "hundred", thread_local=False)) for _ in range(100)]
    def queued():
        fields = info(r, "hundred")
        assert fields is not None, (losses.seen, holder.lost_reason, r.info("flock"))
        return fields["waiters"] == 100

    wait_until(queued, what="100 waiters to queue")
    queue = info(r, "hundred")["queue"]
    proxy.partition()
    for t in threads:
        t.join(30)
    assert order == queue
    assert losses.seen and losses.seen[0][0] < granted_at[0]
    report("100 waiters: loss reported before the first grant by", 1000 * (granted_at[0] - losses.seen[0][0]))
    assert info(r, "hundred") is None


def test_a_session_silent_for_less_than_its_safe_window_loses_nothing(r, cut_off):
    # A heartbeat read is answered within T/4: a silence shorter than
    # T/2 - m is always heard of by the session's deadline, whenever it
    # starts. Its grant and its queued wait stay, on the same session.
    proxy, client = cut_off
    timeout = 2.0
    holder = Lock(client, "silent", session_timeout=timeout)
    assert holder.acquire()
    waiter = Lock(client, "silent", session_timeout=timeout, thread_local=False)
    start(lambda: waiter.acquire(blocking_timeout=30))
    wait_until(lambda: info(r, "silent")["waiters"] == 1, what="the waiter to queue")
    session = session_of(client, timeout)
    sid, queue = session.sid, info(r, "silent")["queue"]
    proxy.partition()
    time.sleep(0.5)  # the silence tested
    proxy.heal()
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        assert not holder.lost, holder.lost_reason
        time.sleep(0.01)
    assert session.sid == sid and info(r, "silent")["queue"] == queue
    assert holding(r, "silent", holder.local.token)["holds"] == 1
    holder.release()
    wait_until(lambda: waiter.local.token is not None, what="the waiter's grant")
    waiter.release()


def test_lost_compares_the_deadline_with_the_clock_when_read(r):
    # The deadline thread held back (as in a process paused): the first
    # read of `lost` past the deadline sees it.
    seen = []
    lock = Lock(r, "clock", timeout=0.2, on_lost=lambda lock, reason: seen.append(reason))
    assert lock.acquire()
    with TIMERS.condition:
        time.sleep(0.3)  # the pause tested
        assert lock.lost and lock.lost_reason == "expired" and seen == ["expired"]


CHILD = """
import asyncio, sys, redis, redis.asyncio
port, flavour, kwargs = int(sys.argv[1]), sys.argv[2], eval(sys.argv[3])
if flavour == "threads":
    from redis_flock import Lock
    lock = Lock(redis.Redis(port=port), "paused", **kwargs)
    assert lock.acquire(blocking_timeout=30)
    print("held", flush=True)
    sys.stdin.readline()
    print(lock.lost, lock.lost_reason, flush=True)
else:
    from redis_flock.asyncio import Lock
    async def main():
        lock = Lock(redis.asyncio.Redis(port=port), "paused", **kwargs)
        assert await lock.acquire(blocking_timeout=30)
        print("held", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        print(lock.lost, lock.lost_reason, flush=True)
    asyncio.run(main())
"""


@pytest.mark.parametrize("flavour", ["threads", "asyncio"])
def test_a_holder_paused_for_a_third_of_its_session_timeout_loses_nothing(r, server, flavour):
    # The read answered during the pause confirms the session as of its
    # send, and the next one waits half the time left: a pause shorter than
    # T/2 - m is heard of in time, at the client and at the server. 3 s, so
    # that the slack (0.157 T - 10 ms) outlasts a loaded machine's delays.
    timeout = 3.0
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(server.port), flavour, repr({"session_timeout": timeout})],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout.readline().strip() == "held"
        token = info(r, "paused")["token"]
        expiries = r.info("flock")["flock_session_expiries"]
        os.kill(child.pid, signal.SIGSTOP)
        time.sleep(timeout / 3)  # the pause tested
        os.kill(child.pid, signal.SIGCONT)
        # Past the session's timeout since the pause began: any loss has come.
        time.sleep(timeout)
        # The server first: the child ends once it has answered.
        assert info(r, "paused")["token"] == token
        assert r.info("flock")["flock_session_expiries"] == expiries
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().split() == ["False", "None"]
    finally:
        os.kill(child.pid, signal.SIGCONT)
        child.kill()
        child.wait()


@pytest.mark.parametrize("flavour", ["threads", "asyncio"])
@pytest.mark.parametrize("keeper", list(KEEPERS))
def test_a_holder_paused_past_its_deadline_sees_lost_at_its_first_check(r, c, server, keeper, flavour):
    kwargs, reason = KEEPERS[keeper]
    # The child's turn comes with the next waiter queued behind it already:
    # however late a loaded machine runs the processes, nobody else can be
    # granted the lock before the child's lease runs out.
    assert r.execute_command("FLOCK.ACQUIRE", "paused", "first", 60000) is not None
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(server.port), flavour, repr(kwargs)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        # The child starts an interpreter and imports the client first.
        wait_until(lambda: info(r, "paused")["waiters"] == 1, timeout=20, what="the child to queue")
        waiter = Lock(c, "paused", thread_local=False)
        t = start(lambda: waiter.acquire(blocking_timeout=20))
        wait_until(lambda: info(r, "paused")["waiters"] == 2, what="the waiter to queue")
        assert r.execute_command("FLOCK.RELEASE", "paused", "first") == 0
        assert child.stdout.readline().strip() == "held"
        os.kill(child.pid, signal.SIGSTOP)
        t.join(20)
        assert waiter.owned(), "the grant did not pass on while the holder was paused"
        # What the child reads first once it runs again: its check of `lost`.
        child.stdin.write("go\n")
        child.stdin.flush()
        os.kill(child.pid, signal.SIGCONT)
        assert child.stdout.readline().split() == ["True", reason]
        waiter.release()
    finally:
        os.kill(child.pid, signal.SIGCONT)
        child.kill()
        child.wait()
