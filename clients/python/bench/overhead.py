"""`make bench-clients`: what the Python client costs a caller, against what it replaces.

    overhead.py PORT pairs     uncontended acquire + release through the public API, one
                               thread (and one asyncio task), one lock, side by side with
                               redis-py's own lock in the same run: p50 and p99 of a pair
    overhead.py PORT grants    8 threads taking one lock in turn, each holding it 100 us
                               (time.sleep, which lets the GIL go, as I/O in the critical
                               section would) then releasing, for BENCH_SECONDS: grants/s through
                               redis_flock.Lock against the same threads sending the raw
                               FLOCK commands, each blocking on a connection of its own (in
                               rounds taken in turn)

Prints Markdown table rows (the headers are scripts/bench-clients.sh's). BENCH_PAIRS (2000),
BENCH_SECONDS (3) and BENCH_WORKERS (8) in the environment change the sizes.
"""

import asyncio
import os
import statistics
import sys
import threading
import time

import redis
import redis.asyncio

import redis_flock
import redis_flock.asyncio

PAIRS = int(os.environ.get("BENCH_PAIRS", "2000"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "3"))
THREADS = int(os.environ.get("BENCH_WORKERS", "8"))
HOLD = 0.0001
# The pairs are timed in blocks that alternate between the two locks, so that a burst of load
# on the shared machine falls on both alike.
BLOCK = 100
WARMUP = 500
# The contended seconds are taken in this many rounds of each way, in turn.
ROUNDS = 6


def quantile(samples, q):
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def row(client, replaced, flock, other):
    f50, f99 = quantile(flock, 0.5) * 1000, quantile(flock, 0.99) * 1000
    o50, o99 = quantile(other, 0.5) * 1000, quantile(other, 0.99) * 1000
    print(f"| {client} | {replaced} | {len(flock)} | {f50:.3f} | {f99:.3f} | {o50:.3f} | {o99:.3f} "
          f"| {f50 / o50:.2f}x | {f99 / o99:.2f}x |")


def pairs(port):
    r = redis.Redis(port=port)
    # Each as its README shows it: redis-py's r.lock(name) (SET NX, a Lua compare-and-delete),
    # and redis_flock.Lock(r, name) (a session grant: FLOCK.ACQUIRE ... INBOX, FLOCK.RELEASE).
    # One lock object each, made once, as a caller keeps one.
    locks = {"flock": redis_flock.Lock(r, "pairs:flock"), "redis-py": r.lock("pairs:redis-py")}
    times = {name: [] for name in locks}

    def block(name, n, record=True):
        lock, out = locks[name], times[name]
        for _ in range(n):
            start = time.perf_counter()
            lock.acquire()
            lock.release()
            if record:
                out.append(time.perf_counter() - start)

    for name in locks:
        block(name, WARMUP, record=False)
    for i in range(PAIRS // BLOCK):
        for name in (("flock", "redis-py") if i % 2 == 0 else ("redis-py", "flock")):
            block(name, BLOCK)
    row("Python `redis_flock.Lock`", "redis-py `redis.lock.Lock`", times["flock"], times["redis-py"])
    r.close()


async def pairs_async(port):
    r = redis.asyncio.Redis(port=port)
    locks = {"flock": redis_flock.asyncio.Lock(r, "apairs:flock"), "redis-py": r.lock("apairs:redis-py")}
    times = {name: [] for name in locks}

    async def block(name, n, record=True):
        lock, out = locks[name], times[name]
        for _ in range(n):
            start = time.perf_counter()
            await lock.acquire()
            await lock.release()
            if record:
                out.append(time.perf_counter() - start)

    for name in locks:
        await block(name, WARMUP, record=False)
    for i in range(PAIRS // BLOCK):
        for name in (("flock", "redis-py") if i % 2 == 0 else ("redis-py", "flock")):
            await block(name, BLOCK)
    row("Python asyncio `redis_flock.asyncio.Lock`", "redis-py `redis.asyncio.lock.Lock`", times["flock"], times["redis-py"])
    await r.aclose()


class Tally:
    """What the rounds of one way counted: grants per worker, the time they ran, the holds."""

    def __init__(self):
        self.grants = [0] * THREADS
        self.elapsed = 0.0
        self.holds = []


def contended(work, seconds, tally):
    """Runs THREADS threads of work(i, stop, holds) for ``seconds``, counted into
    ``tally``; each grant appends its hold time to holds."""
    stop = threading.Event()
    holds = [[] for _ in range(THREADS)]
    threads = [threading.Thread(target=work, args=(i, stop, holds[i]), daemon=True) for i in range(THREADS)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    tally.elapsed += time.perf_counter() - start
    for t in threads:
        t.join(30)
    for i, h in enumerate(holds):
        tally.grants[i] += len(h)
        tally.holds += h


def grants(port):
    conns = [redis.Redis(port=port, single_connection_client=True) for _ in range(THREADS)]

    def raw(i, stop, holds):
        owner = f"raw-{i}"
        while not stop.is_set():
            conns[i].execute_command("FLOCK.ACQUIRE", "grants:raw", owner, 30000, "WAIT", 0)
            held = time.perf_counter()
            time.sleep(HOLD)
            holds.append(time.perf_counter() - held)
            conns[i].execute_command("FLOCK.RELEASE", "grants:raw", owner)

    client = redis.Redis(port=port)
    # One lock object shared by the threads, as redis-py's is meant to be (thread_local=True:
    # each thread's grant is its own); a new owner per acquire, as redis-py's.
    lock = redis_flock.Lock(client, "grants:flock")

    def flock(i, stop, holds):
        while not stop.is_set():
            lock.acquire()
            held = time.perf_counter()
            time.sleep(HOLD)
            holds.append(time.perf_counter() - held)
            lock.release()

    ways = {"raw": raw, "flock": flock}
    tallies = {name: Tally() for name in ways}
    # A warm-up round of each (connections, the client's session), then rounds taken in turn,
    # so that a burst of load on the shared machine falls on both alike.
    for name, work in ways.items():
        contended(work, 0.3, Tally())
    for r in range(ROUNDS):
        for name in (("raw", "flock") if r % 2 == 0 else ("flock", "raw")):
            contended(ways[name], SECONDS / ROUNDS, tallies[name])
    rate = {name: sum(t.grants) / t.elapsed for name, t in tallies.items()}
    api = tallies["flock"]
    print(f"| Python `redis_flock.Lock` | {THREADS} threads | 100 us `time.sleep` (mean "
          f"{statistics.mean(api.holds) * 1e6:.0f} us held) | {rate['raw']:.0f} | {rate['flock']:.0f} "
          f"| {rate['flock'] / rate['raw']:.2f}x | {min(api.grants)}-{max(api.grants)} |")
    client.close()
    for conn in conns:
        conn.close()


if __name__ == "__main__":
    port, what = int(sys.argv[1]), sys.argv[2]
    if what == "pairs":
        pairs(port)
        asyncio.run(pairs_async(port))
    elif what == "grants":
        grants(port)
    else:
        sys.exit(f"unknown measurement {what!r}: pairs or grants")
