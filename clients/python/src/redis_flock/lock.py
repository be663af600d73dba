"""``redis_flock.Lock``: redis-py's ``redis.lock.Lock`` on FLOCK."""

import threading
import time
from types import TracebackType
from typing import Literal, Optional, Type

from redis.exceptions import LockError, ResponseError

from ._core import (
    LOST_REPLY,
    RENEWAL_ERRORS,
    RESEND_DELAYS,
    LockBase,
    ReadSide,
    ReadWriteLockBase,
    SemaphoreBase,
    Number,
    lock_error,
    logger,
    parse_info,
    renewal_lost,
    to_ms,
)


def send(call, args):
    """``call(*args)``, sent again with the same arguments (request ID
    included) when the reply is lost."""
    for delay in RESEND_DELAYS:
        try:
            return call(*args)
        except LOST_REPLY:
            time.sleep(delay)
    return call(*args)


class Dedicated:
    """A connection of its own, made with the client pool's settings, for a
    blocking wait (it would hold a pool connection for its whole length) and
    for a watchdog (a busy pool must not delay renewals)."""

    def __init__(self, client, socket_timeout: Optional[float]):
        pool = client.connection_pool
        self.connection = pool.connection_class(**dict(pool.connection_kwargs, socket_timeout=socket_timeout))

    def call(self, *args):
        self.connection.send_command(*args)
        return self.connection.read_response()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        # Closing the connection also takes an abandoned waiter out of the queue.
        self.connection.disconnect()


class Lock(LockBase):
    """A fair distributed lock, used like redis-py's ``redis.lock.Lock``:
    ``redis_flock.Lock(r, "orders:42")`` or ``r.lock("orders:42",
    lock_class=redis_flock.Lock)``. See README.md for every difference."""

    def __enter__(self) -> "Lock":
        if self.acquire():
            return self
        raise self._unlocked_error()

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        try:
            self.release()
        except LockError:
            if self.raise_on_release_error:
                raise
            logger.warning("Lock was unlocked or no longer owned when exiting context manager.")

    def acquire(
        self,
        sleep: Optional[Number] = None,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[Number] = None,
        token=None,
    ) -> bool:
        """Takes the lock; True once granted. Not blocking: one try. Blocking:
        waits in the server's FIFO queue, up to ``blocking_timeout`` seconds
        (None: no limit), on a connection of its own. ``sleep`` is unused."""
        owner = self._owner(token, self.redis.get_encoder())
        wait_ms = self._wait_ms(blocking, blocking_timeout)
        try:
            granted = send(self.redis.execute_command, self._acquire_command(owner, None))
            if granted is None and wait_ms is not None:
                with Dedicated(self.redis, self._wait_socket_timeout(wait_ms)) as connection:
                    granted = send(connection.call, self._acquire_command(owner, wait_ms))
        except ResponseError as e:
            raise lock_error(e, "acquire", self.name) from e
        if granted is None:
            return False
        grant, replaced = self._new_grant(owner, granted, threading.Lock())
        if replaced is not None:
            replaced.stop()
        if grant is not None and self.watchdog:
            wake = threading.Event()
            grant.on_stop = wake.set
            threading.Thread(
                target=self._watch, args=(grant, wake), name=f"flock-watchdog {self.name!r}", daemon=True
            ).start()
        return True

    def _watch(self, grant, wake: threading.Event) -> None:
        """Renews the grant every third of its lease until released; marks it
        lost on NOTOWNER, or when no renewal got through for a whole lease."""
        lease_ms = self._lease_ms()
        interval = lease_ms / 3000
        confirmed = time.monotonic()
        with Dedicated(self.redis, interval) as connection:
            while not wake.wait(interval):
                with grant.mutex:
                    if grant.stopped:
                        return
                    sent = time.monotonic()
                    try:
                        send(connection.call, self._renew_command(grant.owner, lease_ms))
                        confirmed = sent
                    except RENEWAL_ERRORS as e:
                        if renewal_lost(grant, self.name, e, time.monotonic() - confirmed, lease_ms):
                            return

    def locked(self) -> bool:
        """Whether anyone holds the lock."""
        return self._info() is not None

    def owned(self) -> bool:
        """Whether this thread's grant still holds the lock."""
        return self._is_owner(self._info())

    def _info(self):
        return parse_info(self.redis.execute_command("FLOCK.INFO", self.name))

    def release(self) -> None:
        """Releases one hold; the lock passes at once to the next waiter. As
        redis-py's, forgets the token whatever the outcome (a reentrant
        lock keeps it while holds are left)."""
        command = self._release_command()
        left = 0
        with self.local.grant.mutex:
            try:
                left = send(self.redis.execute_command, command)
            except ResponseError as e:
                raise lock_error(e, "release", self.name) from e
            finally:
                self._released_one(left)

    def extend(self, additional_time: Number, replace_ttl: bool = False) -> Literal[True]:
        """Adds ``additional_time`` seconds to the lease left (or makes it the
        lease, ``replace_ttl=True``)."""
        owner = self._held("Cannot extend an unlocked lock")
        self._timed("extend")
        additional_ms = to_ms(additional_time)
        lease_ms = additional_ms if replace_ttl else self._extended_lease(self._info(), owner, additional_ms)
        return self._renew(owner, lease_ms, "extend")

    def reacquire(self) -> Literal[True]:
        """Resets the lease to ``timeout``."""
        owner = self._held("Cannot reacquire an unlocked lock")
        return self._renew(owner, self._timed("reacquire"), "reacquire")

    def _renew(self, owner: bytes, lease_ms: int, action: str) -> Literal[True]:
        try:
            send(self.redis.execute_command, self._renew_command(owner, lease_ms))
        except ResponseError as e:
            raise lock_error(e, action, self.name) from e
        return True


class ReadLock(ReadSide, Lock):
    """The read side of a read-write lock (FLOCK's ``SHARED``), with Lock's
    arguments and methods; usually taken from ``ReadWriteLock.read_lock()``."""


class ReadWriteLock(ReadWriteLockBase):
    """``read_lock()`` and ``write_lock()`` on one key, made with Lock's
    arguments: ``ReadWriteLock(r, "report", timeout=10)``. See README.md."""

    lock_class = Lock
    read_class = ReadLock


class Semaphore(SemaphoreBase, Lock):
    """At most ``limit`` permits held at once, ``permits`` per acquire, with
    Lock's other arguments and methods: ``Semaphore(r, "pool", 3)``."""
