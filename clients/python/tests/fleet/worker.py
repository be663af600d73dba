"""One process of the mixed fleet (test_mixed_fleet.py): takes the keys at
random with redis-py's own Lock (``legacy``: SET NX PX, polled, released by a
compare-and-delete script) or with redis_flock.Lock (``flock``), and logs each
request, grant and release through the fleet's script, until the script's
answer to a request's log says the test has seen enough (or SECONDS pass).
Prints its counts as one JSON line.

python worker.py legacy|flock PORT SHA SECONDS KEY..."""

import json
import os
import random
import sys
import time

import redis
from redis.exceptions import ResponseError

import redis_flock

side, port, sha, seconds, keys = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4]), sys.argv[5:]
r = redis.Redis(port=port)
who = f"{side}-py-{os.getpid()}"
counts = {"side": f"{side} (Python)", "grants": 0, "timeouts": 0, "wrongtype": 0, "errors": []}


def log(key, what, delta):
    """Logs the event; answers whether the test has seen enough."""
    return r.evalsha(sha, 3, "fleet:events", f"fleet:occupancy:{key}", "fleet:stop", f"{key} {side} {who} {what}", delta)


end = time.monotonic() + seconds
while time.monotonic() < end:
    key = random.choice(keys)
    if log(key, "req", 0):
        break
    if side == "legacy":
        # As applications use it: a 5 s TTL, polled every 0.1 s (its default).
        lock = redis.lock.Lock(r, key, timeout=5, blocking_timeout=10)
    else:
        lock = redis_flock.Lock(r, key, timeout=5, blocking_timeout=10)
    try:
        if not lock.acquire():
            counts["timeouts"] += 1
            continue
    except ResponseError as e:
        counts["wrongtype" if str(e).startswith("WRONGTYPE") else "errors"] += 1
        continue
    counts["grants"] += 1
    log(key, "acq", 1)
    time.sleep(random.uniform(0.001, 0.003))
    log(key, "rel", -1)
    lock.release()
    time.sleep(random.uniform(0, 0.01))
print(json.dumps(counts))
