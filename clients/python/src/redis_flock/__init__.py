"""FLOCK fair distributed locks for redis-py.

``redis_flock.Lock`` is a drop-in for ``redis.lock.Lock`` and
``redis_flock.asyncio.Lock`` for ``redis.asyncio.lock.Lock``, on a server
with the FLOCK module loaded: FIFO waiting on the server through one session
per client (its waits share one connection; a lock without a timeout lives
with it; losses are pushed), a deadline per grant by which its holder knows
it lost it (``lost``, ``lost_reason``, ``on_lost``), fencing tokens,
server-side leases, a watchdog for grants without a session, request IDs. ``ReadWriteLock`` and
``Semaphore`` (in both modules) are the same lock with FLOCK's ``SHARED``
and ``PERMITS n LIMIT m``. ``MultiLock`` takes several locks for one owner,
all or none (``FLOCK.ACQUIREALL``). ``durable_replicas=n`` makes a grant count only
once n replicas acknowledged it (``LockNotDurableError`` otherwise, the hold
given back). See README.md."""

from ._core import (
    WATCHDOG_TIMEOUT,
    AcquireCancelled,
    CancelToken,
    CrossSlotError,
    DeadlockError,
    LockNotDurableError,
    StaleTokenError,
    UpgradeError,
    WrongModeError,
)
from .lock import Lock, MultiLock, ReadLock, ReadWriteLock, Semaphore

__all__ = [
    "Lock",
    "MultiLock",
    "ReadLock",
    "ReadWriteLock",
    "Semaphore",
    "CancelToken",
    "AcquireCancelled",
    "CrossSlotError",
    "DeadlockError",
    "LockNotDurableError",
    "StaleTokenError",
    "UpgradeError",
    "WrongModeError",
    "WATCHDOG_TIMEOUT",
]
__version__ = "0.2.0"
