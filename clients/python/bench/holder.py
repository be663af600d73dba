"""The Python holder of knows_first.py (`make bench-clients`, who knows first):

    holder.py PROXY-PORT MODE MS KEYS PREFIX

holds KEYS `redis_flock.Lock`s through a client whose every connection goes through the
partition proxy on PROXY-PORT: session grants with `session_timeout` MS (MODE `session`), a
fixed lease `timeout` of MS (`lease`), or `use_session=False` with a `watchdog_timeout` of
MS (`watchdog`). Each loss is the time its `on_lost` callback ran (time.monotonic(), which
is CLOCK_MONOTONIC); each local deadline is read at the cut from the grant (not public API:
`lock.local.grant.due()`, the deadline the client's timer fires at). Protocol: see
knows_first.py.
"""

import json
import logging
import sys
import time

import redis

import redis_flock


def main() -> None:
    proxy_port, mode, ms, keys, prefix = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    # The client logs each loss as a warning: the bench counts them itself.
    logging.getLogger("redis_flock").setLevel(logging.ERROR)
    lost = {}

    def on_lost(lock, reason):
        lost[lock.name] = (time.monotonic(), reason)

    options = {
        "session": {"session_timeout": ms / 1000},
        "lease": {"timeout": ms / 1000},
        "watchdog": {"use_session": False, "watchdog_timeout": ms / 1000},
    }[mode]
    client = redis.Redis(port=int(proxy_port))
    locks = [redis_flock.Lock(client, f"{prefix}:{i}", on_lost=on_lost, **options) for i in range(keys)]
    for lock in locks:
        if not lock.acquire(blocking_timeout=10):
            sys.exit(f"{lock.name} not acquired")
    print("held", flush=True)
    deadline = {}
    for line in sys.stdin:
        if line.strip() == "cut":
            # The grants' deadlines move no more: no reply gets through the proxy now.
            time.sleep(0.005)
            for lock in locks:
                grant = lock.local.grant
                if grant is not None:
                    deadline[lock.name] = grant.due()[0]
        elif line.strip() == "report":
            print(json.dumps({"lost": lost, "deadline": deadline}), flush=True)
            return


if __name__ == "__main__":
    main()
