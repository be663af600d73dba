"""What the blocking and the asyncio lock share: the lock's state and the FLOCK
commands, replies and errors. No I/O here: each flavour sends the commands."""

import inspect
import itertools
import logging
import os
import threading
import time
from collections import OrderedDict
from types import SimpleNamespace
from typing import Any, Callable, Optional, Union

from redis.exceptions import (
    ClusterCrossSlotError,
    ConnectionError,
    LockError,
    LockNotOwnedError,
    ResponseError,
    TimeoutError,
)

logger = logging.getLogger("redis_flock")

# The rules every client shares (docs/client-protocol.md; the `protocol` block
# of clients/scenarios.json holds the same values, tests/test_protocol.py
# checks them).
#
# A session's reader reads its inbox (FLOCK.INBOX) for at most a quarter of the
# session's timeout T: the server answers nil by then, the heartbeat.
HEARTBEAT_FRACTION = 4
# Every local deadline is taken in by this margin, 10 ms + 1% of the lease or
# timeout it applies to: for the clocks' rates and a timer firing late.
DRIFT_MARGIN = 0.010
DRIFT_MARGIN_PERCENT = 1
# A grant taken without a session (use_session=False, a MultiLock's, a
# durable one) and without a timeout has this lease, renewed by the watchdog
# every third of it (Redisson's lockWatchdogTimeout is 30 s too).
WATCHDOG_TIMEOUT = 30.0
WATCHDOG_RENEW_FRACTION = 3
# T for the command timeouts of a lock that has no session of its own to ask:
# the server's default flock.session-timeout-ms.
DEFAULT_SESSION_TIMEOUT = 10.0

# A command whose reply was lost is sent again at once with the same request
# ID, up to this many times; the server applies it once (docs/commands.md,
# "Request IDs"). An error reply is never resent: the server answered it.
RESENDS = 3
LOST_REPLY = (ConnectionError, TimeoutError)

# A blocking wait's socket outlives the server-side WAIT by this much, so that
# the server's own timeout (a nil reply) ends it and a dead server still does.
WAIT_SOCKET_MARGIN = 10.0

# The one reply that means the lock is no longer this holder's: the lease
# ended, someone force-released it, the key was deleted (the text says which).
LOST_PREFIXES = ("NOTOWNER",)

# Why a grant was lost (lost_reason, on_lost's reason): docs/client-protocol.md.
EXPIRED = "expired"  # a fixed lease reached its deadline, or the server pushed it
UNCONFIRMED = "unconfirmed"  # a session or watchdog grant's deadline passed unconfirmed
SESSIONENDED = "sessionended"  # the session that held it closed or expired
NOTOWNER = "notowner"  # a renewal or check answered NOTOWNER (lost_detail: its text)
LOSS_REASONS = (EXPIRED, UNCONFIRMED, SESSIONENDED, "forcereleased", "deleted", "demoted", NOTOWNER)


def drift_margin(seconds: float) -> float:
    """What a deadline counted over ``seconds`` is taken in by."""
    return DRIFT_MARGIN + seconds * DRIFT_MARGIN_PERCENT / 100


# A session wait ends with the server's `timeout` event; the client's own
# deadline is this much later (then it sends FLOCK.CANCEL), and after a CANCEL
# it waits this long for the wait's event before giving up on it (a grant that
# comes later is released by the reader).
LOCAL_DEADLINE_MARGIN = 2.0
CANCEL_GRACE = 2.0
# At most this many waits of one session are being sent at once, each on a
# pool connection: a thousand waiting threads add the session's connection
# and at most this many pool connections.
SEND_CONCURRENCY = 2
# Reopening a broken session: at once, then after pauses doubling up to this.
REOPEN_MAX_DELAY = 1.0
# Losses pushed for grants not (yet) known to a lock object are kept this
# many, so that a grant registered a moment after its loss still sees it.
RECENT_LOSSES = 1024
# Grants handed to their waits are remembered this many (SessionState.told).
TOLD = 1024

# A wait or try sent to a Cluster node's own connection (the session's
# server) that answers MOVED or ASK is sent again to the key's node, up to this
# many times (redis-py's RedisCluster follows redirections 16 times too); after
# ASK (a slot being migrated) it pauses ASK_PAUSE times the attempt first.
REDIRECTS = 16
ASK_PAUSE = 0.01

# A MultiLock's wait that ended without its reply is given back by a try
# with its request ID; one that comes before the server saw the wait's
# connection close is answered QUEUED, and is asked again after a pause of
# this many seconds times the attempt, up to RESENDS times.
GIVE_BACK_PAUSE = 0.01

Number = Union[int, float]


def to_ms(seconds: Number) -> int:
    """Seconds (int or float, as redis-py takes them) to FLOCK's milliseconds;
    at least 1, the smallest lease or wait FLOCK accepts."""
    return max(1, int(seconds * 1000))


def wait_left(wait_ms: Optional[int], started: float) -> Optional[int]:
    """What is left of ``wait_ms`` (None: a try; 0: no limit) begun at
    ``started``: a wait sent again to another Cluster node keeps its
    deadline."""
    if not wait_ms:
        return wait_ms
    return max(1, wait_ms - int((time.monotonic() - started) * 1000))


def wait_socket_timeout(wait_ms: int) -> Optional[float]:
    """The socket timeout of a connection blocking on a wait of ``wait_ms``
    (0: no limit)."""
    return None if wait_ms == 0 else wait_ms / 1000 + WAIT_SOCKET_MARGIN


# Request IDs and random owners: 96 random bits made once per process (again
# in a forked child), then a counter. Unique across clients as a UUID v4 is,
# and the prefix names the process; at a tenth of uuid4()'s cost, paid on
# every acquire and release.
_IDS = [os.urandom(12).hex(), itertools.count()]
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _IDS.__setitem__(slice(None), [os.urandom(12).hex(), itertools.count()]))


def new_id() -> str:
    """A request ID, or a random owner, never made before by any client."""
    prefix, counter = _IDS
    return f"{prefix}{next(counter):x}"


def pack(args, encoder) -> bytes:
    """``args`` as one RESP command, as redis-py's packer makes it (str
    encoded as ``encoder`` says, int in decimal, bytes as they are) at a
    quarter of its cost: FLOCK's commands are short and their arguments of
    these three kinds (anything else goes to ``encoder``)."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        kind = type(arg)
        if kind is str:
            arg = arg.encode(encoder.encoding, encoder.encoding_errors)
        elif kind is int:
            arg = b"%d" % arg
        elif kind is not bytes:
            arg = encoder.encode(arg)
        out.append(b"$%d\r\n%b\r\n" % (len(arg), arg))
    return b"".join(out)


def with_id(*args):
    """The command with a request ID of its own: a resend of these very
    arguments is applied once."""
    return (*args, "ID", new_id())


# What a watchdog's renewal can fail with without ending the watchdog's loop.
RENEWAL_ERRORS = (ResponseError, *LOST_REPLY)


def is_notowner(error: BaseException) -> bool:
    """NOTOWNER: the server says the grant is not this owner's (any more);
    its text says why."""
    return isinstance(error, ResponseError) and str(error).startswith(LOST_PREFIXES)


class UpgradeError(LockError, ResponseError):
    """The server's ``UPGRADE``: this owner holds the lock shared (reads) and
    asked for it exclusively, which would wait for itself. Release the read
    holds first. Also a ResponseError, as the reply it stands for."""


class DeadlockError(LockError, ResponseError):
    """The server's ``DEADLOCK``: this wait would never end, as its owner
    would wait, through other owners, for itself (the message names them).
    Nothing was queued; release what this owner holds and try again."""


class WrongModeError(LockError, ResponseError):
    """The server's ``WRONGMODE``: the key is a lock and was asked for permits,
    or a semaphore asked without permits or with another limit."""


class StaleTokenError(LockNotOwnedError):
    """The server's ``STALE``: ``fenced()`` sent a command with this grant's
    fencing token after the grant had ended (its lease ran out, it was
    force-released, the lock was deleted): the command did not run, and the
    lock is ``lost``. Also raised without sending when the grant is already
    known lost here. A LockNotOwnedError, as redis-py's lock raises for a
    lock no longer owned."""


class CrossSlotError(LockError, ClusterCrossSlotError):
    """A Redis Cluster's ``CROSSSLOT``: the keys of a ``MultiLock`` are in
    different hash slots, and one command can only take keys of one slot.
    Give them a common hash tag (``{account:42}:from``, ``{account:42}:to``).
    Nothing was taken."""


class LockNotDurableError(LockError):
    """The server's grant did not reach ``durable_replicas`` replicas within
    ``durable_timeout`` (docs/client-protocol.md, "Durable grants"): the hold
    was given back (FLOCK.RELEASE) and the acquire failed. ``reached``: how
    many replicas acknowledged it (0 when the check itself failed);
    ``asked``: how many were asked for."""

    def __init__(self, message=None, lock_name=None, reached: int = 0, asked: int = 0):
        super().__init__(message, lock_name=lock_name)
        self.reached = reached
        self.asked = asked


class AcquireCancelled(LockError):
    """A blocking ``acquire()`` whose ``CancelToken`` was cancelled: the wait
    left the server's queue (``FLOCK.CANCEL``), and a grant that won the race
    was released. The threads' counterpart of asyncio's CancelledError."""


class CancelToken:
    """Cancels blocking ``acquire(cancel=token)`` calls from another thread,
    as an ``AbortController`` does in Node or ``Thread.interrupt`` in Java:
    ``token.cancel()`` makes every acquire given this token (waiting, or
    started later) raise ``AcquireCancelled``. A waiting thread sends
    ``FLOCK.CANCEL`` and lets the wait's event decide: a grant that won the
    race is released first. Once cancelled, a token stays cancelled."""

    def __init__(self):
        self._mutex = threading.Lock()
        self._cancelled = False
        self._callbacks: list = []

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        with self._mutex:
            if self._cancelled:
                return
            self._cancelled = True
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def _subscribe(self, callback: Callable[[], Any]) -> Callable[[], None]:
        """Calls ``callback`` on cancel() (at once if cancelled already);
        returns what unsubscribes it."""
        with self._mutex:
            if not self._cancelled:
                self._callbacks.append(callback)
                return lambda: self._unsubscribe(callback)
        callback()
        return lambda: None

    def _unsubscribe(self, callback) -> None:
        with self._mutex:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

    def _check(self, name) -> None:
        if self._cancelled:
            raise AcquireCancelled("acquire() was cancelled", lock_name=name)


# Error replies that become redis-py's lock errors; the rest stay what redis-py
# made of them (ResponseError and its subclasses).
LOCK_ERRORS = {
    "NOTOWNER": LockNotOwnedError,
    "STALE": StaleTokenError,
    "UPGRADE": UpgradeError,
    "WRONGMODE": WrongModeError,
    "DEADLOCK": DeadlockError,
}


def lock_error(error: ResponseError, action: str, name, lost: Optional[str] = None) -> Exception:
    """NOTOWNER becomes redis-py's LockNotOwnedError, as its Lock raises,
    UPGRADE, WRONGMODE, DEADLOCK and CROSSSLOT the errors above; others stay
    as they are. ``lost``: why this process already knew the grant was lost
    (a pushed loss). ``name``: a lock's name, or a MultiLock's list of them."""
    if isinstance(error, ClusterCrossSlotError):
        return CrossSlotError(
            f"Cannot {action} {name!r} together: in a Redis Cluster one command takes keys of one hash slot"
            f" only; give the keys a common hash tag, e.g. '{{account:42}}:from' and '{{account:42}}:to'"
            f" (CROSSSLOT {error})",
            lock_name=name,
        )
    kind = LOCK_ERRORS.get(str(error).split(" ", 1)[0])
    if kind is None:
        return error
    if issubclass(kind, LockNotOwnedError):
        what = "a lock that's no longer owned"
        if lost:
            what += f": its grant was lost ({LOSS_TEXT.get(lost, lost)})"
    else:
        what = f"{'locks' if isinstance(name, list) else 'lock'} {name!r}"
    return kind(f"Cannot {action} {what} ({error})", lock_name=name)


def call_on_lost(lock, reason: str) -> None:
    """``lock.on_lost(lock, reason)`` if given; an awaitable it returns is
    scheduled on the running loop. Its exceptions are logged, not raised:
    it runs on the session's reader, the process's deadline timer (thread or
    event loop), a renewal, or the thread that read ``lost`` first after the
    deadline."""
    if lock.on_lost is None:
        return
    try:
        result = lock.on_lost(lock, reason)
        if inspect.isawaitable(result):
            import asyncio

            asyncio.ensure_future(result)
    except Exception:
        logger.exception("FLOCK on_lost callback of lock %r failed", lock.name)


# The reasons of a loss, as a person reads them.
LOSS_TEXT = {
    EXPIRED: "its lease ended",
    UNCONFIRMED: "its session or watchdog did not confirm it before its deadline",
    SESSIONENDED: "the session that held it ended",
    "forcereleased": "it was force-released",
    "deleted": "the lock key was deleted",
    "demoted": "the server stopped being a master",
    NOTOWNER: "the server answered NOTOWNER",
}


def parse_info(reply) -> Optional[dict]:
    """FLOCK.INFO's reply (a RESP3 map or a RESP2 flat list, bytes or str
    keys) as a dict with str keys, ``holders`` a list of such dicts, or None
    when nobody holds the lock."""
    if reply is None:
        return None
    fields = _fields(reply)
    if "holders" in fields:
        fields["holders"] = [_fields(holder) for holder in fields["holders"]]
    return fields


def _fields(reply) -> dict:
    pairs = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2])
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in pairs}


def holder(info: Optional[dict], owner: Optional[bytes]) -> Optional[dict]:
    """``owner``'s entry in FLOCK.INFO (owner, holds, token, ttl-ms, ...), or
    None when it holds nothing. Every holder, exclusive, shared or semaphore,
    is in ``holders``."""
    if info is None or owner is None:
        return None
    return next((h for h in info["holders"] if _as_bytes(h["owner"]) == owner), None)


# What keeps a grant (docs/client-protocol.md, "The rules every client
# shares"): its session (``FLOCK.ACQUIRE key owner 0 ... INBOX sid``, lost with
# the session), a fixed lease (``timeout=``), or the watchdog's renewals (a
# grant taken without a session and without a timeout).
SESSION_GRANT, FIXED_GRANT, WATCHDOG_GRANT = "session", "fixed", "watchdog"


class Grant:
    """One grant of the lock to this Lock object: the owner sent to the server,
    the fencing token, its deadline, and the watchdog's state. ``mutex``
    orders the watchdog's RENEW before the RELEASE, so a renewal never follows
    the release and reports a loss that did not happen."""

    def __init__(self, owner: bytes, token: int, mutex, kind: str = FIXED_GRANT):
        self.owner = owner
        self.token = token
        self.mutex = mutex
        self.kind = kind
        # The holds taken through this Lock object, unreleased (counted in
        # HELD too, LockBase._count): the server's count also has those of
        # the other lock objects of the owner (the other side of a
        # read-write lock, a caller-named owner's).
        self.holds = 0
        self.lost = False
        # Why it was lost (LOSS_REASONS), and for NOTOWNER the server's text.
        self.lost_reason: Optional[str] = None
        self.lost_detail: Optional[str] = None
        self.stopped = False
        # The RELEASE (with its request ID) of a release() that was
        # cancelled (asyncio: backend.RELEASE_KEPT_ON): sent again by the
        # next release(), or before a reentry of this grant.
        self.pending_release = None
        # A fixed or watchdog lease (ms) and the moment it counts from, as
        # this process knows it: the send time of the command that set it
        # (the acquire, the INBOX read that brought the grant, the last
        # renewal whose reply came). The deadline is their sum less the
        # drift margin; a re-watch asks for what is left, never more.
        self.lease_ms: int = 0
        self.lease_from = time.monotonic()
        # A session grant's session (its SessionState): its deadline is the
        # session's.
        self.session: Optional["SessionState"] = None
        # The session that watches it (its `lost` events), and the RELEASE of
        # a re-watch's extra hold that did not get through (sent before the
        # holder's own release).
        self.watched_sid: Optional[str] = None
        self.extra_release = None
        # Whether its owner may acquire again (a reentrant lock's, or a
        # token= given): only then are its holds counted (HELD) and its
        # releases remembered (RELEASED).
        self.owner_reused = True
        # The grants one FLOCK.ACQUIREALL made with it (a MultiLock's keys):
        # the loss of the first of them is reported, not of each.
        self.group: tuple = (self,)
        self.reported = False
        # The backend's timers of its deadline and of the watchdog's next
        # renewal (cancel()), cancelled when it stops.
        self.deadline_timer = None
        self.renewal_timer = None
        # (SessionState, ident) of the session that watches it: unwatched
        # when it stops.
        self.watch = None
        # The Session whose connections its release goes out on (a single
        # server's grant taken through a session), or None: the lock's client.
        self.sender = None

    def due(self) -> tuple:
        """(its deadline on time.monotonic(), the reason it is lost then)."""
        if self.kind == SESSION_GRANT:
            return self.session.deadline_of(self.watched_sid)
        seconds = self.lease_ms / 1000
        return self.lease_from + seconds - drift_margin(seconds), EXPIRED if self.kind == FIXED_GRANT else UNCONFIRMED

    def left_ms(self) -> int:
        """What is left of its fixed lease, as this process counts it."""
        return self.lease_ms - int((time.monotonic() - self.lease_from) * 1000)

    def stop(self) -> None:
        self.stopped = True
        if self.deadline_timer is not None:
            self.deadline_timer.cancel()
        if self.renewal_timer is not None:
            self.renewal_timer.cancel()
        if self.watch is not None:
            state, ident = self.watch
            state.unwatch(ident, self)

    def mark_lost(self, name, why: str, detail: Optional[str] = None) -> bool:
        """Marks the grant lost; False when it already was."""
        if self.lost:
            return False
        self.lost = True
        self.lost_reason = why
        self.lost_detail = detail
        logger.warning("FLOCK lock %r lost: %s", name, detail or LOSS_TEXT.get(why, why))
        return True


# Stale holds (docs/client-protocol.md, the rule "stale holds"): a release
# that a failover lost (answered by a master deposed a moment later), that the
# server refused (NOREPLICAS, READONLY; a durable check's give-back) or whose
# every reply was lost leaves the hold on the server, and so may an acquire
# whose every reply was lost. The same owner's next acquire then reenters it
# (the same token, one more hold, the lease renewed), and a thread that loops
# acquire/release keeps the lock from every other for good. So the token of
# each (lock, owner)'s last release that may have left a hold is remembered
# here (RELEASED), for at most STALE_RELEASES of them, and the process counts
# its unreleased holds of each grant (HELD); a grant that comes back with a
# remembered token gives back the holds FLOCK.INFO counts beyond those, and
# the caller holds one more than before, as it expects. A release of the
# process's last hold of (lock, owner) that answers holds left gives those
# back at once (a failover's churn can reenter a hold whose memory a grant
# elsewhere has since replaced). HELD counts an acquire from before it is
# sent, so that such a release never takes its grant for a stale hold.
STALE_RELEASES = 1024
# Remembered for an acquire whose every reply was lost (a failover, the
# resends given up on): the server may have granted it, a hold no lock
# object knows of, which the owner's next grant reenters.
ANY_TOKEN = -1


class _Released:
    """The token of the grant each (lock name, owner) let go of last, where
    the release may have left its hold (refused, every reply lost, or
    answered by a master a failover may depose), or ANY_TOKEN: a later grant
    with that token may have reentered holds nobody knows of. Thread-safe,
    never blocks on I/O."""

    def __init__(self):
        self.mutex = threading.Lock()
        self.tokens: OrderedDict = OrderedDict()

    def remember(self, name, owner: bytes, token: int) -> None:
        with self.mutex:
            self.tokens[(_name_key(name), owner)] = token
            self.tokens.move_to_end((_name_key(name), owner))
            while len(self.tokens) > STALE_RELEASES:
                self.tokens.popitem(last=False)

    def take(self, name, owner: bytes, token: int) -> bool:
        """Whether ``token`` is the one this (lock, owner) released last, or
        ANY_TOKEN was remembered; forgotten either way (a grant with another
        token means the owner held nothing when it was made)."""
        if not self.tokens:
            return False
        with self.mutex:
            return self.tokens.pop((_name_key(name), owner), None) in (token, ANY_TOKEN)


RELEASED = _Released()


class _Held:
    """The process's unreleased holds of an owner used again, across its
    lock objects and threads: of each grant (lock name, owner, token), and
    of each (lock name, owner) in all, with its acquires in flight (counted
    from before the ACQUIRE is sent until it ends, granted or not): a
    give-back leaves those. Thread-safe, never blocks on I/O."""

    def __init__(self):
        self.mutex = threading.Lock()
        # (name, owner, token): the holds granted and not released.
        self.counts: dict = {}
        # (name, owner): those of every token, and its acquires in flight.
        self.owners: dict = {}
        # (name, owner): its acquires in flight.
        self.acquiring: dict = {}

    @staticmethod
    def _add(counts: dict, key, n: int) -> None:
        count = counts.get(key, 0) + n
        if count > 0:
            counts[key] = count
        else:
            counts.pop(key, None)

    def add(self, name, owner: bytes, token: int, n: int) -> None:
        """``n`` more (fewer) holds of grant ``token``."""
        name = _name_key(name)
        with self.mutex:
            self._add(self.counts, (name, owner, token), n)
            self._add(self.owners, (name, owner), n)

    def acquire(self, name, owner: bytes, n: int) -> None:
        """``n`` more (1: one is about to be sent) or fewer (-1: one ended)
        acquires of (``name``, ``owner``) in flight."""
        pair = (_name_key(name), owner)
        with self.mutex:
            self._add(self.acquiring, pair, n)
            self._add(self.owners, pair, n)

    def count(self, name, owner: bytes, token: int) -> int:
        """The holds of grant ``token`` the process has, its acquires in
        flight of the owner counted as holds of it: at a grant, its own one
        included."""
        name = _name_key(name)
        return self.counts.get((name, owner, token), 0) + self.acquiring.get((name, owner), 0)

    def held(self, name, owner: bytes) -> int:
        """The process's unreleased holds of (``name``, ``owner``), of
        every token, and its acquires in flight."""
        return self.owners.get((_name_key(name), owner), 0)


HELD = _Held()


def _name_key(name) -> bytes:
    return name if isinstance(name, bytes) else str(name).encode()


class _Local(threading.local):
    # Class attributes: defaults in every thread, not only the creating one.
    token = None
    grant = None
    random_owner = None


class LockBase:
    """The constructor, arguments and state shared by both flavours.

    ``durable_replicas=n`` (0: off) makes every grant count only once ``n``
    replicas acknowledged it within ``durable_timeout`` seconds (1.0): after
    the grant, ``FLOCK.RENEW`` and ``WAIT n`` go in one round trip to the key's
    node; fewer replicas, and the hold is given back and ``acquire()`` raises
    LockNotDurableError. Name every replica of the deployment (README.md,
    "Durable grants").

    ``session_timeout`` (seconds, None: the server's
    ``flock.session-timeout-ms``) is the timeout T of the session this lock
    waits and holds through: a lock without a ``timeout`` holds a session
    grant, lost when its session is not heard from for T (docs/client-protocol.md,
    "The rules every client shares").

    ``lock_delay`` (seconds, 0 to 60; None: the server's
    ``flock.lock-delay-ms``) is the lock-delay of this lock's grants: when
    one ends without being released (its lease ran out, its session ended),
    the server grants the lock to nobody for that long (docs/commands.md,
    "Lock-delay").

    ``acquire_options`` are extra FLOCK.ACQUIRE arguments placed before WAIT
    and ID: the read side of a read-write lock or a semaphore (FLOCK's
    ``SHARED``, ``PERMITS n LIMIT m``) are subclasses that set them."""

    acquire_options: tuple = ()

    def __init__(
        self,
        redis,
        name,
        timeout: Optional[Number] = None,
        sleep: Number = 0.1,
        blocking: bool = True,
        blocking_timeout: Optional[Number] = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
        *,
        reentrant: bool = False,
        watchdog_timeout: Number = WATCHDOG_TIMEOUT,
        on_lost: Optional[Callable[[Any, str], Any]] = None,
        use_session: bool = True,
        durable_replicas: int = 0,
        durable_timeout: Number = 1.0,
        session_timeout: Optional[Number] = None,
        lock_delay: Optional[Number] = None,
    ):
        self.redis = redis
        self.name = name
        self.timeout = timeout
        # Unused: FLOCK queues the waiter on the server, nothing polls.
        self.sleep = sleep
        self.blocking = blocking
        self.blocking_timeout = blocking_timeout
        self.thread_local = bool(thread_local)
        self.raise_on_release_error = raise_on_release_error
        self.reentrant = reentrant
        self.watchdog_timeout = watchdog_timeout
        # Called as on_lost(lock, reason) when a grant of this lock is lost
        # (its deadline passed, the server pushed its end, its session ended,
        # a renewal answered NOTOWNER), on the session's reader, the deadline
        # timer or a renewal (thread or task); an awaitable it returns is
        # scheduled on the loop.
        self.on_lost = on_lost
        # Waits go through the process's session (FLOCK.INBOX), or, False,
        # block on a connection of their own (FLOCK.ACQUIRE ... WAIT).
        self.use_session = use_session
        # The session's timeout T in seconds (FLOCK.SESSION TIMEOUT), None:
        # the server's. A session per pool and T.
        if session_timeout is not None and not 0.1 <= session_timeout <= 3600:
            raise ValueError("session_timeout must be None or from 0.1 to 3600 seconds")
        self.session_timeout = session_timeout
        if lock_delay is not None and not 0 <= lock_delay <= 60:
            raise ValueError("lock_delay must be None or from 0 to 60 seconds")
        self.lock_delay = lock_delay
        # Durable grants (docs/client-protocol.md, "Durable grants"): a grant
        # counts once this many replicas acknowledged it, within
        # durable_timeout seconds; else it is given back and the acquire
        # raises LockNotDurableError. 0: off.
        if int(durable_replicas) < 0 or durable_timeout <= 0:
            raise ValueError("durable_replicas must be >= 0 and durable_timeout > 0")
        self.durable_replicas = int(durable_replicas)
        self.durable_timeout = durable_timeout
        self.local = _Local() if self.thread_local else SimpleNamespace(token=None, grant=None)

    @property
    def _object_id(self) -> str:
        """This lock object's ID, made on first use (a reentrant owner is
        made of it): most locks never need it."""
        made = self.__dict__.get("_object_id_made")
        if made is None:
            made = self._object_id_made = new_id()
        return made

    @_object_id.setter
    def _object_id(self, value: str) -> None:
        self._object_id_made = value

    @property
    def fencing_token(self) -> Optional[int]:
        """The fencing token of this thread's grant (None when not held)."""
        grant = self.local.grant
        return grant.token if grant else None

    @property
    def lost(self) -> bool:
        """True once this grant is known lost: its deadline passed (checked
        against the clock here too, so that a process paused past it sees
        it at once), the server pushed its end (lease ended, force-released,
        key deleted, demoted), its session ended, or a renewal answered
        NOTOWNER. The grant is kept until release(), which then raises
        LockNotOwnedError."""
        grant = self.local.grant
        if grant is None:
            return False
        if not grant.lost:
            self._check_due(grant)
        return grant.lost

    @property
    def lost_reason(self) -> Optional[str]:
        """Why this grant was lost, or None: ``expired`` (its fixed lease ran
        out), ``unconfirmed`` (its session's heartbeat or the watchdog's
        renewal did not confirm it before its deadline), ``sessionended``
        (its session closed or expired), ``forcereleased``, ``deleted``,
        ``demoted`` (pushed by the server) or ``notowner`` (a renewal or
        check answered NOTOWNER: ``lost_detail`` has the server's text)."""
        return self.local.grant.lost_reason if self.lost else None

    @property
    def lost_detail(self) -> Optional[str]:
        """The server's text when ``lost_reason`` is ``notowner``, else None."""
        return self.local.grant.lost_detail if self.lost else None

    def _grant_lost(self, grant: "Grant", reason: str, detail: Optional[str] = None) -> None:
        """Marks ``grant`` lost at once and calls ``on_lost``."""
        if grant.mark_lost(self.name, reason, detail):
            call_on_lost(self, reason)

    def _check_due(self, grant: "Grant") -> Optional[float]:
        """Marks ``grant`` lost when its deadline has passed; else returns
        the deadline (None once it is lost or stopped)."""
        if grant.lost or grant.stopped:
            return None
        deadline, reason = grant.due()
        if time.monotonic() < deadline:
            return deadline
        self._grant_lost(grant, reason)
        return None

    @property
    def watchdog(self) -> bool:
        """Whether grants are renewed by a watchdog: no ``timeout`` and no
        session to hold them (``use_session=False``, a MultiLock's keys, or
        durable grants, which outlive a session)."""
        return self._kind() == WATCHDOG_GRANT

    def _kind(self) -> str:
        """What keeps this lock's grants: a fixed lease (``timeout``), the
        session, or the watchdog."""
        if self.timeout:
            return FIXED_GRANT
        if self.use_session and not self.durable_replicas:
            return SESSION_GRANT
        return WATCHDOG_GRANT

    def _lease_ms(self) -> int:
        """The lease-ms FLOCK.ACQUIRE asks: 0 for a session grant."""
        kind = self._kind()
        if kind == SESSION_GRANT:
            return 0
        return to_ms(self.watchdog_timeout if kind == WATCHDOG_GRANT else self.timeout)

    def _command_timeout(self) -> float:
        """The socket timeout of a command this lock sends for itself that
        serves no deadline (a release, a cancel): a quarter of the session's
        timeout."""
        return (self.session_timeout or DEFAULT_SESSION_TIMEOUT) / HEARTBEAT_FRACTION

    def _grant_timeout(self, grant: "Grant") -> float:
        """The socket timeout of a command that serves ``grant`` (a renewal,
        a re-watch): until its deadline, at least a millisecond; a session
        grant's, a quarter of the session's timeout."""
        if grant.kind == SESSION_GRANT:
            return self._command_timeout()
        return max(0.001, grant.due()[0] - time.monotonic())

    def _owner(self, token, encoder) -> bytes:
        if token is not None:
            return encoder.encode(token)
        if self.reentrant:
            if self.thread_local:
                return f"{self._object_id}:{threading.get_ident()}".encode()
            return self._object_id.encode()
        # As redis-py: a new token per acquire, so acquiring again does not reenter.
        self.local.random_owner = new_id().encode()
        return self.local.random_owner

    def _wait_ms(self, blocking, blocking_timeout) -> Optional[int]:
        """None: only try; 0: wait without limit; else the wait in ms."""
        if not (self.blocking if blocking is None else blocking):
            return None
        if blocking_timeout is None:
            blocking_timeout = self.blocking_timeout
        if blocking_timeout is None:
            return 0
        if blocking_timeout <= 0:
            return None
        return to_ms(blocking_timeout)

    def _acquire_command(self, owner: bytes, wait_ms: Optional[int], rid: Optional[str] = None):
        """FLOCK.ACQUIRE (with WAIT ``wait_ms`` unless None) with request ID
        ``rid``, or one of its own."""
        args = self._acquire_base(owner)
        if wait_ms is not None:
            args += ["WAIT", wait_ms]
        return (*args, "ID", rid) if rid is not None else with_id(*args)

    def _acquire_base(self, owner: bytes) -> list:
        """FLOCK.ACQUIRE without WAIT, INBOX and ID."""
        delay = () if self.lock_delay is None else ("LOCKDELAY", int(self.lock_delay * 1000))
        return ["FLOCK.ACQUIRE", self.name, owner, self._lease_ms(), *self.acquire_options, *delay]

    def _durable_commands(self, owner: bytes):
        """A durable grant's check (docs/client-protocol.md, "Durable
        grants"): (a function making the RENEW, the WAIT to send after it in
        one round trip on a connection to the key's node, the RELEASE that
        gives one hold back). Each RENEW made has a request ID of its own: a
        resend of the same ID would be answered from the server's record and
        write nothing for the WAIT to count. The RENEW is
        that connection's own write, after the grant in the replication
        stream: WAIT's count of acknowledgements covers the grant even when
        it was written by another client's command (a pushed grant)."""
        return (
            lambda: with_id("FLOCK.RENEW", self.name, owner, self._lease_ms()),
            ("WAIT", self.durable_replicas, to_ms(self.durable_timeout)),
            with_id("FLOCK.RELEASE", self.name, owner),
        )

    def _not_durable(self, replies, token: int) -> Optional["LockNotDurableError"]:
        """None when the check's replies (RENEW's, WAIT's; or the exception
        that ended the round trip) say the grant of ``token`` reached
        ``durable_replicas`` replicas; else the error to raise once the hold
        is given back. A RENEW that answers another token found another
        grant of this owner (an older one a failover's promoted replica
        kept): this one is gone."""
        asked, reached, why = self.durable_replicas, 0, ""
        if isinstance(replies, BaseException):
            why = f": the RENEW and WAIT got no answer ({replies})"
        else:
            renewed, acknowledged = replies
            if isinstance(renewed, Exception):
                why = f": RENEW answered {renewed}"
            elif isinstance(acknowledged, Exception):
                why = f": WAIT answered {acknowledged}"
            else:
                reached = int(acknowledged)
                if int(renewed) != token:
                    why = (
                        f": the grant (token {token}) was gone, the server holds another grant of this owner"
                        f" (token {int(renewed)})"
                    )
                elif reached >= asked:
                    return None
        return LockNotDurableError(
            f"NOTDURABLE lock {self.name!r}: {reached} of {asked} replicas acknowledged the grant"
            f" within {self.durable_timeout} s{why}; the hold was given back",
            lock_name=self.name,
            reached=reached,
            asked=asked,
        )

    def _give_back_failed(self, owner: bytes, token: int, error: Exception) -> None:
        """A durable check's give-back (its RELEASE) that failed. NOTOWNER:
        the grant had ended already (the RENEW said so too). Anything else
        leaves the hold on the server: the next grant with its token gives
        it back (RELEASED)."""
        if str(error).startswith(LOST_PREFIXES):
            return
        logger.warning("FLOCK: could not give back the grant of %r that was not durable: %s", self.name, error)
        RELEASED.remember(self.name, owner, token)

    def _lost_by_deadline(self, grant: Grant) -> bool:
        """Whether ``grant`` is lost by what this process found (its
        deadline passed, its session ended): the server may hold it a moment
        longer, and a RELEASE still succeed. (A loss the server pushed or a
        NOTOWNER the server's RELEASE answers itself.)"""
        if not grant.lost:
            self._check_due(grant)
        return grant.lost and grant.lost_reason in (EXPIRED, UNCONFIRMED, SESSIONENDED)

    def _lost_error(self, grant: Grant) -> LockError:
        """What a release() of a grant known lost raises (once its RELEASE
        was sent all the same): LockNotOwnedError, with the reason."""
        return lock_error(
            ResponseError("NOTOWNER the grant was lost before its release"), "release", self.name, grant.lost_reason
        )

    def _release_error(self, error: ResponseError) -> Exception:
        grant = self.local.grant
        return lock_error(error, "release", self.name, grant.lost_reason if grant else None)

    def _renew_command(self, owner: bytes, lease_ms: int):
        return with_id("FLOCK.RENEW", self.name, owner, lease_ms)

    def _release_command(self):
        return with_id(
            "FLOCK.RELEASE", self.name, self._held("Cannot release a lock that's not owned or is already unlocked.")
        )

    def _held(self, message: str) -> bytes:
        """This thread's owner, or redis-py's LockError when it holds nothing."""
        token = self.local.token
        if token is None:
            raise LockError(message, lock_name=self.name)
        return token

    def _timed(self, action: str) -> int:
        if not self.timeout:
            raise LockError(f"Cannot {action} a lock with no timeout", lock_name=self.name)
        return to_ms(self.timeout)

    def _extended_lease(self, info, owner: bytes, additional_ms: int) -> int:
        """The lease that adds ``additional_ms`` to what is left of this
        owner's lease, or NOTOWNER when the lock is no longer its."""
        mine = holder(info, owner)
        if mine is None:
            raise lock_error(ResponseError("NOTOWNER not the holder"), "extend", self.name)
        return mine["ttl-ms"] + additional_ms

    def _is_owner(self, info) -> bool:
        return holder(info, self.local.token) is not None

    def _new_grant(self, owner: bytes, token: int, mutex, basis: Optional[float] = None,
                   lease_ms: Optional[int] = None, session=None, sid: Optional[str] = None):
        """(the Grant whose timers start, the one it replaces): (None, None)
        when this is a reentry of the grant this thread already has, kept as
        it was kept. A replaced grant was lost: this thread could not have
        acquired again. ``basis``: the send time of the command that brought
        the grant (its lease counts from then; a reentry resets the lease);
        ``lease_ms``: the lease left a grant's event named (None: the lease
        asked); ``session``, ``sid``: the session (SessionState) and its ID
        that granted it, whose grant it is when the lock holds session
        grants."""
        basis = time.monotonic() if basis is None else basis
        kind = self._kind()
        current = self.local.grant
        if current is not None and current.owner == owner and current.token == token:
            self._count(current, 1)
            changed = current.kind != kind
            self._keep(current, kind, basis, lease_ms, session, sid)
            # A reentry with a lease gives a session grant a lease of its
            # own (and one with 0 makes a leased grant its session's).
            return (current if changed else None), None
        grant = Grant(owner, token, mutex, kind)
        grant.owner_reused = self._owner_reused(owner)
        self._count(grant, 1)
        if current is not None:
            # Forgotten: its holds are no longer this process's to release.
            self._count(current, -current.holds)
        self._keep(grant, kind, basis, lease_ms, session, sid)
        self.local.token = owner
        self.local.grant = grant
        return grant, current

    def _owner_reused(self, owner: bytes) -> bool:
        """Whether ``owner`` may acquire again: a new owner per acquire (not
        reentrant, no token=) never comes back."""
        return self.reentrant or owner != self._last_random_owner()

    def _count(self, grant: Grant, n: int) -> None:
        """``n`` more (fewer, when negative) unreleased holds of ``grant``:
        its own count, and the process's (HELD) for an owner used again."""
        grant.holds += n
        if grant.owner_reused:
            HELD.add(self.name, grant.owner, grant.token, n)

    def _keep(self, grant: Grant, kind: str, basis: float, lease_ms: Optional[int], session, sid) -> None:
        """What keeps ``grant`` from now on, and its deadline."""
        grant.kind = kind
        if kind == SESSION_GRANT:
            grant.session, grant.watched_sid = session, sid
        elif kind == WATCHDOG_GRANT:
            # Renewed with the watchdog's lease; a lease left that an event
            # named moves its start back instead.
            grant.lease_ms = self._lease_ms()
            grant.lease_from = basis - (0 if lease_ms is None else (grant.lease_ms - lease_ms) / 1000)
        else:
            grant.lease_ms = self._lease_ms() if lease_ms is None else lease_ms
            grant.lease_from = basis

    def _last_random_owner(self) -> Optional[bytes]:
        """The owner _owner made up for this thread's last acquire (no
        token= given, not reentrant), if any."""
        return getattr(self.local, "random_owner", None)

    def _lease_renewed(self, lease_ms: int, sent: float) -> None:
        """A RENEW sent at ``sent`` (extend, reacquire) made the lease ``lease_ms``."""
        grant = self.local.grant
        if grant is not None and grant.kind == FIXED_GRANT:
            grant.lease_ms, grant.lease_from = lease_ms, sent

    def _rewatch_commands(self, grant: "Grant", sid: str):
        """The re-watch of ``grant`` on session ``sid``: (RENEW, reentrant
        ACQUIRE ... INBOX sid, RELEASE of that extra hold), each with a
        request ID of its own; None when its fixed lease has run out. The
        lease asked: the watchdog's, or what is left of the fixed one. (A
        session grant is never re-watched: it ended with its session.)"""
        if grant.kind == WATCHDOG_GRANT:
            lease = to_ms(self.watchdog_timeout)
        else:
            lease = grant.left_ms()
            if lease < 1:
                return None
        return (
            with_id("FLOCK.RENEW", self.name, grant.owner, lease),
            with_id("FLOCK.ACQUIRE", self.name, grant.owner, lease, *self.acquire_options, "INBOX", sid),
            with_id("FLOCK.RELEASE", self.name, grant.owner),
        )

    def _acquire_failed(self, owner: bytes) -> None:
        """An acquire whose every reply was lost (not an error reply, not a
        cancel): it may have been granted all the same, a hold no lock object
        knows of, so an owner used again gives back, with its next grant,
        the holds beyond the process's (ANY_TOKEN)."""
        if self._owner_reused(owner):
            RELEASED.remember(self.name, owner, ANY_TOKEN)

    def _released_one(self, left: Optional[int]) -> None:
        """After a RELEASE answered ``left`` holds, or failed (None) other
        than NOTOWNER (refused, every reply lost): the caller's hold counts
        as released, and the grant is forgotten once this object's holds are
        all released (or none is left). For an owner used again, the token
        is remembered (RELEASED) when the release failed, left no hold, or
        let go of this object's last hold (others' were left): the hold may
        be on the server still (refused, lost, or answered by a master a
        failover deposes), and the next grant with that token gives it back."""
        grant = self.local.grant
        self._count(grant, -1)
        done = left == 0 or grant.holds <= 0
        if grant.owner_reused and (done or left is None):
            RELEASED.remember(self.name, grant.owner, grant.token)
        if done:
            self._dropped()

    def _stale_holds(self, owner: bytes, token: int, info) -> int:
        """How many of ``owner``'s holds (FLOCK.INFO ``info``) are stale,
        after a grant of ``token`` that reentered a grant remembered in
        RELEASED: all but the process's (HELD: every lock object's
        unreleased holds of the grant, and the acquires of the owner in
        flight, the new one's included, whose grants may be among them)."""
        mine = holder(info, owner)
        if mine is None or int(mine["token"]) != token:
            return 0
        return max(0, int(mine["holds"]) - HELD.count(self.name, owner, token))

    def _acquiring(self, owner: bytes) -> bool:
        """Before an acquire of ``owner`` is sent: counted in HELD (an owner
        used again) until _acquire_ended, so that a release of the owner's
        last hold meanwhile does not take its grant for a stale hold (rule
        "stale holds"). Whether it was counted."""
        if not self._owner_reused(owner):
            return False
        HELD.acquire(self.name, owner, 1)
        return True

    def _acquire_ended(self, owner: bytes) -> None:
        """The acquire counted by _acquiring ended: granted (its hold is
        counted by _new_grant), or not (busy, timeout, an error, a cancel)."""
        HELD.acquire(self.name, owner, -1)

    def _last_hold(self, grant: Grant) -> bool:
        """Whether the caller's hold of ``grant`` (not yet uncounted) is the
        process's last of (lock, owner): then the holds a release of it
        answers left are stale (rule "stale holds"). A new owner per acquire
        has no other holds than this object's."""
        if grant.owner_reused:
            return HELD.held(self.name, grant.owner) <= 1
        return grant.holds <= 1

    def _is_stale(self, owner: bytes, token: int) -> bool:
        """Whether the grant of ``token`` to ``owner`` may have reentered
        holds that nobody in this process knows of: a release of it failed
        or may have been lost, or an acquire's every reply was lost."""
        return self._owner_reused(owner) and RELEASED.take(self.name, owner, token)

    def _dropped(self) -> Optional[Grant]:
        """Forgets this thread's grant (released or lost); returns it so that
        its watchdog can be stopped."""
        grant = self.local.grant
        self.local.token = self.local.grant = None
        if grant is not None:
            self._count(grant, -grant.holds)
            grant.stop()
        return grant

    def _unlocked_error(self) -> LockError:
        return LockError("Unable to acquire lock within the time specified", lock_name=self.name)


class ReadSide:
    """Makes a lock class the read side of a read-write lock: FLOCK's
    ``SHARED``. Readers hold it together; a writer waits for them all, and
    readers arriving behind a waiting writer wait for it (FIFO)."""

    acquire_options = ("SHARED",)


class SemaphoreBase:
    """Makes a lock class a semaphore of ``limit`` permits, of which each
    acquire takes ``permits``: FLOCK's ``PERMITS n LIMIT m``. The lock's
    other arguments follow ``limit``."""

    def __init__(self, redis, name, limit: int, *args, permits: int = 1, **kwargs):
        super().__init__(redis, name, *args, **kwargs)
        self.limit = limit
        self.permits = permits
        self.acquire_options = ("PERMITS", permits, "LIMIT", limit)


class ReadWriteLockBase:
    """A read-write lock: ``read_lock()`` and ``write_lock()`` are two lock
    objects on the same key (the flavour's ``read_class`` and
    ``lock_class``), made with the same arguments. Reentrant by default, as
    Redisson's: both sides use one owner per thread, so a writer may also
    read (one more hold on its exclusive grant); a reader asking to write
    gets UpgradeError."""

    lock_class: type
    read_class: type

    def __init__(self, redis, name, *args, reentrant: bool = True, **kwargs):
        self.name = name
        self._write = self.lock_class(redis, name, *args, reentrant=reentrant, **kwargs)
        self._read = self.read_class(redis, name, *args, reentrant=reentrant, **kwargs)
        # One owner per thread for both sides: a stale hold's give-back
        # leaves those the other side holds (HELD counts both).
        self._read._object_id = self._write._object_id

    def read_lock(self):
        """The shared side (``SHARED``)."""
        return self._read

    def write_lock(self):
        """The exclusive side."""
        return self._write


class MultiPart:
    """Makes a lock class one key of a MultiLock: acquired and released only
    with the others, its grant kept, renewed (watchdog), extended and checked
    as the class does it. Its losses are the MultiLock's: of the grants one
    ACQUIREALL made, the first lost calls ``on_lost(multi_lock, reason)``."""

    multi: "MultiLockBase"

    def _grant_lost(self, grant: Grant, reason: str, detail: Optional[str] = None) -> None:
        if not grant.mark_lost(self.name, reason, detail):
            return
        # Keys are lost on different threads (renewals) at once: one reports.
        with _GROUP_LOSSES:
            if any(g.reported for g in grant.group):
                return
            grant.reported = True
        call_on_lost(self.multi, reason)


_GROUP_LOSSES = threading.Lock()


class MultiLockBase:
    """Several locks taken for one owner at once, all or none
    (``FLOCK.ACQUIREALL``), and released together (``FLOCK.RELEASEALL``):
    what both flavours share. It takes Lock's arguments, ``names`` for
    ``name``, but ``use_session`` and the durable ones: ACQUIREALL has no
    INBOX, so a wait blocks a connection of its own and a loss is found by
    the watchdog's renewal (or the release), not pushed.

    Each key is a lock object of the flavour's ``part_class`` (its Lock made
    a MultiPart), and all of them share the owner: Lock's grants, watchdog,
    stale holds, ``extend`` and ``reacquire`` serve every key, and what a
    MultiLock adds is the one command that acquires or releases them all.

    The owner, as Lock's: a new one per ``acquire()`` by default;
    ``reentrant=True``, one per MultiLock object and thread (the same thread
    acquiring again reenters every key); ``acquire(token=...)``, the one
    given, so that a caller's single locks and MultiLocks are one owner: a
    key it holds already is reentered, and a wait that would close a cycle
    through them raises DeadlockError."""

    part_class: type

    def __init__(
        self,
        redis,
        names,
        timeout: Optional[Number] = None,
        sleep: Number = 0.1,
        blocking: bool = True,
        blocking_timeout: Optional[Number] = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
        *,
        reentrant: bool = False,
        watchdog_timeout: Number = WATCHDOG_TIMEOUT,
        on_lost: Optional[Callable[[Any, str], Any]] = None,
    ):
        if isinstance(names, (str, bytes)):
            raise TypeError("MultiLock takes a list of lock names, not one name")
        names = list(names)
        if not names or len({_name_key(name) for name in names}) != len(names):
            raise ValueError("MultiLock takes at least one lock name, each once")
        self.redis = redis
        self.names = names
        self.raise_on_release_error = raise_on_release_error
        self.on_lost = on_lost
        self._locks = [
            self.part_class(redis, name, timeout, sleep, blocking, blocking_timeout, thread_local,
                            raise_on_release_error, reentrant=reentrant, watchdog_timeout=watchdog_timeout,
                            use_session=False)
            for name in names
        ]
        for lock in self._locks:
            # One owner for every key (the reentrant one is made of it).
            lock._object_id = self._locks[0]._object_id
            lock.multi = self

    @property
    def name(self) -> list:
        """The lock names (``names``): what errors name as ``lock_name``."""
        return self.names

    @property
    def fencing_tokens(self) -> Optional[list]:
        """Each key's fencing token (in the order of ``names``) of this
        thread's grant, or None when it holds them not."""
        tokens = [lock.fencing_token for lock in self._locks]
        return None if None in tokens else tokens

    @property
    def lost(self) -> bool:
        """True once the grant of one of the keys is known lost (a watchdog
        renewal answered NOTOWNER, none was confirmed before the deadline, or
        a fixed lease ran out)."""
        return any([lock.lost for lock in self._locks])

    @property
    def lost_reason(self) -> Optional[str]:
        """Why the first key lost was lost (Lock.lost_reason), or None."""
        return next((lock.lost_reason for lock in self._locks if lock.lost), None)

    @property
    def lost_detail(self) -> Optional[str]:
        """The server's text when ``lost_reason`` is ``notowner``."""
        return next((lock.lost_detail for lock in self._locks if lock.lost), None)

    def _owner(self, token, encoder) -> bytes:
        first = self._locks[0]
        owner = first._owner(token, encoder)
        for lock in self._locks[1:]:
            # Each key knows a new owner per acquire as its own: its last
            # release is not remembered (Grant.owner_reused).
            lock.local.random_owner = first._last_random_owner()
        return owner

    def _wait_ms(self, blocking, blocking_timeout) -> Optional[int]:
        return self._locks[0]._wait_ms(blocking, blocking_timeout)

    def _acquire_all_command(self, keys: list, owner: bytes) -> list:
        """FLOCK.ACQUIREALL without WAIT and ID."""
        return ["FLOCK.ACQUIREALL", len(keys), *keys, owner, self._locks[0]._lease_ms()]

    def _release_all_command(self, owner: bytes):
        return with_id("FLOCK.RELEASEALL", len(self.names), *self.names, owner)

    def _held(self, message: str) -> bytes:
        """This thread's owner, or LockError when it holds nothing."""
        owner = next((lock.local.token for lock in self._locks if lock.local.token is not None), None)
        if owner is None:
            raise LockError(message, lock_name=self.names)
        return owner

    def _grants(self) -> list:
        """This thread's grant of each key held."""
        return [lock.local.grant for lock in self._locks if lock.local.grant is not None]

    def _mutexes(self) -> list:
        """The mutexes of this thread's grants, each once, in key order: a
        release holds them all, so that no watchdog renewal follows it."""
        return list({id(grant.mutex): grant.mutex for grant in self._grants()}.values())

    def _grouped(self) -> None:
        """After a grant: this thread's grants of every key are one group."""
        group = tuple(self._grants())
        for grant in group:
            grant.group = group

    def _released(self, left: Optional[list]) -> None:
        """After RELEASEALL answered each key's holds ``left``, or failed
        (None) other than NOTOWNER: Lock._released_one for every key."""
        for i, lock in enumerate(self._locks):
            if lock.local.grant is not None:
                lock._released_one(int(left[i]) if left is not None and left[i] is not None else None)

    def _acquire_failed(self, owner: bytes) -> None:
        for lock in self._locks:
            lock._acquire_failed(owner)

    def _acquiring(self, owner: bytes) -> list:
        """Lock._acquiring for every key: those counted."""
        return [lock for lock in self._locks if lock._acquiring(owner)]

    def _acquire_ended(self, counted: list, owner: bytes) -> None:
        for lock in counted:
            lock._acquire_ended(owner)

    def _unlocked_error(self) -> LockError:
        return LockError("Unable to acquire lock within the time specified", lock_name=self.names)

    def _lost_error(self, grant: Grant) -> LockError:
        """As Lock's: a release of keys one of which was lost by its deadline."""
        return lock_error(
            ResponseError("NOTOWNER a grant was lost before its release"), "release", self.names, grant.lost_reason
        )


def _as_bytes(value) -> bytes:
    return value.encode() if isinstance(value, str) else value


# --- Sessions: the bookkeeping both flavours share (no I/O) -----------------

GRANTED, TIMEOUT, CANCELLED, ERROR, LOST = "granted", "timeout", "cancelled", "error", "lost"
MOVED = "moved"
# What the reader does after an event (SessionState.dispatch's answer).
RELEASE, REWATCH = "release", "rewatch"


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def parse_event(event):
    """An INBOX event ``[kind, key, owner, token, detail]`` as (kind str, key
    bytes, owner bytes, token int, detail str)."""
    kind, key, owner, token, detail = event
    return _text(kind), _as_bytes(key), _as_bytes(owner), int(token), _text(detail)


def is_nosession(error: Exception) -> bool:
    return isinstance(error, ResponseError) and str(error).startswith("NOSESSION")


def is_queued(error: Exception) -> bool:
    """QUEUED: this owner's wait with that request ID is still queued."""
    return isinstance(error, ResponseError) and str(error).startswith("QUEUED")


def is_key_gone(error: Exception) -> bool:
    """A wait's LOCKDELETED: the key was deleted, or (in a Cluster) migrated."""
    return isinstance(error, ResponseError) and str(error).startswith("LOCKDELETED")


def is_demotion(error: Exception) -> bool:
    """FLOCK.INBOX's UNBLOCKED when the server stopped being a master (not a
    CLIENT UNBLOCK)."""
    return isinstance(error, ResponseError) and str(error).startswith("UNBLOCKED") and "master" in str(error)


def is_waiting(reply) -> bool:
    """The status reply an ``ACQUIRE ... WAIT ... INBOX`` gives when it queued."""
    return reply is not None and not isinstance(reply, int) and _text(reply) == "WAITING"


class Wait:
    """One queued ``ACQUIRE ... WAIT ... INBOX`` of this process: matched to
    its event by (key, owner). ``outcome`` is set once: (kind, token,
    detail-or-exception). The flavour's subclass wakes the waiter."""

    def __init__(self, client, key: bytes, owner: bytes, command: list, wait_ms: int, rid: str):
        self.client = client
        self.key = key
        self.owner = owner
        self.ident = (key, owner)
        self.command = command
        self.rid = rid
        self.wait_ms = wait_ms
        # The server's deadline; the client's own is LOCAL_DEADLINE_MARGIN later.
        self.deadline = None if wait_ms == 0 else time.monotonic() + wait_ms / 1000
        self.outcome = None
        # Its caller sent FLOCK.CANCEL and awaits the event (not sent again
        # on a new session); then, abandoned: the caller gave up on it, and a
        # grant it gets is released by the reader.
        self.cancelling = False
        self.abandoned = False
        # The session ID it was last sent to (queued there), and when: waits
        # sent again on a new session go in the order they had queued.
        self.sent_to: Optional[str] = None
        self.queued = 0
        # The send time of the command whose reply or event brought its
        # outcome (the ACQUIRE, or the FLOCK.INBOX read): a grant's lease
        # counts from then.
        self.basis: Optional[float] = None

    def args(self, sid: str) -> tuple:
        """The command for session ``sid``: what is left of the wait, the
        same request ID every time."""
        if self.deadline is None:
            wait = 0
        else:
            wait = max(1, int((self.deadline - time.monotonic()) * 1000))
        return (*self.command, "WAIT", wait, "INBOX", sid, "ID", self.rid)

    def live(self) -> bool:
        """Neither cancelled nor given up: sent again on a new session."""
        return not (self.abandoned or self.cancelling)

    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def local_deadline(self) -> Optional[float]:
        return None if self.deadline is None else self.deadline + LOCAL_DEADLINE_MARGIN

    def wake(self) -> None:
        raise NotImplementedError


class SessionState:
    """What one session knows: the waits sent through it (by key and owner)
    and the grants it watches (by key, owner and token), and what its events
    do to them. Thread-safe; never blocks on I/O."""

    def __init__(self):
        self.mutex = threading.Lock()
        self.waits: dict = {}
        self.watched: dict = {}
        self.recent_losses: OrderedDict = OrderedDict()
        # The newest grants (key, owner, token) handed to their waits. A grant
        # can come twice: the reply to a wait sent again with its request ID
        # (the server's record of it) and its event, read before that resend
        # reached the server. The second is dropped: it is not the owner's
        # next wait's, nor a grant nobody waits for (its holder has it, or
        # has released it and may hold another grant by now).
        self.told: OrderedDict = OrderedDict()
        self.sends = 0
        # The session open now, and whether a grant may be watched by
        # another one (its grants are re-watched there).
        self.current_sid: Optional[str] = None
        self.stale = False
        # The session's timeout T (seconds, as FLOCK.SESSION WITHTIMEOUT
        # answered it) and its deadline on time.monotonic(): the send time of
        # the last FLOCK.INBOX (or FLOCK.SESSION) whose reply came, plus T,
        # less the drift margin. Its session grants are lost then.
        self.timeout: Optional[float] = None
        self.deadline = float("-inf")

    # The session's life.

    def opened(self, sid: str, timeout: float, sent: float) -> None:
        """FLOCK.SESSION, sent at ``sent``, opened ``sid`` with timeout T."""
        with self.mutex:
            self.current_sid, self.timeout = sid, timeout
            self.deadline = sent + timeout - drift_margin(timeout)

    def confirmed(self, sid: str, sent: float) -> bool:
        """A FLOCK.INBOX of ``sid`` sent at ``sent`` was answered: the
        session lived then. False when its deadline has passed all the same
        (the reply came late: a paused process); then its grants are lost."""
        with self.mutex:
            if sid == self.current_sid:
                self.deadline = max(self.deadline, sent + self.timeout - drift_margin(self.timeout))
        return self.check(sid)

    def check(self, sid: str) -> bool:
        """Whether session ``sid`` is alive by its deadline; when it is not,
        its session grants are lost (``unconfirmed``)."""
        deadline, reason = self.deadline_of(sid)
        if time.monotonic() < deadline:
            return True
        self.lose_session_grants(sid, reason)
        return False

    def deadline_of(self, sid: Optional[str]) -> tuple:
        """(the deadline of session ``sid``, the reason its grants are lost
        then): ``unconfirmed`` for the session open now, ``sessionended``
        (now) for one that ended. (Read without the mutex: a session that
        ends meanwhile loses its grants itself.)"""
        if sid is not None and sid == self.current_sid:
            return self.deadline, UNCONFIRMED
        return float("-inf"), SESSIONENDED

    def session_ended(self, sid: Optional[str] = None) -> None:
        """Session ``sid``'s connection closed (or it answered NOSESSION): the
        server ended the session, its waiters left their queues (cancelled
        waits get no event any more), and its session grants are lost:
        ``unconfirmed`` if its deadline had passed, else ``sessionended``."""
        reason = SESSIONENDED
        with self.mutex:
            if sid is not None and sid == self.current_sid:
                if time.monotonic() >= self.deadline:
                    reason = UNCONFIRMED
                self.current_sid = None
            gone = [w for w in self.waits.values() if not w.live()]
        for wait in gone:
            self.settle(wait, (CANCELLED, 0, ""))
        if sid is not None:
            self.lose_session_grants(sid, reason)

    def lose_session_grants(self, sid: str, reason: str) -> None:
        """Every session grant of session ``sid`` is lost, for ``reason``."""
        with self.mutex:
            lost = []
            for ident, entries in list(self.watched.items()):
                mine = [(lock, g) for lock, g in entries if g.kind == SESSION_GRANT and g.watched_sid == sid]
                if mine:
                    lost += mine
                    entries[:] = [entry for entry in entries if entry not in mine]
                    if not entries:
                        del self.watched[ident]
        for lock, grant in lost:
            lock._grant_lost(grant, reason)

    # Waits.

    def register(self, wait: Wait) -> None:
        """Before the wait is sent: its event may come before the reply."""
        with self.mutex:
            current = self.waits.get(wait.ident)
            if current is not None and not current.abandoned and not current.cancelling:
                raise ResponseError("QUEUED this owner already waits for this lock (in this process)")
            self.waits[wait.ident] = wait

    def settle(self, wait: Wait, outcome, basis: Optional[float] = None) -> bool:
        """Sets the wait's outcome once (a reply or an event, brought by a
        command sent at ``basis``) and wakes it."""
        with self.mutex:
            if wait.outcome is not None:
                return False
            self._tell(wait, outcome, time.monotonic() if basis is None else basis)
        wait.wake()
        return True

    def _tell(self, wait: Wait, outcome, basis: float) -> None:
        """Sets the wait's outcome (under the mutex) and remembers a grant."""
        wait.outcome, wait.basis = outcome, basis
        if self.waits.get(wait.ident) is wait:
            del self.waits[wait.ident]
        if outcome[0] == GRANTED:
            self.told[(wait.key, wait.owner, outcome[1])] = None
            if len(self.told) > TOLD:
                self.told.popitem(last=False)

    def cancelling(self, wait: Wait):
        """The caller is about to send FLOCK.CANCEL for ``wait``: its outcome
        if it already has one, else None."""
        with self.mutex:
            if wait.outcome is None:
                wait.cancelling = True
            return wait.outcome

    def abandon(self, wait: Wait):
        """The caller gives up on ``wait``: its outcome if it has one (the
        caller then releases a grant), else None and a later grant is the
        reader's to release."""
        with self.mutex:
            if wait.outcome is not None:
                return wait.outcome
            wait.abandoned = True
            return None

    def pending(self) -> list:
        """The waits to send again on a new session, in the order they queued."""
        with self.mutex:
            return sorted((w for w in self.waits.values() if w.live()), key=lambda w: w.queued)

    def queued(self, wait: Wait, sid: str, outcome=None, basis: Optional[float] = None) -> None:
        """``wait`` was sent to session ``sid``; ``outcome``: the reply ended
        it at once (a grant), settled as settle() does."""
        with self.mutex:
            self.sends += 1
            wait.sent_to, wait.queued = sid, self.sends
            if outcome is None or wait.outcome is not None:
                return
            self._tell(wait, outcome, basis)
        wait.wake()

    def has_pending(self) -> bool:
        with self.mutex:
            return any(w.live() for w in self.waits.values())

    def fail_all(self, error: Exception) -> None:
        """The session was closed by its client: every wait ends with ``error``."""
        with self.mutex:
            waits = list(self.waits.values())
        for wait in waits:
            self.settle(wait, (ERROR, 0, error))

    # Watched grants.

    def watch(self, key: bytes, owner: bytes, token: int, lock, grant: Grant, sid: Optional[str] = None) -> None:
        """Registers a grant made with INBOX (on session ``sid``): its `lost`
        event marks it. A loss that came first is applied at once; a session
        grant whose session ended, or whose deadline passed, meanwhile is
        lost at once."""
        ident = (key, owner, token)
        with self.mutex:
            self.watched.setdefault(ident, []).append((lock, grant))
            grant.watched_sid = sid
            if sid != self.current_sid and grant.kind != SESSION_GRANT:
                self.stale = True
            reason = self.recent_losses.pop(ident, None) if self.recent_losses else None
        grant.watch = (self, ident)
        if reason is not None:
            lock._grant_lost(grant, reason)
        elif grant.kind == SESSION_GRANT and not (sid == self.current_sid and time.monotonic() < self.deadline):
            self.check(sid)

    def unwatch(self, ident, grant: Grant) -> None:
        with self.mutex:
            entries = self.watched.get(ident)
            if entries is None:
                return
            entries[:] = [(lock, g) for lock, g in entries if g is not grant]
            if not entries:
                del self.watched[ident]

    def to_rewatch(self, sid: str) -> list:
        """The (lock, grant) held and watched by another session than ``sid``
        (or with an extra hold to release): to check and re-watch there."""
        with self.mutex:
            self.stale = False
            return [
                (lock, grant)
                for entries in self.watched.values()
                for lock, grant in entries
                if not (grant.stopped or grant.lost or grant.kind == SESSION_GRANT)
                and (grant.watched_sid != sid or grant.extra_release is not None)
            ]

    def has_watched(self) -> bool:
        """Whether a grant held is watched: a broken session is reopened for it."""
        with self.mutex:
            return any(not (g.stopped or g.lost) for entries in self.watched.values() for _, g in entries)

    def holds(self, key: bytes, owner: bytes, token: int) -> bool:
        with self.mutex:
            return (key, owner, token) in self.watched

    def demoted(self, error: ResponseError) -> None:
        """FLOCK.INBOX itself answered UNBLOCKED because the server stopped
        being a master (Redis 7.0 and 8.2 answer a blocked client so, then
        close its connection, and the session's events with it): what those
        events would have said. Every watched grant is lost (``demoted``) and
        every live wait ends with that error."""
        with self.mutex:
            entries = [entry for entries in self.watched.values() for entry in entries]
            self.watched.clear()
            waits = [w for w in self.waits.values() if w.live()]
        for lock, grant in entries:
            lock._grant_lost(grant, "demoted")
        for wait in waits:
            self.settle(wait, (ERROR, 0, error))

    # Events.

    def dispatch(self, event, sent: Optional[float] = None) -> Optional[tuple]:
        """Applies one INBOX event, brought by a read sent at ``sent``, in
        order. Returns what the reader does
        next: (RELEASE, key, owner) when a grant nobody waits for any more
        must be released; (REWATCH, key, [(lock, grant), ...]) when grants
        this session watched went with their key to another server (a
        ``moved`` event: held there, watched from here no more); else None."""
        kind, key, owner, token, detail = parse_event(event)
        if kind == MOVED:
            with self.mutex:
                entries = list(self.watched.pop((key, owner, token), ()))
            return (REWATCH, key, entries) if entries else None
        if kind == LOST:
            with self.mutex:
                entries = list(self.watched.pop((key, owner, token), ()))
                if not entries:
                    self.recent_losses[(key, owner, token)] = detail
                    while len(self.recent_losses) > RECENT_LOSSES:
                        self.recent_losses.popitem(last=False)
            for lock, grant in entries:
                lock._grant_lost(grant, detail)
            return None
        with self.mutex:
            if kind == GRANTED and (key, owner, token) in self.told:
                return None
            wait = self.waits.get((key, owner))
            abandoned = wait is None or wait.abandoned
        if wait is not None:
            self.settle(wait, (kind, token, detail), sent)
        if kind == GRANTED and abandoned and not self.holds(key, owner, token):
            return RELEASE, key, owner
        return None
