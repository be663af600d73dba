"""What only the blocking flavour does, hand-written: its primitives
(threading's), commands with a socket timeout of their own, the process's
one deadline thread (its timers), a session's connection and its reader
thread, a wait on a connection of its own (``use_session=False``), and
acquire()'s arguments. redis_flock._session and redis_flock.lock
are generated from the asyncio flavour's modules (scripts/unasync.py), which
import redis_flock._asyncio_backend, this module's counterpart with the same
names, where these import this one."""

import contextlib
import heapq
import itertools
import os
import socket
import threading
import time
from typing import Optional

import redis
from redis.exceptions import ConnectionError

from ._core import REOPEN_MAX_DELAY, SEND_CONCURRENCY, CancelToken, Number, SessionState, logger, pack

# --- Primitives ---------------------------------------------------------------

mutex = threading.Lock
sleep = time.sleep

# Guards Event's flags.
_SETTING = threading.Lock()


class Event:
    """threading.Event's set() and wait(timeout), for a wait's one waiting
    thread, on a lock held until set(): a tenth of the cost of a
    threading.Event (no Condition), made for every acquire. poke() wakes
    the waiting thread once without setting it (its turn to read the
    session's inbox: SessionConnection._await)."""

    __slots__ = ("_lock", "_set", "_released")

    def __init__(self):
        self._lock = threading.Lock()
        self._lock.acquire()
        self._set = False
        # The lock is released: by set() for good, or by a poke() that no
        # wait() has taken yet.
        self._released = False

    def set(self) -> None:
        with _SETTING:
            if self._set:
                return
            self._set = True
        self.poke()

    def poke(self) -> None:
        with _SETTING:
            if self._released:
                return
            self._released = True
        self._lock.release()

    def unpoke(self) -> None:
        """Takes back a poke that no wait() took."""
        with _SETTING:
            if self._released and not self._set:
                self._released = False
                self._lock.acquire(blocking=False)

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Whether it was set or poked (within ``timeout`` seconds)."""
        if self._set:
            return True
        if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
            return self._set
        with _SETTING:
            if not self._set:
                # A poke, taken: held again until the next.
                self._released = False
                return True
        self._lock.release()
        return True


class Limiter:
    """At most ``n`` holders at once (``with limiter:``), as a
    threading.BoundedSemaphore, at a fraction of its cost when nobody waits."""

    def __init__(self, n: int):
        self.free = n
        self.waiting = 0
        self.lock = threading.Lock()
        self.condition = threading.Condition(self.lock)

    def __enter__(self):
        with self.lock:
            while self.free == 0:
                self.waiting += 1
                try:
                    self.condition.wait()
                finally:
                    self.waiting -= 1
            self.free -= 1

    def __exit__(self, *exc):
        with self.lock:
            self.free += 1
            if self.waiting:
                self.condition.notify()

# What a wait's clean-up (FLOCK.CANCEL, then its event) lets pass with
# keep=False: an error; anything else (KeyboardInterrupt) ends it.
CANCEL_SURVIVES = (Exception,)

# A release() that did not complete (an error, every reply lost, an
# interrupt) counts as done, as redis-py's redis.lock.Lock forgets its token:
# none keeps the grant for the next release().
RELEASE_KEPT_ON = ()


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


def _get_connection(pool, until: float):
    """A connection of ``pool`` (redis-py 5.0's get_connection() takes a
    command name, later ones none). A pool at its max_connections raises
    at once; this waits for a connection to come back, up to ``until``
    (as a BlockingConnectionPool does), so that renewals due together share
    a small pool."""
    while True:
        try:
            try:
                return pool.get_connection()
            except TypeError:
                return pool.get_connection("FLOCK")
        except ConnectionError as e:
            if "Too many connections" not in str(e) or time.monotonic() >= until:
                raise
        time.sleep(0.002)


def call(client, args, timeout: Optional[float]):
    """``client.execute_command(*args)`` with a socket timeout of ``timeout``
    seconds for this command alone (docs/client-protocol.md: a command the
    client sends for itself never hangs), on a connection of the client's
    pool. A RedisCluster (no pool of its own: it routes by key and follows
    MOVED) sends it itself, with its nodes' own socket timeout."""
    pool = getattr(client, "connection_pool", None)
    if pool is None or timeout is None or getattr(client, "connection", None) is not None:
        return client.execute_command(*args)
    connection = _get_connection(pool, time.monotonic() + timeout)
    try:
        if connection._sock is None:
            connection.connect()
        connection._sock.settimeout(timeout)
        connection.send_packed_command([pack(args, connection.encoder)])
        # An error reply raises without breaking the connection; a timeout
        # or an I/O error disconnects it (redis-py), and it goes back closed.
        return connection.read_response()
    finally:
        if connection._sock is not None:
            connection._sock.settimeout(connection.socket_timeout)
        pool.release(connection)


def exchange(connection, args, timeout: float):
    """Sends ``args`` on ``connection`` (a session's own) and reads the reply,
    within ``timeout`` seconds each."""
    if connection._sock is None:
        # connect() itself: there a Sentinel-managed connection asks the
        # sentinels for the master.
        connection.connect()
    connection._sock.settimeout(timeout)
    connection.send_packed_command([pack(args, connection.encoder)])
    return connection.read_response()


class Timer:
    """One timer of TIMERS: ``cancel()`` stops it."""

    __slots__ = ("timers", "function", "args", "cancelled")

    def __init__(self, timers, function, args):
        self.timers = timers
        self.function = function
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            self.timers._cancelled()


class Timers:
    """The process's one deadline thread (``flock-deadlines``, a daemon): a
    heap of timers, each a function to call at a moment of time.monotonic():
    a deadline (a grant lost unless confirmed since), a watchdog's renewal
    (started on a thread of its own, so that a slow one delays no other).
    Started by the first timer and never ended (in a forked child, started
    again): no thread per grant, none started per acquire. Timer functions
    must not block."""

    def __init__(self):
        self._reset()
        if hasattr(os, "register_at_fork"):
            # The parent's timers are the parent's; its thread is not here.
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self.condition = threading.Condition()
        self.heap: list = []
        self.order = itertools.count()
        self.thread: Optional[threading.Thread] = None
        self.cancelled_count = 0

    def schedule(self, when: float, function, *args) -> Timer:
        """Calls ``function(*args)`` on the deadline thread at ``when``."""
        timer = Timer(self, function, args)
        with self.condition:
            heapq.heappush(self.heap, (when, next(self.order), timer))
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="flock-deadlines", daemon=True)
                self.thread.start()
            elif self.heap[0][2] is timer:
                self.condition.notify()
        return timer

    def pending(self) -> list:
        """The (function, args) of the timers not yet due (for tests)."""
        with self.condition:
            return [(t.function, t.args) for _, _, t in sorted(self.heap, key=lambda e: e[:2]) if not t.cancelled]

    def _cancelled(self) -> None:
        # A heap of mostly cancelled timers (grants released long before
        # their deadline) is rebuilt without them.
        with self.condition:
            self.cancelled_count += 1
            if self.cancelled_count > 256 and 2 * self.cancelled_count > len(self.heap):
                self.heap = [entry for entry in self.heap if not entry[2].cancelled]
                heapq.heapify(self.heap)
                self.cancelled_count = 0

    def _run(self) -> None:
        while True:
            with self.condition:
                while True:
                    if not self.heap:
                        self.condition.wait()
                        continue
                    when, _, timer = self.heap[0]
                    if timer.cancelled:
                        heapq.heappop(self.heap)
                        self.cancelled_count = max(0, self.cancelled_count - 1)
                        continue
                    delay = when - time.monotonic()
                    if delay <= 0:
                        heapq.heappop(self.heap)
                        # Done: a cancel() now changes nothing.
                        timer.cancelled = True
                        break
                    self.condition.wait(delay)
            try:
                timer.function(*timer.args)
            except Exception:
                logger.exception("FLOCK deadline timer %r", timer.function)


TIMERS = Timers()
schedule = TIMERS.schedule


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
# This process's ID (os.getpid() is a system call), updated in a forked child.
_PID = [os.getpid()]
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _PID.__setitem__(0, os.getpid()))


def session_of(client, make, timeout: Optional[float] = None):
    """The session of ``client``'s connection pool with the timeout asked
    (``timeout`` seconds; None: the server's), made by ``make(pool,
    timeout)`` on first use (and again in a forked child: the parent's is
    the parent's). The pool's disconnect() (what Redis.close() calls) also
    closes them."""
    pool = client.connection_pool
    sessions = pool.__dict__.get("_flock_sessions")
    session = sessions.get(timeout) if sessions else None
    if session is not None and session.pid == _PID[0]:
        return session
    with _REGISTRY:
        sessions = pool.__dict__.get("_flock_sessions")
        if sessions is None:
            sessions = pool._flock_sessions = {}
            original = pool.disconnect

            def disconnect(*args, **kwargs):
                if args[0] if args else kwargs.get("inuse_connections", True):
                    for current in list(sessions.values()):
                        if current.pid == _PID[0]:
                            current.close()
                return original(*args, **kwargs)

            pool.disconnect = disconnect
        session = sessions.get(timeout)
        if session is None or session.pid != _PID[0]:
            session = sessions[timeout] = make(pool, timeout)
        return session


# SessionConnection.leader when the reader thread reads the inbox.
READER = "reader"


class SessionConnection:
    """A session's connection and its reader: one daemon thread
    (``flock-session``) that reads the inbox, and when the connection
    breaks opens a new session, re-watches the grants held and sends the
    waits again there, before it reads on. The session's protocol (open(),
    _inbox(), _rewatch(), send_wait(), ...) is redis_flock._session.Session's,
    this class's subclass."""

    def __init__(self, pool, timeout: Optional[float]):
        self.pool = pool
        # The timeout asked for (FLOCK.SESSION TIMEOUT), None: the server's.
        self.asked = timeout
        self.pid = _PID[0]
        self.state = SessionState()
        # Guards opening, the connection, the session ID, the reader and the
        # generation.
        self.lock = threading.Lock()
        self.connection = None
        self.sid: Optional[str] = None
        self.reader: Optional[threading.Thread] = None
        # close() starts a new generation: the old reader ends.
        self.generation = 0
        self._limiter = Limiter(SEND_CONCURRENCY)
        # For the reader's own commands (releasing a grant nobody waits for).
        self.client = redis.Redis(connection_pool=pool)
        # The session whose grants were all re-watched, and the one whose
        # waits were all sent (a wait is sent by its own thread while the
        # session lasts: the reader sends waits again only on a new one).
        self.rewatched: Optional[str] = None
        self.resent: Optional[str] = None
        # The timer of the session's deadline.
        self.timer = None
        # The session's own idle connections for sending (Session.send).
        self.senders: list = []
        # Whose turn it is to read the inbox (_await): READER, the reader
        # thread's, or a SessionWait's whose thread waits in _await, one of
        # ``parked`` (oldest first). Guarded by ``turns``.
        self.turns = threading.Condition()
        self.leader = READER
        self.parked: dict = {}

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

    @property
    def limiter(self):
        """At most SEND_CONCURRENCY commands sent at once; in a forked child
        (the parent's state, perhaps held by a thread of the parent's), none."""
        return self._limiter if self.pid == _PID[0] else contextlib.nullcontext()

    def _idle_sender(self):
        """An idle connection of the session's for sending, or None. In a
        forked child (a grant of the parent's released there) the parent's
        are not the child's to use: None, and a connection is made."""
        if self.pid != _PID[0]:
            return None
        try:
            return self.senders.pop()
        except IndexError:
            return None

    def _sender_back(self, connection) -> None:
        if self.pid == _PID[0]:
            self.senders.append(connection)
        else:
            disconnect(connection)

    def close(self) -> None:
        """Closes the session's connection (the server ends the session: its
        waits leave their queues, its session grants end); waits in progress
        raise ConnectionError, session grants are lost (``sessionended``). A
        later acquire opens a new session."""
        with self.lock:
            self.generation += 1
            connection, sid = self.connection, self.sid
            self.connection, self.sid, self.reader = None, None, None
            timer, self.timer = self.timer, None
        if timer is not None:
            timer.cancel()
        if connection is not None:
            shutdown(connection)
        senders, self.senders = self.senders, []
        for sender in senders:
            disconnect(sender)
        self.state.session_ended(sid)
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
            if not self._reader_turn(generation, connection):
                continue
            try:
                if not self._inbox(connection, sid):
                    self._broken(connection)
            except Exception as e:
                if self.generation == generation:
                    logger.info("FLOCK session connection lost (%s): reopening", e)
                self._broken(connection)

    # Whose turn it is to read the inbox. A grant read by the reader thread
    # wakes it, then the waiting thread: two wake-ups, and the GIL passed
    # twice, between the grant and its use. So while threads wait in
    # _await, the one that waited first reads the inbox instead (a waiting
    # thread's wait is ended by an event or its deadline, not by a cancel:
    # that one waits on its event), most often reading its own grant: one
    # wake-up, as a blocking ACQUIRE has. It wakes the others whose events
    # it reads, as the reader would, and when its wait ends passes the turn
    # to the next, or back to the reader thread, which also takes it back
    # when a read fails (it reopens the session).

    def _reader_turn(self, generation: int, connection) -> bool:
        """Before the reader thread's FLOCK.INBOX on ``connection``: while
        threads wait in _await, the turn goes to them, and this waits for it
        to come back. False when it came back from a wait's thread whose
        read failed or found the session being replaced, or the session
        changed: the reader looks at the session again first."""
        with self.turns:
            if not self.parked:
                return True
            if self.leader is READER:
                self._hand_over()
            while self.leader is not READER:
                if self.generation != generation or self.connection is not connection:
                    return False
                self.turns.wait()
            return not self.parked and self.generation == generation and self.connection is connection

    def _hand_over(self) -> None:
        """(Under ``turns``.) The turn to the wait parked first, or back to
        the reader thread."""
        if self.parked:
            self.leader = next(iter(self.parked))
            self.leader.event.poke()
        else:
            self.leader = READER
            self.turns.notify()

    def _give_back(self) -> None:
        with self.turns:
            self.leader = READER
            self.turns.notify()

    def _await(self, wait, timeout: Optional[float], cancel) -> bool:
        """Waits up to ``timeout`` seconds (None: no limit) for ``wait``'s
        event (its outcome, or its CancelToken's cancel): whether it came.
        Without a CancelToken, the thread reads the inbox in its turn."""
        if cancel is not None or self.pid != _PID[0]:
            return wait.event.wait(timeout)
        until = None if timeout is None else time.monotonic() + timeout
        with self.turns:
            self.parked[wait] = None
        try:
            while wait.outcome is None:
                left = None if until is None else until - time.monotonic()
                if left is not None and left <= 0:
                    break
                if self.leader is wait:
                    self._read_turn(left)
                else:
                    wait.event.wait(left)
        finally:
            with self.turns:
                del self.parked[wait]
                if self.leader is wait:
                    self._hand_over()
            wait.event.unpoke()
        return wait.outcome is not None

    def _read_turn(self, longest: Optional[float]) -> None:
        """One FLOCK.INBOX in a waiting thread's turn, waiting at most
        ``longest`` seconds; the turn goes back to the reader thread when
        the session is being replaced or the read fails."""
        with self.lock:
            connection, sid = self.connection, self.sid
        if connection is None or self.rewatched != sid or self.resent != sid or self.state.stale:
            self._give_back()
            return
        try:
            if self._inbox(connection, sid, longest):
                return
        except Exception as e:
            logger.info("FLOCK session connection lost (%s): reopening", e)
        except BaseException:
            self._broken(connection)
            self._give_back()
            raise
        self._broken(connection)
        self._give_back()

    def _broken(self, connection) -> None:
        sid = None
        with self.lock:
            if self.connection is connection:
                sid = self.sid
                self.connection = self.sid = None
        connection.disconnect()
        self.state.session_ended(sid)

    def _gone(self, sid: str) -> None:
        """The server said NOSESSION for ``sid``: drop that connection, the
        reader reopens and sends the waits again."""
        with self.lock:
            connection = self.connection if self.sid == sid else None
            if connection is not None:
                self.connection = self.sid = None
        if connection is not None:
            shutdown(connection)
            self.state.session_ended(sid)

    def _resend(self, sid: str) -> bool:
        """Sends the live waits not (being) sent to session ``sid`` there,
        once per session; False when one could not be sent (tried again
        after a pause)."""
        if self.resent == sid:
            return True
        for wait in self.state.pending():
            if wait.sent_to == sid:
                continue
            try:
                self.send_wait(wait)
            except Exception as e:
                logger.info("FLOCK session: sending a wait again failed (%s)", e)
                return False
        self.resent = sid
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
