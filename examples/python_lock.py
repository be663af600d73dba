#!/usr/bin/env python3
"""FLOCK from Python with redis-py: a context manager that holds a fair lock
while a background thread renews its lease and notices when it is lost.

    python3 examples/python_lock.py [redis://127.0.0.1:6379]    (or: make example-python)

Needs a server with FLOCK loaded (make run) and redis-py (pip install redis).

Lost replies: every FLOCK command goes out with a fresh request ID (ID
<uuid4>). redis-py 6+ retries a command on ConnectionError and TimeoutError
by default (redis.Redis(host, port): 10 times in redis-py 8.1; connections
of Redis.from_url do not retry unless given retry=...), and its retry resends
the very same arguments, ID included: the server answers a resend of a
command it already applied with its first reply instead of applying it again
(no double release, no extra hold).
"""

import sys
import threading
import time
import uuid

try:
    import redis
except ImportError:
    print("skipped: redis-py is not installed (pip install redis)")
    sys.exit(0)

PROCESS_ID = str(uuid.uuid4())


def flock(client, *args):
    """Sends one FLOCK command with a request ID of its own. A retry of this
    call (redis-py's Retry) resends the same ID; a new call gets a new one."""
    return client.execute_command(*args, "ID", str(uuid.uuid4()))


class LockBusy(Exception):
    """The lock was held by someone else (a try) or the wait timed out."""


class FlockLock:
    """``with FlockLock(r, "orders:42", lease_ms=10_000, wait_ms=5_000) as lock:``

    Acquires on enter (``wait_ms=None`` only tries, ``0`` waits without
    limit), raises LockBusy if not granted, renews every lease_ms / 3 on
    another pooled connection, and releases on exit. ``lock.token`` is the
    fencing token; ``lock.lost`` (a threading.Event) is set when a renewal
    finds the lock gone (NOTOWNER) or no renewal got through for a whole
    lease. The owner is "<process uuid>:<thread id>", so the same thread
    entering the same lock again reenters it.
    """

    def __init__(self, client, key, lease_ms=10_000, wait_ms=None, owner=None):
        self.client, self.key, self.lease_ms, self.wait_ms = client, key, lease_ms, wait_ms
        self.owner = owner or f"{PROCESS_ID}:{threading.get_ident()}"
        self.token = None
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._renewer = None

    def __enter__(self):
        args = ["FLOCK.ACQUIRE", self.key, self.owner, self.lease_ms]
        if self.wait_ms is not None:
            args += ["WAIT", self.wait_ms]
        # A blocking WAIT needs a socket timeout longer than wait_ms (the
        # default, None, has none).
        self.token = flock(self.client, *args)
        if self.token is None:
            raise LockBusy(self.key)
        self._renewer = threading.Thread(target=self._renew, name=f"flock-renew {self.key}", daemon=True)
        self._renewer.start()
        return self

    def _renew(self):
        confirmed = time.monotonic()
        while not self._stop.wait(self.lease_ms / 3000):
            sent = time.monotonic()
            try:
                flock(self.client, "FLOCK.RENEW", self.key, self.owner, self.lease_ms)
                confirmed = sent
            except redis.ResponseError as e:
                if str(e).startswith("NOTOWNER"):
                    self.lost.set()
                    return
            except redis.ConnectionError:
                if time.monotonic() - confirmed >= self.lease_ms / 1000:
                    self.lost.set()
                    return

    def __exit__(self, *exc):
        self._stop.set()
        self._renewer.join()
        try:
            flock(self.client, "FLOCK.RELEASE", self.key, self.owner)
        except redis.ResponseError as e:
            # NOTOWNER: it was lost meanwhile (then `lost` is usually set).
            if not str(e).startswith("NOTOWNER"):
                raise
        return False


def main(url):
    # Spell out the retry redis-py 6+ gives redis.Redis(host, port) by default:
    # from_url would give its connections none.
    from redis.backoff import ExponentialBackoff
    from redis.retry import Retry

    retry = Retry(ExponentialBackoff(cap=1, base=0.01), 3)
    r = redis.Redis.from_url(url, retry=retry, retry_on_error=[redis.ConnectionError, redis.TimeoutError])
    key = "example:py-orders"
    r.delete(key)

    # 1. Hold a lock with a short lease for three leases: the renewer keeps it.
    #    Meanwhile another thread waits for it and is handed it on exit.
    handed = {}

    def second_worker():
        with FlockLock(r, key, lease_ms=5_000, wait_ms=5_000) as lock:
            handed["token"] = lock.token

    with FlockLock(r, key, lease_ms=300) as lock:
        print(f"1. {lock.owner} holds {key} with fencing token {lock.token}")
        waiter = threading.Thread(target=second_worker)
        waiter.start()
        time.sleep(1.0)
        info = r.execute_command("FLOCK.INFO", key)
        # A dict on RESP3, a flat field/value list on RESP2.
        fields = info if isinstance(info, dict) else dict(zip(info[::2], info[1::2]))
        queue = [o.decode() for o in fields[b"queue"]]
        print(f"2. after 1 s (3 leases) still held: token {fields[b'token']}, queue {queue}, lost={lock.lost.is_set()}")
        first = lock.token
    waiter.join()
    print(f"3. released; the waiting thread was handed the lock with token {handed['token']} (> {first}: {handed['token'] > first})")

    # 2. Lease loss: an administrator force-releases the lock; the renewer's
    #    next FLOCK.RENEW answers NOTOWNER and `lost` is set.
    with FlockLock(r, key, lease_ms=300) as lock:
        r.execute_command("FLOCK.FORCERELEASE", key)
        print(f"4. after FLOCK.FORCERELEASE the holder notices the loss: lost={lock.lost.wait(2)}")
    print("done")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "redis://127.0.0.1:6379")
