"""`make bench-clients`: one process's waiting threads, then asyncio tasks, through the
Python client. Prints how
many connections the waits add, the server memory per waiter (INFO used_memory once idle
buffers shrank) and how long a holder takes to hear of FLOCK.FORCERELEASE.
Arguments: port, waiters."""

import asyncio
import sys
import threading
import time

import redis

import redis_flock
import redis_flock.asyncio


def settled(admin):
    time.sleep(4)
    last = admin.info("memory")["used_memory"]
    for _ in range(30):
        time.sleep(0.5)
        now = admin.info("memory")["used_memory"]
        if abs(now - last) <= now / 1000:
            return now
        last = now
    return last


def main(port, n):
    admin = redis.Redis(port=port)
    client = redis.Redis(port=port)
    holder = redis_flock.Lock(client, "m")
    holder.acquire()
    c0, m0 = admin.info("clients")["connected_clients"], settled(admin)

    def wait():
        lock = redis_flock.Lock(client, "m")
        lock.acquire()
        lock.release()

    threads = [threading.Thread(target=wait, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    while admin.info("everything").get("flock_waiters", 0) < n:
        time.sleep(0.01)
    c1, m1 = admin.info("clients")["connected_clients"], settled(admin)
    print(f"| Python `redis_flock.Lock` (threads) | {n} | {c1 - c0} | {(m1 - m0) // n} B |", end="")
    holder.release()
    for t in threads:
        t.join()

    lock = redis_flock.Lock(client, "f")
    lock.acquire()
    sent = time.monotonic()
    admin.execute_command("FLOCK.FORCERELEASE", "f")
    while not lock.lost:
        pass
    print(f" {(time.monotonic() - sent) * 1000:.2f} ms |")


async def main_async(port, n):
    admin = redis.Redis(port=port)
    client = redis.asyncio.Redis(port=port)
    holder = redis_flock.asyncio.Lock(client, "am")
    await holder.acquire()
    c0, m0 = admin.info("clients")["connected_clients"], settled(admin)

    async def wait():
        lock = redis_flock.asyncio.Lock(client, "am")
        await lock.acquire()
        await lock.release()

    tasks = [asyncio.create_task(wait()) for _ in range(n)]
    while admin.info("everything").get("flock_waiters", 0) < n:
        await asyncio.sleep(0.01)
    c1 = admin.info("clients")["connected_clients"]
    m1 = await asyncio.get_running_loop().run_in_executor(None, settled, admin)
    print(f"| Python asyncio `redis_flock.asyncio.Lock` (tasks) | {n} | {c1 - c0} | {(m1 - m0) // n} B |", end="")
    await holder.release()
    await asyncio.gather(*tasks)

    lock = redis_flock.asyncio.Lock(client, "af")
    await lock.acquire()
    sent = time.monotonic()
    admin.execute_command("FLOCK.FORCERELEASE", "af")
    while not lock.lost:
        await asyncio.sleep(0)
    print(f" {(time.monotonic() - sent) * 1000:.2f} ms |")
    await client.aclose()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
    asyncio.run(main_async(int(sys.argv[1]), int(sys.argv[2])))
