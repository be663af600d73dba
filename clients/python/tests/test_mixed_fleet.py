"""A fleet in the middle of its move to FLOCK: processes of redis-py's own
Lock (SET NX PX, polled, released by compare-and-delete) and of the FLOCK
clients (Python, Node, Java) take the same keys at once, under contention.
Never two holders, no WRONGTYPE, and a FLOCK waiter is granted when a legacy
holder lets go (how long after is measured, in target/mixed-fleet-*.md).

Every worker (tests/fleet/) logs each request, grant and release through one
script that appends to a list with the server's clock, so the test replays
the fleet's history in the order the server saw it."""

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import redis

from conftest import REPO, Server

FLEET = Path(__file__).resolve().parent / "fleet"
KEYS = ["fleet:orders:1", "fleet:orders:2"]
SECONDS = 6
LOG = """
local t = redis.call('TIME')
redis.call('RPUSH', KEYS[1], ARGV[1] .. ' ' .. t[1] .. string.format('%06d', tonumber(t[2])))
return redis.call('INCRBY', KEYS[2], ARGV[2])
"""


def java_jar() -> Path:
    jar = REPO / "clients/java/build/flock-client.jar"
    if not jar.is_file():
        subprocess.run([str(REPO / "clients/java/build.sh"), "jar"], cwd=REPO / "clients/java", check=True)
    return jar


def workers(port: int, sha: str):
    common = [str(port), sha, str(SECONDS)]
    python = [sys.executable, str(FLEET / "worker.py")]
    node_modules = REPO / "clients/node/node_modules"
    assert node_modules.is_dir(), "the Node client's dependencies are missing: make deps-node"
    commands = [
        [*python, "legacy", *common, *KEYS],
        [*python, "legacy", *common, *KEYS],
        [*python, "flock", *common, *KEYS],
        [*python, "flock", *common, *KEYS],
        ["node", str(FLEET / "worker.js"), *common, "4", *KEYS],
        ["java", "-cp", str(java_jar()), str(FLEET / "FleetWorker.java"), *common, "4", *KEYS],
    ]
    env = dict(os.environ, NODE_PATH=str(node_modules))
    return [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for c in commands]


def replay(events):
    """Overlaps, grants per side, and for each FLOCK grant that came right
    after a legacy release to a waiter already waiting then, the time
    between them (microseconds, by the server's clock)."""
    holding, last_release, requested = Counter(), {}, {}
    overlaps, grants, after_legacy = 0, Counter(), []
    for line in events:
        key, side, who, what, at = line.decode().split()
        at = int(at)
        if what == "req":
            requested[who] = at
        elif what == "acq":
            holding[key] += 1
            overlaps += holding[key] > 1
            grants[side] += 1
            released = last_release.pop(key, None)
            if side == "flock" and released and released[0] == "legacy" and requested[who] < released[1]:
                after_legacy.append(at - released[1])
        elif what == "rel":
            holding[key] -= 1
            last_release[key] = (side, at)
    return overlaps, grants, after_legacy


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
        results = []
        for p in procs:
            out, err = p.communicate(timeout=SECONDS + 120)
            assert p.returncode == 0, f"{p.args}: exit {p.returncode}\n{err}"
            results.append(json.loads(out.strip().splitlines()[-1]))
        overlaps, grants, after_legacy = replay(r.lrange("fleet:events", 0, -1))
        table = ["| process | grants | timeouts | WRONGTYPE |", "|---|---:|---:|---:|"]
        table += [f"| {w['side']} | {w['grants']:,} | {w['timeouts']} | {w['wrongtype']} |" for w in results]
        longest = max(after_legacy, default=0)
        summary = (
            f"{server_name(r)}, keys {', '.join(KEYS)}, {SECONDS} s: {grants['legacy']:,} legacy grants, "
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
