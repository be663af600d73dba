"""`redis-flock top` (redis_flock.top) against real servers: ``--once``'s table
checked figure by figure against FLOCK.TOP and INFO flock, on a server, a
Cluster (every master) and a Sentinel master; the live view driven in tmux
(sort, filter, pause, quit), each figure on its screen checked against the
server; one clear line and exit 1 for a dead server or a missing module.

The contention is made by hand: holders with 30 s leases, and waiters that
block in ``FLOCK.ACQUIRE ... WAIT`` on connections of their own; FLUSHALL
ends them all (the waiters are answered)."""

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import redis

import redis_flock
from conftest import Server, free_port
from helpers import info, wait_until
from redis_flock import top

PYTHON_DIR = Path(__file__).resolve().parents[1]
# The child processes run the redis_flock this process imported. Without
# COLUMNS and LINES, which pytest-xdist sets (80x24) and rich obeys over the
# size of tmux's pane.
CHILD_ENV = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
CHILD_ENV["PYTHONPATH"] = os.pathsep.join(
    [str(Path(redis_flock.__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)


class Contention:
    """Holders and queued waiters on one server (``port``), each waiter a
    thread blocked on a connection of its own; ``end()`` (FLUSHALL) answers
    the waiters and joins them."""

    def __init__(self, port: int):
        self.port = port
        self.admin = redis.Redis(port=port)
        self.threads = []
        self.connections = []

    def hold(self, key: str, owner: str, lease_ms: int = 30000):
        assert self.admin.execute_command("FLOCK.ACQUIRE", key, owner, lease_ms) is not None

    def wait(self, key: str, owner: str, timeout_ms: int = 20000):
        """One more waiter for ``key``, seen queued before this returns (so
        that the queue's order, and the oldest wait, are the calls' order)."""
        before = self.waiters(key)
        c = redis.Redis(port=self.port, single_connection_client=True, socket_timeout=timeout_ms / 1000 + 10)
        self.connections.append(c)

        def run():
            try:
                c.execute_command("FLOCK.ACQUIRE", key, owner, 30000, "WAIT", timeout_ms)
            except redis.RedisError:
                pass  # LOCKDELETED at the end, by FLUSHALL

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self.threads.append(thread)
        wait_until(lambda: self.waiters(key) == before + 1, timeout=10, what=f"{owner} to queue for {key}")

    def waiters(self, key: str) -> int:
        fields = info(self.admin, key)
        return 0 if fields is None else fields["waiters"]

    def end(self):
        self.admin.flushall()
        for thread in self.threads:
            thread.join(10)
            assert not thread.is_alive()
        for c in self.connections:
            c.close()
        self.admin.close()


def make_three(contention: Contention, keys=("top:a", "top:b", "top:c")):
    """Three contended locks whose three orders all differ: by waiters a
    (3), b (2), c (1); by wait b, c, a (b's head queued first); by hold c,
    b, a (c granted first). The pauses keep the grants apart on the
    server's millisecond clock."""
    a, b, c = keys
    for key in (c, b, a):
        contention.hold(key, f"holder-{key}")
        time.sleep(0.03)
    contention.wait(b, "wb1")
    contention.wait(c, "wc1")
    contention.wait(a, "wa1")
    contention.wait(a, "wa2")
    contention.wait(b, "wb2")
    contention.wait(a, "wa3")
    return {a: 3, b: 2, c: 1}


def flock_top(c, *args):
    return top.parse_top(c.execute_command("FLOCK.TOP", *args))


def info_flock(c) -> dict:
    return c.info("flock")


def run_top(*args, timeout=30):
    return subprocess.run([sys.executable, "-m", "redis_flock.top", *args], capture_output=True, text=True,
                          timeout=timeout, env=CHILD_ENV, cwd=PYTHON_DIR)


def table_rows(lines, keys):
    """The rows of the locks' table (those that begin with one of ``keys``),
    split on blanks: key, waiters, oldest wait, holder, held, lease, mode[, node]."""
    rows = []
    for line in lines:
        words = line.split()
        if words and words[0] in keys:
            rows.append(words)
    return rows


def summary(text: str) -> dict:
    """The totals line (``grants/s 1.0   waiters 6   contended locks 3 ...``)
    as {label: number}."""
    line = next(line for line in text.splitlines() if line.startswith("grants/s"))
    figures = {}
    for part in line.strip().split("   "):
        label, _, value = part.strip().rpartition(" ")
        figures[label] = None if value == "-" else float(value.replace(",", ""))
    return figures


@pytest.fixture(scope="module")
def top_server():
    """A server of this file's own: INFO's totals are the server's, and
    another file's leftovers ending during a check would move them."""
    s = Server()
    yield s
    s.stop()


@pytest.fixture()
def contention(top_server):
    c = Contention(top_server.port)
    yield c
    c.end()


@pytest.fixture()
def admin(top_server):
    c = redis.Redis(port=top_server.port)
    yield c
    c.close()


def test_parse_top_gives_the_same_locks_on_resp2_and_resp3(top_server, contention):
    expected = make_three(contention)
    replies = []
    for protocol in (2, 3):
        with redis.Redis(port=top_server.port, protocol=protocol) as c:
            replies.append(flock_top(c))
    resp2, resp3 = replies
    assert [lock.key for lock in resp2] == ["top:a", "top:b", "top:c"]
    for lock in resp2:
        assert lock.waiters == expected[lock.key]
        assert [h.owner for h in lock.holders] == [f"holder-{lock.key}"]
        assert lock.mode == "exclusive" and lock.held_ms >= lock.oldest_wait_ms > 0
        assert 0 < lock.holders[0].ttl_ms <= 30000 and lock.holders[0].session is False
    # The ages move between the two calls; everything else is the same.
    strip = lambda locks: [(lock.key, lock.mode, lock.waiters, [(h.owner, h.token, h.session) for h in lock.holders])
                           for lock in locks]
    assert strip(resp2) == strip(resp3)


def assert_shows_the_servers(text: str, keys, locks, expected: dict, figures: dict):
    """The rows and totals of ``text`` (the output or the screen of redis-flock
    top, showing ``keys`` of the three contended locks ``expected``) are what
    FLOCK.TOP (``locks``) and INFO flock (``figures``) say: (rows, totals)."""
    rows = table_rows(text.splitlines(), keys)
    assert [row[0] for row in rows] == [lock.key for lock in locks]
    for row, lock in zip(rows, locks):
        assert int(row[1]) == lock.waiters == expected[lock.key]
        assert row[3] == lock.holders[0].owner
        assert row[6] == lock.mode
    totals = summary(text)
    assert totals["waiters"] == figures["flock_waiters"] == 6
    assert totals["contended locks"] == figures["flock_contended_locks"] == 3
    assert totals["sessions"] == figures["flock_sessions"]
    assert totals["locks"] == figures["flock_locks"]
    return rows, totals


def test_once_prints_the_table_the_server_gives(top_server, contention, admin):
    # A wait granted and a hold released first: percentiles that are not all 0.
    contention.hold("top:done", "first", 30000)
    contention.wait("top:done", "second")
    admin.execute_command("FLOCK.RELEASE", "top:done", "first")
    wait_until(lambda: info(admin, "top:done")["owner"] == b"second", what="the hand-off")
    admin.execute_command("FLOCK.RELEASE", "top:done", "second")
    expected = make_three(contention)

    done = run_top("--url", f"redis://127.0.0.1:{top_server.port}", "--once")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "\x1b" not in out, "escape codes in the output to a pipe"
    # Nothing ended or started since: the server says now what it said then.
    locks, figures = flock_top(admin, "COUNT", 20), info_flock(admin)

    rows, totals = assert_shows_the_servers(out, expected, locks, expected, figures)
    assert [row[0] for row in rows] == ["top:a", "top:b", "top:c"]
    assert [row[3] for row in rows] == [f"holder-{row[0]}" for row in rows]
    assert totals["grants"] == figures["flock_grants"]
    # The percentiles, as INFO gives them (microseconds), each row by its label.
    lines = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.split()}
    for kind in ("wait", "hold", "handoff"):
        values = top._percentiles(figures[f"flock_{kind}_percentiles_usec"])
        assert lines[kind] == [top.fmt_usec(values[p]) for p in top.PERCENTILES], kind
    assert top._percentiles(figures["flock_wait_percentiles_usec"])["max"] > 0
    assert "wait:granted" in lines and "hold:released" in lines

    # MATCH and BY go to FLOCK.TOP.
    done = run_top("--url", f"redis://127.0.0.1:{top_server.port}", "--once", "--by", "hold", "--match", "top:[bc]")
    assert done.returncode == 0, done.stderr
    assert [row[0] for row in table_rows(done.stdout.splitlines(), expected)] \
        == [lock.key for lock in flock_top(admin, "BY", "hold", "MATCH", "top:[bc]")] == ["top:c", "top:b"]


def test_the_console_script_is_redis_flock_top(top_server, contention):
    text = (PYTHON_DIR / "pyproject.toml").read_text()
    scripts = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    assert re.search(r'^redis-flock = "redis_flock\.cli:main"$', scripts, re.M), scripts
    make_three(contention)
    done = subprocess.run([sys.executable, "-m", "redis_flock.cli", "top", "--url",
                           f"redis://127.0.0.1:{top_server.port}", "--once"],
                          capture_output=True, text=True, timeout=30, env=CHILD_ENV)
    assert done.returncode == 0, done.stderr
    assert [row[0] for row in table_rows(done.stdout.splitlines(), {"top:a", "top:b", "top:c"})] \
        == ["top:a", "top:b", "top:c"]


def test_a_dead_server_is_one_line_and_exit_1():
    done = run_top("--url", f"redis://127.0.0.1:{free_port()}", "--once")
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("redis-flock top: redis://127.0.0.1:"), done.stderr
    assert "Traceback" not in done.stderr


def test_a_server_without_the_module_is_one_line_and_exit_1():
    plain = Server(module=False)
    try:
        done = run_top("--url", f"redis://127.0.0.1:{plain.port}", "--once")
    finally:
        plain.stop()
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "FLOCK.TOP" in lines[0] and "module" in lines[0], done.stderr
    assert "Traceback" not in done.stderr


# The live view, in tmux


class Tmux:
    """One tmux server of the test's own (its own socket, in a directory of
    its own that goes with it; no config), with one session running ``argv``
    in a 160x50 pane. The shell around it writes its exit status and its
    stderr to files (tmux's own ``pane_dead_status`` was at times empty for
    a process that exited)."""

    def __init__(self, argv):
        self.dir = Path(tempfile.mkdtemp(prefix="flock-top-"))
        self.socket = str(self.dir / "tmux")
        self.session = "top"
        self.status, self.stderr = self.dir / "status", self.dir / "stderr"
        command = (f"{' '.join(shlex.quote(a) for a in argv)} 2>{shlex.quote(str(self.stderr))}; "
                   f"echo $? >{shlex.quote(str(self.status))}")
        self.tmux("new-session", "-d", "-x", "160", "-y", "50", "-s", self.session, command)
        # The pane stays when the view exits: its last screen tells why.
        self.tmux("set-option", "-t", self.session, "remain-on-exit", "on")

    def tmux(self, *args) -> str:
        done = subprocess.run(["tmux", "-f", "/dev/null", "-S", self.socket, *args], capture_output=True, text=True,
                              timeout=10, env=CHILD_ENV)
        assert done.returncode == 0, f"tmux {' '.join(args)}: {done.stderr}"
        return done.stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", self.session)

    def keys(self, *keys, literal=False):
        self.tmux("send-keys", "-t", self.session, *(["-l"] if literal else []), *keys)

    def exit_status(self):
        """The view's exit status once it exited (and the pane with it), else None."""
        text = self.status.read_text().strip() if self.status.exists() else ""
        if not text or self.tmux("list-panes", "-t", self.session, "-F", "#{pane_dead}").strip() != "1":
            return None
        return int(text)

    def kill(self):
        subprocess.run(["tmux", "-S", self.socket, "kill-server"], capture_output=True, timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture()
def tmux_view(top_server):
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (the live view is driven through it; `make deps-python` installs it)")
    views = []

    def start(*args):
        views.append(Tmux([sys.executable, "-m", "redis_flock.top", "--url", f"redis://127.0.0.1:{top_server.port}",
                           "--interval", "0.2", *args]))
        return views[-1]

    yield start
    for view in views:
        view.kill()


def screen_when(view: Tmux, condition, what: str, timeout=10) -> str:
    """The screen once ``condition(screen)`` holds."""
    seen = []

    def check():
        seen[:] = [view.screen()]
        return condition(seen[0])

    try:
        wait_until(check, timeout=timeout, what=what)
    except AssertionError as e:
        raise AssertionError(f"{e}; the screen:\n{seen[0] if seen else ''}") from None
    return seen[0]


def keys_on(screen: str, keys) -> list:
    return [row[0] for row in table_rows(screen.splitlines(), keys)]


def test_live_view_shows_sorts_filters_pauses_and_quits(top_server, contention, admin, tmux_view):
    expected = make_three(contention)
    keys = set(expected) | {"top:d"}
    view = tmux_view()
    screen = screen_when(view, lambda s: keys_on(s, keys) == ["top:a", "top:b", "top:c"], "the three locks")

    # Each figure against the server (nothing changes meanwhile).
    locks, figures = flock_top(admin), info_flock(admin)
    assert_shows_the_servers(screen, keys, locks, expected, figures)
    assert "3 of 3 contended locks" in screen
    assert "redis-flock top" in screen and f"127.0.0.1:{top_server.port}" in screen

    # Sort: w (by wait), h (by hold), s cycles on to by waiters.
    for key, by in (("w", "wait"), ("h", "hold"), ("s", "waiters")):
        order = [lock.key for lock in flock_top(admin, "BY", by)]
        view.keys(key)
        screen_when(view, lambda s: re.search(rf"\bby {by}(\s|$)", s.split("\n", 1)[0]) and keys_on(s, keys) == order,
                    f"the order by {by}: {order}")
    assert [lock.key for lock in flock_top(admin, "BY", "wait")] == ["top:b", "top:c", "top:a"]
    assert [lock.key for lock in flock_top(admin, "BY", "hold")] == ["top:c", "top:b", "top:a"]

    # Filter: / then a glob and Enter; / and Enter alone clears it.
    view.keys("/")
    view.keys("top:[ab]*", literal=True)
    view.keys("Enter")
    matching = [lock.key for lock in flock_top(admin, "MATCH", "top:[ab]*")]
    assert matching == ["top:a", "top:b"]
    screen_when(view, lambda s: "match top:[ab]*" in s and keys_on(s, keys) == matching, "only the matching keys")
    view.keys("/")
    view.keys("Enter")
    screen_when(view, lambda s: "match " not in s and keys_on(s, keys) == ["top:a", "top:b", "top:c"],
                "every key again")

    # Pause: the screen stops changing while a new lock becomes contended.
    view.keys("p")
    # The footer, the frame's last line, says resume: the whole frame is drawn.
    paused = screen_when(view, lambda s: "PAUSED" in s and " resume " in s, "PAUSED")
    contention.hold("top:d", "holder-top:d")
    for n in range(4):
        contention.wait("top:d", f"wd{n}")
    after = [lock.key for lock in flock_top(admin)]
    assert after == ["top:d", "top:a", "top:b", "top:c"]
    # Several refresh intervals (0.2 s) of a screen that must not change.
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        assert view.screen() == paused
        time.sleep(0.05)
    view.keys("p")
    # All four rows: a frame being drawn has the new ones above the old ones.
    screen_when(view, lambda s: "PAUSED" not in s and keys_on(s, keys) == after, "top:d after the pause")

    # Quit: the view exits, with 0.
    view.keys("q")
    try:
        wait_until(lambda: view.exit_status() is not None, timeout=10, what="the view to exit")
    except AssertionError as e:
        raise AssertionError(f"{e}; the screen:\n{view.screen()}") from None
    assert view.exit_status() == 0, view.stderr.read_text()
    assert view.stderr.read_text() == ""


# Cluster and Sentinel


@pytest.fixture()
def cluster_contention(cluster):
    made = [Contention(port) for port in cluster.ports()]
    yield made
    for c in made:
        c.end()


def test_once_on_a_cluster_asks_every_master(cluster, cluster_contention):
    # A contended lock on each master: 3, 2 and 1 waiters.
    keys = [cluster.key_on(i, "top") for i in range(3)]
    for i, key in enumerate(keys):
        cluster_contention[i].hold(key, f"holder-{i}")
        for n in range(3 - i):
            cluster_contention[i].wait(key, f"w{i}-{n}")
    done = run_top("--url", f"redis://127.0.0.1:{cluster.ports()[1]}", "--once")
    assert done.returncode == 0, done.stderr
    figures = [c.info("flock") for c in cluster.clients]
    rows = table_rows(done.stdout.splitlines(), keys)
    assert [row[0] for row in rows] == keys
    for i, row in enumerate(rows):
        assert int(row[1]) == 3 - i and row[3] == f"holder-{i}"
        assert row[7] == f"127.0.0.1:{cluster.ports()[i]}"
    totals = summary(done.stdout)
    assert totals["waiters"] == sum(f["flock_waiters"] for f in figures) == 6
    assert totals["contended locks"] == sum(f["flock_contended_locks"] for f in figures) == 3
    assert "cluster of 3 masters" in done.stdout and "largest of 3 masters" in done.stdout


def test_once_on_a_sentinel_master(sentinel_setup):
    master = sentinel_setup.current_master()
    contention = Contention(master.port)
    try:
        contention.hold("top:sentinel", "holder-s")
        contention.wait("top:sentinel", "ws")
        hosts = ",".join(f"{host}:{port}" for host, port in sentinel_setup.sentinel_addresses())
        done = run_top("--url", f"redis+sentinel://{hosts}/{sentinel_setup.NAME}", "--once")
        assert done.returncode == 0, done.stderr
        rows = table_rows(done.stdout.splitlines(), {"top:sentinel"})
        assert rows and rows[0][1] == "1" and rows[0][3] == "holder-s"
        assert f"sentinel master {sentinel_setup.NAME} at 127.0.0.1:{master.port}" in done.stdout
        assert summary(done.stdout)["waiters"] == contention.admin.info("flock")["flock_waiters"]
    finally:
        contention.end()
