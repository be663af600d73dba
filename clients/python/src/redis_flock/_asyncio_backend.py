"""What only the asyncio flavour does, hand-written: its primitives
(asyncio's), commands with a timeout of their own, timers (the loop's), a
session's connection and its reader task, a wait on a connection of its own
(``use_session=False``), and acquire()'s arguments. redis_flock._asyncio_session and
redis_flock.asyncio import it; scripts/unasync.py makes the blocking
flavour's modules of theirs, which import redis_flock._backend, this
module's counterpart with the same names, instead."""

import asyncio
import math
import time
from typing import Optional

import redis.asyncio
from redis.exceptions import ConnectionError, TimeoutError

from ._core import REOPEN_MAX_DELAY, SEND_CONCURRENCY, Number, SessionState, logger, pack

# --- Primitives ---------------------------------------------------------------

mutex = asyncio.Lock
sleep = asyncio.sleep

# What a wait's clean-up (FLOCK.CANCEL, then its event) lets pass with
# keep=False: an error, and a second cancel of the task, which must not stop
# it (the first one is raised when it is done).
CANCEL_SURVIVES = (Exception, asyncio.CancelledError)

# A release() cancelled keeps the grant and its RELEASE, as redis-py's asyncio
# lock keeps its token: the next release() resends the same request
# (README.md, "Errors"). One that failed otherwise counts as done.
RELEASE_KEPT_ON = (asyncio.CancelledError,)


class Event:
    """threading.Event's set() and wait(timeout) for the tasks of one loop:
    wait() answers whether it was set."""

    def __init__(self):
        self.future = asyncio.get_running_loop().create_future()

    def set(self) -> None:
        if not self.future.done():
            self.future.set_result(None)

    async def wait(self, timeout: Optional[float] = None) -> bool:
        try:
            # Shielded: a timeout does not cancel the future, which can be
            # awaited again.
            await asyncio.wait_for(asyncio.shield(self.future), timeout)
        except asyncio.TimeoutError:
            return False
        return True


def raise_lost_cancel() -> None:
    """Raises the cancel of the current task that an asyncio.wait_for lost:
    before Python 3.12 it returns the result of what it awaited when the
    cancel comes as that completes (redis-py writes each command through
    one, and the wait's outcome is awaited through one), and the task went
    on waiting. The task still counts the cancel (Task.cancelling(), Python
    3.11; before that, such a cancel stays lost)."""
    task = asyncio.current_task()
    if task is not None and getattr(task, "cancelling", lambda: 0)():
        raise asyncio.CancelledError()


# Tasks started here, referenced until they end.
_BACKGROUND: set = set()


def _keep(task: asyncio.Future) -> asyncio.Future:
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)
    return task


def spawn(name: str, function, *args) -> None:
    """``function(*args)`` in a task of its own on the running loop: work
    for the session's reader that waits on a server."""
    _keep(asyncio.get_running_loop().create_task(function(*args), name=name))


async def finish(function, *args) -> None:
    """``function(*args)`` in a task of its own, awaited through a shield: a
    second cancel of the caller does not stop it (the caller raises its
    first one)."""
    task = _keep(asyncio.ensure_future(function(*args)))
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        pass


async def disconnect(connection) -> None:
    try:
        await connection.disconnect()
    except Exception:
        pass


if hasattr(asyncio, "timeout"):

    async def _within(awaitable, timeout: float):
        async with asyncio.timeout(timeout):
            return await awaitable

else:  # Python < 3.11

    async def _within(awaitable, timeout: float):
        return await asyncio.wait_for(awaitable, timeout)


async def call(client, args, timeout: Optional[float]):
    """``await client.execute_command(*args)``, given up on after ``timeout``
    seconds (docs/client-protocol.md: a command the client sends for itself
    never hangs): redis-py closes a connection whose command was cancelled."""
    if timeout is None:
        return await client.execute_command(*args)
    return await _replied(client.execute_command(*args), args[0], timeout)


async def _replied(awaitable, name, timeout: float):
    """``await awaitable`` (the reply to command ``name``) within ``timeout``
    seconds, else redis-py's TimeoutError, a lost reply."""
    try:
        return await _within(awaitable, timeout)
    except asyncio.TimeoutError as e:
        raise TimeoutError(f"no reply to {name} within {timeout:.3f} s") from e


async def exchange(connection, args, timeout: float):
    """Sends ``args`` on ``connection`` (a session's own) and reads the reply
    within ``timeout`` seconds, else raises TimeoutError (the connection is
    then closed). Not ``read_response(timeout=...)``: that answers None when
    the time is up, as a nil reply would, and leaves the reply to come for
    the next read; a heartbeat read would confirm its session without an
    answer."""
    if not connection.is_connected:
        # connect() itself: there a Sentinel-managed connection asks the
        # sentinels for the master (send's own would go to the default
        # address).
        await connection.connect()
    await connection.send_packed_command([pack(args, connection.encoder)])
    # redis-py closes a connection whose read was cancelled.
    return await _replied(connection.read_response(timeout=math.inf), args[0], timeout)


def schedule(when: float, function, *args) -> asyncio.TimerHandle:
    """Calls ``function(*args)`` on the running loop at ``when`` (on
    time.monotonic(), the loop's clock): the loop's own heap of timers, no
    task per grant. ``cancel()`` stops it."""
    return asyncio.get_running_loop().call_later(max(0.0, when - time.monotonic()), function, *args)


async def node_client(client, key: bytes):
    """The client of the server that holds ``key``: ``client`` itself, or for
    a RedisCluster a Redis of the key's node, whose own pool gives that node
    its own session (a session lives on one server). A redis.asyncio
    RedisCluster learns its slots on its first command (initialize() here),
    and its nodes have no Redis of their own: one is made per node, with the
    node's connection settings, kept on the cluster client and closed by its
    aclose()."""
    if not hasattr(client, "get_node_from_key"):
        return client
    await client.initialize()
    node = client.get_node_from_key(key)
    nodes = client.__dict__.get("_flock_nodes")
    if nodes is None:
        nodes = client._flock_nodes = {}
        original = client.aclose

        async def aclose(*args, **kwargs):
            for redis_client in list(nodes.values()):
                # The pool's disconnect() also closes its sessions.
                await redis_client.connection_pool.disconnect()
            nodes.clear()
            return await original(*args, **kwargs)

        client.aclose = aclose
    redis_client = nodes.get(node.name)
    if redis_client is None:
        pool = redis.asyncio.ConnectionPool(connection_class=node.connection_class, **node.connection_kwargs)
        redis_client = nodes[node.name] = redis.asyncio.Redis(connection_pool=pool)
    return redis_client


# --- Sessions -----------------------------------------------------------------


def session_of(client, make, timeout: Optional[float] = None):
    """The session of ``client``'s pool on the running loop with the
    timeout asked (``timeout`` seconds; None: the server's), made by
    ``make(pool, timeout, loop)`` on first use. The pool's disconnect()
    (what Redis.aclose() calls) also closes them."""
    pool = client.connection_pool
    loop = asyncio.get_running_loop()
    sessions = pool.__dict__.get("_flock_sessions")
    if sessions is None:
        sessions = pool._flock_sessions = {}
        original = pool.disconnect

        async def disconnect(*args, **kwargs):
            if args[0] if args else kwargs.get("inuse_connections", True):
                running = asyncio.get_running_loop()
                for (loop, asked), session in list(sessions.items()):
                    # A session of another loop cannot be awaited here.
                    if loop is running:
                        await session.close()
                    else:
                        sessions.pop((loop, asked), None)
            return await original(*args, **kwargs)

        pool.disconnect = disconnect
    for other in [other for other in sessions if other[0].is_closed()]:
        del sessions[other]
    session = sessions.get((loop, timeout))
    if session is None:
        session = sessions[(loop, timeout)] = make(pool, timeout, loop)
    return session


class SessionConnection:
    """A session's connection and its reader: a task on the loop
    (``flock-session``) that reads the inbox of one connection until it
    breaks; then a task (``flock-session-reopen``) opens a new session,
    re-watches the grants held and sends the waits again there. The
    session's protocol (open(), _inbox(), _rewatch(), send_wait(), ...) is
    redis_flock._asyncio_session.Session's, this class's subclass."""

    def __init__(self, pool, timeout: Optional[float], loop):
        self.pool = pool
        # The timeout asked for (FLOCK.SESSION TIMEOUT), None: the server's.
        self.asked = timeout
        self.loop = loop
        self.state = SessionState()
        # Guards opening.
        self.lock = asyncio.Lock()
        self.connection = None
        self.sid: Optional[str] = None
        self.reader: Optional[asyncio.Task] = None
        self.reopening: Optional[asyncio.Task] = None
        self.limiter = asyncio.Semaphore(SEND_CONCURRENCY)
        # For the reader's own commands (releasing a grant nobody waits for).
        self.client = redis.asyncio.Redis(connection_pool=pool)
        # The session whose grants were all re-watched.
        self.rewatched: Optional[str] = None
        # The timer of the session's deadline.
        self.timer = None
        # The session's own idle connections for sending (Session.send).
        self.senders: list = []

    def _start_reader(self, connection) -> None:
        """open() made ``connection`` the session's: a reader reads it."""
        self.reader = self.loop.create_task(self._read(connection, self.sid), name="flock-session")

    async def close(self) -> None:
        """Closes the session's connection (the server ends the session: its
        waits leave their queues, its session grants end); waits in progress
        raise ConnectionError, session grants are lost (``sessionended``). A
        later acquire opens a new session."""
        connection, sid, self.connection, self.sid = self.connection, self.sid, None, None
        for task in (self.reader, self.reopening):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        self.reader = self.reopening = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if connection is not None:
            await disconnect(connection)
        senders, self.senders = self.senders, []
        for sender in senders:
            await disconnect(sender)
        self.state.session_ended(sid)
        self.state.fail_all(ConnectionError("the FLOCK session was closed (the client was closed)"))

    async def _read(self, connection, sid: str) -> None:
        """Reads the inbox of ``connection``'s session ``sid`` until it breaks."""
        try:
            while await self._inbox(connection, sid):
                if self.state.stale:
                    # A grant watched by an earlier session: re-watched here.
                    self._start_reopening()
        except asyncio.CancelledError:
            await disconnect(connection)
            raise
        except Exception as e:
            logger.info("FLOCK session connection lost (%s): reopening", e)
        self._broken(connection)
        await disconnect(connection)

    def _broken(self, connection) -> None:
        if self.connection is not connection:
            return
        sid = self.sid
        self.connection = self.sid = None
        self.state.session_ended(sid)
        if self.state.has_pending() or self.state.has_watched():
            self._start_reopening()

    async def _await(self, wait, timeout: Optional[float], cancel) -> bool:
        """Waits up to ``timeout`` seconds (None: no limit) for ``wait``'s
        event (its outcome, or its CancelToken's cancel): whether it came.
        The reader task brings it."""
        return await wait.event.wait(timeout)

    def _idle_sender(self):
        """An idle connection of the session's for sending, or None."""
        return self.senders.pop() if self.senders else None

    async def _sender_back(self, connection) -> None:
        self.senders.append(connection)

    def _start_reopening(self) -> None:
        if self.reopening is None or self.reopening.done():
            self.reopening = self.loop.create_task(self._reopen(), name="flock-session-reopen")

    def _gone(self, sid: str) -> None:
        """The server said NOSESSION for ``sid``: drop that connection and
        reopen (the waits are sent again)."""
        if self.sid != sid:
            return
        connection, reader = self.connection, self.reader
        self.reader = None
        if reader is not None:
            reader.cancel()
        self._broken(connection)

    async def _reopen(self) -> None:
        """Opens a new session, checks the grants held that another session
        watched and moves their watch there, and sends the live waits there
        again, until each is there (or ended); pauses doubling up to
        REOPEN_MAX_DELAY between failed attempts."""
        delay = 0.0
        while self.state.has_pending() or self.state.has_watched():
            try:
                sid = await self.open()
                rewatched = await self._rewatch(sid)
                todo = [wait for wait in self.state.pending() if wait.sent_to != sid]
                if rewatched and not todo:
                    return
                for wait in todo:
                    await self.send_wait(wait)
                if not rewatched:
                    raise ConnectionError("a grant could not be re-watched")
                delay = 0.0
                continue  # check again: the session may have broken meanwhile
            except asyncio.CancelledError:
                raise
            except Exception as e:
                logger.debug("FLOCK session: reopening failed: %s", e)
                delay = min(max(delay * 2, 0.05), REOPEN_MAX_DELAY)
            await asyncio.sleep(delay)


# --- Locks --------------------------------------------------------------------


class Dedicated:
    """A connection of its own, made with the client pool's settings, for a
    blocking wait without a session (``use_session=False``): it holds that
    connection for its whole length, never a pool's. A cancelled task
    closes it (``cancel`` and ``name`` are the blocking flavour's)."""

    def __init__(self, client, socket_timeout: Optional[float], cancel=None, name=None):
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
        # connect() first: there a Sentinel-managed connection asks the
        # sentinels for the master (send_command's own connect would go to
        # the default address).
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


class LockFlavour:
    """acquire() as redis-py's ``redis.asyncio.lock.Lock.acquire`` takes it
    (no ``sleep``); the lock's _acquire does it."""

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
        return await self._acquire(blocking, blocking_timeout, token, None)


class MultiLockFlavour:
    """MultiLock's acquire(), with Lock's arguments."""

    async def acquire(
        self,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[Number] = None,
        token=None,
    ) -> bool:
        """Takes every lock for one owner, or none: one FLOCK.ACQUIREALL;
        True once all are granted. Not blocking: one try. Blocking: ``...
        WAIT`` on a connection of its own, in every key's FIFO queue at
        once, up to ``blocking_timeout`` seconds (None: no limit); a key its
        owner holds already is reentered. Cancelling the task ends the wait
        (its connection closes); a grant that won the race is given back."""
        return await self._acquire(blocking, blocking_timeout, token, None)
