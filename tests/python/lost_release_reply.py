#!/usr/bin/env python3
"""The double release of a lost reply, with redis-py's own retry.

    python3 tests/python/lost_release_reply.py PORT KEY with-id|without-id

127.0.0.1:PORT leads through the fault-injecting proxy of tests/common/proxy.rs, armed
to swallow the reply to the first FLOCK.RELEASE and drop the connection.
A holder with 2 holds releases once; redis-py resends the command on a new
connection (its Retry resends the same argv). Prints one line:
`redis-py <version> retries=<n> reply=<holds left> holds=<holds now>`.
tests/integration/request_ids.rs runs it both ways and checks the numbers.
"""

import sys
import uuid

import redis

port, key, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
# redis-py's defaults, retry included (redis-py 8.1: 10 retries on
# ConnectionError and TimeoutError). Not Redis.from_url: its connections get
# no retry in redis-py 8.1.
r = redis.Redis(host="127.0.0.1", port=port)
retry = r.connection_pool.make_connection().retry
if retry is None or retry._retries == 0:
    # redis-py < 6 did not retry by default: give it what 6+ does by default.
    from redis.backoff import ExponentialBackoff
    from redis.retry import Retry

    retry = Retry(ExponentialBackoff(), 3)
    r = redis.Redis(host="127.0.0.1", port=port, retry=retry, retry_on_error=[redis.ConnectionError, redis.TimeoutError])

owner = "py-holder"
first = r.execute_command("FLOCK.ACQUIRE", key, owner, 60_000)
again = r.execute_command("FLOCK.ACQUIRE", key, owner, 60_000)
assert first == again, (first, again)

release = ["FLOCK.RELEASE", key, owner]
if mode == "with-id":
    # One ID per call: redis-py's retry resends these very arguments.
    release += ["ID", str(uuid.uuid4())]
left = r.execute_command(*release)

info = r.execute_command("FLOCK.INFO", key)
# A dict on RESP3 (redis-py 8's default), a flat field/value list on RESP2.
fields = info if isinstance(info, dict) else dict(zip(info[::2], info[1::2])) if info else {}
holds = fields.get(b"holds", 0)
print(f"redis-py {redis.__version__} retries={retry._retries} reply={left} holds={holds}")
