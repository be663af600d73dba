"""What only the blocking flavour does, hand-written: its primitives
(threading's), a session's connection and its reader thread, a wait on a
connection of its own (``use_session=False``), the process's one watchdog
thread, and acquire()'s arguments. redis_flock._session and redis_flock.lock
are generated from the asyncio flavour's modules (scripts/unasync.py), which
import redis_flock._asyncio_backend, this module's counterpart with the same
names, where these import this one."""

import heapq
import itertools
import os
import socket
import threading
import time
from typing import Optional

import redis
from redis.exceptions import ConnectionError

from ._core import REOPEN_MAX_DELAY, SEND_CONCURRENCY, CancelToken, Number, SessionState, logger

# --- Primitives ---------------------------------------------------------------

mutex = threading.Lock
Event = threading.Event
sleep = time.sleep

# What a wait's clean-up (FLOCK.CANCEL, then its event) lets pass with
# keep=False: an error; anything else (KeyboardInterrupt) ends it.
CANCEL_SURVIVES = (Exception,)

# A release() that did not complete (an error, a lost reply) forgets the
# grant all the same, as redis-py's redis.lock.Lock forgets its token.
KEEPS_UNFINISHED_RELEASE = False


def raise_lost_cancel() -> None:
    """Nothing to do: an exception does not cancel a thread (a CancelToken
    wakes it instead)."""


def spawn(name: str, function, *args) -> None:
    """``function(*args)`` on a daemon thread of its own: work for the
    session's reader that waits on a server."""
    threading.Thread(target=function, args=args, name=name, daemon=True).start()


def finish(function, *args) -> None:
    """``function(*args)``: a thread is not cancelled midway."""
    function(*args)


def disconnect(connection) -> None:
    try:
        connection.disconnect()
    except Exception:
        pass


def shutdown(connection) -> None:
    """Wakes a thread reading ``connection`` (its read fails): shuts the
    socket down without touching the parser that thread is in."""
    sock = getattr(connection, "_sock", None)
    if sock is None:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def node_client(client, key: bytes):
    """The client of the server that holds ``key``: ``client`` itself, or for
    a RedisCluster the Redis of the key's node, whose own pool gives that
    node its own session (a session lives on one server)."""
    if not hasattr(client, "get_node_from_key"):
        return client
    return client.get_redis_connection(client.get_node_from_key(key))


# --- Sessions -----------------------------------------------------------------

_REGISTRY = threading.Lock()


def session_of(client, make):
    """The session of ``client``'s connection pool, made by ``make(pool)`` on
    first use (and again in a forked child: the parent's is the parent's).
    The pool's disconnect() (what Redis.close() calls) also closes it."""
    pool = client.connection_pool
    with _REGISTRY:
        session = pool.__dict__.get("_flock_session")
        if session is None or session.pid != os.getpid():
            if session is None:
                original = pool.disconnect

                def disconnect(*args, **kwargs):
                    current = pool.__dict__.get("_flock_session")
                    if current is not None and current.pid == os.getpid():
                        if args[0] if args else kwargs.get("inuse_connections", True):
                            current.close()
                    return original(*args, **kwargs)

                pool.disconnect = disconnect
            session = pool._flock_session = make(pool)
        return session


class SessionConnection:
    """A session's connection and its reader: one daemon thread
    (``flock-session``) that reads the inbox, and when the connection
    breaks opens a new session, re-watches the grants held and sends the
    waits again there, before it reads on. The session's protocol (open(),
    _inbox(), _rewatch(), send_wait(), ...) is redis_flock._session.Session's,
    this class's subclass."""

    def __init__(self, pool):
        self.pool = pool
        self.pid = os.getpid()
        self.state = SessionState()
        # Guards opening, the connection, the session ID, the reader and the
        # generation.
        self.lock = threading.Lock()
        self.connection = None
        self.sid: Optional[str] = None
        self.reader: Optional[threading.Thread] = None
        # close() starts a new generation: the old reader ends.
        self.generation = 0
        self.limiter = threading.BoundedSemaphore(SEND_CONCURRENCY)
        # For the reader's own commands (releasing a grant nobody waits for).
        self.client = redis.Redis(connection_pool=pool)
        # The session whose grants were all re-watched.
        self.rewatched: Optional[str] = None

    def _start_reader(self, connection) -> None:
        """open() made ``connection`` the session's (under ``self.lock``):
        the reader thread starts unless it runs (it reopened the session)."""
        if self.reader is None:
            self.reader = threading.Thread(
                target=self._read, args=(self.generation,), name="flock-session", daemon=True
            )
            self.reader.start()

    def _start_reopening(self) -> None:
        """Nothing to start: the reader re-watches the grants before its next
        FLOCK.INBOX."""

    def close(self) -> None:
        """Closes the session's connection (the server ends the session: its
        waits leave their queues); waits in progress raise ConnectionError. A
        later acquire opens a new session."""
        with self.lock:
            self.generation += 1
            connection, self.connection, self.sid, self.reader = self.connection, None, None, None
        if connection is not None:
            shutdown(connection)
        self.state.fail_all(ConnectionError("the FLOCK session was closed (the client was closed)"))

    def _read(self, generation: int) -> None:
        delay = 0.0
        while True:
            with self.lock:
                if self.generation != generation:
                    return
                connection, sid = self.connection, self.sid
                if connection is None and not self.state.has_pending() and not self.state.has_watched():
                    # Broken with nothing waiting or held: the next acquire reopens.
                    self.reader = None
                    return
            if connection is None:
                time.sleep(delay)
                try:
                    self.open()
                    delay = 0.0
                except Exception as e:
                    delay = min(max(delay * 2, 0.05), REOPEN_MAX_DELAY)
                    logger.debug("FLOCK session: reopening failed: %s", e)
                continue
            # Grants watched by a session before this one are checked and
            # re-watched here; waits queued on a session before this one (or
            # answered NOSESSION) are sent here again, in the order they had
            # queued.
            if not self._rewatch(sid) or not self._resend(sid):
                delay = min(max(delay * 2, 0.05), REOPEN_MAX_DELAY)
                time.sleep(delay)
                continue
            delay = 0.0
            try:
                if not self._inbox(connection):
                    self._broken(connection)
            except Exception as e:
                if self.generation == generation:
                    logger.info("FLOCK session connection lost (%s): reopening", e)
                self._broken(connection)

    def _broken(self, connection) -> None:
        with self.lock:
            if self.connection is connection:
                self.connection = self.sid = None
        connection.disconnect()
        self.state.session_ended()

    def _gone(self, sid: str) -> None:
        """The server said NOSESSION for ``sid``: drop that connection, the
        reader reopens and sends the waits again."""
        with self.lock:
            connection = self.connection if self.sid == sid else None
            if connection is not None:
                self.connection = self.sid = None
        if connection is not None:
            shutdown(connection)

    def _resend(self, sid: str) -> bool:
        """Sends the live waits not (being) sent to session ``sid`` there;
        False when one could not be sent (tried again after a pause)."""
        for wait in self.state.pending():
            if wait.sent_to == sid:
                continue
            try:
                self.send_wait(wait)
            except Exception as e:
                logger.info("FLOCK session: sending a wait again failed (%s)", e)
                return False
        return True


# --- Locks --------------------------------------------------------------------


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
    through for a whole lease (the lock's _watchdog_renew). The thread ends
    when nothing is left to renew and starts again with the next grant."""

    class Entry:
        def __init__(self, lock, grant):
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

    def watch(self, lock, grant) -> None:
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
                confirmed = entry.lock._watchdog_renew(entry.grant, entry.lease_ms, entry.confirmed)
            except Exception:
                logger.exception("FLOCK watchdog of lock %r", entry.lock.name)
                confirmed = entry.confirmed
            if confirmed is not None:
                entry.confirmed = confirmed
                self._schedule(entry)


WATCHDOG = Watchdog()


class LockFlavour:
    """acquire() as redis-py's ``redis.lock.Lock.acquire`` takes it, plus
    ``cancel=``; the lock's _acquire does it."""

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
        return self._acquire(blocking, blocking_timeout, token, cancel)


class MultiLockFlavour:
    """MultiLock's acquire(), with Lock's arguments."""

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
        return self._acquire(blocking, blocking_timeout, token, cancel)
