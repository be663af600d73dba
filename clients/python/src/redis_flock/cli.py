"""The ``redis-flock`` command (the console script; not ``flock``, which is
util-linux's flock(1)). Its one subcommand so far is ``top``."""

import argparse
import sys
from typing import Optional, Sequence


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        from . import top
    except ImportError as e:
        # rich is an extra: the lock library itself does without it.
        if e.name != "rich" and not (e.name or "").startswith("rich."):
            raise
        print("redis-flock: its views draw with rich, which is not installed: pip install 'redis-flock[top]'",
              file=sys.stderr)
        return 1
    parser = argparse.ArgumentParser(prog="redis-flock", description="Tools for FLOCK, the fair lock module for Redis.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    top.add_arguments(commands.add_parser("top", help="the most contended locks, live (FLOCK.TOP, INFO flock)",
                                          description=top.__doc__.split("\n\n")[0]))
    args = parser.parse_args(argv)
    return top.run(args)


if __name__ == "__main__":
    sys.exit(main())
