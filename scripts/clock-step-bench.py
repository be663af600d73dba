#!/usr/bin/env python3
"""Leases across a step of the server's wall clock (issue 31's target):
LOCKS locks held with leases of 1 to 30 s and a waiter queued on each; the
server's wall clock steps an hour forward (in a second run, back) as soon
as every waiter is queued. For each lease: how long after its
deadline the waiter was granted (negative: the lease ended early), and
whether the tokens rose. The server runs under libfaketime (its wall clock
only, never the machine's); `make bench-clock` runs it.

Usage: clock-step-bench.py MODULE [LOCKS]. FLOCK_SERVER picks the server
(it must not link jemalloc as a shared library: Debian's 7.0 hangs under
libfaketime; `make bench-clock` uses Redis 8.2 unless SERVER is given)."""

import glob
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time

import redis

LIBFAKETIME = (glob.glob("/usr/lib/*/faketime/libfaketime.so.1") or sys.exit("libfaketime is missing: `make deps`"))[0]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(module, offset_file):
    port = free_port()
    env = {**os.environ, "LD_PRELOAD": LIBFAKETIME, "FAKETIME_TIMESTAMP_FILE": offset_file,
           "FAKETIME_NO_CACHE": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    server = subprocess.Popen(
        [os.environ.get("FLOCK_SERVER") or "redis-server", "--port", str(port), "--bind", "127.0.0.1",
         "--save", "", "--appendonly", "no", "--maxclients", "4000", "--loadmodule", module],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    r = redis.Redis(port=port)
    for _ in range(100):
        try:
            r.ping()
            return server, port
        except redis.ConnectionError:
            time.sleep(0.05)
    server.kill()
    sys.exit("the server did not start under libfaketime")


def run(module, locks, step_s):
    with tempfile.TemporaryDirectory() as tmp:
        offset_file = os.path.join(tmp, "offset")
        with open(offset_file, "w") as f:
            f.write("+0")
        server, port = start(module, offset_file)
        try:
            return measure(port, offset_file, locks, step_s)
        finally:
            server.kill()
            server.wait()


def measure(port, offset_file, locks, step_s):
    rng = random.Random(31)
    leases = [rng.randint(1000, 30000) for _ in range(locks)]
    r = redis.Redis(port=port)
    granted = [None] * locks
    go = threading.Event()

    def wait(i, c):
        go.wait()
        token = c.execute_command("FLOCK.ACQUIRE", f"lock:{i}", "next", 1000, "WAIT", 60000)
        granted[i] = (time.monotonic(), token)

    # Connected first, so that every waiter queues within moments of the grants.
    conns = [redis.Redis(port=port, socket_timeout=90, single_connection_client=True) for _ in range(locks)]
    for c in conns:
        c.ping()
    threads = [threading.Thread(target=wait, args=(i, c), daemon=True) for i, c in enumerate(conns)]
    for t in threads:
        t.start()
    deadlines, tokens = [], []
    for i, lease in enumerate(leases):
        sent = time.monotonic()
        tokens.append(r.execute_command("FLOCK.ACQUIRE", f"lock:{i}", "holder", lease))
        deadlines.append(sent + lease / 1000)
    go.set()
    # Queued, or granted already (the shortest leases may end first).
    while (lambda i: int(i["flock_waiters"]) + int(i["flock_grants"]) - locks)(r.info("flock")) < locks:
        time.sleep(0.01)
    with open(offset_file, "w") as f:
        f.write(f"{step_s:+d}")
    stepped = time.monotonic()
    for t in threads:
        t.join(timeout=120)
    late_ms = sorted((g[0] - d) * 1000 for g, d in zip(granted, deadlines) if g)
    after = [d for d in deadlines if d > stepped]
    rising = all(g and g[1] > t for g, t in zip(granted, tokens))
    steps = int(r.info("flock")["flock_clock_steps"])
    return late_ms, len(after), rising, steps


def pct(values, p):
    return values[min(len(values) - 1, int(len(values) * p / 100))]


def main():
    module = sys.argv[1]
    locks = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    print(f"| step | leases | ended after the step | early (< -1 ms) | granted | late p50 | p99 | p99.9 | max | tokens rise | steps seen |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for step in (3600, -3600):
        late, after, rising, steps = run(module, locks, step)
        early = sum(1 for x in late if x < -1)
        print(f"| {step:+d} s | {locks} | {after} | {early} | {len(late)} | {pct(late, 50):.1f} ms | {pct(late, 99):.1f} ms "
              f"| {pct(late, 99.9):.1f} ms | {late[-1]:.1f} ms | {'yes' if rising else 'NO'} | {steps} |")


if __name__ == "__main__":
    main()
