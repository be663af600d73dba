"""The README's examples are examples/*.py, verbatim, and they run."""

import subprocess
import sys
from pathlib import Path

import pytest
import redis

HERE = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((HERE / "examples").glob("*.py"))


def run(example, server):
    done = subprocess.run(
        [sys.executable, str(example), f"redis://127.0.0.1:{server.port}"],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_readme_shows_the_example(example):
    readme = (HERE / "README.md").read_text()
    assert f"```python\n{example.read_text()}```" in readme


def test_quickstart_runs(server):
    lines = run(HERE / "examples" / "quickstart.py", server)
    assert lines[0].startswith("holding orders:42, fencing token ") and lines[0].endswith("lost: False")
    first = int(lines[0].split("fencing token ")[1].split(",")[0])
    second = int(lines[1].split("fencing token ")[1].split(",")[0])
    assert second > first and lines[1].endswith("owned: True")


def test_multilock_runs(server):
    lines = run(HERE / "examples" / "multilock.py", server)
    head, tokens = lines[0].split(", fencing tokens ")
    assert head == "holding ['{bank}:account:1', '{bank}:account:2']"
    first, second = (int(token) for token in tokens.strip("[]").split(", "))
    assert first > 0 and second > 0 and first != second


def test_quickstart_writes_its_row_through_the_lock(server):
    run(HERE / "examples" / "quickstart.py", server)
    assert redis.Redis(port=server.port).hget("orders:42:row", "status") == b"paid"
