"""`make bench-clients`: who knows first, a cut-off holder or the next waiter.

    knows_first.py PORT CLIENT -- HOLDER-COMMAND...

For each configuration, each run: a partition proxy (scripts/partition-proxy.py) in front
of the server on PORT, a holder process started as HOLDER-COMMAND PROXY-PORT MODE MS KEYS
PREFIX, whose client reaches the server only through the proxy and holds KEYS locks
(PREFIX:0 ... PREFIX:KEYS-1) of kind MODE (`session`: session grants with a session timeout
of MS; `lease`: a fixed lease of MS; `watchdog`: no session, a watchdog lease of MS), and
one waiter per key queued behind it on a direct connection (a raw blocking
`FLOCK.ACQUIRE key w 30000 WAIT 0`, all read by this process through one epoll). Once every
waiter is queued the proxy cuts the holder off (no byte either way, every socket left
open), at a moment of the holder's steady state: a session's, a third to two thirds of T
later, when a heartbeat has confirmed it and the next one is on its way; a watchdog's, up
to a third of the lease later; a fixed lease's, at once. Each key gives one trial: the
time its waiter's grant arrived less the time the holder's client reported the loss, both
on CLOCK_MONOTONIC (shared by the processes of the machine). A trial whose grant came first
(or whose loss was never reported) breaks the rule that the holder knows first.

The holder's side, in any language: print `held` once every lock is held; on the line
`cut` (sent right after the proxy cut), note each lock's local deadline; from then on note
when the client reports each loss and why; on the line `report`, print one JSON object
{"lost": {key: [seconds, reason]}, "deadline": {key: seconds}} (CLOCK_MONOTONIC seconds; a
deadline the API does not expose is left out) and exit. clients/python/bench/holder.py and
clients/node/bench/holder.js are two.

The proxy is scripts/partition-proxy.py: a connection that its client closes while cut
is not closed on the server's side until the heal, as behind a real partition (a client
gives its session up at its deadline and closes the session's connection; passing that
FIN on would end the session at once instead of T after the server last heard of it).

Prints one Markdown table row per configuration. KNOWS_FIRST in the environment replaces
the configurations: space-separated MODE:MS:RUNSxKEYS.
"""

import json
import os
import random
import selectors
import socket
import statistics
import subprocess
import sys
import time

import redis

CONFIGS = os.environ.get(
    "KNOWS_FIRST",
    "session:200:6x50 session:1000:3x50 session:10000:1x50 lease:500:4x50 watchdog:1000:4x50",
)
PROXY = os.path.join(os.path.dirname(__file__), "..", "..", "..", "scripts", "partition-proxy.py")
# How long after the last grant the holder is asked for its report: a loss it reports later
# counts as never reported.
REPORT_GRACE = 0.5


def command(*args) -> bytes:
    parts = [str(a).encode() for a in args]
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


def readline(proc, timeout: float) -> str:
    """A line of the child's stdout within timeout seconds (its stdout is line-buffered)."""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        if not sel.select(timeout):
            raise TimeoutError(f"no line from {proc.args!r} within {timeout} s")
    finally:
        sel.close()
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"{proc.args!r} ended (exit {proc.wait()})")
    return line.strip()


def tell(proc, line: str) -> None:
    proc.stdin.write(line + "\n")
    proc.stdin.flush()


def run(port: int, holder_cmd: list, mode: str, ms: int, keys: int, prefix: str, admin) -> list:
    """One cut: a trial per key, (grant, loss, reason, deadline, cut) on CLOCK_MONOTONIC."""
    waiters = []
    for _ in range(keys):
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        waiters.append(s)
    proxy = subprocess.Popen([sys.executable, PROXY, f"127.0.0.1:{port}"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, bufsize=1)
    holder = None
    try:
        proxy_port = readline(proxy, 10)
        holder = subprocess.Popen([*holder_cmd, proxy_port, mode, str(ms), str(keys), prefix],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        if readline(holder, 60) != "held":
            raise RuntimeError("the holder did not say `held`")
        queued_before = int(admin.info("flock")["flock_waiters"])
        for i, s in enumerate(waiters):
            s.sendall(command("FLOCK.ACQUIRE", f"{prefix}:{i}", "w", 30000, "WAIT", 0))
        while int(admin.info("flock")["flock_waiters"]) < queued_before + keys:
            time.sleep(0.001)
        time.sleep(random.uniform(ms / 3000, 2 * ms / 3000) if mode == "session"
                   else random.uniform(0, ms / 3000) if mode == "watchdog" else 0)
        tell(proxy, "cut")
        if readline(proxy, 10) != "ok":
            raise RuntimeError("the proxy did not cut")
        cut = time.monotonic()
        tell(holder, "cut")

        sel = selectors.DefaultSelector()
        for i, s in enumerate(waiters):
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ, i)
        replies, granted = [b""] * keys, [None] * keys
        give_up = cut + 3 * ms / 1000 + 10
        while None in granted and time.monotonic() < give_up:
            events = sel.select(0.5)
            # The moment epoll said the reply was there: taken before any of them is read.
            now = time.monotonic()
            for key, _ in events:
                i = key.data
                replies[i] += key.fileobj.recv(4096)
                if replies[i].endswith(b"\r\n") and granted[i] is None:
                    if not replies[i].startswith(b":"):
                        raise RuntimeError(f"waiter {i} was answered {replies[i]!r}")
                    granted[i] = now
                    sel.unregister(key.fileobj)
        sel.close()
        time.sleep(REPORT_GRACE)
        tell(holder, "report")
        report = json.loads(readline(holder, 30))
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
        proxy.kill()
        proxy.wait()
        for s in waiters:
            s.close()
    trials = []
    for i in range(keys):
        key = f"{prefix}:{i}"
        loss, reason = report["lost"].get(key, (None, None))
        trials.append((granted[i], loss, reason, report.get("deadline", {}).get(key), cut))
    return trials


def quantile(samples, q):
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    port, client = int(sys.argv[1]), sys.argv[2]
    holder_cmd = sys.argv[sys.argv.index("--") + 1:]
    admin = redis.Redis(port=port)
    for n, config in enumerate(CONFIGS.split()):
        mode, ms, shape = config.split(":")
        runs, keys = (int(x) for x in shape.split("x"))
        trials = []
        for r in range(runs):
            trials += run(port, holder_cmd, mode, int(ms), keys, f"knows:{os.getpid()}:{n}:{r}", admin)
        # grant - loss per trial (ms); a grant first, or a loss never reported, breaks the rule.
        gaps = [(g - l) * 1000 for g, l, _, _, _ in trials if g is not None and l is not None]
        first = sum(1 for g, l, _, _, _ in trials if g is not None and (l is None or g <= l))
        ungranted = sum(1 for g, *_ in trials if g is None)
        late = [(l - d) * 1000 for _, l, _, d, _ in trials if l is not None and d is not None]
        reasons = {}
        for _, _, why, _, _ in trials:
            reasons[why or "not reported"] = reasons.get(why or "not reported", 0) + 1
        notes = ", ".join(f"{why} {count}" for why, count in sorted(reasons.items()))
        early = sum(1 for _, l, _, _, c in trials if l is not None and l < c)
        if early:
            notes += f"; {early} lost before the cut"
        if ungranted:
            notes += f"; {ungranted} waiters never granted"
        kind = {"session": "session grant, T", "lease": "fixed lease", "watchdog": "watchdog lease"}[mode]
        ms_text = f"{int(ms) / 1000:g} s" if int(ms) >= 1000 else f"{ms} ms"
        stats = (f"{min(gaps):.1f} | {statistics.median(gaps):.1f} | {quantile(gaps, 0.99):.1f}"
                 if gaps else "- | - | -")
        late_text = f"{quantile(late, 0.99):.1f}" if late else "not exposed"
        print(f"| {client} | {kind} {ms_text} | {runs} x {keys} | {len(trials)} | {stats} | {first} "
              f"| {late_text} | {notes} |", flush=True)


if __name__ == "__main__":
    main()
