"""What only the blocking flavour does, hand-written: its primitives
(threading's), and a session's connection and its reader thread.
redis_flock._session is generated from the asyncio flavour's module
(scripts/unasync.py), which imports redis_flock._asyncio_backend, this
module's counterpart with the same names, where it imports this one."""

import os
import socket
import threading
import time
from typing import Optional

import redis
from redis.exceptions import ConnectionError

from ._core import REOPEN_MAX_DELAY, SEND_CONCURRENCY, SessionState, logger

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

