"""redis_flock.Lock where redis.lock.Lock was: python3 quickstart.py [redis://127.0.0.1:6379]"""

import sys

import redis

from redis_flock import Lock

r = redis.Redis.from_url(sys.argv[1] if len(sys.argv) > 1 else "redis://127.0.0.1:6379")

# No timeout: the grant lives with the process's session (no renewals); a
# process cut off from the server knows it lost it within the session's
# timeout (10 s, session_timeout=), before anyone else is granted it.
# Waiters queue on the server in FIFO order; the process's one session
# connection hears their grants (and pushed losses: lock.lost, on_lost).
with Lock(r, "orders:42", blocking_timeout=5, on_lost=lambda lock, why: print(f"lost: {why}")) as lock:
    # Pass the fencing token to the storage you write to: it rejects older ones.
    print(f"holding orders:42, fencing token {lock.fencing_token}, lost: {lock.lost}")
    # Data in Redis: the write runs only while this grant holds the lock
    # (FLOCK.FENCED); once it ended, StaleTokenError and nothing runs.
    lock.fenced("HSET", "orders:42:row", "status", "paid")

# Or through redis-py's own factory, with a 10 s lease of its own:
lock = r.lock("orders:42", timeout=10, lock_class=Lock)
if lock.acquire(blocking=False):
    lock.extend(5)  # 15 s left now
    print(f"held again with fencing token {lock.fencing_token}, owned: {lock.owned()}")
    lock.release()
