"""``redis_flock.asyncio.Lock``: redis-py's ``redis.asyncio.lock.Lock`` on FLOCK."""

# The blocking flavour's module is generated from the asyncio flavour's
# (scripts/unasync.py); what differs for real between them is in their
# ``backend`` module.

import time
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Awaitable, Literal, Optional, Type

from redis.exceptions import LockError, LockNotOwnedError, ResponseError

from . import _asyncio_backend as backend
from ._asyncio_session import confirm_durable, release_extra, routed, send, send_own, session_of
from ._core import (
    CANCELLED,
    ERROR,
    GIVE_BACK_PAUSE,
    GRANTED,
    LOST_REPLY,
    NOTOWNER,
    RELEASED,
    RENEWAL_ERRORS,
    RESENDS,
    SESSION_GRANT,
    WATCHDOG_GRANT,
    WATCHDOG_RENEW_FRACTION,
    AcquireCancelled,
    LockBase,
    LockNotDurableError,
    MultiLockBase,
    MultiPart,
    Number,
    ReadSide,
    ReadWriteLockBase,
    SemaphoreBase,
    StaleTokenError,
    holder,
    is_notowner,
    is_queued,
    lock_error,
    logger,
    new_id,
    parse_info,
    to_ms,
    wait_socket_timeout,
    with_id,
)

__all__ = ["Lock", "LockNotDurableError", "MultiLock", "ReadLock", "ReadWriteLock", "Semaphore"]


class AsyncManaged:
    """``async with lock:`` for Lock and MultiLock, as redis-py's: LockError
    (with ``lock_name``) when not acquired; a release error raised on exit
    unless ``raise_on_release_error`` is False (then logged)."""

    async def __aenter__(self):
        if await self.acquire():
            return self
        raise self._unlocked_error()

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        try:
            await self.release()
        except LockError:
            if self.raise_on_release_error:
                raise
            logger.warning("Lock was unlocked or no longer owned when exiting context manager.")


class Lock(backend.LockFlavour, AsyncManaged, LockBase):
    """A fair distributed lock, used like redis-py's
    ``redis.asyncio.lock.Lock``: ``redis_flock.asyncio.Lock(r, "orders:42")``
    or ``r.lock("orders:42", lock_class=redis_flock.asyncio.Lock)``. See
    README.md for every difference."""

    def _encoder(self):
        # Made once per client: its settings do not change.
        encoder = self.redis.__dict__.get("_flock_encoder")
        if encoder is None:
            try:
                encoder = self.redis.connection_pool.get_encoder()
            except AttributeError:
                # A RedisCluster.
                encoder = self.redis.get_encoder()
            self.redis._flock_encoder = encoder
        return encoder

    async def _acquire(self, blocking: Optional[bool], blocking_timeout: Optional[Number], token, cancel) -> bool:
        """acquire(), whose arguments are the flavour's (the backend's
        LockFlavour): ``cancel``, a CancelToken or None."""
        if cancel is not None:
            cancel._check(self.name)
        encoder = self._encoder()
        owner = self._owner(token, encoder)
        key = encoder.encode(self.name)

        async def attempt(node, rid, wait_ms):
            # A session per server: a RedisCluster's node of the key.
            session = session_of(node, self.session_timeout) if self.use_session else None
            if session is not None:
                granted, sid, basis, lease_ms = await self._acquire_in(session, node, key, owner, wait_ms, cancel, rid)
            else:
                granted, basis, lease_ms = await self._acquire_blocking(node, owner, wait_ms, cancel, rid)
                sid = None
            return granted, node, session, sid, basis, lease_ms

        # Counted as the process's hold of the owner from before it is sent
        # until its grant is (rule "stale holds").
        counted = self._acquiring(owner)
        try:
            try:
                granted, node, session, sid, basis, lease_ms = await routed(
                    self.redis, key, self.name, "acquire", attempt, new_id(), self._wait_ms(blocking, blocking_timeout)
                )
            except LOST_REPLY:
                # Every reply lost: perhaps granted all the same (see _acquire_failed).
                self._acquire_failed(owner)
                raise
            if granted is None:
                return False
            await self._granted(node, owner, granted, basis, session, key, sid, lease_ms)
            return True
        finally:
            if counted:
                self._acquire_ended(owner)

    async def _granted(
        self, node, owner: bytes, granted: int, basis: Optional[float], session=None, key=None, sid=None,
        lease_ms: Optional[int] = None,
    ):
        """Records the grant of token ``granted`` made on ``node`` by a
        command sent at ``basis`` (its lease counts from then: ``lease_ms``
        if the grant's event named what was left, else the lease asked);
        through ``session`` ``sid``, which watches it from now on (and holds
        it, for a session grant). Then its deadline is watched (_arm)."""
        if self._release_pending(owner, granted):
            # A reentry of the grant whose release() was cancelled: that
            # release is sent again first, so that the caller holds one more
            # hold than it kept, not two.
            await self._resend_release()
        if self._is_stale(owner, granted):
            # A reentry of holds a release left (refused, lost in a
            # failover) or a lost acquire took: they go back first.
            await self._give_back_stale(owner, granted)
        # Durable grants: counted once enough replicas have it, else given
        # back (LockNotDurableError), before this object records anything.
        await confirm_durable(self, node, owner, granted)
        grant, replaced = self._new_grant(
            owner, granted, backend.mutex(), basis, lease_ms, session.state if session is not None else None, sid
        )
        if replaced is not None:
            replaced.stop()
        if grant is not None:
            if session is not None and grant.holds == 1:
                session.state.watch(key, owner, granted, self, grant, sid)
                if node is self.redis:
                    # A single server's: released through the session's own
                    # connections (a Cluster's follows its key).
                    grant.sender = session
            self._arm(grant)

    def _arm(self, grant) -> None:
        """Watches the deadline of ``grant`` (docs/client-protocol.md, "The
        rules every client shares"): a session grant's is its session's (the
        session's timer); a fixed lease's or the watchdog's, a timer of the
        backend's at it (no thread or task per grant), and for the
        watchdog, its first renewal a third of the lease after the grant."""
        if grant.kind == SESSION_GRANT:
            return
        if grant.deadline_timer is not None:
            # A reentry that gave a grant a lease of another kind.
            grant.deadline_timer.cancel()
        self._deadline_timer(grant)
        if grant.kind == WATCHDOG_GRANT:
            self._renew_at(grant, grant.lease_from + grant.lease_ms / 1000 / WATCHDOG_RENEW_FRACTION)

    def _deadline_timer(self, grant) -> None:
        """At the deadline of ``grant``: lost (``expired``, ``unconfirmed``)
        unless it moved on meanwhile (then the timer is set again there)."""
        if grant.kind == SESSION_GRANT:
            return
        deadline = self._check_due(grant)
        if deadline is not None:
            grant.deadline_timer = backend.schedule(deadline, self._deadline_timer, grant)

    def _renew_at(self, grant, when: float) -> None:
        """Starts the watchdog's renewal of ``grant`` at ``when``, in a
        thread or task of its own (backend.spawn): a slow renewal delays no
        other, nor the deadline timers."""
        if not (grant.stopped or grant.lost):
            grant.renewal_timer = backend.schedule(when, backend.spawn, "flock-watchdog", self._watchdog_renew, grant)

    async def _watchdog_renew(self, grant) -> None:
        """One renewal of the watchdog's, under the grant's mutex, through the
        client's pool, with a socket timeout until the grant's deadline. Its
        reply confirms the grant: the deadline moves to the RENEW's send time
        plus the lease (less the margin), and the next renewal is a third of
        the lease later. NOTOWNER: lost (``notowner``). Another failure: tried
        again a ninth of the lease later; the deadline timer marks the grant
        lost (``unconfirmed``) if none gets through in time."""
        interval = grant.lease_ms / 1000 / WATCHDOG_RENEW_FRACTION
        async with grant.mutex:
            if grant.stopped or grant.lost or grant.kind != WATCHDOG_GRANT or self._check_due(grant) is None:
                return
            sent = time.monotonic()
            try:
                await send_own(
                    self.redis, self._renew_command(grant.owner, grant.lease_ms), lambda: self._grant_timeout(grant)
                )
            except Exception as e:
                # NOTOWNER ends it; anything else (an I/O error, its client
                # closed under it) is tried again while the deadline allows.
                if is_notowner(e):
                    self._grant_lost(grant, NOTOWNER, str(e))
                    return
                logger.info("FLOCK watchdog: renewing %r failed (%r): trying again", self.name, e)
                next_at = time.monotonic() + interval / WATCHDOG_RENEW_FRACTION
            else:
                grant.lease_from = sent
                next_at = sent + interval
        self._renew_at(grant, next_at)

    async def _acquire_in(self, session, node, key: bytes, owner: bytes, wait_ms: Optional[int], cancel, rid: str):
        """(token or None, the session that granted it, the send time of
        the command that brought the grant, the lease left its event named
        or None), sent on ``node``, the session's server."""
        command = self._acquire_base(owner)
        if wait_ms is None:
            return (*await session.try_acquire(node, command, rid), None)
        (kind, token, detail), wait = await session.wait(node, key, owner, command, wait_ms, rid, cancel)
        if kind == GRANTED:
            return token, wait.sent_to, wait.basis, int(detail) if detail else None
        if kind == CANCELLED and cancel is not None and cancel.cancelled:
            raise AcquireCancelled("acquire() was cancelled", lock_name=self.name)
        if kind == ERROR:
            raise detail if isinstance(detail, Exception) else ResponseError(detail)
        return None, None, None, None

    async def _acquire_blocking(self, node, owner: bytes, wait_ms: Optional[int], cancel, rid: str):
        """A try through the client, then a wait blocking on a connection of
        its own to ``node``, the key's server: (the token or None, the send
        time its lease counts from, the lease left or None). The wait has
        request ID ``rid``, the try one made from it: sent again to a
        Cluster's new master after a failover, a grant the old master made
        and replicated is recognised (no second hold)."""
        sent = time.monotonic()
        granted = await send(self.redis.execute_command, self._acquire_command(owner, None, rid + ":try"))
        if granted is None and wait_ms is not None:
            try:
                sent = time.monotonic()
                async with backend.Dedicated(node, wait_socket_timeout(wait_ms), cancel, self.name) as connection:
                    granted = await send(connection.call, self._acquire_command(owner, wait_ms, rid))
            except AcquireCancelled:
                # A grant that won the race (its reply lost with the socket)
                # is given back: this owner held nothing before its wait.
                try:
                    await send_own(self.redis, with_id("FLOCK.RELEASE", self.name, owner), self._command_timeout())
                except ResponseError:
                    pass
                raise
            if granted is not None:
                return (granted, *await self._waited(owner, sent))
        return granted, sent, None

    async def _waited(self, owner: bytes, sent: float):
        """A grant that a wait blocking on a connection of its own brought,
        whose ACQUIRE was sent at ``sent``: its lease began when it was
        granted, at some moment since. Counted from ``sent``, a long wait
        leaves little of it; after a wait of more than a third of the lease
        the lease is read again (the watchdog's renewed: a RENEW; a fixed
        one: FLOCK.INFO's lease left), counted from that command's send
        time. (the send time, the lease left or None)."""
        lease_ms = self._lease_ms()
        if time.monotonic() - sent <= lease_ms / 1000 / WATCHDOG_RENEW_FRACTION:
            return sent, None
        again = time.monotonic()
        try:
            if self._kind() == WATCHDOG_GRANT:
                await send_own(self.redis, self._renew_command(owner, lease_ms), self._command_timeout())
                return again, None
            mine = holder(await self._info(), owner)
        except (ResponseError, *LOST_REPLY) as e:
            logger.info("FLOCK: reading the lease of %r after its wait failed (%s)", self.name, e)
            return sent, None
        return (again, int(mine["ttl-ms"])) if mine is not None else (sent, None)

    async def _give_back_stale(self, owner: bytes, token: int) -> None:
        """Releases the holds of grant ``token`` beyond the new one and the
        process's unreleased ones (docs/client-protocol.md, "stale holds").
        When that fails, the token is remembered again and the next grant
        with it tries again; the acquire holds the lock either way."""
        try:
            for _ in range(self._stale_holds(owner, token, await self._info())):
                await send_own(self.redis, with_id("FLOCK.RELEASE", self.name, owner), self._command_timeout())
        except RENEWAL_ERRORS as e:
            RELEASED.remember(self.name, owner, token)
            logger.warning("FLOCK: could not give back the stale holds of %r: %s", self.name, e)

    def _release_pending(self, owner: bytes, token: int) -> bool:
        grant = self.local.grant
        return grant is not None and grant.owner == owner and grant.token == token and grant.pending_release is not None

    async def _resend_release(self) -> None:
        """Sends the RELEASE of a cancelled release() of this grant again
        (its request ID: applied once) and counts it; when that fails, it
        counts as release() counts a failed one."""
        grant = self.local.grant
        async with grant.mutex:
            if grant.pending_release is None:
                return
            try:
                await send_own(self.redis, grant.pending_release, self._command_timeout())
            except RENEWAL_ERRORS as e:
                logger.warning("FLOCK: could not release the hold of %r a cancelled release() left: %s", self.name, e)
                self._release_failed(grant, self._release_error(e) if isinstance(e, ResponseError) else e)
                return
            grant.pending_release = None
            # Its last hold: the reentry is a new grant of this object.
            self._count(grant, -1)
            if grant.holds <= 0:
                self._dropped()

    async def locked(self) -> bool:
        """Whether anyone holds the lock."""
        return await self._info() is not None

    async def owned(self) -> bool:
        """Whether this thread's (task's) grant still holds the lock."""
        return self._is_owner(await self._info())

    async def _info(self):
        return parse_info(await self.redis.execute_command("FLOCK.INFO", self.name))

    async def fenced(self, *command):
        """Runs ``command`` (a command of the server and its arguments:
        ``"HSET", "{order:42}:row", "status", "paid"``) only while this
        thread's (task's) grant holds the lock, in one step on the server
        (FLOCK.FENCED with the grant's fencing token), and answers its reply
        as ``execute_command`` would. Raises StaleTokenError when the grant
        has ended (nothing ran; ``lost`` is then True; nothing is sent when
        it is known lost here), LockNotOwnedError when this thread (task)
        holds no grant; the command's own errors as they come. In a Redis
        Cluster the command's keys share the lock's slot: give them its hash
        tag (docs/fencing.md)."""
        grant = self.local.grant
        if grant is None:
            raise LockNotOwnedError(f"Cannot write through an unlocked lock {self.name!r}", lock_name=self.name)
        if self.lost:
            raise StaleTokenError(
                f"Cannot write through a lock that's no longer owned: its grant was lost ({grant.lost_reason})",
                lock_name=self.name,
            )
        try:
            return await self.redis.execute_command("FLOCK.FENCED", self.name, grant.token, *command)
        except ResponseError as e:
            error = lock_error(e, "write through", self.name, grant.lost_reason)
            if isinstance(error, StaleTokenError):
                self._grant_lost(grant, NOTOWNER, str(e))
            raise error from e

    async def release(self) -> None:
        """Releases one hold; the lock passes at once to the next waiter. A
        release that failed (refused, every reply lost) counts as done, as
        redis-py's forgets its token (a reentrant lock keeps its other
        holds); for an owner used again (reentrant, token=) its next grant
        gives back the hold if the server kept it (README.md, "Cluster and
        Sentinel"). A release of the process's last hold of the owner that
        the server answers left holds gives those back at once.
        A cancelled one (asyncio) keeps the grant, as redis-py's asyncio
        lock keeps its token, and calling release() again resends the same
        request ID, so it is applied once.
        A grant this process found lost by its deadline or its session's end
        (``expired``, ``unconfirmed``, ``sessionended``) is released all the
        same, in case the server still holds it, and then LockNotOwnedError
        raised, as redis-py's lock does once its key expired."""
        command = self._release_command()
        grant = self.local.grant
        timeout = self._command_timeout()
        async with grant.mutex:
            lost = self._lost_by_deadline(grant)
            try:
                if grant.extra_release is not None:
                    # A re-watch's extra hold whose RELEASE did not get through.
                    await release_extra(self.redis, timeout, grant)
                grant.pending_release = grant.pending_release or command
                if grant.sender is not None:
                    left = await grant.sender.send(grant.pending_release, timeout)
                else:
                    left = await send_own(self.redis, grant.pending_release, timeout)
            except ResponseError as e:
                error = self._release_error(e)
                self._release_failed(grant, error)
                raise error from e
            except BaseException as e:
                self._release_failed(grant, e)
                raise
            grant.pending_release = None
            try:
                if left and self._last_hold(grant):
                    # The process's last hold of the owner, and the server
                    # counts more: holds let go that stayed (rule "stale
                    # holds"), given back now.
                    left = await self._give_back_left(grant, int(left))
            finally:
                self._released_one(left)
            if lost:
                if self.local.grant is grant:
                    self._dropped()
                raise self._lost_error(grant)

    async def _give_back_left(self, grant, left: int) -> Optional[int]:
        """Releases the ``left`` holds of ``grant``'s owner that a release
        of the process's last hold of it answered were left: nobody in this
        process knows of them (docs/client-protocol.md, "stale holds": a
        failover's churn can reenter a hold whose memory a grant elsewhere
        has since replaced). Stops once an acquire of the owner starts
        meanwhile: its grant may be among them, and its token is remembered
        for it to give back the rest. The holds then left (0: none, or
        NOTOWNER), or None when a RELEASE failed otherwise: remembered
        (_released_one) for the owner's next grant."""
        try:
            for _ in range(left):
                if not (left and self._last_hold(grant)):
                    break
                release = with_id("FLOCK.RELEASE", self.name, grant.owner)
                left = int(await send_own(self.redis, release, self._command_timeout()))
        except RENEWAL_ERRORS as e:
            if is_notowner(e):
                return 0
            logger.warning("FLOCK: could not give back the stale holds of %r: %s", self.name, e)
            return None
        return left

    def _release_failed(self, grant, error: BaseException) -> None:
        """A release of ``grant`` that raised ``error``. NOTOWNER: the owner
        holds nothing, the grant is forgotten. A cancel (asyncio:
        backend.RELEASE_KEPT_ON) keeps the grant and its RELEASE, for the
        next release() to send again. Anything else (refused, every reply
        lost) counts the caller's hold as released, and its token is
        remembered for a give-back (_released_one)."""
        if isinstance(error, LockNotOwnedError):
            self._dropped()
        elif not isinstance(error, backend.RELEASE_KEPT_ON):
            grant.pending_release = None
            self._released_one(None)

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
            await send_own(self.redis, self._renew_command(owner, lease_ms), self._command_timeout())
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


class _Part(MultiPart, Lock):
    """One key of a MultiLock."""


class MultiLock(backend.MultiLockFlavour, AsyncManaged, MultiLockBase):
    """Several locks taken for one owner at once, all or none, and released
    together: ``MultiLock(r, ["{account:42}:from", "{account:42}:to"])``,
    with Lock's arguments (README.md, "Several locks at once"). In a Redis
    Cluster the keys must share a hash slot (a hash tag), else
    CrossSlotError."""

    part_class = _Part

    async def _acquire(self, blocking: Optional[bool], blocking_timeout: Optional[Number], token, cancel) -> bool:
        """acquire(), whose arguments are the flavour's (the backend's
        MultiLockFlavour): ``cancel``, a CancelToken or None."""
        if cancel is not None:
            cancel._check(self.names)
        encoder = self._locks[0]._encoder()
        owner = self._owner(token, encoder)
        keys = [encoder.encode(name) for name in self.names]
        command = self._acquire_all_command(keys, owner)

        async def attempt(node, rid, wait_ms):
            sent = time.monotonic()
            return await self._acquire_on(node, command, owner, wait_ms, cancel, rid), node, sent, wait_ms is not None

        counted = self._acquiring(owner)
        try:
            try:
                tokens, node, sent, waited = await routed(
                    self.redis, keys[0], self.names, "acquire", attempt, new_id(),
                    self._wait_ms(blocking, blocking_timeout),
                )
            except LOST_REPLY:
                self._acquire_failed(owner)
                raise
            if tokens is None:
                return False
            for lock, granted in zip(self._locks, tokens):
                # A wait's grant: its lease read again after a long wait.
                basis, lease_ms = await lock._waited(owner, sent) if waited else (sent, None)
                await lock._granted(node, owner, int(granted), basis, lease_ms=lease_ms)
            self._grouped()
            return True
        finally:
            self._acquire_ended(counted, owner)

    async def _acquire_on(self, node, command: list, owner: bytes, wait_ms: Optional[int], cancel, rid: str):
        """The tokens, or None: a try through ``node``'s pool, or a wait on
        a connection of its own to ``node`` (the keys' server)."""
        if wait_ms is None:
            return await send(node.execute_command, (*command, "ID", rid))
        try:
            async with backend.Dedicated(node, wait_socket_timeout(wait_ms), cancel, self.names) as connection:
                return await send(connection.call, (*command, "WAIT", wait_ms, "ID", rid))
        except ResponseError:
            raise
        except BaseException:
            # To its end, even if the task is cancelled again meanwhile.
            await backend.finish(self._give_back, node, command, owner, rid)
            raise

    async def _give_back(self, node, command: list, owner: bytes, rid: str) -> None:
        """A wait that ended without its reply (cancelled, interrupted, or
        the reply lost after every resend) may have been granted: the same
        request without WAIT answers its tokens if so (or takes the keys
        now), and a RELEASEALL gives them back."""
        try:
            for attempt in range(1, RESENDS + 2):
                try:
                    tokens = await send_own(node, (*command, "ID", rid), self._locks[0]._command_timeout())
                    break
                except ResponseError as e:
                    if not is_queued(e) or attempt > RESENDS:
                        raise
                    await backend.sleep(GIVE_BACK_PAUSE * attempt)
            if tokens is not None:
                await send_own(node, self._release_all_command(owner), self._locks[0]._command_timeout())
        except Exception as e:
            logger.warning("FLOCK: could not give back the locks %r of a wait that ended: %s", self.names, e)

    async def release(self) -> None:
        """Releases one hold of every key (FLOCK.RELEASEALL), all or none:
        each key passes at once to its next waiter. A release that failed
        or was cancelled: counted or kept as Lock's release() does it."""
        owner = self._held("Cannot release a lock that's not owned or is already unlocked.")
        key = self._locks[0]._encoder().encode(self.names[0])
        async with AsyncExitStack() as stack:
            for mutex in self._mutexes():
                await stack.enter_async_context(mutex)
            grants = self._grants()
            lost = any([lock._lost_by_deadline(lock.local.grant) for lock in self._locks if lock.local.grant is not None])
            command = grants[0].pending_release or self._release_all_command(owner)
            for grant in grants:
                grant.pending_release = command
            try:
                left = await routed(
                    self.redis, key, self.names, "release",
                    lambda node, *_: send_own(node, command, self._locks[0]._command_timeout()), lost=self.lost_reason,
                )
            except BaseException as e:
                self._release_failed(grants, e)
                raise
            for grant in grants:
                grant.pending_release = None
            left = list(left)
            try:
                for i, lock in enumerate(self._locks):
                    # Lock.release's rule for each key's holds left.
                    grant = lock.local.grant
                    if left[i] and grant is not None and lock._last_hold(grant):
                        left[i] = await lock._give_back_left(grant, int(left[i]))
            finally:
                self._released(left)
            if lost:
                for lock in self._locks:
                    lock._dropped()
                raise self._lost_error(next((grant for grant in grants if grant.lost), grants[0]))

    def _release_failed(self, grants: list, error: BaseException) -> None:
        """As Lock._release_failed, for every key."""
        if isinstance(error, LockNotOwnedError):
            for lock in self._locks:
                lock._dropped()
        elif not isinstance(error, backend.RELEASE_KEPT_ON):
            for grant in grants:
                grant.pending_release = None
            self._released(None)

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
        """Whether this thread's (task's) grant still holds every lock."""
        for lock in self._locks:
            if not await lock.owned():
                return False
        return True
