"""A Jepsen-style run (issue 31). Four client processes take turns on one
FLOCK lock (a fixed lease, redis_flock.Lock, on a master that Sentinel
watches with two replicas) and increment a counter kept in three stores at
once: a Redis key written through FLOCK.FENCED (acknowledged once both
replicas have it: `WAIT 2`), and a row in SQLite and in PostgreSQL written by
docs/fencing.md's recipe (the fence kept with the row). Each reads the
value, sometimes pauses past its lease (as a GC pause would), and writes
value + 1. A nemesis meanwhile stops clients past their lease (SIGSTOP),
kills them (a new one takes the place), cuts them off behind
scripts/partition-proxy.py (no FIN, no RST), fails the master over
(SENTINEL FAILOVER), and steps the servers' wall clock to anywhere within an
hour of the real one, either way (libfaketime, on the redis-server processes
only; not on a server that links jemalloc as a shared library, Debian's 7.0,
which hangs under it). Each client writes
its history; the checker reads it: with fencing, no acknowledged increment
is lost and no write with a stale token is accepted (the accepted writes'
tokens rise with the values they wrote); the same run with plain writes
loses updates, so the nemesis is known to bite.

JEPSEN_SECONDS (default 12) is each run's length; `make jepsen` runs longer
and prints the table (docs/guarantees.md has its figures).

Run as a script, this file is one client: test_jepsen starts four."""

import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import redis
from redis.sentinel import Sentinel
from redis_flock import Lock, StaleTokenError

REPO = Path(__file__).resolve().parents[3]
SECONDS = float(os.environ.get("JEPSEN_SECONDS", "12"))
CLIENTS = 4
LEASE_MS = 300
# A client pauses between its read and its write on one operation in this
# many, for twice its lease: the next holder gets the lock meanwhile.
PAUSE_EVERY = 5
KEY, LOCK = "jepsen:counter", "jepsen:lock"
STORES = ("redis", "sqlite", "postgres")
# docs/fencing.md's recipe: a read claims the row (raises its fence), a write
# checks the fence; without fencing, a SELECT and a plain UPDATE.
SQL_READ = {True: "UPDATE counter SET fence = :token WHERE id = 1 AND fence <= :token RETURNING value",
            False: "SELECT value FROM counter WHERE id = 1"}
SQL_WRITE = {True: "UPDATE counter SET value = :value, fence = :token WHERE id = 1 AND fence <= :token",
             False: "UPDATE counter SET value = :value WHERE id = 1"}


def pg_style(sql):
    return sql.replace(":value", "%(value)s").replace(":token", "%(token)s")


class Refused(Exception):
    """A fenced read or write the store refused: the token is stale."""


# ---- One client (this file run as a script) --------------------------------


class Proxied(Sentinel):
    """Sentinel's master, reached through this client's proxy to it."""

    def __init__(self, sentinels, proxies):
        super().__init__(sentinels, socket_timeout=1)
        self.proxies = proxies

    def discover_master(self, service_name):
        host, port = super().discover_master(service_name)
        return host, self.proxies[str(port)]


def client(number, fenced, cfg):
    import sqlite3

    import psycopg

    sentinel = Proxied([("127.0.0.1", p) for p in cfg["sentinels"]], cfg["proxies"])
    r = sentinel.master_for("flock", socket_timeout=2, socket_connect_timeout=2)
    pg_port, sqlite_path, history, stop_at = cfg["pg_port"], cfg["sqlite"], cfg["history"], cfg["stop_at"]
    lock = Lock(r, LOCK, timeout=LEASE_MS / 1000, blocking_timeout=1)
    sql = sqlite3.connect(sqlite_path, timeout=30, isolation_level=None)
    pg = psycopg.connect(host="127.0.0.1", port=pg_port, user="flock", dbname="postgres", autocommit=True)
    read_sql, update = SQL_READ[fenced], SQL_WRITE[fenced]

    def one(row):
        if row is None:
            raise Refused()
        return row[0]

    reads = {
        "redis": lambda token: int(r.get(KEY) or 0),
        "sqlite": lambda token: one(sql.execute(read_sql, {"token": token}).fetchone()),
        "postgres": lambda token: one(pg.execute(pg_style(read_sql), {"token": token}).fetchone()),
    }

    def write_redis(value, token):
        if not fenced:
            r.set(KEY, value)
        else:
            try:
                lock.fenced("SET", KEY, value)
            except StaleTokenError:
                return "refused"
        # Applied, but a failover may still lose it until both replicas have it.
        return "ok" if r.execute_command("WAIT", 2, 1000) >= 2 else "unknown"

    writes = {
        "redis": write_redis,
        "sqlite": lambda value, token: "ok" if sql.execute(update, {"value": value, "token": token}).rowcount else "refused",
        "postgres": lambda value, token: "ok"
        if pg.execute(pg_style(update), {"value": value, "token": token}).rowcount
        else "refused",
    }
    rng = random.Random(number)
    with open(history, "a", buffering=1) as out:
        while time.time() < stop_at:
            try:
                if not lock.acquire():
                    continue
            except Exception:
                time.sleep(0.05)
                continue
            token = lock.fencing_token
            try:
                read = {store: reads[store](token) for store in STORES}
                if rng.randrange(PAUSE_EVERY) == 0:
                    time.sleep(2 * LEASE_MS / 1000)
                for store in STORES:
                    try:
                        result = writes[store](read[store] + 1, token)
                    except Exception:
                        # The reply was lost: applied or not, nobody knows.
                        result = "unknown"
                    out.write(json.dumps({"c": number, "store": store, "wrote": read[store] + 1, "token": token, "result": result}) + "\n")
            except Exception:
                pass
            try:
                lock.release()
            except Exception:
                pass


# ---- The run ------------------------------------------------------------------


class Proxy:
    def __init__(self, port):
        self.p = subprocess.Popen(
            [sys.executable, str(REPO / "scripts/partition-proxy.py"), f"127.0.0.1:{port}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        self.port = int(self.p.stdout.readline())

    def say(self, what):
        self.p.stdin.write(what + "\n")
        self.p.stdin.flush()
        assert self.p.stdout.readline().strip() == "ok"

    def close(self):
        try:
            self.say("quit")
        except (OSError, AssertionError):
            pass
        self.p.wait(timeout=10)


def faked_clock(tmp, program):
    """The environment that runs ``program`` under libfaketime with its wall
    clock offset by what the returned file says (seconds), or (None, None)
    where it cannot run so."""
    lib = glob.glob("/usr/lib/*/faketime/libfaketime.so.1")
    linked = subprocess.run(["ldd", shutil.which(program) or program], capture_output=True, text=True).stdout
    if not lib or "libjemalloc" in linked:
        return None, None
    offset = tmp / "clock-offset"
    offset.write_text("+0")
    return {"LD_PRELOAD": lib[0], "FAKETIME_TIMESTAMP_FILE": str(offset), "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1"}, offset


def run(fenced, setup, pg, tmp, clock=None):
    """One run: the clients and the nemesis for SECONDS; the history's check,
    by store. ``clock``: the file that offsets the servers' wall clock, for
    the nemesis to step."""
    sentinel = Sentinel(setup.sentinel_addresses(), socket_timeout=1)
    r = sentinel.master_for("flock", socket_timeout=5)
    r.delete(KEY, LOCK)
    sqlite_path = str(tmp / f"jepsen-{fenced}.db")
    import sqlite3

    db = sqlite3.connect(sqlite_path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    for conn in (db, pg.db):
        conn.execute("DROP TABLE IF EXISTS counter")
        conn.execute("CREATE TABLE counter (id INT PRIMARY KEY, value BIGINT NOT NULL, fence BIGINT NOT NULL)")
        conn.execute("INSERT INTO counter VALUES (1, 0, 0)")
    history = tmp / f"history-{fenced}"
    history.mkdir()
    # A proxy per client and server: a cut cuts the client off every server.
    proxies = [{s.port: Proxy(s.port) for s in setup.data} for _ in range(CLIENTS)]
    stop_at = time.time() + SECONDS

    def start(n):
        cfg = {"sentinels": [p for _, p in setup.sentinel_addresses()],
               "proxies": {str(port): proxy.port for port, proxy in proxies[n].items()},
               "pg_port": pg.port, "sqlite": sqlite_path, "history": str(history / f"{n}.jsonl"), "stop_at": stop_at}
        # Its log (the client's loss warnings, a crash) beside its history.
        with open(history / f"{n}.log", "a") as log:
            return subprocess.Popen(
                [sys.executable, __file__, str(n), str(int(fenced)), json.dumps(cfg)],
                env={**os.environ, "PYTHONPATH": str(REPO / "clients/python/src")},
                stderr=log,
            )

    clients = [start(n) for n in range(CLIENTS)]
    faults = {"pause": 0, "kill": 0, "cut": 0, "failover": 0, **({"step": 0} if clock else {})}
    rng = random.Random(7)
    try:
        while time.time() < stop_at - 1:
            time.sleep(rng.uniform(0.3, 1.0))
            n, fault = rng.randrange(CLIENTS), rng.choice(list(faults))
            faults[fault] += 1
            if fault == "pause":
                clients[n].send_signal(signal.SIGSTOP)
                time.sleep(2 * LEASE_MS / 1000)
                clients[n].send_signal(signal.SIGCONT)
            elif fault == "step":
                clock.write_text(f"{rng.randint(-3600, 3600):+d}")
            elif fault == "failover":
                # One at a time: counted only if the sentinels take it on.
                faults[fault] -= not failover(setup)
            elif fault == "kill":
                clients[n].kill()
                clients[n].wait()
                clients[n] = start(n)
            else:
                for proxy in proxies[n].values():
                    proxy.say("cut")
                time.sleep(2 * LEASE_MS / 1000)
                for proxy in proxies[n].values():
                    proxy.say("heal")
        for c in clients:
            c.wait(timeout=60)
    finally:
        for c in clients:
            c.kill()
        for client_proxies in proxies:
            for p in client_proxies.values():
                p.close()
        if clock:
            clock.write_text("+0")
    # The last failover done (the counter read from the master that has the last word).
    wait_until_settled(setup)
    finals = {
        "redis": int(r.get(KEY) or 0),
        "sqlite": db.execute("SELECT value FROM counter").fetchone()[0],
        "postgres": pg.db.execute("SELECT value FROM counter").fetchone()[0],
    }
    records = []
    for f in history.glob("*.jsonl"):
        for line in f.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                pass  # the last line of a killed client
    return {store: check([x for x in records if x["store"] == store], finals[store]) for store in STORES}, faults


def failover(setup):
    """Starts a failover if the last one is done; whether it started."""
    if not setup._settled():
        return False
    try:
        with redis.Redis(port=setup.sentinels[0].port, socket_timeout=2) as c:
            c.execute_command("SENTINEL", "FAILOVER", setup.NAME)
        return True
    except redis.RedisError:
        return False  # NOGOODSLAVE, INPROG: the sentinels are not ready


def wait_until_settled(setup):
    from conftest import wait_until

    wait_until(lambda: setup.master_port() is not None and setup._settled(), timeout=60,
               what="the last failover to settle")


def check(records, final):
    """Lost updates: acknowledged increments that the final value does not
    hold (two acknowledged writes of one value, or one above the final
    value). Stale writes: accepted writes whose token is below one accepted
    before it, in the order the values say."""
    acks = sorted((x for x in records if x["result"] == "ok"), key=lambda x: x["wrote"])
    values = [x["wrote"] for x in acks]
    lost = len(values) - len(set(values)) + sum(1 for v in set(values) if v > final)
    stale, highest = 0, 0
    for x in acks:
        if x["token"] <= highest:
            stale += 1
        highest = max(highest, x["token"])
    count = lambda result: sum(1 for x in records if x["result"] == result)  # noqa: E731
    return {"ops": len(records), "ok": count("ok"), "refused": count("refused"), "unknown": count("unknown"),
            "final": final, "lost": lost, "stale": stale}


def test_with_fencing_no_update_is_lost_and_without_it_the_nemesis_loses_some(tmp_path):
    import postgres
    from conftest import SERVER, SentinelSetup

    env, clock = faked_clock(tmp_path, SERVER)
    if not clock:
        print(f"\n{SERVER} hangs under libfaketime: no wall-clock steps in this run")
    setup = SentinelSetup(env=env)
    pg = postgres.Postgres()
    try:
        rows = []
        for fenced in (True, False):
            checked, faults = run(fenced, setup, pg, tmp_path, clock)
            for store, c in checked.items():
                rows.append((fenced, store, c, faults))
        steps = sum(int(redis.Redis(port=s.port).info("flock")["flock_clock_steps"]) for s in setup.data)
    finally:
        pg.close()
        setup.stop()
    if clock:
        assert steps > 0, "the server saw none of the nemesis's clock steps"
    print()
    print(f"| writes | store | seconds | operations | acknowledged | refused (stale) | unknown | final | lost updates | stale accepted | faults |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for fenced, store, c, faults in rows:
        print(f"| {'fenced' if fenced else 'plain'} | {store} | {SECONDS:.0f} | {c['ops']} | {c['ok']} | {c['refused']} | {c['unknown']} "
              f"| {c['final']} | {c['lost']} | {c['stale']} | {', '.join(f'{k} {v}' for k, v in faults.items())} |")
    for fenced, store, c, _ in rows:
        assert c["ok"] > 0, (store, c)
        if fenced:
            assert (c["lost"], c["stale"]) == (0, 0), f"fenced {store}: {c}"
        else:
            assert c["lost"] > 0, f"plain {store}: the nemesis lost no update, so it is not known to bite: {c}"


if __name__ == "__main__":
    number, fenced, cfg = sys.argv[1:]
    client(int(number), fenced == "1", json.loads(cfg))
