"""The README's example is examples/quickstart.py, verbatim, and it runs."""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
EXAMPLE = HERE / "examples" / "quickstart.py"


def test_readme_shows_the_example():
    readme = (HERE / "README.md").read_text()
    assert f"```python\n{EXAMPLE.read_text()}```" in readme


def test_example_runs(server):
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), f"redis://127.0.0.1:{server.port}"],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("holding orders:42, fencing token ") and lines[0].endswith("lost: False")
    first = int(lines[0].split("fencing token ")[1].split(",")[0])
    second = int(lines[1].split("fencing token ")[1].split(",")[0])
    assert second > first and lines[1].endswith("owned: True")
