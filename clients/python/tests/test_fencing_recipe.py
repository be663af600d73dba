"""docs/fencing.md's recipe for data outside Redis, run as the page shows it: the
token kept with the row, every write conditional on it. Against SQLite (the
standard library's) and a real PostgreSQL (Debian's package) that this module
starts on a free port, as the tests start redis-server."""

import re
from pathlib import Path

import postgres
import pytest
import redis

from redis_flock import Lock

DOC = Path(__file__).resolve().parents[3] / "docs" / "fencing.md"


def statements():
    """The page's SQL blocks, in order: CREATE, the claim (a read that raises
    the fence), UPDATE, INSERT ... ON CONFLICT."""
    blocks = re.findall(r"```sql\n(.*?)```", DOC.read_text(), re.S)
    create, claim, update, upsert = (" ".join(block.split()) for block in blocks)
    assert create.startswith("CREATE") and "RETURNING" in claim and update.startswith("UPDATE")
    assert upsert.startswith("INSERT")
    return create, claim, update, upsert


class Sqlite:
    def __init__(self):
        import sqlite3

        # Autocommit: each statement commits as it ends (a claim's once its row is read).
        self.db = sqlite3.connect(":memory:", isolation_level=None)

    def run(self, sql, params=None):
        return self.db.execute(sql, params or {})

    def close(self):
        self.db.close()


class Postgres(postgres.Postgres):
    def run(self, sql, params=None):
        # The page's named parameters (:name) in psycopg's style (%(name)s).
        return self.db.execute(re.sub(r"(?<!:):(\w+)", r"%(\1)s", sql), params or {})


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request):
    store = Sqlite() if request.param == "sqlite" else Postgres()
    yield store
    store.close()


def test_a_late_holders_writes_change_nothing_once_the_next_holder_claimed_the_row(db, server):
    r = redis.Redis(port=server.port)
    create, claim, update, upsert = statements()
    db.run(create)
    # No session: nothing tells the first holder that its grant was force-released.
    first = Lock(r, "recipe:account:42", timeout=30, use_session=False)
    assert first.acquire(blocking=False)
    early = first.fencing_token
    assert db.run(upsert, {"id": "42", "balance": 100, "token": early}).rowcount == 1, "the insert"
    assert tuple(db.run(claim, {"id": "42", "token": early}).fetchone()) == (100,), "the same grant reads"
    assert db.run(update, {"id": "42", "balance": 90, "token": early}).rowcount == 1, "and writes again"

    # The first holder pauses past its grant; the next holder is granted and
    # claims the row as it reads it, before writing anything.
    assert r.execute_command("FLOCK.FORCERELEASE", "recipe:account:42") == 1
    second = Lock(r, "recipe:account:42", timeout=30, use_session=False)
    assert second.acquire(blocking=False)
    late = second.fencing_token
    assert late > early
    assert tuple(db.run(claim, {"id": "42", "token": late}).fetchone()) == (90,)

    # The first holder wakes up: its reads and writes are refused, so the
    # second holder's write, from what it read, loses nothing.
    assert db.run(update, {"id": "42", "balance": 999, "token": early}).rowcount == 0, "a late update"
    assert db.run(upsert, {"id": "42", "balance": 999, "token": early}).rowcount == 0, "a late insert"
    assert db.run(claim, {"id": "42", "token": early}).fetchone() is None, "a late read"
    assert db.run(update, {"id": "42", "balance": 80, "token": late}).rowcount == 1
    row = db.run("SELECT balance, fence FROM accounts WHERE id = '42'").fetchone()
    assert tuple(row) == (80, late)
    second.release()
    r.close()
