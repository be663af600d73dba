"""``redis_flock.asyncio.Lock``: redis-py's ``redis.asyncio.lock.Lock`` on FLOCK."""

import asyncio
import time
import uuid
from typing import Awaitable, Literal, Optional

from redis.exceptions import AskError, LockError, LockNotOwnedError, ResponseError

from ._asyncio_session import confirm_durable, moved_away, node_client, redirected, release_extra, send, session_of
from ._core import (
    ERROR,
    GRANTED,
    REDIRECTS,
    RELEASED,
    RENEWAL_ERRORS,
    LockBase,
    LockNotDurableError,
    ReadSide,
    ReadWriteLockBase,
    SemaphoreBase,
    Number,
    is_demotion,
    is_key_gone,
    lock_error,
    logger,
    parse_info,
    renewal_lost,
    to_ms,
    with_id,
)

__all__ = ["Lock", "LockNotDurableError", "ReadLock", "ReadWriteLock", "Semaphore"]


class Dedicated:
    """A connection of its own, made with the client pool's settings, for a
    blocking wait without a session (see redis_flock.lock.Dedicated)."""

    def __init__(self, client, socket_timeout: Optional[float]):
        pool = client.connection_pool
        self.connection = pool.connection_class(**dict(pool.connection_kwargs, socket_timeout=socket_timeout))

    async def call(self, *args):
        # connect() first (see redis_flock._session.Session.open).
        await self.connection.connect()
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
        key = encoder.encode(self.name)
        wait_ms = self._wait_ms(blocking, blocking_timeout)
        rid, started = str(uuid.uuid4()), time.monotonic()
        try:
            for attempt in range(REDIRECTS + 1):
                # The key's server (see redis_flock.lock.Lock.acquire).
                node = await node_client(self.redis, key)
                session = session_of(node) if self.use_session else None
                try:
                    if session is not None:
                        granted, sid, at = await self._acquire_in(session, node, key, owner, wait_ms, rid)
                    else:
                        granted, sid, at = await self._acquire_blocking(node, owner, wait_ms, rid), None, None
                    break
                except ResponseError as e:
                    redirect = e
                    if node is not self.redis and is_key_gone(e):
                        # A slot migration (see redis_flock.lock.Lock.acquire).
                        redirect, rid = await moved_away(node, key), str(uuid.uuid4())
                    elif node is not self.redis and is_demotion(e):
                        # CLUSTER FAILOVER: the node became a replica of the key's
                        # new master (it answers MOVED), and the wait is sent
                        # there again with the same request ID: a grant the old
                        # master made and replicated is recognised, a replicated
                        # waiter's place taken over.
                        redirect = await moved_away(node, key)
                    if node is self.redis or not isinstance(redirect, AskError) or attempt == REDIRECTS:
                        raise lock_error(e, "acquire", self.name) from e
                    await redirected(self.redis, redirect, attempt + 1)
                    wait_ms = self._wait_left(wait_ms, started)
        except BaseException:
            # Perhaps granted all the same (see _acquire_failed).
            self._acquire_failed(owner, token)
            raise
        if granted is None:
            return False
        if self._is_stale(owner, granted):
            # A reentry of a hold this task released: the release was lost
            # in a failover or refused. Its holds go back first.
            await self._give_back_stale(owner, granted)
        elif self._release_pending(owner, granted):
            # A reentry of the grant whose release() did not complete (the
            # server refused it, or its reply was lost): that release is
            # sent again first, so that the caller holds one more hold than
            # it kept, not two.
            await self._resend_release()
        # Durable grants: counted once enough replicas have it, else given
        # back (LockNotDurableError), before this object records anything.
        await confirm_durable(self, node, owner, granted)
        grant, replaced = self._new_grant(owner, granted, asyncio.Lock(), at)
        if replaced is not None:
            replaced.stop()
        if grant is not None:
            if session is not None:
                session.state.watch(key, owner, granted, self, grant, sid)
            if self.watchdog and not grant.lost:
                grant.on_stop.append(asyncio.create_task(self._watch(grant), name=f"flock-watchdog {self.name!r}").cancel)
        return True

    async def _acquire_in(self, session, node, key: bytes, owner: bytes, wait_ms: Optional[int], rid: str):
        """(token or None, the session that granted it, when its reply came),
        sent on ``node``, the session's server."""
        command = self._acquire_base(owner)
        if wait_ms is None:
            return await session.try_acquire(node, command, rid)
        (kind, token, detail), wait = await session.wait(node, key, owner, command, wait_ms, rid)
        if kind == GRANTED:
            return token, wait.sent_to, wait.settled_at
        if kind == ERROR:
            raise detail if isinstance(detail, Exception) else ResponseError(detail)
        return None, None, None

    async def _acquire_blocking(self, node, owner: bytes, wait_ms: Optional[int], rid: str) -> Optional[int]:
        """A try through the client, then a wait blocking on a connection of
        its own to ``node``, the key's server; the wait with request ID
        ``rid`` and the try with one made from it (see redis_flock.lock)."""
        granted = await send(self.redis.execute_command, self._acquire_command(owner, None, rid + ":try"))
        if granted is None and wait_ms is not None:
            async with Dedicated(node, self._wait_socket_timeout(wait_ms)) as connection:
                granted = await send(connection.call, self._acquire_command(owner, wait_ms, rid))
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

    async def _give_back_stale(self, owner: bytes, token: int) -> None:
        """See redis_flock.lock.Lock._give_back_stale."""
        try:
            for _ in range(self._stale_holds(owner, token, await self._info())):
                await send(self.redis.execute_command, with_id("FLOCK.RELEASE", self.name, owner))
        except RENEWAL_ERRORS as e:
            RELEASED.remember(self.name, owner, token)
            logger.warning("FLOCK: could not give back the stale holds of %r: %s", self.name, e)

    def _release_pending(self, owner: bytes, token: int) -> bool:
        grant = self.local.grant
        return grant is not None and grant.owner == owner and grant.token == token and grant.pending_release is not None

    async def _resend_release(self) -> None:
        """Sends the grant's pending RELEASE again (its request ID: applied
        once) and counts it; on failure it stays pending."""
        grant = self.local.grant
        async with grant.mutex:
            if grant.pending_release is None:
                return
            try:
                await send(self.redis.execute_command, grant.pending_release)
            except RENEWAL_ERRORS as e:
                logger.warning("FLOCK: could not release the hold of %r a release() left: %s", self.name, e)
                return
            grant.pending_release = None
            grant.holds -= 1

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
