"""What the blocking and the asyncio lock share: the lock's state and the FLOCK
commands, replies and errors. No I/O here: each flavour sends the commands."""

import logging
import threading
import uuid
from types import SimpleNamespace
from typing import Optional, Union

from redis.exceptions import ConnectionError, LockError, LockNotOwnedError, ResponseError, TimeoutError

logger = logging.getLogger("redis_flock")

# The lease of a lock created without a timeout, renewed by the watchdog every
# third of it (Redisson's lockWatchdogTimeout is 30 s too).
WATCHDOG_TIMEOUT = 30.0

# A command whose reply was lost is sent again with the same request ID, after
# each of these pauses; the server applies it once (docs/commands.md, "Request
# IDs"). An error reply is never resent: the server answered it.
RESEND_DELAYS = (0.05, 0.2, 0.5)
LOST_REPLY = (ConnectionError, TimeoutError)

# A blocking wait's socket outlives the server-side WAIT by this much, so that
# the server's own timeout (a nil reply) ends it and a dead server still does.
WAIT_SOCKET_MARGIN = 10.0

# Replies that mean the lock is no longer this holder's: the lease ended or
# someone force-released it (NOTOWNER), or the key was overwritten (WRONGTYPE).
LOST_PREFIXES = ("NOTOWNER", "WRONGTYPE")

Number = Union[int, float]


def to_ms(seconds: Number) -> int:
    """Seconds (int or float, as redis-py takes them) to FLOCK's milliseconds;
    at least 1, the smallest lease or wait FLOCK accepts."""
    return max(1, int(seconds * 1000))


def with_id(*args):
    """The command with a request ID of its own: a resend of these very
    arguments is applied once."""
    return (*args, "ID", str(uuid.uuid4()))


# What a watchdog's renewal can fail with without ending the watchdog's loop.
RENEWAL_ERRORS = (ResponseError, *LOST_REPLY)


def renewal_lost(grant: "Grant", name, error: Exception, unconfirmed_s: float, lease_ms: int) -> bool:
    """Whether a failed renewal means the grant is lost (then marked so): the
    server said it is not ours, or no renewal got through for a whole lease
    (the server has ended it by now). Other errors are tried again."""
    if isinstance(error, ResponseError):
        lost = str(error).startswith(LOST_PREFIXES)
    else:
        lost = unconfirmed_s >= lease_ms / 1000
    if lost:
        grant.mark_lost(name, error)
    return lost


class UpgradeError(LockError, ResponseError):
    """The server's ``UPGRADE``: this owner holds the lock shared (reads) and
    asked for it exclusively, which would wait for itself. Release the read
    holds first. Also a ResponseError, as the reply it stands for."""


class WrongModeError(LockError, ResponseError):
    """The server's ``WRONGMODE``: the key is a lock and was asked for permits,
    or a semaphore asked without permits or with another limit."""


# Error replies that become redis-py's lock errors; the rest stay what redis-py
# made of them (ResponseError and its subclasses).
LOCK_ERRORS = {"NOTOWNER": LockNotOwnedError, "UPGRADE": UpgradeError, "WRONGMODE": WrongModeError}


def lock_error(error: ResponseError, action: str, name) -> Exception:
    """NOTOWNER becomes redis-py's LockNotOwnedError, as its Lock raises,
    UPGRADE and WRONGMODE the errors above; others stay as they are."""
    kind = LOCK_ERRORS.get(str(error).split(" ", 1)[0])
    if kind is None:
        return error
    what = "a lock that's no longer owned" if kind is LockNotOwnedError else f"lock {name!r}"
    return kind(f"Cannot {action} {what} ({error})", lock_name=name)


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


class Grant:
    """One grant of the lock to this Lock object: the owner sent to the server,
    the fencing token, and the watchdog's state. ``mutex`` orders the
    watchdog's RENEW before the RELEASE, so a renewal never follows the
    release and reports a loss that did not happen."""

    def __init__(self, owner: bytes, token: int, mutex):
        self.owner = owner
        self.token = token
        self.mutex = mutex
        # The holds taken through this Lock object: the server's count also has
        # those of the other side of a read-write lock sharing the owner.
        self.holds = 1
        self.lost = False
        self.stopped = False
        # The RELEASE (with its request ID) an asyncio release() sent and did
        # not see answered: sent again by the next release().
        self.pending_release = None
        # Wakes the watchdog (set by the flavour that starts it).
        self.on_stop = None

    def stop(self) -> None:
        self.stopped = True
        if self.on_stop is not None:
            self.on_stop()

    def mark_lost(self, name, why) -> None:
        self.lost = True
        logger.warning("FLOCK lock %r lost: %s", name, why)


class _Local(threading.local):
    # Class attributes: defaults in every thread, not only the creating one.
    token = None
    grant = None


class LockBase:
    """The constructor, arguments and state shared by both flavours.

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
        self.local = _Local() if self.thread_local else SimpleNamespace(token=None, grant=None)
        self._object_id = uuid.uuid4().hex

    @property
    def fencing_token(self) -> Optional[int]:
        """The fencing token of this thread's grant (None when not held)."""
        grant = self.local.grant
        return grant.token if grant else None

    @property
    def lost(self) -> bool:
        """True once the watchdog found this grant's lease gone."""
        grant = self.local.grant
        return bool(grant and grant.lost)

    @property
    def watchdog(self) -> bool:
        """Whether grants are renewed by a watchdog (no ``timeout`` given)."""
        return not self.timeout

    def _lease_ms(self) -> int:
        return to_ms(self.watchdog_timeout if self.watchdog else self.timeout)

    def _owner(self, token, encoder) -> bytes:
        if token is not None:
            return encoder.encode(token)
        if self.reentrant:
            if self.thread_local:
                return f"{self._object_id}:{threading.get_ident()}".encode()
            return self._object_id.encode()
        # As redis-py: a new token per acquire, so acquiring again does not reenter.
        return uuid.uuid4().hex.encode()

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

    @staticmethod
    def _wait_socket_timeout(wait_ms: int) -> Optional[float]:
        return None if wait_ms == 0 else wait_ms / 1000 + WAIT_SOCKET_MARGIN

    def _acquire_command(self, owner: bytes, wait_ms: Optional[int]):
        args = ["FLOCK.ACQUIRE", self.name, owner, self._lease_ms(), *self.acquire_options]
        if wait_ms is not None:
            args += ["WAIT", wait_ms]
        return with_id(*args)

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
        if self.watchdog:
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

    def _new_grant(self, owner: bytes, token: int, mutex):
        """(the Grant to start a watchdog for, the one it replaces): (None,
        None) when this is a reentry of the grant this thread already has. A
        replaced grant was lost: this thread could not have acquired again."""
        current = self.local.grant
        if current is not None and current.owner == owner and current.token == token:
            current.holds += 1
            return None, None
        self.local.token = owner
        self.local.grant = Grant(owner, token, mutex)
        return self.local.grant, current

    def _released_one(self, left: int) -> None:
        """After a RELEASE answered ``left`` holds (0 too when it failed):
        forgets the grant once this object's holds are all released."""
        grant = self.local.grant
        grant.holds -= 1
        if left == 0 or grant.holds <= 0:
            self._dropped()

    def _dropped(self) -> Optional[Grant]:
        """Forgets this thread's grant (released or lost); returns it so that
        its watchdog can be stopped."""
        grant = self.local.grant
        self.local.token = self.local.grant = None
        if grant is not None:
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
        self._read._object_id = self._write._object_id

    def read_lock(self):
        """The shared side (``SHARED``)."""
        return self._read

    def write_lock(self):
        """The exclusive side."""
        return self._write


def _as_bytes(value) -> bytes:
    return value.encode() if isinstance(value, str) else value
