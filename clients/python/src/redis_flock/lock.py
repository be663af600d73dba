"""``redis_flock.Lock``: redis-py's ``redis.lock.Lock`` on FLOCK."""

import heapq
import itertools
import threading
import time
import uuid
from contextlib import ExitStack
from types import TracebackType
from typing import Literal, Optional, Type

from redis.exceptions import LockError, ResponseError

from ._core import (
    CANCELLED,
    ERROR,
    AcquireCancelled,
    CancelToken,
    GIVE_BACK_PAUSE,
    GRANTED,
    RELEASED,
    RENEWAL_ERRORS,
    RESENDS,
    LockBase,
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
from ._backend import shutdown
from ._session import confirm_durable, release_extra, routed, send, session_of


class Dedicated:
    """A connection of its own, made with the client pool's settings, for a
    blocking wait without a session (``use_session=False``): it holds that
    connection for its whole length, never a pool's."""

    def __init__(self, client, socket_timeout: Optional[float], cancel=None, name=None):
        pool = client.connection_pool
        self.connection = pool.connection_class(**dict(pool.connection_kwargs, socket_timeout=socket_timeout))
        self.cancel, self.name = cancel, name
        # A cancel (CancelToken) shuts the socket down: the wait's read fails
        # and the server takes the waiter out of the queue.
        self.unsubscribe = cancel._subscribe(lambda: shutdown(self.connection)) if cancel is not None else None

    def call(self, *args):
        try:
            # Connected before the check: a cancel after it finds the socket.
            # (And a Sentinel-managed connection finds the master in connect(),
            # not in send_command's own.)
            self.connection.connect()
            if self.cancel is not None:
                self.cancel._check(self.name)
            self.connection.send_command(*args)
            return self.connection.read_response()
        except Exception:
            if self.cancel is not None:
                self.cancel._check(self.name)
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.unsubscribe is not None:
            self.unsubscribe()
        # Closing the connection also takes an abandoned waiter out of the queue.
        self.connection.disconnect()


class Watchdog:
    """The process's one watchdog thread (``flock-watchdog``): renews every
    held grant without a timeout every third of its lease, through its lock's
    client (the pool), and marks it lost on NOTOWNER or when no renewal got
    through for a whole lease. The thread ends when nothing is left to renew
    and starts again with the next grant."""

    class Entry:
        def __init__(self, lock: "Lock", grant):
            self.lock = lock
            self.grant = grant
            self.lease_ms = lock._lease_ms()
            self.interval = self.lease_ms / 3000
            self.confirmed = time.monotonic()

    def __init__(self):
        self.condition = threading.Condition()
        self.heap: list = []
        self.order = itertools.count()
        self.thread: Optional[threading.Thread] = None

    def watch(self, lock: "Lock", grant) -> None:
        entry = self.Entry(lock, grant)
        grant.on_stop.append(self.wake)
        self._schedule(entry)

    def entries(self) -> list:
        """The grants renewed now (for tests and debugging)."""
        with self.condition:
            return [entry.grant for _, _, entry in self.heap if not self._done(entry)]

    def wake(self) -> None:
        with self.condition:
            self.condition.notify()

    def _schedule(self, entry) -> None:
        with self.condition:
            heapq.heappush(self.heap, (time.monotonic() + entry.interval, next(self.order), entry))
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="flock-watchdog", daemon=True)
                self.thread.start()
            self.condition.notify()

    @staticmethod
    def _done(entry) -> bool:
        return entry.grant.stopped or entry.grant.lost

    def _run(self) -> None:
        while True:
            with self.condition:
                while True:
                    if not self.heap:
                        self.thread = None
                        return
                    due, _, entry = self.heap[0]
                    if self._done(entry):
                        heapq.heappop(self.heap)
                        continue
                    delay = due - time.monotonic()
                    if delay <= 0:
                        heapq.heappop(self.heap)
                        break
                    self.condition.wait(delay)
            try:
                again = self._renew(entry)
            except Exception:
                logger.exception("FLOCK watchdog of lock %r", entry.lock.name)
                again = True
            if again:
                self._schedule(entry)

    def _renew(self, entry) -> bool:
        lock, grant = entry.lock, entry.grant
        with grant.mutex:
            if self._done(entry):
                return False
            sent = time.monotonic()
            try:
                send(lock.redis.execute_command, lock._renew_command(grant.owner, entry.lease_ms))
                entry.confirmed = sent
            except RENEWAL_ERRORS as e:
                reason = renewal_lost(e, time.monotonic() - entry.confirmed, entry.lease_ms)
                if reason is not None:
                    lock._grant_lost(grant, reason)
                    return False
        return True


WATCHDOG = Watchdog()


class Managed:
    """``with lock:`` for Lock and MultiLock, as redis-py's: LockError (with
    ``lock_name``) when not acquired; a release error raised on exit unless
    ``raise_on_release_error`` is False (then logged)."""

    def __enter__(self):
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


class Lock(Managed, LockBase):
    """A fair distributed lock, used like redis-py's ``redis.lock.Lock``:
    ``redis_flock.Lock(r, "orders:42")`` or ``r.lock("orders:42",
    lock_class=redis_flock.Lock)``. See README.md for every difference."""

    def acquire(
        self,
        sleep: Optional[Number] = None,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[Number] = None,
        token=None,
        *,
        cancel: Optional[CancelToken] = None,
    ) -> bool:
        """Takes the lock; True once granted. Not blocking: one try. Blocking:
        one ``FLOCK.ACQUIRE ... WAIT`` that queues in the server's FIFO queue,
        up to ``blocking_timeout`` seconds (None: no limit): through the
        process's session (the reply is at once, the grant comes in the
        session's inbox), or, with ``use_session=False``, blocking on a
        connection of its own. ``sleep`` is unused. ``cancel``: a
        CancelToken whose cancel() (from another thread) ends the wait with
        AcquireCancelled."""
        if cancel is not None:
            cancel._check(self.name)
        encoder = self.redis.get_encoder()
        owner = self._owner(token, encoder)
        key = encoder.encode(self.name)

        def attempt(node, rid, wait_ms):
            # A session per server: a RedisCluster's node of the key.
            session = session_of(node) if self.use_session else None
            if session is not None:
                granted, sid, at = self._acquire_in(session, node, key, owner, wait_ms, cancel, rid)
            else:
                granted, sid, at = self._acquire_blocking(node, owner, wait_ms, cancel, rid), None, None
            return granted, node, session, sid, at

        try:
            granted, node, session, sid, at = routed(
                self.redis, key, self.name, "acquire", attempt, str(uuid.uuid4()), self._wait_ms(blocking, blocking_timeout)
            )
        except BaseException:
            # Perhaps granted all the same (see _acquire_failed).
            self._acquire_failed(owner, token)
            raise
        if granted is None:
            return False
        self._granted(node, owner, granted, at, session, key, sid)
        return True

    def _granted(self, node, owner: bytes, granted: int, at: Optional[float], session=None, key=None, sid=None):
        """Records the grant of token ``granted`` made on ``node`` (its
        reply came at ``at``; through ``session`` ``sid``, which watches it
        from now on), and starts its watchdog."""
        if self._is_stale(owner, granted):
            # A reentry of a hold this thread released: the release was
            # lost in a failover or refused. Its holds go back first.
            self._give_back_stale(owner, granted)
        # Durable grants: counted once enough replicas have it, else given
        # back (LockNotDurableError), before this object records anything.
        confirm_durable(self, node, owner, granted)
        grant, replaced = self._new_grant(owner, granted, threading.Lock(), at)
        if replaced is not None:
            replaced.stop()
        if grant is not None:
            if session is not None:
                session.state.watch(key, owner, granted, self, grant, sid)
            if self.watchdog and not grant.lost:
                WATCHDOG.watch(self, grant)

    def _acquire_in(self, session, node, key: bytes, owner: bytes, wait_ms: Optional[int], cancel, rid: str):
        """(token or None, the session that granted it, when its reply came),
        sent on ``node``, the session's server."""
        command = self._acquire_base(owner)
        if wait_ms is None:
            return session.try_acquire(node, command, rid)
        (kind, token, detail), wait = session.wait(node, key, owner, command, wait_ms, rid, cancel)
        if kind == GRANTED:
            return token, wait.sent_to, wait.settled_at
        if kind == CANCELLED and cancel is not None and cancel.cancelled:
            raise AcquireCancelled("acquire() was cancelled", lock_name=self.name)
        if kind == ERROR:
            raise detail if isinstance(detail, Exception) else ResponseError(detail)
        return None, None, None

    def _acquire_blocking(self, node, owner: bytes, wait_ms: Optional[int], cancel, rid: str) -> Optional[int]:
        """A try through the client, then a wait blocking on a connection of
        its own to ``node``, the key's server. The wait has request ID
        ``rid``, the try one made from it: sent again to a Cluster's new
        master after a failover, a grant the old master made and replicated
        is recognised (no second hold)."""
        granted = send(self.redis.execute_command, self._acquire_command(owner, None, rid + ":try"))
        if granted is None and wait_ms is not None:
            try:
                with Dedicated(node, wait_socket_timeout(wait_ms), cancel, self.name) as connection:
                    granted = send(connection.call, self._acquire_command(owner, wait_ms, rid))
            except AcquireCancelled:
                # A grant that won the race (its reply lost with the socket)
                # is given back: this owner held nothing before its wait.
                try:
                    send(self.redis.execute_command, with_id("FLOCK.RELEASE", self.name, owner))
                except ResponseError:
                    pass
                raise
        return granted

    def _give_back_stale(self, owner: bytes, token: int) -> None:
        """Releases the holds of grant ``token`` that this thread released
        before (docs/client-protocol.md, "Durable grants"): the caller holds
        one. When that fails, the token is remembered again and the next
        grant with it tries again; the acquire holds the lock either way."""
        try:
            for _ in range(self._stale_holds(owner, token, self._info())):
                send(self.redis.execute_command, with_id("FLOCK.RELEASE", self.name, owner))
        except RENEWAL_ERRORS as e:
            RELEASED.remember(self.name, owner, token)
            logger.warning("FLOCK: could not give back the stale holds of %r: %s", self.name, e)

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
        grant = self.local.grant
        with grant.mutex:
            try:
                if grant.extra_release is not None:
                    # A re-watch's extra hold whose RELEASE did not get through.
                    release_extra(self.redis.execute_command, grant)
                left = send(self.redis.execute_command, command)
            except ResponseError as e:
                raise self._release_error(e) from e
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
        sent = time.monotonic()
        try:
            send(self.redis.execute_command, self._renew_command(owner, lease_ms))
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


class MultiLock(Managed, MultiLockBase):
    """Several locks taken for one owner at once, all or none, and released
    together: ``MultiLock(r, ["{account:42}:from", "{account:42}:to"])``,
    with Lock's arguments (README.md, "Several locks at once"). In a Redis
    Cluster the keys must share a hash slot (a hash tag), else
    CrossSlotError."""

    part_class = _Part

    def acquire(
        self,
        sleep: Optional[Number] = None,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[Number] = None,
        token=None,
        *,
        cancel: Optional[CancelToken] = None,
    ) -> bool:
        """Takes every lock for one owner, or none: one FLOCK.ACQUIREALL;
        True once all are granted. Not blocking: one try. Blocking: ``...
        WAIT`` on a connection of its own, in every key's FIFO queue at
        once, up to ``blocking_timeout`` seconds (None: no limit); a key its
        owner holds already is reentered. ``sleep`` is unused. ``cancel``: a
        CancelToken whose cancel() ends the wait with AcquireCancelled."""
        if cancel is not None:
            cancel._check(self.names)
        encoder = self.redis.get_encoder()
        owner = self._owner(token, encoder)
        keys = [encoder.encode(name) for name in self.names]
        command = self._acquire_all_command(keys, owner)

        def attempt(node, rid, wait_ms):
            return self._acquire_on(node, command, owner, wait_ms, cancel, rid), node

        try:
            tokens, node = routed(
                self.redis, keys[0], self.names, "acquire", attempt, str(uuid.uuid4()), self._wait_ms(blocking, blocking_timeout)
            )
        except BaseException:
            self._acquire_failed(owner, token)
            raise
        if tokens is None:
            return False
        at = time.monotonic()
        for lock, granted in zip(self._locks, tokens):
            lock._granted(node, owner, int(granted), at)
        self._grouped()
        return True

    def _acquire_on(self, node, command: list, owner: bytes, wait_ms: Optional[int], cancel, rid: str):
        """The tokens, or None: a try through ``node``'s pool, or a wait on
        a connection of its own to ``node`` (the keys' server)."""
        if wait_ms is None:
            return send(node.execute_command, (*command, "ID", rid))
        try:
            with Dedicated(node, wait_socket_timeout(wait_ms), cancel, self.names) as connection:
                return send(connection.call, (*command, "WAIT", wait_ms, "ID", rid))
        except ResponseError:
            raise
        except BaseException:
            self._give_back(node, command, owner, rid)
            raise

    def _give_back(self, node, command: list, owner: bytes, rid: str) -> None:
        """A wait that ended without its reply (cancelled, interrupted, or
        the reply lost after every resend) may have been granted: the same
        request without WAIT answers its tokens if so (or takes the keys
        now), and a RELEASEALL gives them back."""
        try:
            for attempt in range(1, RESENDS + 2):
                try:
                    tokens = send(node.execute_command, (*command, "ID", rid))
                    break
                except ResponseError as e:
                    if not is_queued(e) or attempt > RESENDS:
                        raise
                    time.sleep(GIVE_BACK_PAUSE * attempt)
            if tokens is not None:
                send(node.execute_command, self._release_all_command(owner))
        except Exception as e:
            logger.warning("FLOCK: could not give back the locks %r of a wait that ended: %s", self.names, e)

    def release(self) -> None:
        """Releases one hold of every key (FLOCK.RELEASEALL), all or none:
        each key passes at once to its next waiter. As Lock's, forgets the
        grant whatever the outcome (a reentrant one keeps it while holds
        are left)."""
        owner = self._held("Cannot release a lock that's not owned or is already unlocked.")
        command = self._release_all_command(owner)
        key = self.redis.get_encoder().encode(self.names[0])
        left = None
        with ExitStack() as stack:
            for mutex in self._mutexes():
                stack.enter_context(mutex)
            try:
                left = routed(
                    self.redis, key, self.names, "release", lambda node, *_: send(node.execute_command, command),
                    lost=self.lost_reason,
                )
            finally:
                self._released(left)

    def extend(self, additional_time: Number, replace_ttl: bool = False) -> Literal[True]:
        """Lock.extend on every key, one after the other."""
        self._held("Cannot extend an unlocked lock")
        for lock in self._locks:
            lock.extend(additional_time, replace_ttl)
        return True

    def reacquire(self) -> Literal[True]:
        """Lock.reacquire on every key, one after the other."""
        self._held("Cannot reacquire an unlocked lock")
        for lock in self._locks:
            lock.reacquire()
        return True

    def locked(self) -> bool:
        """Whether anyone holds one of the locks."""
        return any(lock.locked() for lock in self._locks)

    def owned(self) -> bool:
        """Whether this thread's grant still holds every lock."""
        return all(lock.owned() for lock in self._locks)
