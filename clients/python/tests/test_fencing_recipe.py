"""docs/fencing.md's recipe for data outside Redis, run as the page shows it: the
token kept with the row, every write conditional on it. Against SQLite (the
standard library's) and a real PostgreSQL (Debian's package) that this module
starts on a free port, as the tests start redis-server."""

import glob
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import redis

from redis_flock import Lock

DOC = Path(__file__).resolve().parents[3] / "docs" / "fencing.md"


def statements():
    """The page's SQL blocks, in order: CREATE, UPDATE, INSERT ... ON CONFLICT."""
    blocks = re.findall(r"```sql\n(.*?)```", DOC.read_text(), re.S)
    create, update, upsert = (" ".join(block.split()) for block in blocks)
    assert create.startswith("CREATE") and update.startswith("UPDATE") and upsert.startswith("INSERT")
    return create, update, upsert


class Sqlite:
    def __init__(self):
        import sqlite3

        self.db = sqlite3.connect(":memory:")

    def run(self, sql, params=None):
        cursor = self.db.execute(sql, params or {})
        self.db.commit()
        return cursor

    def close(self):
        self.db.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Postgres:
    """A PostgreSQL server of its own in a temporary directory: initdb, then
    postgres on a free loopback port, trust authentication. As root (CI),
    the server runs as the package's `postgres` user, which it requires."""

    def __init__(self):
        import psycopg

        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if not found:
            pytest.fail("PostgreSQL is not installed: `make deps-python` installs Debian's postgresql")
        bin_dir = Path(found[-1]).parent
        self.dir = tempfile.mkdtemp(prefix="flock-pg-")
        as_user = []
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")
            as_user = ["runuser", "-u", "postgres", "--"]
        data = os.path.join(self.dir, "data")
        subprocess.run(
            [*as_user, bin_dir / "initdb", "-D", data, "--auth=trust", "-U", "flock"],
            check=True, capture_output=True,
        )
        self.port = free_port()
        self.server = subprocess.Popen(
            [*as_user, bin_dir / "postgres", "-D", data, "-p", str(self.port), "-k", self.dir,
             "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                self.db = psycopg.connect(host="127.0.0.1", port=self.port, user="flock", dbname="postgres", autocommit=True)
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline or self.server.poll() is not None:
                    raise
                time.sleep(0.05)

    def run(self, sql, params=None):
        # The page's named parameters (:name) in psycopg's style (%(name)s).
        return self.db.execute(re.sub(r"(?<!:):(\w+)", r"%(\1)s", sql), params or {})

    def close(self):
        self.db.close()
        self.server.terminate()
        self.server.wait(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request):
    store = Sqlite() if request.param == "sqlite" else Postgres()
    yield store
    store.close()


def test_a_late_holders_writes_change_nothing_once_the_next_holder_wrote(db, server):
    r = redis.Redis(port=server.port)
    create, update, upsert = statements()
    db.run(create)
    # No session: nothing tells the first holder that its grant was force-released.
    first = Lock(r, "recipe:account:42", timeout=30, use_session=False)
    assert first.acquire(blocking=False)
    early = first.fencing_token
    assert db.run(upsert, {"id": "42", "balance": 100, "token": early}).rowcount == 1, "the insert"
    assert db.run(update, {"id": "42", "balance": 90, "token": early}).rowcount == 1, "the same grant writes again"

    # The first holder pauses past its grant; the next holder is granted and writes.
    assert r.execute_command("FLOCK.FORCERELEASE", "recipe:account:42") == 1
    second = Lock(r, "recipe:account:42", timeout=30, use_session=False)
    assert second.acquire(blocking=False)
    assert second.fencing_token > early
    assert db.run(update, {"id": "42", "balance": 50, "token": second.fencing_token}).rowcount == 1

    # The first holder wakes up and writes: both forms are refused.
    assert db.run(update, {"id": "42", "balance": 999, "token": early}).rowcount == 0, "a late update"
    assert db.run(upsert, {"id": "42", "balance": 999, "token": early}).rowcount == 0, "a late insert"
    row = db.run("SELECT balance, fence FROM accounts WHERE id = '42'").fetchone()
    assert tuple(row) == (50, second.fencing_token)
    second.release()
    r.close()
