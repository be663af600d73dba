"""``redis_flock.asyncio.Lock``: redis-py's ``redis.asyncio.lock.Lock`` on FLOCK."""

import asyncio
import time
import uuid
from contextlib import AsyncExitStack
from typing import Awaitable, Literal, Optional

from redis.exceptions import ConnectionError, LockError, LockNotOwnedError, ResponseError

from ._asyncio_session import confirm_durable, release_extra, routed, send, session_of
from ._core import (
    ERROR,
    GIVE_BACK_PAUSE,
    GRANTED,
    RELEASED,
    RENEWAL_ERRORS,
    RESENDS,
    LockBase,
    LockNotDurableError,
    MultiLockBase,
    MultiPart,
    ReadSide,
    ReadWriteLockBase,
    SemaphoreBase,
    Number,
    is_queued,
    lock_error,
    logger,
    parse_info,
    renewal_lost,
    to_ms,
    wait_socket_timeout,
    with_id,
)

__all__ = ["Lock", "LockNotDurableError", "MultiLock", "ReadLock", "ReadWriteLock", "Semaphore"]


class Dedicated:
    """A connection of its own, made with the client pool's settings, for a
    blocking wait without a session (see redis_flock.lock.Dedicated)."""

    def __init__(self, client, socket_timeout: Optional[float]):
        pool = client.connection_pool
        self.connection = pool.connection_class(**dict(pool.connection_kwargs, socket_timeout=socket_timeout))
        self.closed = False

    async def call(self, *args):
        # The connection's work runs in a task of its own, awaited through a
        # shield, so that a cancel of the caller always raises here: redis-py
        # writes through asyncio.wait_for on a socket with a timeout, which
        # before Python 3.12 loses a cancel that comes as the write completes,
        # and the caller would wait on. That task ends with the close
        # (__aexit__): its read fails, or it finds the connection closed.
        work = asyncio.ensure_future(self._call(args))
        work.add_done_callback(_retrieved)
        return await asyncio.shield(work)

    async def _call(self, args):
        # connect() first (see redis_flock._session.Session.open).
        await self.connection.connect()
        await self._check_open()
        await self.connection.send_command(*args)
        await self._check_open()
        return await self.connection.read_response()

    async def _check_open(self) -> None:
        if self.closed:
            # Closed while this task was connecting or writing.
            await self.connection.disconnect()
            raise ConnectionError("the wait's connection was closed")

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        # Closing the connection also takes a cancelled waiter out of the queue.
        self.closed = True
        await self.connection.disconnect()


def _retrieved(task: asyncio.Future) -> None:
    """Retrieves the outcome of a Dedicated call nobody awaits any more (its
    caller was cancelled), so that asyncio does not log it as lost."""
    if not task.cancelled():
        task.exception()


class AsyncManaged:
    """``async with lock:`` for Lock and MultiLock (see
    redis_flock.lock.Managed)."""

    async def __aenter__(self):
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


class Lock(AsyncManaged, LockBase):
    """A fair distributed lock, used like redis-py's
    ``redis.asyncio.lock.Lock``: ``redis_flock.asyncio.Lock(r, "orders:42")``
    or ``r.lock("orders:42", lock_class=redis_flock.asyncio.Lock)``."""

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

        async def attempt(node, rid, wait_ms):
            # A session per server (see redis_flock.lock.Lock.acquire).
            session = session_of(node) if self.use_session else None
            if session is not None:
                granted, sid, at = await self._acquire_in(session, node, key, owner, wait_ms, rid)
            else:
                granted, sid, at = await self._acquire_blocking(node, owner, wait_ms, rid), None, None
            return granted, node, session, sid, at

        try:
            granted, node, session, sid, at = await routed(
                self.redis, key, self.name, "acquire", attempt, str(uuid.uuid4()), self._wait_ms(blocking, blocking_timeout)
            )
        except BaseException:
            # Perhaps granted all the same (see _acquire_failed).
            self._acquire_failed(owner, token)
            raise
        if granted is None:
            return False
        await self._granted(node, owner, granted, at, session, key, sid)
        return True

    async def _granted(self, node, owner: bytes, granted: int, at: Optional[float], session=None, key=None, sid=None):
        """See redis_flock.lock.Lock._granted."""
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
            async with Dedicated(node, wait_socket_timeout(wait_ms)) as connection:
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


# Give-backs of cancelled MultiLock waits, referenced until they end.
_BACKGROUND: set = set()


class _Part(MultiPart, Lock):
    """One key of a MultiLock."""


class MultiLock(AsyncManaged, MultiLockBase):
    """Several locks taken for one owner at once, all or none, and released
    together, with redis_flock.asyncio.Lock's arguments (see
    redis_flock.lock.MultiLock)."""

    part_class = _Part

    async def acquire(
        self,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[Number] = None,
        token=None,
    ) -> bool:
        """Takes every lock for one owner, or none: one FLOCK.ACQUIREALL (see
        redis_flock.lock.MultiLock.acquire). Cancelling the task ends the
        wait (its connection closes); a grant that won the race is given
        back."""
        encoder = self._locks[0]._encoder()
        owner = self._owner(token, encoder)
        keys = [encoder.encode(name) for name in self.names]
        command = self._acquire_all_command(keys, owner)

        async def attempt(node, rid, wait_ms):
            return await self._acquire_on(node, command, owner, wait_ms, rid), node

        try:
            tokens, node = await routed(
                self.redis, keys[0], self.names, "acquire", attempt, str(uuid.uuid4()), self._wait_ms(blocking, blocking_timeout)
            )
        except BaseException:
            self._acquire_failed(owner, token)
            raise
        if tokens is None:
            return False
        at = time.monotonic()
        for lock, granted in zip(self._locks, tokens):
            await lock._granted(node, owner, int(granted), at)
        self._grouped()
        return True

    async def _acquire_on(self, node, command: list, owner: bytes, wait_ms: Optional[int], rid: str):
        """See redis_flock.lock.MultiLock._acquire_on."""
        if wait_ms is None:
            return await send(node.execute_command, (*command, "ID", rid))
        try:
            async with Dedicated(node, wait_socket_timeout(wait_ms)) as connection:
                return await send(connection.call, (*command, "WAIT", wait_ms, "ID", rid))
        except ResponseError:
            raise
        except BaseException:
            # In a task of its own: a second cancel does not stop it.
            give_back = asyncio.ensure_future(self._give_back(node, command, owner, rid))
            _BACKGROUND.add(give_back)
            give_back.add_done_callback(_BACKGROUND.discard)
            try:
                await asyncio.shield(give_back)
            except asyncio.CancelledError:
                pass
            raise

    async def _give_back(self, node, command: list, owner: bytes, rid: str) -> None:
        """See redis_flock.lock.MultiLock._give_back."""
        try:
            for attempt in range(1, RESENDS + 2):
                try:
                    tokens = await send(node.execute_command, (*command, "ID", rid))
                    break
                except ResponseError as e:
                    if not is_queued(e) or attempt > RESENDS:
                        raise
                    await asyncio.sleep(GIVE_BACK_PAUSE * attempt)
            if tokens is not None:
                await send(node.execute_command, self._release_all_command(owner))
        except Exception as e:
            logger.warning("FLOCK: could not give back the locks %r of a wait that ended: %s", self.names, e)

    async def release(self) -> None:
        """Releases one hold of every key (FLOCK.RELEASEALL), all or none. As
        Lock's, keeps the grant when the release did not complete
        (cancelled, connection lost): calling release() again resends the
        same request ID, so it is applied once."""
        owner = self._held("Cannot release a lock that's not owned or is already unlocked.")
        key = self._locks[0]._encoder().encode(self.names[0])
        async with AsyncExitStack() as stack:
            for mutex in self._mutexes():
                await stack.enter_async_context(mutex)
            grants = self._grants()
            command = grants[0].pending_release or self._release_all_command(owner)
            for grant in grants:
                grant.pending_release = command
            try:
                left = await routed(
                    self.redis, key, self.names, "release", lambda node, *_: send(node.execute_command, command),
                    lost=self.lost_reason,
                )
            except LockNotOwnedError:
                for lock in self._locks:
                    lock._dropped()
                raise
            for grant in grants:
                grant.pending_release = None
            self._released(left)

    def extend(self, additional_time: Number, replace_ttl: bool = False) -> Awaitable[Literal[True]]:
        """Lock.extend on every key, one after the other."""
        self._held("Cannot extend an unlocked lock")
        self._locks[0]._timed("extend")
        return self._each(lambda lock: lock.extend(additional_time, replace_ttl))

    def reacquire(self) -> Awaitable[Literal[True]]:
        """Lock.reacquire on every key, one after the other."""
        self._held("Cannot reacquire an unlocked lock")
        self._locks[0]._timed("reacquire")
        return self._each(lambda lock: lock.reacquire())

    async def _each(self, call) -> Literal[True]:
        for lock in self._locks:
            await call(lock)
        return True

    async def locked(self) -> bool:
        """Whether anyone holds one of the locks."""
        for lock in self._locks:
            if await lock.locked():
                return True
        return False

    async def owned(self) -> bool:
        """Whether this task's grant still holds every lock."""
        for lock in self._locks:
            if not await lock.owned():
                return False
        return True
