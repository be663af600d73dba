"""`make bench-clients`: what the Python client costs a caller, against what it replaces.

    overhead.py PORT pairs     uncontended acquire + release through the public API, one
                               thread (and one asyncio task), one lock, side by side with
                               redis-py's own lock in the same run: p50 and p99 of a pair
    overhead.py PORT grants    8 threads taking one lock in turn, each holding it 100 us
                               (time.sleep, which lets the GIL go, as I/O in the critical
                               section would) then releasing, for SECONDS: grants/s through
                               redis_flock.Lock against the same threads sending the raw
                               FLOCK commands, each blocking on a connection of its own

Prints Markdown table rows (the headers are scripts/bench-clients.sh's). PAIRS (2000),
SECONDS (3) and THREADS (8) in the environment change the sizes.
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

PAIRS = int(os.environ.get("PAIRS", "2000"))
SECONDS = float(os.environ.get("SECONDS", "3"))
THREADS = int(os.environ.get("THREADS", "8"))
HOLD = 0.0001
# The pairs are timed in blocks that alternate between the two locks, so that a burst of load
# on the shared machine falls on both alike.
BLOCK = 100
WARMUP = 500


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


def contended(make_worker):
    """Runs THREADS workers for SECONDS: (grants/s, the mean hold in us, the fewest and the
    most grants of a worker). make_worker(i, stop, holds) makes worker i's loop, which
    appends each grant's hold time to holds."""
    stop = threading.Event()
    counts = [[] for _ in range(THREADS)]
    workers = [make_worker(i, stop, counts[i]) for i in range(THREADS)]
    threads = [threading.Thread(target=w, daemon=True) for w in workers]
    start = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(SECONDS)
    stop.set()
    elapsed = time.perf_counter() - start
    for t in threads:
        t.join(30)
    granted = sum(len(c) for c in counts)
    holds = [h for c in counts for h in c]
    return granted / elapsed, statistics.mean(holds) * 1e6, min(len(c) for c in counts), max(len(c) for c in counts)


def grants(port):
    def raw_worker(i, stop, holds):
        conn = redis.Redis(port=port, single_connection_client=True)
        owner = f"raw-{i}"

        def run():
            while not stop.is_set():
                conn.execute_command("FLOCK.ACQUIRE", "grants:raw", owner, 30000, "WAIT", 0)
                held = time.perf_counter()
                time.sleep(HOLD)
                holds.append(time.perf_counter() - held)
                conn.execute_command("FLOCK.RELEASE", "grants:raw", owner)
            conn.close()

        return run

    client = redis.Redis(port=port)
    # One lock object shared by the threads, as redis-py's is meant to be (thread_local=True:
    # each thread's grant is its own); a new owner per acquire, as redis-py's.
    lock = redis_flock.Lock(client, "grants:flock")

    def flock_worker(i, stop, holds):
        def run():
            while not stop.is_set():
                lock.acquire()
                held = time.perf_counter()
                time.sleep(HOLD)
                holds.append(time.perf_counter() - held)
                lock.release()

        return run

    # Warm up the client (its session and connections) before the clock starts.
    lock.acquire()
    lock.release()
    raw, _, _, _ = contended(raw_worker)
    api, api_hold, api_min, api_max = contended(flock_worker)
    print(f"| Python `redis_flock.Lock` | {THREADS} threads | 100 us `time.sleep` (mean {api_hold:.0f} us held) "
          f"| {raw:.0f} | {api:.0f} | {api / raw:.2f}x | {api_min}-{api_max} |")
    client.close()


if __name__ == "__main__":
    port, what = int(sys.argv[1]), sys.argv[2]
    if what == "pairs":
        pairs(port)
        asyncio.run(pairs_async(port))
    elif what == "grants":
        grants(port)
    else:
        sys.exit(f"unknown measurement {what!r}: pairs or grants")
