"""A fleet in the middle of its move to FLOCK: processes of redis-py's own
Lock (SET NX PX, polled, released by compare-and-delete) and of the FLOCK
clients (Python, Node, Java) take the same keys at once, under contention.
Never two holders, no WRONGTYPE, and a FLOCK waiter is granted when a legacy
holder lets go (how long after is measured, in target/mixed-fleet-*.md).

Every worker (tests/fleet/) logs each request, grant and release through one
script that appends to a list with the server's clock, so the test replays
the fleet's history in the order the server saw it. Once that history shows
every process granted (the JVM takes seconds to start), the whole fleet runs
for SECONDS, and on until a FLOCK waiter was granted right after a legacy
release (the polling legacy processes win a key a few times a second between
the FLOCK grants): the test then tells the workers to stop, through the
script's answer."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import redis

from conftest import REPO, Server
from helpers import wait_until

FLEET = Path(__file__).resolve().parent / "fleet"
KEYS = ["fleet:orders:1", "fleet:orders:2"]
# About a thousand grants in the normal run; FLOCK_SOAK=1 runs the full
# scale, FLOCK_SOAK_SECS (6 s by default).
SECONDS = float(os.environ.get("FLOCK_SOAK_SECS", 6)) if os.environ.get("FLOCK_SOAK") == "1" else 2.0
# A worker stops by itself this long after its start whatever happened.
LIMIT = SECONDS + 60
LOG = """
local t = redis.call('TIME')
redis.call('RPUSH', KEYS[1], ARGV[1] .. ' ' .. t[1] .. string.format('%06d', tonumber(t[2])))
redis.call('INCRBY', KEYS[2], ARGV[2])
return redis.call('EXISTS', KEYS[3])
"""


def java_worker() -> list:
    """The command of the Java worker: FleetWorker compiled once per version
    of it and of the client's jar, into target/fleet-classes (the source
    launcher compiles it at every start: 2-3 s)."""
    jar = REPO / "clients/java/build/flock-client.jar"
    if not jar.is_file():
        subprocess.run([str(REPO / "clients/java/build.sh"), "jar"], cwd=REPO / "clients/java", check=True)
    source = FLEET / "FleetWorker.java"
    classes = REPO / "target/fleet-classes" / hashlib.sha256(source.read_bytes() + jar.read_bytes()).hexdigest()[:16]
    if not classes.is_dir():
        classes.parent.mkdir(parents=True, exist_ok=True)
        compiled = Path(tempfile.mkdtemp(dir=classes.parent))
        subprocess.run(["javac", "-cp", str(jar), "-d", str(compiled), str(source)], check=True)
        try:
            compiled.rename(classes)
        except OSError:  # compiled meanwhile by another run
            shutil.rmtree(compiled)
    return ["java", "-cp", f"{jar}{os.pathsep}{classes}", "FleetWorker"]


def workers(port: int, sha: str):
    common = [str(port), sha, str(LIMIT)]
    python = [sys.executable, str(FLEET / "worker.py")]
    node_modules = REPO / "clients/node/node_modules"
    assert node_modules.is_dir(), "the Node client's dependencies are missing: make deps-node"
    commands = [
        [*python, "legacy", *common, *KEYS],
        [*python, "legacy", *common, *KEYS],
        [*python, "flock", *common, *KEYS],
        [*python, "flock", *common, *KEYS],
        ["node", str(FLEET / "worker.js"), *common, "4", *KEYS],
        [*java_worker(), *common, "4", *KEYS],
    ]
    env = dict(os.environ, NODE_PATH=str(node_modules))
    return [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for c in commands]


class History:
    """The fleet's history replayed as it grows: overlaps, grants per side,
    the processes granted, and for each FLOCK grant that came right after a
    legacy release to a waiter already waiting then, the time between them
    (microseconds, by the server's clock)."""

    def __init__(self, r):
        self.r, self.read = r, 0
        self.holding, self.last_release, self.requested = Counter(), {}, {}
        self.overlaps, self.grants, self.granted, self.after_legacy = 0, Counter(), set(), []

    def replay(self):
        """Replays the events logged since the last call."""
        events = self.r.lrange("fleet:events", self.read, -1)
        self.read += len(events)
        for line in events:
            key, side, who, what, at = line.decode().split()
            at = int(at)
            if what == "req":
                self.requested[who] = at
            elif what == "acq":
                self.holding[key] += 1
                self.overlaps += self.holding[key] > 1
                self.grants[side] += 1
                self.granted.add(who)
                released = self.last_release.pop(key, None)
                if side == "flock" and released and released[0] == "legacy" and self.requested[who] < released[1]:
                    self.after_legacy.append(at - released[1])
            elif what == "rel":
                self.holding[key] -= 1
                self.last_release[key] = (side, at)


def finish(p) -> dict:
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, f"{p.args}: exit {p.returncode}\n{err}"
    return json.loads(out.strip().splitlines()[-1])


def server_name(r) -> str:
    info = r.info("server")
    name = info.get("server_name", "redis")
    return f"{name} {info.get(f'{name}_version', info['redis_version'])}"


def test_legacy_and_flock_processes_share_the_keys_without_overlap_or_wrongtype():
    server = Server()
    try:
        r = redis.Redis(port=server.port)
        sha = r.script_load(LOG)
        procs = workers(server.port, sha)
        history, everyone_in = History(r), []

        def shown() -> bool:
            history.replay()
            if any(p.poll() is not None for p in procs):
                return True  # a worker ended early: its exit says why
            if not everyone_in and len(history.granted) == len(procs):
                everyone_in.append(time.monotonic())
            return bool(everyone_in) and time.monotonic() - everyone_in[0] >= SECONDS and bool(history.after_legacy)

        try:
            wait_until(shown, timeout=LIMIT,
                       what="every process to be granted and a FLOCK grant right after a legacy release")
        finally:
            r.set("fleet:stop", 1)
            results = [finish(p) for p in procs]
        ran = time.monotonic() - everyone_in[0] if everyone_in else 0.0
        history.replay()
        overlaps, grants, after_legacy = history.overlaps, history.grants, history.after_legacy
        table = ["| process | grants | timeouts | WRONGTYPE |", "|---|---:|---:|---:|"]
        table += [f"| {w['side']} | {w['grants']:,} | {w['timeouts']} | {w['wrongtype']} |" for w in results]
        longest = max(after_legacy, default=0)
        summary = (
            f"{server_name(r)}, keys {', '.join(KEYS)}, {ran:.1f} s of the whole fleet: {grants['legacy']:,} legacy grants, "
            f"{grants['flock']:,} FLOCK grants, {overlaps} overlaps; {len(after_legacy)} FLOCK waiters granted "
            f"right after a legacy release, the longest {longest / 1000:.2f} ms after it"
        )
        report = "\n".join([summary, "", *table, ""])
        print(report)
        out_dir = REPO / "target"
        out_dir.mkdir(exist_ok=True)
        (out_dir / f"mixed-fleet-{server_name(r).replace(' ', '-')}.md").write_text(report)
        assert all(not w["errors"] for w in results), results
        assert sum(w["wrongtype"] for w in results) == 0, results
        assert overlaps == 0, report
        assert r.get(f"fleet:occupancy:{KEYS[0]}") in (b"0", None) and r.get(f"fleet:occupancy:{KEYS[1]}") in (b"0", None)
        assert all(w["grants"] > 0 for w in results), report
        assert after_legacy, f"no FLOCK waiter was granted after a legacy release: {report}"
    finally:
        server.stop()
