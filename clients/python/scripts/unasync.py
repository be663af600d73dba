#!/usr/bin/env python3
"""Generates the Python client's blocking flavour from its asyncio flavour,
as httpcore generates its sync code from its async code (its
scripts/unasync.py): the asyncio modules are the source, and each generated
module is its source with the names below replaced, so that a fix lands in
both flavours. What differs for real (a reader thread or a reader task,
cancellation, acquire()'s arguments) is not generated: each flavour has a
hand-written backend module of the same names, redis_flock._asyncio_backend
and redis_flock._backend, that its modules import as ``backend``.

The generated files are committed (an install needs no build step) and
begin with a header that says so.

    python3 clients/python/scripts/unasync.py           # writes them
    python3 clients/python/scripts/unasync.py --check   # fails when one is stale

``--check`` runs in `make lint` (`make unasync`; CI) and in scripts/test.sh's
checks phase. Standard library only."""

import argparse
import difflib
import io
import re
import sys
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "redis_flock"

# (asyncio source, blocking module generated from it), in PACKAGE.
FILES = [
    ("_asyncio_session.py", "_session.py"),
    ("asyncio.py", "lock.py"),
]

# Applied in order to the whole text, docstrings and comments included.
SUBS = [
    # Each flavour's own modules.
    (r"\b_asyncio_backend\b", "_backend"),
    (r"\b_asyncio_session\b", "_session"),
    # Names in the docs: redis_flock.asyncio.Lock, redis.asyncio.lock.Lock.
    (r"\bredis_flock\.asyncio\.", "redis_flock."),
    (r"\bredis\.asyncio\.", "redis."),
    # Coroutines become functions.
    (r"\basync def\b", "def"),
    (r"\basync with\b", "with"),
    (r"\basync for\b", "for"),
    (r"\bawait ", ""),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\benter_async_context\b", "enter_context"),
    # AsyncManaged, AsyncExitStack.
    (r"\bAsync([A-Z]\w*)", r"\1"),
    # Awaitable[Literal[True]] (one level of brackets inside).
    (r"\bAwaitable\[((?:[^\[\]]|\[[^\[\]]*\])*)\]", r"\1"),
    (r"\bAwaitable, ", ""),
]

# Names that must not be left in the generated code (comments and strings
# may mention them).
ASYNC_NAMES = {"async", "await", "asyncio", "Awaitable"}


def header(source: str) -> str:
    return (
        f"# Generated from {source} by clients/python/scripts/unasync.py: do not edit.\n"
        f"# Edit {source} (or _backend.py, what only the blocking flavour does), then\n"
        "# run `python3 clients/python/scripts/unasync.py`; `make unasync` checks.\n"
    )


def unasync(text: str) -> str:
    for pattern, replacement in SUBS:
        text = re.sub(pattern, replacement, text)
    return text


def leftovers(text: str) -> list:
    """The lines of ``text`` whose code still names ASYNC_NAMES."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.NAME and token.string in ASYNC_NAMES:
            found.append(f"line {token.start[0]}: {token.line.rstrip()}")
    return found


def generate(source: str) -> str:
    text = header(source) + unasync((PACKAGE / source).read_text())
    problems = leftovers(text)
    if problems:
        raise SystemExit(f"unasync.py: {source} leaves asyncio in its blocking flavour:\n" + "\n".join(problems))
    compile(text, source, "exec")
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; fail when a generated file is stale")
    args = parser.parse_args()
    stale = []
    for source, target in FILES:
        text = generate(source)
        path = PACKAGE / target
        current = path.read_text() if path.exists() else ""
        if current == text:
            continue
        if args.check:
            stale.append(target)
            sys.stdout.writelines(
                difflib.unified_diff(
                    current.splitlines(True), text.splitlines(True), f"{target} (committed)", f"{target} (from {source})"
                )
            )
        else:
            path.write_text(text)
            print(f"unasync.py: wrote {path}")
    if stale:
        print(
            f"unasync.py: {', '.join(stale)} stale: generated from the asyncio code, never edited by hand;"
            " run python3 clients/python/scripts/unasync.py",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
