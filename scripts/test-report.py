#!/usr/bin/env python3
"""What the test runs recorded, read back (Python 3 standard library only).

  test-report.py count NAME PATH...    one line of counts for a suite, in the form
                                       cargo prints ("test result: ok. N passed; N
                                       failed; N ignored (NAME)"), read from its JUnit
                                       XML reports (the clients' suites) or its
                                       libtest log (the Rust suite)
  test-report.py slowest N PATH...     the N slowest tests of every report and log
                                       under PATH, slowest first, with their suite

A PATH is a file or a folder searched for *.xml (JUnit reports, as pytest
--junitxml, node's junit reporter and the JUnit console launcher write them) and
*.log (libtest's output with --report-time: "test NAME ... ok <1.234s>").
"""

import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

LIBTEST = re.compile(r"^test (\S+) \.\.\. (ok|FAILED|ignored)(?: <([0-9.]+)s>)?")


def files(paths):
    for p in map(Path, paths):
        if p.is_dir():
            yield from sorted(p.rglob("*.xml"))
            yield from sorted(p.rglob("*.log"))
        elif p.exists():
            yield p


def junit_cases(suite, element, groups):
    """The test cases under one JUnit element; a case is named by its class
    (pytest, JUnit) or, where the class says nothing (node's reporter names
    them all "test"), by the describe() groups around it."""
    for child in element:
        if child.tag == "testsuite":
            yield from junit_cases(suite, child, groups + [child.get("name", "")])
        elif child.tag == "testcase":
            if child.find("failure") is not None or child.find("error") is not None:
                outcome = "failed"
            elif child.find("skipped") is not None:
                outcome = "ignored"
            else:
                outcome = "passed"
            cls = child.get("classname") or ""
            where = cls if "." in cls else " > ".join(g for g in groups if g)
            name = child.get("name", "?")
            yield suite, f"{where}::{name}" if where else name, float(child.get("time") or 0), outcome


def cases(path):
    """(suite, name, seconds, outcome) of every test case in one report or log."""
    suite = path.stem if path.parent.name in ("", ".") else path.parent.name
    if path.suffix == ".xml":
        yield from junit_cases(suite, ET.parse(path).getroot(), [])
    else:
        for line in path.read_text(errors="replace").splitlines():
            m = LIBTEST.match(line)
            if m:
                outcome = {"ok": "passed", "FAILED": "failed", "ignored": "ignored"}[m[2]]
                yield suite, m[1], float(m[3] or 0), outcome


def count(name, paths):
    n = {"passed": 0, "failed": 0, "ignored": 0}
    for path in files(paths):
        for _, _, _, outcome in cases(path):
            n[outcome] += 1
    result = "ok" if n["failed"] == 0 else "FAILED"
    print(f"test result: {result}. {n['passed']} passed; {n['failed']} failed; {n['ignored']} ignored ({name})")


def slowest(n, paths):
    rows = sorted((c for path in files(paths) for c in cases(path)), key=lambda c: -c[2])[:n]
    for suite, name, seconds, _ in rows:
        print(f"{seconds:8.2f} s  {suite:<8} {name}")


def main(argv):
    if len(argv) >= 3 and argv[0] == "count":
        count(argv[1], argv[2:])
    elif len(argv) >= 3 and argv[0] == "slowest":
        slowest(int(argv[1]), argv[2:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
