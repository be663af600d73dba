"""``redis_flock.asyncio.Lock``: redis-py's ``redis.asyncio.lock.Lock`` on FLOCK."""

import asyncio
import time
from typing import Awaitable, Literal, Optional

from redis.exceptions import LockError, LockNotOwnedError, ResponseError

from ._asyncio_session import release_extra, send, session_of
from ._core import (
    ERROR,
    GRANTED,
    RENEWAL_ERRORS,
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

__all__ = ["Lock", "ReadLock", "ReadWriteLock", "Semaphore"]


class Dedicated:
    """A connection of its own, made with the client pool's settings, for a
    blocking wait without a session (see redis_flock.lock.Dedicated)."""

    def __init__(self, client, socket_timeout: Optional[float]):
        pool = client.connection_pool
        self.connection = pool.connection_class(**dict(pool.connection_kwargs, socket_timeout=socket_timeout))

    async def call(self, *args):
        await self.connection.send_command(*args)
        return await self.connection.read_response()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        # Closing the connection also takes a cancelled waiter out of the queue.
        await self.connection.disconnect()


class Lock(LockBase):
    """A fair distributed lock, used like redis-py's
    ``redis.asyncio.lock.Lock``: ``redis_flock.asyncio.Lock(r, "orders:42")``
    or ``r.lock("orders:42", lock_class=redis_flock.asyncio.Lock)``."""

    async def __aenter__(self) -> "Lock":
        if await self.acquire():
            return self
        raise self._unlocked_error()

    async def __aexit__(self, exc_type, exc_value, traceback) -> None:
        try:
            await self.release()
        except LockError:
            if self.raise_on_release_error:
                raise
            logger.warning("Lock was unlocked or no longer owned when exiting context manager.")

    def _encoder(self):
        try:
            return self.redis.connection_pool.get_encoder()
        except AttributeError:
            return self.redis.get_encoder()

    async def acquire(
        self,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[Number] = None,
        token=None,
    ) -> bool:
        """Takes the lock; True once granted. Not blocking: one try. Blocking:
        one ``FLOCK.ACQUIRE ... WAIT`` that queues in the server's FIFO queue,
        up to ``blocking_timeout`` seconds (None: no limit), through the
        session of this loop (or, ``use_session=False``, on a connection of
        its own). Cancelling the task sends FLOCK.CANCEL; a grant that won
        the race is released."""
        encoder = self._encoder()
        owner = self._owner(token, encoder)
        wait_ms = self._wait_ms(blocking, blocking_timeout)
        # A client without a pool of its own (RedisCluster) waits the blocking way.
        session = session_of(self.redis) if self.use_session and hasattr(self.redis, "connection_pool") else None
        try:
            if session is not None:
                granted = await self._acquire_in(session, encoder.encode(self.name), owner, wait_ms)
            else:
                granted = await self._acquire_blocking(owner, wait_ms)
        except ResponseError as e:
            raise lock_error(e, "acquire", self.name) from e
        granted, sid, at = granted if session is not None else (granted, None, None)
        if granted is None:
            return False
        grant, replaced = self._new_grant(owner, granted, asyncio.Lock(), at)
        if replaced is not None:
            replaced.stop()
        if grant is not None:
            if session is not None:
                session.state.watch(encoder.encode(self.name), owner, granted, self, grant, sid)
            if self.watchdog and not grant.lost:
                grant.on_stop.append(asyncio.create_task(self._watch(grant), name=f"flock-watchdog {self.name!r}").cancel)
        return True

    async def _acquire_in(self, session, key: bytes, owner: bytes, wait_ms: Optional[int]):
        """(token or None, the session that granted it, when its reply came)."""
        command = self._acquire_base(owner)
        if wait_ms is None:
            return await session.try_acquire(self.redis, command)
        (kind, token, detail), wait = await session.wait(self.redis, key, owner, command, wait_ms)
        if kind == GRANTED:
            return token, wait.sent_to, wait.settled_at
        if kind == ERROR:
            raise detail if isinstance(detail, Exception) else ResponseError(detail)
        return None, None, None

    async def _acquire_blocking(self, owner: bytes, wait_ms: Optional[int]) -> Optional[int]:
        granted = await send(self.redis.execute_command, self._acquire_command(owner, None))
        if granted is None and wait_ms is not None:
            async with Dedicated(self.redis, self._wait_socket_timeout(wait_ms)) as connection:
                granted = await send(connection.call, self._acquire_command(owner, wait_ms))
        return granted

    async def _watch(self, grant) -> None:
        """Renews the grant every third of its lease, through the client's
        pool, until released; marks it lost on NOTOWNER, or when no renewal
        got through for a whole lease."""
        lease_ms = self._lease_ms()
        interval = lease_ms / 3000
        confirmed = time.monotonic()
        while True:
            await asyncio.sleep(interval)
            async with grant.mutex:
                if grant.stopped or grant.lost:
                    return
                sent = time.monotonic()
                try:
                    await send(self.redis.execute_command, self._renew_command(grant.owner, lease_ms))
                    confirmed = sent
                except RENEWAL_ERRORS as e:
                    reason = renewal_lost(e, time.monotonic() - confirmed, lease_ms)
                    if reason is not None:
                        self._grant_lost(grant, reason)
                        return

    async def locked(self) -> bool:
        """Whether anyone holds the lock."""
        return await self._info() is not None

    async def owned(self) -> bool:
        """Whether this grant still holds the lock."""
        return self._is_owner(await self._info())

    async def _info(self):
        return parse_info(await self.redis.execute_command("FLOCK.INFO", self.name))

    async def release(self) -> None:
        """Releases one hold; the lock passes at once to the next waiter. As
        redis-py's asyncio lock, keeps the token when the release did not
        complete (cancelled, connection lost): calling release() again
        resends the same request ID, so it is applied once."""
        command = self._release_command()
        grant = self.local.grant
        async with grant.mutex:
            if grant.extra_release is not None:
                # A re-watch's extra hold whose RELEASE did not get through.
                await release_extra(self.redis.execute_command, grant)
            grant.pending_release = grant.pending_release or command
            try:
                left = await send(self.redis.execute_command, grant.pending_release)
            except ResponseError as e:
                error = self._release_error(e)
                if isinstance(error, LockNotOwnedError):
                    self._dropped()
                raise error from e
            grant.pending_release = None
            self._released_one(left)

    def extend(self, additional_time: Number, replace_ttl: bool = False) -> Awaitable[Literal[True]]:
        """Adds ``additional_time`` seconds to the lease left (or makes it the
        lease, ``replace_ttl=True``)."""
        owner = self._held("Cannot extend an unlocked lock")
        self._timed("extend")
        return self._extend(owner, to_ms(additional_time), replace_ttl)

    async def _extend(self, owner: bytes, additional_ms: int, replace_ttl: bool) -> Literal[True]:
        lease_ms = additional_ms if replace_ttl else self._extended_lease(await self._info(), owner, additional_ms)
        return await self._renew(owner, lease_ms, "extend")

    def reacquire(self) -> Awaitable[Literal[True]]:
        """Resets the lease to ``timeout``."""
        owner = self._held("Cannot reacquire an unlocked lock")
        return self._renew(owner, self._timed("reacquire"), "reacquire")

    async def _renew(self, owner: bytes, lease_ms: int, action: str) -> Literal[True]:
        sent = time.monotonic()
        try:
            await send(self.redis.execute_command, self._renew_command(owner, lease_ms))
        except ResponseError as e:
            raise lock_error(e, action, self.name, self.lost_reason) from e
        self._lease_renewed(lease_ms, sent)
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
