"""`make bench-clients`: no false expiry, a busy server and holders that pause.

    silences.py PORT SECONDS -- 'NAME=HOLDER-COMMAND' ...

For SECONDS, while two `redis-benchmark` processes keep the server on PORT busy (one with
pipelined SET/GET, one with FLOCK.ACQUIREs of random keys whose 50 ms leases the server
then ends), one holder process per client (started as HOLDER-COMMAND PORT session MS KEYS
PREFIX, the holders of knows_first.py) holds KEYS session grants with a session timeout
of MS, and is stopped (SIGSTOP) again and again, each pause up to a third of MS long (a
GC pause, a frozen VM, a starved interpreter), after MS/5 to MS of running. The pauses of
the holders are independent. After the last, and the session timeout after it, each
holder reports what its client lost (the line `report`: {"lost": {key: reason or
[seconds, reason]}}). Nothing may be lost: no holder reports a loss, and the server
counts no session expiry (`flock_session_expiries`).

How busy the server was is printed beside: the round trip of a PING sent every 50 ms on
a connection of its own (p50, p99, max), and the server's CPU time over the run.

Prints one Markdown table row per holder. SILENCE_MS (3000) and SILENCE_KEYS (20) in the
environment change the session timeout and the grants per holder.
"""

import collections
import json
import os
import random
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time

import redis

T_MS = int(os.environ.get("SILENCE_MS", 3000))
KEYS = int(os.environ.get("SILENCE_KEYS", 20))


class Holder:
    def __init__(self, name: str, argv: list, port: int) -> None:
        self.name = name
        self.pauses = []
        self.process = subprocess.Popen(
            [*argv, str(port), "session", str(T_MS), str(KEYS), f"silences:{name}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        line = self.process.stdout.readline().strip()
        if line != "held":
            sys.exit(f"{name}: the holder said {line!r}, not held")

    def pause_until(self, end: float, rng: random.Random) -> None:
        """Runs it MS/5 to MS, stops it up to MS/3, over and over until `end`."""
        t = T_MS / 1000
        while time.monotonic() < end:
            time.sleep(rng.uniform(t / 5, t))
            stopped = time.monotonic()
            os.kill(self.process.pid, signal.SIGSTOP)
            time.sleep(rng.uniform(0, t / 3))
            os.kill(self.process.pid, signal.SIGCONT)
            self.pauses.append(time.monotonic() - stopped)

    def report(self) -> dict:
        self.process.stdin.write("report\n")
        self.process.stdin.flush()
        lost = json.loads(self.process.stdout.readline())["lost"]
        self.process.wait(10)
        return {key: value[1] if isinstance(value, list) else value for key, value in lost.items()}


def probe(port: int, until: threading.Event, samples: list) -> None:
    conn = redis.Redis(port=port)
    while not until.wait(0.05):
        start = time.monotonic()
        conn.ping()
        samples.append(time.monotonic() - start)


def cpu(r) -> float:
    info = r.info("cpu")
    return info["used_cpu_sys"] + info["used_cpu_user"]


def main() -> None:
    port, seconds = int(sys.argv[1]), float(sys.argv[2])
    holders_args = sys.argv[sys.argv.index("--") + 1:]
    r = redis.Redis(port=port)
    expiries = r.info("flock")["flock_session_expiries"]
    load = [
        subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for argv in (
            ["redis-benchmark", "-p", str(port), "-c", "20", "-P", "16", "-n", "2000000000", "-r", "100000",
             "-t", "set,get", "-q", "-l"],
            ["redis-benchmark", "-p", str(port), "-c", "10", "-n", "2000000000", "-r", "100000", "-q", "-l",
             "FLOCK.ACQUIRE", "busy:__rand_int__", "o", "50"],
        )
    ]
    pings, stop = [], threading.Event()
    prober = threading.Thread(target=probe, args=(port, stop, pings), daemon=True)
    holders = []
    try:
        for spec in holders_args:
            name, argv = spec.split("=", 1)
            holders.append(Holder(name, shlex.split(argv), port))
        rng = random.Random(os.environ.get("SILENCE_SEED"))
        cpu_before, start = cpu(r), time.monotonic()
        prober.start()
        end = start + seconds
        pausers = [threading.Thread(target=h.pause_until, args=(end, random.Random(rng.random()))) for h in holders]
        for p in pausers:
            p.start()
        for p in pausers:
            p.join()
        # Any loss the last pauses caused has come by the session's timeout after them.
        time.sleep(T_MS / 1000)
        stop.set()
        elapsed = time.monotonic() - start
        busy = (cpu(r) - cpu_before) / elapsed
        reports = [h.report() for h in holders]
    finally:
        for p in load + [h.process for h in holders]:
            p.kill()
            p.wait()
    expired = r.info("flock")["flock_session_expiries"] - expiries
    pings.sort()
    ping = "/".join(f"{1000 * q:.1f}" for q in (pings[len(pings) // 2], pings[int(0.99 * len(pings))], pings[-1]))
    for holder, lost in zip(holders, reports):
        reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(collections.Counter(lost.values()).items())) or "-"
        print(
            f"| {holder.name} | {T_MS} | {elapsed:.0f} | {KEYS} | {len(holder.pauses)} "
            f"| {1000 * statistics.mean(holder.pauses):.0f} | {1000 * max(holder.pauses):.0f} "
            f"| {len(lost)} ({reasons}) | {expired} | {ping} | {100 * busy:.0f}% |"
        )
    if expired or any(reports):
        sys.exit("a session was lost: see the table")


if __name__ == "__main__":
    main()
