"""FLOCK fair distributed locks for redis-py.

``redis_flock.Lock`` is a drop-in for ``redis.lock.Lock`` and
``redis_flock.asyncio.Lock`` for ``redis.asyncio.lock.Lock``, on a server
with the FLOCK module loaded: FIFO waiting on the server, fencing tokens,
server-side leases, a watchdog, request IDs. See README.md."""

from ._core import WATCHDOG_TIMEOUT
from .lock import Lock

__all__ = ["Lock", "WATCHDOG_TIMEOUT"]
__version__ = "0.1.0"
