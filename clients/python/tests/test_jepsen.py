"""A Jepsen-style run (issue 31). Four client processes take turns on one
FLOCK lock (a fixed lease, redis_flock.Lock) and increment a counter kept in
three stores at once: a Redis key written through FLOCK.FENCED, and a row in
SQLite and in PostgreSQL written by docs/fencing.md's recipe (the fence kept
with the row). Each reads the value, sometimes pauses past its lease (as a GC
pause would), and writes value + 1. A nemesis meanwhile stops clients past
their lease (SIGSTOP), kills them (a new one takes the place), and cuts them
off behind scripts/partition-proxy.py (no FIN, no RST). Each client writes
its history; the checker reads it: with fencing, no acknowledged increment
is lost and no write with a stale token is accepted (the accepted writes'
tokens rise with the values they wrote); the same run with plain writes
loses updates, so the nemesis is known to bite.

JEPSEN_SECONDS (default 12) is each run's length; `make jepsen` runs longer
and prints the table (docs/guarantees.md has its figures). Not covered here
yet: wall-clock steps and a failover.

Run as a script, this file is one client: test_jepsen starts four."""

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import redis
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


def client(number, fenced, port, pg_port, sqlite_path, history, stop_at):
    import sqlite3

    import psycopg

    r = redis.Redis(port=port, socket_timeout=2, socket_connect_timeout=2)
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
            return "ok"
        try:
            lock.fenced("SET", KEY, value)
            return "ok"
        except StaleTokenError:
            return "refused"

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


def run(fenced, server, pg, tmp):
    """One run: the clients and the nemesis for SECONDS; the history's check, by store."""
    r = redis.Redis(port=server.port)
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
    proxies = [Proxy(server.port) for _ in range(CLIENTS)]
    stop_at = time.time() + SECONDS

    def start(n):
        # Its log (the client's loss warnings, a crash) beside its history.
        with open(history / f"{n}.log", "a") as log:
            return subprocess.Popen(
                [sys.executable, __file__, str(n), str(int(fenced)), str(proxies[n].port), str(pg.port), sqlite_path,
                 str(history / f"{n}.jsonl"), str(stop_at)],
                env={**os.environ, "PYTHONPATH": str(REPO / "clients/python/src")},
                stderr=log,
            )

    clients = [start(n) for n in range(CLIENTS)]
    faults = {"pause": 0, "kill": 0, "cut": 0}
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
            elif fault == "kill":
                clients[n].kill()
                clients[n].wait()
                clients[n] = start(n)
            else:
                proxies[n].say("cut")
                time.sleep(2 * LEASE_MS / 1000)
                proxies[n].say("heal")
        for c in clients:
            c.wait(timeout=60)
    finally:
        for c in clients:
            c.kill()
        for p in proxies:
            p.close()
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


def test_with_fencing_no_update_is_lost_and_without_it_the_nemesis_loses_some(server, tmp_path):
    import postgres

    pg = postgres.Postgres()
    try:
        rows = []
        for fenced in (True, False):
            checked, faults = run(fenced, server, pg, tmp_path)
            for store, c in checked.items():
                rows.append((fenced, store, c, faults))
    finally:
        pg.close()
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
    number, fenced, port, pg_port, sqlite_path, history, stop_at = sys.argv[1:]
    client(int(number), fenced == "1", int(port), int(pg_port), sqlite_path, history, float(stop_at))
