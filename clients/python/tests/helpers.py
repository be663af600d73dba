"""Helpers the tests share: FLOCK.INFO, taking a lock from its holder, waiting
for an observable condition with a deadline."""

import time

from redis_flock._core import parse_info


def wait_until(condition, timeout=5.0, what="the condition"):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.01)


def info(r, key):
    return parse_info(r.execute_command("FLOCK.INFO", key))


def owner_of(r, key):
    """The holder's owner as bytes, or None."""
    fields = info(r, key)
    if fields is None:
        return None
    owner = fields["owner"]
    return owner.encode() if isinstance(owner, str) else owner


def ttl_ms(r, key):
    return info(r, key)["ttl-ms"]


def steal(r, key, owner="a"):
    """What redis-py's tests do with SET: the lock now belongs to someone else."""
    r.execute_command("FLOCK.FORCERELEASE", key)
    assert r.execute_command("FLOCK.ACQUIRE", key, owner, 60000) is not None


def stat(r, field):
    """A counter of INFO flock, e.g. wait_timeouts."""
    return int(r.info("flock")[f"flock_{field}"])
