"""``redis-flock top``: the most contended FLOCK locks of a server, a Cluster
(every master) or a Sentinel master, live in the terminal or once for a script.

    redis-flock top [--url redis://host:port] [--interval 1] [--count 20] [--once]
    python -m redis_flock.top ...

What it shows comes from two commands per server, ``FLOCK.TOP`` and ``INFO
flock`` (docs/commands.md, "FLOCK.TOP" and "Observability"), gathered into a
``Snapshot`` that both the live view and ``--once`` render. The live view
reads its keys through termios (rich has no input API): ``s`` cycles the order
(``w`` by wait, ``h`` by hold, ``n`` by waiters), ``/`` filters by a glob
(FLOCK.TOP's MATCH), ``p`` or space pauses, ``q`` quits."""

from __future__ import annotations

import argparse
import math
import os
import select
import sys
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple
from urllib.parse import unquote

import redis
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException, RedisError, ResponseError
from redis.sentinel import MasterNotFoundError, Sentinel
from rich import box
from rich.console import Console, Group
from rich.layout import Layout
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

DEFAULT_URL = "redis://127.0.0.1:6379"
ORDERS = ("waiters", "wait", "hold")
PERCENTILES = ("p50", "p90", "p99", "p99.9", "max")
# The distributions of INFO flock, in the order shown: queued until granted
# or gone, granted until the grant ended, handed to a waiter until its reply
# was written.
DISTRIBUTIONS = ("wait", "hold", "handoff")
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
# A server that stopped answering shows as an error on the screen, not as a
# view that hangs (the URL's own socket_timeout= wins).
TIMEOUTS = {"socket_timeout": 5, "socket_connect_timeout": 5}


@dataclass
class Holder:
    owner: str
    held_ms: int
    ttl_ms: int
    session: bool
    token: int


@dataclass
class TopLock:
    """One entry of FLOCK.TOP; ``node`` names the master that answered it
    (a Cluster's keys live on one master each), None on a single server."""

    key: str
    mode: str
    waiters: int
    oldest_wait_ms: int
    held_ms: int
    holders: List[Holder]
    node: Optional[str] = None


@dataclass
class Snapshot:
    """What one refresh saw: FLOCK.TOP merged over the masters asked, and
    INFO flock with its counts summed over them and each percentile the
    largest any of them gave (a merged histogram cannot be had from
    percentiles; the worst master is what a reader of tails wants).
    ``taken`` is monotonic, for rates; ``wall`` is for people."""

    taken: float
    wall: float
    where: str
    nodes: int
    locks: List[TopLock]
    counts: Dict[str, int]
    # kind ("wait", "hold", "handoff") -> ending ("" for all of them) -> percentile -> usec
    distributions: Dict[str, Dict[str, Dict[str, float]]]

    def count(self, name: str) -> Optional[int]:
        return self.counts.get(name)

    def grants_per_second(self, previous: Optional["Snapshot"]) -> Optional[float]:
        """Grants between two refreshes; None without an earlier one, or when
        the counter went back (CONFIG RESETSTAT, a restarted server)."""
        if previous is None:
            return None
        now, then = self.count("grants"), previous.count("grants")
        elapsed = self.taken - previous.taken
        if now is None or then is None or now < then or elapsed <= 0:
            return None
        return (now - then) / elapsed


# FLOCK.TOP's replies


def _text(value) -> str:
    # Keys and owners are binary-safe on the server; a view must print them.
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else str(value)


def _fields(entry) -> dict:
    """A RESP2 flat field/value array (or a RESP3 map) as a dict with str keys."""
    pairs = entry.items() if isinstance(entry, dict) else zip(entry[::2], entry[1::2])
    return {_text(k): v for k, v in pairs}


def parse_top(reply, node: Optional[str] = None) -> List[TopLock]:
    """FLOCK.TOP's reply, RESP2 or RESP3, as TopLocks in the server's order."""
    locks = []
    for entry in reply or ():
        f = _fields(entry)
        holders = []
        for h in f.get("holders") or ():
            h = _fields(h)
            holders.append(Holder(owner=_text(h.get("owner", b"")), held_ms=int(h.get("held-ms", 0)),
                                  ttl_ms=int(h.get("ttl-ms", -1)), session=bool(int(h.get("session", 0))),
                                  token=int(h.get("token", 0))))
        locks.append(TopLock(key=_text(f["key"]), mode=_text(f.get("mode", b"")), waiters=int(f["waiters"]),
                             oldest_wait_ms=int(f.get("oldest-wait-ms", 0)), held_ms=int(f.get("held-ms", 0)),
                             holders=holders, node=node))
    return locks


def order_key(by: str) -> Callable[[TopLock], tuple]:
    """FLOCK.TOP's own order (ties: the oldest wait, then the key), to merge
    the answers of several masters into one list as one server would give it."""
    if by == "wait":
        return lambda lock: (-lock.oldest_wait_ms, lock.key)
    if by == "hold":
        return lambda lock: (-lock.held_ms, -lock.oldest_wait_ms, lock.key)
    return lambda lock: (-lock.waiters, -lock.oldest_wait_ms, lock.key)


# INFO flock


def _percentiles(value) -> Dict[str, float]:
    # redis-py parses "p50=1,p90=2" into a dict; a version that does not gives the text.
    if isinstance(value, (bytes, str)):
        value = dict(item.split("=", 1) for item in _text(value).split(",") if "=" in item)
    if not isinstance(value, dict):
        return {}
    out = {}
    for k, v in value.items():
        try:
            out[_text(k)] = float(v)
        except (TypeError, ValueError):
            pass
    return out


def merge_info(infos: Sequence[dict]) -> Tuple[Dict[str, int], Dict[str, Dict[str, Dict[str, float]]]]:
    """INFO flock of each master (redis-py's parsed dicts) as (counts summed,
    distributions by kind and ending, each percentile the largest seen)."""
    counts: Dict[str, int] = {}
    dists: Dict[str, Dict[str, Dict[str, float]]] = {}
    for info in infos:
        for name, value in info.items():
            name = _text(name)
            if not name.startswith("flock_"):
                continue
            name = name[len("flock_"):]
            for kind in DISTRIBUTIONS:
                prefix = f"{kind}_percentiles_usec"
                if name == prefix or name.startswith(prefix + "_"):
                    ending = name[len(prefix) + 1:]
                    merged = dists.setdefault(kind, {}).setdefault(ending, {})
                    for p, usec in _percentiles(value).items():
                        merged[p] = max(merged.get(p, 0.0), usec)
                    break
            else:
                if isinstance(value, int) and not isinstance(value, bool):
                    counts[name] = counts.get(name, 0) + value
    return counts, dists


# Where the figures come from


class Source:
    """One server, a Cluster or a Sentinel master, asked the same two questions
    on every refresh. ``targets()`` names each master to ask and a function
    that sends it a command: a Cluster's primaries are looked up each time, as
    a failover changes them."""

    def __init__(self, url: str):
        self.url = url
        self.kind = "server"
        self.cluster: Optional[RedisCluster] = None
        self.client: Optional[redis.Redis] = None
        self.sentinel: Optional[Sentinel] = None
        self.master_name: Optional[str] = None
        self.sentinel_addresses: List[Tuple[str, int]] = []
        scheme = url.split("://", 1)[0].lower() if "://" in url else ""
        if scheme in SENTINEL_SCHEMES:
            self._open_sentinel(url, ssl=scheme.startswith("rediss"))
            return
        client = redis.Redis.from_url(url, **TIMEOUTS)
        try:
            # A Cluster node answers for its own slots only: a seed of the
            # Cluster, whose every master FLOCK.TOP must ask.
            clustered = int(client.info("cluster").get("cluster_enabled", 0)) == 1
        except BaseException:
            client.close()
            raise
        if clustered:
            client.close()
            self.kind = "cluster"
            self.cluster = RedisCluster.from_url(url, **TIMEOUTS)
        else:
            self.client = client

    def _open_sentinel(self, url: str, ssl: bool):
        """``redis+sentinel://[user:password@]host:port[,host:port]/name[/db]``;
        the credentials are the master's (sentinels without AUTH, as usual)."""
        rest = url.split("://", 1)[1]
        netloc, _, path = rest.partition("/")
        userinfo, _, hosts = netloc.rpartition("@")
        username = password = None
        if userinfo:
            user, _, secret = userinfo.partition(":")
            username, password = unquote(user) or None, unquote(secret) or None
        addresses = self.sentinel_addresses = [_host_port(item, 26379) for item in hosts.split(",")]
        parts = [p for p in path.split("/") if p]
        if not parts:
            raise ValueError("a Sentinel URL names its master: redis+sentinel://host:port[,host:port]/mastername")
        self.kind = "sentinel"
        self.master_name = unquote(parts[0])
        db = int(parts[1]) if len(parts) > 1 else 0
        extra = {"ssl": True} if ssl else {}
        self.sentinel = Sentinel(addresses, sentinel_kwargs={**TIMEOUTS, **extra}, **TIMEOUTS, **extra)
        self.client = self.sentinel.master_for(self.master_name, db=db, username=username, password=password,
                                               **TIMEOUTS, **extra)

    def targets(self) -> List[Tuple[str, Callable]]:
        if self.cluster is not None:
            return [(node.name, _on_node(self.cluster, node)) for node in self.cluster.get_primaries()]
        return [(self.address(), self.client.execute_command)]

    def address(self) -> str:
        if self.sentinel is not None:
            host, port = self.sentinel.discover_master(self.master_name)
            return f"{host}:{port}"
        kwargs = self.client.connection_pool.connection_kwargs
        if "path" in kwargs:
            return kwargs["path"]
        return f"{kwargs.get('host', '127.0.0.1')}:{kwargs.get('port', 6379)}"

    def take(self, by: str = "waiters", match: Optional[str] = None, count: int = 20) -> Snapshot:
        """One refresh: FLOCK.TOP (COUNT, BY, MATCH as given) and INFO flock
        from every master; a Cluster's answers merged in FLOCK.TOP's order."""
        try:
            return self._take(by, match, count)
        except MasterNotFoundError:
            # redis-py's text holds the repr of a whole client.
            sentinels = ",".join(f"{h}:{p}" for h, p in self.sentinel_addresses)
            raise redis.ConnectionError(f"no sentinel of {sentinels} named a master {self.master_name!r} "
                                        "(none answered, or none knows it)") from None

    def _take(self, by: str, match: Optional[str], count: int) -> Snapshot:
        args: list = ["FLOCK.TOP", "COUNT", count, "BY", by]
        if match:
            args += ["MATCH", match]
        targets = self.targets()
        locks: List[TopLock] = []
        infos = []
        for name, ask in targets:
            locks += parse_top(ask(*args), node=name if self.cluster is not None else None)
            infos.append(ask("INFO", "flock"))
        if len(targets) > 1:
            locks.sort(key=order_key(by))
            if count:
                locks = locks[:count]
        counts, dists = merge_info(infos)
        if self.kind == "cluster":
            where = f"cluster of {len(targets)} masters"
        elif self.kind == "sentinel":
            where = f"sentinel master {self.master_name} at {targets[0][0]}"
        else:
            where = f"server {targets[0][0]}"
        return Snapshot(taken=time.monotonic(), wall=time.time(), where=where, nodes=len(targets), locks=locks,
                        counts=counts, distributions=dists)

    def close(self):
        for c in (self.cluster, self.client):
            if c is not None:
                c.close()


def _host_port(item: str, default_port: int) -> Tuple[str, int]:
    if item.startswith("["):  # [IPv6]:port
        host, _, rest = item[1:].partition("]")
        port = rest.lstrip(":")
    else:
        host, _, port = item.partition(":")
    return host or "127.0.0.1", int(port) if port else default_port


def _on_node(cluster: RedisCluster, node) -> Callable:
    def ask(*args):
        return cluster.execute_command(*args, target_nodes=node)

    return ask


# Rendering, shared by the live view and --once


def fmt_ms(ms: Optional[float]) -> str:
    if ms is None:
        return "-"
    if ms < 1000:
        return f"{ms:.0f}ms"
    s = ms / 1000
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    if s < 86400:
        return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"
    return f"{int(s // 86400)}d{int(s % 86400 // 3600):02d}h"


def fmt_usec(us: Optional[float]) -> str:
    if us is None:
        return "-"
    if us < 1000:
        return f"{us:.0f}us"
    if us < 1_000_000:
        return f"{us / 1000:.3g}ms"
    return fmt_ms(us / 1000)


def fmt_count(n: Optional[float]) -> str:
    return "-" if n is None else f"{n:,}" if isinstance(n, int) else f"{n:,.1f}"


def holders_text(lock: TopLock, most: int = 3) -> str:
    """The holders' owners, earliest grant first; a semaphore's hundred
    holders would push every other column off the screen."""
    if not lock.holders:
        return "-"
    names = [h.owner for h in lock.holders[:most]]
    more = len(lock.holders) - most
    # One word, so that a script splitting --once's lines on blanks finds the columns.
    return ",".join(names + ([f"+{more}"] if more > 0 else []))


def lease_text(lock: TopLock) -> str:
    if not lock.holders:
        return "-"
    ttl = lock.holders[0].ttl_ms
    return "none" if ttl < 0 else fmt_ms(ttl)


def summary_text(snap: Snapshot, rate: Optional[float]) -> Text:
    figures = [
        ("grants/s", fmt_count(None if rate is None else round(rate, 1))),
        ("waiters", fmt_count(snap.count("waiters"))),
        ("contended locks", fmt_count(snap.count("contended_locks"))),
        ("sessions", fmt_count(snap.count("sessions"))),
        ("locks", fmt_count(snap.count("locks"))),
        ("grants", fmt_count(snap.count("grants"))),
    ]
    text = Text()
    for i, (label, value) in enumerate(figures):
        if i:
            text.append("   ")
        text.append(f"{label} ", style="dim")
        text.append(value, style="bold")
    return text


def locks_table(snap: Snapshot, by: str, plain: bool) -> Table:
    sorted_by = {"waiters": "WAITERS", "wait": "OLDEST WAIT", "hold": "HELD"}[by]
    table = Table(box=None if plain else box.SIMPLE_HEAD, show_edge=not plain, pad_edge=not plain,
                  header_style="" if plain else "bold", expand=False)
    overflow = "fold" if plain else "ellipsis"
    columns = [("KEY", "left"), ("WAITERS", "right"), ("OLDEST WAIT", "right"), ("HOLDER", "left"),
               ("HELD", "right"), ("LEASE", "right"), ("MODE", "left")]
    if snap.nodes > 1:
        columns.append(("NODE", "left"))
    for name, justify in columns:
        header = name if plain or name != sorted_by else f"{name} ▼"
        table.add_column(header, justify=justify, no_wrap=not plain, overflow=overflow,
                         max_width=None if plain or name not in ("KEY", "HOLDER") else 48)
    for lock in snap.locks:
        row = [lock.key, str(lock.waiters), fmt_ms(lock.oldest_wait_ms), holders_text(lock), fmt_ms(lock.held_ms),
               lease_text(lock), lock.mode]
        if snap.nodes > 1:
            row.append(lock.node or "")
        table.add_row(*row)
    return table


def distribution_rows(snap: Snapshot) -> List[Tuple[str, Dict[str, float]]]:
    """(label, percentiles): each kind, then each way a wait or hold ended
    that was seen (the first rows are those a short screen keeps)."""
    rows = [(kind, snap.distributions.get(kind, {}).get("", {})) for kind in DISTRIBUTIONS]
    for kind in DISTRIBUTIONS:
        endings = snap.distributions.get(kind, {})
        rows += [(f"{kind}:{ending}", endings[ending]) for ending in sorted(endings) if ending]
    return rows


def percentiles_table(snap: Snapshot, plain: bool, rows: Optional[int] = None) -> Table:
    table = Table(box=None if plain else box.SIMPLE_HEAD, show_edge=False, pad_edge=not plain,
                  header_style="" if plain else "bold", expand=False)
    table.add_column("LATENCY" if plain else "", no_wrap=True)
    for p in PERCENTILES:
        table.add_column(p.upper(), justify="right", no_wrap=True)
    for label, values in distribution_rows(snap)[:rows]:
        table.add_row(label, *(fmt_usec(values.get(p)) for p in PERCENTILES), style="" if ":" in label else "bold")
    return table


def spread_note(snap: Snapshot) -> str:
    return f" (each the largest of {snap.nodes} masters)" if snap.nodes > 1 else ""


BLOCKS = " ▏▎▍▌▋▊▉█"


def bar(fraction: float, width: int) -> str:
    cells = max(0.0, min(1.0, fraction)) * width
    full = int(cells)
    part = BLOCKS[int((cells - full) * 8)] if full < width else ""
    return ("█" * full + part.strip()).ljust(width)


def histogram(snap: Snapshot, kind: str, width: int = 24) -> Table:
    """The percentiles of one distribution as bars on a log scale from a
    tenth of p50 to the max: a tail of seconds behind a p50 of microseconds
    shows as well as the spread of one ten times as wide, where a linear
    scale leaves the p50 a dot and a log scale from 0 fills every bar."""
    values = snap.distributions.get(kind, {}).get("", {})
    top = max(values.values(), default=0.0)
    low = max(values.get("p50", 0.0), 1.0) / 10
    grid = Table.grid(padding=(0, 1))
    grid.add_column(justify="right", style="dim")
    grid.add_column(justify="right")
    grid.add_column(no_wrap=True, overflow="crop")
    style = "cyan" if kind == "wait" else "magenta"
    for p in PERCENTILES:
        v = values.get(p, 0.0)
        fraction = math.log(max(v, low) / low) / math.log(top / low) if top > low else 0.0
        grid.add_row(p, fmt_usec(values.get(p)), Text(bar(fraction, width), style=style))
    return grid


def render_once(snap: Snapshot, url: str, by: str, match: Optional[str], plain: bool) -> Group:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(snap.wall))
    title = Text(f"redis-flock top  {url}  {snap.where}  {when}  by {by}" + (f"  match {match}" if match else ""))
    return Group(title, summary_text(snap, None), Text(""), locks_table(snap, by, plain), Text(""),
                 Text(f"latency percentiles{spread_note(snap)}"), percentiles_table(snap, plain))


# The live view


class Keys:
    """The terminal's keys one at a time, unechoed (cbreak: Ctrl-C still
    interrupts), for as long as the view runs; nothing when stdin is not a
    terminal, so that the view can be piped into."""

    def __init__(self):
        self.fd = sys.stdin.fileno() if sys.stdin is not None and sys.stdin.isatty() else None
        self.saved = None

    def __enter__(self):
        if self.fd is not None:
            import termios
            import tty

            self.saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd)
        return self

    def __exit__(self, *exc):
        if self.saved is not None:
            import termios

            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)

    def read(self, timeout: float) -> str:
        if self.fd is None:
            time.sleep(timeout)
            return ""
        ready, _, _ = select.select([self.fd], [], [], max(0.0, timeout))
        if not ready:
            return ""
        data = os.read(self.fd, 256)
        if not data:  # the terminal went away
            raise EOFError
        return data.decode("utf-8", "ignore")


def console_width(view: "View") -> int:
    return view.console.width if view.console is not None else 80


class View:
    """The state the keys change, and the screen drawn from it and the last
    snapshot. A refresh that fails keeps the last snapshot on the screen with
    the error above it, and the next one tries again: a failover or a restart
    should not end the view."""

    def __init__(self, source: Source, url: str, interval: float, count: int, by: str = "waiters",
                 match: Optional[str] = None):
        self.source, self.url, self.interval, self.count = source, url, interval, count
        self.by, self.match = by, match
        self.paused = False
        self.editing: Optional[str] = None  # the filter being typed
        self.quit = False
        self.snapshot: Optional[Snapshot] = None
        self.rate: Optional[float] = None
        self.error: Optional[str] = None
        self.console: Optional[Console] = None

    def refresh(self):
        try:
            snap = self.source.take(self.by, self.match, self.count)
        except (RedisError, OSError) as e:
            self.error = explain(e)
            return
        self.rate = snap.grants_per_second(self.snapshot)
        self.snapshot, self.error = snap, None

    def handle(self, chunk: str) -> bool:
        """Applies the keys read; True when the figures must be read again
        (another order or filter, or the end of a pause)."""
        refetch = False
        i = 0
        while i < len(chunk):
            ch = chunk[i]
            i += 1
            if ch == "\x1b":
                # Esc alone cancels the filter being typed; a sequence (an
                # arrow key) arrives whole and means nothing here.
                if self.editing is not None and i == len(chunk):
                    self.editing = None
                return refetch
            if self.editing is not None:
                if ch in "\r\n":
                    self.match, self.editing = self.editing or None, None
                    refetch = True
                elif ch in "\x7f\x08":
                    self.editing = self.editing[:-1]
                elif ch.isprintable():
                    self.editing += ch
                continue
            if ch == "q":
                self.quit = True
                return refetch
            if ch in "p ":
                self.paused = not self.paused
                refetch = refetch or not self.paused
            elif ch == "s":
                self.by = ORDERS[(ORDERS.index(self.by) + 1) % len(ORDERS)]
                refetch = True
            elif ch in "whn":
                self.by = {"w": "wait", "h": "hold", "n": "waiters"}[ch]
                refetch = True
            elif ch == "/":
                self.editing = ""
        return refetch

    def render(self) -> Layout:
        snap = self.snapshot
        width = console_width(self)
        # One line each, the most wanted first: a narrow terminal cuts the end.
        header = Text(no_wrap=True, overflow="ellipsis")
        if self.paused:
            header.append(" PAUSED ", style="bold reverse red")
            header.append("  ")
        header.append("redis-flock top", style="bold")
        header.append(f"  by {self.by}")
        if self.match:
            header.append(f"  match {self.match}", style="yellow")
        if snap is not None:
            header.append(f"  {time.strftime('%H:%M:%S', time.localtime(snap.wall))}")
        header.append(f"  every {self.interval:g}s")
        if snap is not None:
            header.append(f"  {snap.where}", style="dim")
        header.append(f"  {self.url}", style="dim")
        status = Text(f"error: {self.error} (trying again)", style="bold red", no_wrap=True, overflow="ellipsis") \
            if self.error else Text("")

        layout = Layout()
        if snap is None:
            layout.split_column(Layout(Group(header, status), size=3), Layout(Text("")), self._footer())
            return layout
        summary = summary_text(snap, self.rate)
        summary.no_wrap, summary.overflow = True, "ellipsis"
        contended = snap.count("contended_locks")
        title = Text(f"{len(snap.locks)} of {fmt_count(contended)} contended locks", style="bold")
        rows = distribution_rows(snap)
        shown = min(len(rows), 9)
        percentiles = percentiles_table(snap, plain=False, rows=shown)
        percentiles_panel = Panel(percentiles, title=f"latency percentiles{spread_note(snap)}", title_align="left",
                                  box=box.ROUNDED)
        layout.split_column(
            Layout(Group(header, summary, status), size=3),
            Layout(Group(title, locks_table(snap, self.by, plain=False)), name="locks", ratio=1),
            Layout(name="dist", size=max(shown + 4, 9)),
            self._footer(),
        )
        # The percentiles take what they need; the two histograms share the
        # rest, if enough is left for them to say something.
        table_width = self.console.measure(percentiles).maximum + 4 if self.console is not None else 64
        bar_width = (width - table_width - 4 - 3 - 2 * 13) // 2
        if bar_width < 8:
            layout["dist"].update(percentiles_panel)
            return layout
        hist = Table.grid(padding=(0, 3))
        hist.add_row(Text("wait", style="bold"), Text("hold", style="bold"))
        hist.add_row(histogram(snap, "wait", bar_width), histogram(snap, "hold", bar_width))
        layout["dist"].split_row(
            Layout(percentiles_panel, size=table_width),
            Layout(Panel(hist, title="histogram (log scale)", title_align="left", box=box.ROUNDED), ratio=1),
        )
        return layout

    def _footer(self) -> Layout:
        if self.editing is not None:
            text = Text("filter (glob, Enter applies, empty clears, Esc cancels): ", style="bold", no_wrap=True,
                        overflow="ellipsis")
            text.append(self.editing + "█")
        else:
            text = Text(no_wrap=True, overflow="ellipsis")
            for k, what in (("s", f"sort ({self.by})"), ("/", "filter"), ("p", "resume" if self.paused else "pause"),
                            ("q", "quit"), ("w/h/n", "by wait/hold/waiters")):
                text.append(f" {k} ", style="reverse")
                text.append(f" {what}  ")
        return Layout(text, size=1)

    def run(self, console: Console):
        self.console = console
        if self.snapshot is None:
            self.refresh()
        next_refresh = time.monotonic() + self.interval
        with Keys() as keys, Live(self.render(), console=console, screen=True, auto_refresh=False,
                                  redirect_stdout=False, redirect_stderr=False) as live:
            size = console.size
            while not self.quit:
                wait = 0.5 if self.paused else next_refresh - time.monotonic()
                chunk = keys.read(min(wait, 0.5))
                changed = bool(chunk)
                if chunk and self.handle(chunk) and not self.paused:
                    next_refresh = 0.0
                if not self.paused and time.monotonic() >= next_refresh:
                    self.refresh()
                    next_refresh = time.monotonic() + self.interval
                    changed = True
                if changed or console.size != size:
                    size = console.size
                    live.update(self.render(), refresh=True)


# The command


def explain(e: BaseException) -> str:
    """One line on what went wrong, for a person: no traceback."""
    text = str(e).strip() or type(e).__name__
    if isinstance(e, ResponseError) and "unknown command" in text.lower():
        return ("the server does not know FLOCK.TOP: load the FLOCK module (with FLOCK.TOP) into it "
                f"(loadmodule /path/libredis_flock.so): {text}")
    if isinstance(e, RedisClusterException):
        return f"cluster: {text}"
    return text


def add_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("--url", default=DEFAULT_URL,
                        help="redis://host:port[/db] (a Cluster node: every master is asked), rediss://..., "
                             "or redis+sentinel://host:port[,host:port]/mastername (default "
                             f"{DEFAULT_URL})")
    parser.add_argument("--once", action="store_true",
                        help="print one table and exit (plain text when stdout is not a terminal)")
    parser.add_argument("--interval", type=float, default=1.0, metavar="SECONDS",
                        help="seconds between refreshes (default 1)")
    parser.add_argument("--count", type=int, default=20, metavar="N",
                        help="contended locks shown, most contended first (default 20; 0: all)")
    parser.add_argument("--by", choices=ORDERS, default="waiters",
                        help="the order: most waiters, oldest wait or longest hold first (default waiters)")
    parser.add_argument("--match", metavar="PATTERN", help="only keys matching this glob (FLOCK.TOP MATCH)")


def run(args: argparse.Namespace) -> int:
    if args.interval <= 0 or args.count < 0:
        print("redis-flock top: --interval must be above 0 and --count at least 0", file=sys.stderr)
        return 2
    source = None
    try:
        source = Source(args.url)
        # The first refresh is where a dead server or a missing module shows:
        # say so and stop, before any screen is drawn.
        snap = source.take(args.by, args.match, args.count)
        console = Console()
        if args.once or not console.is_terminal:
            _print_snapshots(source, snap, args, console)
        else:
            view = View(source, args.url, args.interval, args.count, args.by, args.match)
            view.snapshot = snap
            view.run(console)
        return 0
    except BrokenPipeError:
        # A reader such as head(1) that stopped reading: not an error, and
        # the interpreter must not fail flushing stdout at exit either.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (RedisError, OSError, ValueError) as e:
        print(f"redis-flock top: {args.url}: {explain(e)}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, EOFError):
        return 130
    finally:
        if source is not None:
            source.close()


def _print_snapshots(source: Source, snap: Snapshot, args: argparse.Namespace, console: Console):
    """--once: one snapshot. Not a terminal and not --once: one per refresh,
    as top -b does. Plain text for a script: no escape codes, and wide
    enough that nothing it reads is cut or folded."""
    plain = not console.is_terminal
    if plain:
        console = Console(width=100_000, no_color=True, highlight=False)
    while True:
        rendered = render_once(snap, args.url, args.by, args.match, plain)
        if plain:
            with console.capture() as capture:
                console.print(rendered, crop=False)
            # Without the blanks that pad the last column.
            sys.stdout.write("".join(line.rstrip() + "\n" for line in capture.get().splitlines()))
        else:
            console.print(rendered)
        sys.stdout.flush()
        if args.once:
            return
        time.sleep(args.interval)
        console.print()
        snap = source.take(args.by, args.match, args.count)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="redis-flock top", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
