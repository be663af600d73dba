"""redis_flock.MultiLock, two accounts of a transfer: python3 multilock.py [redis://127.0.0.1:6379]"""

import sys

import redis

from redis_flock import MultiLock

r = redis.Redis.from_url(sys.argv[1] if len(sys.argv) > 1 else "redis://127.0.0.1:6379")

# One FLOCK.ACQUIREALL: both locks for one owner, or none. A wait holds its
# place in both queues at once, so transfers in opposite directions never
# deadlock. The hash tag {bank} puts both keys in one Redis Cluster slot.
accounts = ["{bank}:account:1", "{bank}:account:2"]
with MultiLock(r, accounts, timeout=10, blocking_timeout=5) as transfer:
    print(f"holding {accounts}, fencing tokens {transfer.fencing_tokens}")
# Released together (FLOCK.RELEASEALL): each lock goes to its next waiter.
