"""Helpers the tests share: FLOCK.INFO, taking a lock from its holder, waiting
for an observable condition with a deadline, a proxy that loses a reply or
cuts a process off."""

import asyncio
import inspect
import contextlib
import socket
import threading
import time

import pytest
import redis

from redis_flock._core import RELEASED, holder, parse_info


# Redis.lock() passes raise_on_release_error on since redis-py 6 (5.0.8 does
# not); redis_flock.Lock takes it either way.
needs_raise_on_release_error = pytest.mark.skipif(
    "raise_on_release_error" not in inspect.signature(redis.Redis.lock).parameters,
    reason="this redis-py's Redis.lock() has no raise_on_release_error",
)


def wait_until(condition, timeout=5.0, what="the condition"):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.01)


async def until(condition, timeout=5.0, what="the condition"):
    """wait_until for asyncio tests: lets the event loop run between two
    checks. ``condition`` runs on the loop: a blocking read of the server in
    it holds the loop for its round trip (see until_read)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        await asyncio.sleep(0.01)


async def until_read(condition, timeout=5.0, what="the condition"):
    """until() for a ``condition`` that only reads the server through a
    blocking client: it runs in a thread, so that the loop's own work (a
    watchdog's renewals) goes on during its round trips, tenths of a second
    each on a busy machine. Not for what a thread cannot read: a thread-local
    lock's state."""
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(condition):
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        await asyncio.sleep(0.01)


async def cancel_while_paused(r, coroutine, command):
    """Runs ``coroutine`` while ``r``'s server pauses writes (CLIENT PAUSE
    WRITE) and cancels it once its ``command`` waits for the pause: the
    command was sent, and its reply is never read."""
    r.execute_command("CLIENT", "PAUSE", 10000, "WRITE")
    try:
        task = asyncio.create_task(coroutine)
        await until_read(
            lambda: any("b" in c["flags"] and c["cmd"] == command for c in r.client_list()),
            what=f"{command} held by the pause",
        )
        # A cancel that comes as redis-py's write of the command completes is
        # lost (asyncio.wait_for, before Python 3.12) and the task goes on to
        # await the reply: cancelled again until it ends.
        deadline = time.monotonic() + 5
        while not task.done():
            assert time.monotonic() < deadline, f"the task sending {command} was not cancelled"
            task.cancel()
            await asyncio.sleep(0.01)
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        r.execute_command("CLIENT", "UNPAUSE")


def remembered(name):
    """What the stale-hold memory (RELEASED) remembers for lock ``name``: {owner: token}."""
    return {owner: token for (key, owner), token in list(RELEASED.tokens.items()) if key == name.encode()}


def info(r, key):
    return parse_info(r.execute_command("FLOCK.INFO", key))


def owner_of(r, key):
    """The holder's owner as bytes, or None."""
    fields = info(r, key)
    if fields is None:
        return None
    owner = fields["owner"]
    return owner.encode() if isinstance(owner, str) else owner


def holding(r, key, owner):
    """``owner``'s entry in FLOCK.INFO's holders, or None."""
    return holder(info(r, key), owner)


def lock_kinds(module):
    """The lock classes of redis_flock or redis_flock.asyncio, by the FLOCK
    mode they acquire: the same tests run on each."""
    return {
        "exclusive": module.Lock,
        "shared": module.ReadLock,
        "semaphore": lambda r, name, **kwargs: module.Semaphore(r, name, 2, **kwargs),
    }


def queue_in_thread(r, lock, waiters=1, then=lambda lock: None, **acquire):
    """Starts ``lock.acquire(**acquire)`` then ``then(lock)`` in a thread, and
    returns once it is the ``waiters``-th in the queue: (the thread, [its
    result])."""
    result = []

    def run():
        result.append(lock.acquire(blocking_timeout=10, **acquire))
        then(lock)

    thread = threading.Thread(target=run)
    thread.start()
    wait_until(lambda: info(r, lock.name)["waiters"] == waiters, what=f"waiter {waiters} to queue")
    return thread, result


def ttl_ms(r, key):
    return info(r, key)["ttl-ms"]


def steal(r, key, owner="a"):
    """What redis-py's tests do with SET: the lock now belongs to someone else."""
    r.execute_command("FLOCK.FORCERELEASE", key)
    assert r.execute_command("FLOCK.ACQUIRE", key, owner, 60000) is not None


def calls(r, command):
    """How often the server ran ``command`` (INFO commandstats)."""
    stats = r.info("commandstats").get(f"cmdstat_{command}")
    return stats["calls"] if stats else 0


def stat(r, field):
    """A counter of INFO flock, e.g. wait_timeouts."""
    return int(r.info("flock")[f"flock_{field}"])


class ReplyDropper:
    """A TCP proxy to a server that, once armed with ``drop_reply_to(marker)``,
    forwards the next command containing ``marker`` and then closes the
    connection instead of forwarding its reply: a reply lost on the way.
    ``partition()`` stops carrying bytes both ways, keeping every socket
    open (no FIN, no RST: a partition, a dead host, a frozen VM); it reads
    nothing from either side meanwhile, so that nothing is lost, and
    ``heal()`` carries them again, what it held back first (as TCP does). A
    connection made meanwhile is not carried to the server until then.
    ``kill()`` plays the death of the process behind it: no new connection
    gets through, and every connection it carries is closed."""

    def __init__(self, server_port: int):
        self.server_port = server_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.marker = None
        self.times = 0
        self.dropped = threading.Event()
        self.drops = 0
        self.killed = False
        self.sockets: list = []
        self.mutex = threading.Lock()
        # Set while bytes flow; cleared by partition().
        self.flowing = threading.Event()
        self.flowing.set()
        threading.Thread(target=self._accept, daemon=True).start()

    def partition(self) -> None:
        self.flowing.clear()

    def heal(self) -> None:
        self.flowing.set()

    def kill(self) -> None:
        with self.mutex:
            self.killed = True
            sockets, self.sockets = self.sockets, []
        # Nothing waits for a heal any more: the sockets are closed.
        self.flowing.set()
        self.listener.close()
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def drop_reply_to(self, marker: bytes, times: int = 1) -> None:
        """Loses the replies of the next ``times`` commands containing ``marker``."""
        self.times = times
        self.marker = marker

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self.listener.accept()
            except OSError:
                return
            self.flowing.wait()
            try:
                upstream = socket.create_connection(("127.0.0.1", self.server_port))
            except OSError:
                downstream.close()
                continue
            with self.mutex:
                if not self.killed:
                    self.sockets += [downstream, upstream]
            if self.killed:
                for s in (downstream, upstream):
                    s.close()
                continue
            marked = threading.Event()
            threading.Thread(target=self._up, args=(downstream, upstream, marked), daemon=True).start()
            threading.Thread(target=self._down, args=(upstream, downstream, marked), daemon=True).start()

    def _up(self, downstream, upstream, marked) -> None:
        with _closing(downstream, upstream, after=self.flowing.wait):
            while data := self._read(downstream):
                if self.marker is not None and self.marker in data:
                    self.times -= 1
                    if self.times <= 0:
                        self.marker = None
                    marked.set()
                upstream.sendall(data)

    def _down(self, upstream, downstream, marked) -> None:
        with _closing(downstream, upstream, after=self.flowing.wait):
            while data := self._read(upstream):
                if marked.is_set():
                    self.drops += 1
                    self.dropped.set()
                    return
                downstream.sendall(data)

    def _read(self, s) -> bytes:
        """What ``s`` sends next (b"": it closed), carried on only while not
        partitioned: what comes meanwhile, a close included, waits for the
        heal."""
        self.flowing.wait()
        data = s.recv(65536)
        self.flowing.wait()
        return data


@contextlib.contextmanager
def _closing(*sockets, after=lambda: None):
    """Closes ``sockets`` at the end, once ``after()`` returns (a partition
    holds a close back too)."""
    try:
        yield
    except OSError:
        pass
    finally:
        after()
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
