#!/usr/bin/env python3
"""What the test runs recorded, read back (Python 3 standard library only).

  test-report.py count NAME PATH...    one line of counts for a suite, in the form
                                       cargo prints ("test result: ok. N passed; N
                                       failed; N ignored (NAME)")
  test-report.py slowest N PATH...     the N slowest tests, slowest first, with
                                       their suite
  test-report.py failures RUN...       every test that failed in any of the runs
                                       (one folder of reports each, as `make flaky`
                                       keeps them): in which runs, and the failure
                                       as its runner reported it

A PATH is a file or a folder searched for *.xml (JUnit reports, as pytest
--junitxml, node's junit reporter and the JUnit console launcher write them) and
*.log (libtest's output with --report-time: "test NAME ... ok <1.234s>"). A test's
suite is the name of the folder its report is in.
"""

import re
import sys
import xml.etree.ElementTree as ET
from collections import namedtuple
from pathlib import Path

Case = namedtuple("Case", "suite name seconds outcome failure")

LIBTEST = re.compile(r"^test (\S+) \.\.\. (ok|FAILED|ignored)(?: <([0-9.]+)s>)?")
# libtest prints a failed test's output after the run, under this heading.
LIBTEST_OUTPUT = re.compile(r"^---- (\S+) stdout ----$")


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
            failed = child.find("failure")
            if failed is None:
                failed = child.find("error")
            if failed is not None:
                outcome = "failed"
            elif child.find("skipped") is not None:
                outcome = "ignored"
            else:
                outcome = "passed"
            failure = "" if failed is None else "\n".join(
                t for t in (failed.get("message", ""), failed.text or "") if t.strip())
            cls = child.get("classname") or ""
            where = cls if "." in cls else " > ".join(g for g in groups if g)
            name = child.get("name", "?")
            yield Case(suite, f"{where}::{name}" if where else name, float(child.get("time") or 0), outcome, failure)


def libtest_cases(suite, text):
    lines = text.splitlines()
    outputs, current = {}, None
    for line in lines:
        m = LIBTEST_OUTPUT.match(line)
        if m:
            current = outputs.setdefault(m[1], [])
        elif current is not None and (line.startswith("---- ") or line == "failures:"):
            current = None
        elif current is not None:
            current.append(line)
    for line in lines:
        m = LIBTEST.match(line)
        if m:
            outcome = {"ok": "passed", "FAILED": "failed", "ignored": "ignored"}[m[2]]
            yield Case(suite, m[1], float(m[3] or 0), outcome, "\n".join(outputs.get(m[1], [])).strip())


def cases(path):
    """The test cases of one report or log."""
    suite = path.parent.name
    if path.suffix == ".xml":
        yield from junit_cases(suite, ET.parse(path).getroot(), [])
    else:
        yield from libtest_cases(suite, path.read_text(errors="replace"))


def count(name, paths):
    n = {"passed": 0, "failed": 0, "ignored": 0}
    for path in files(paths):
        for case in cases(path):
            n[case.outcome] += 1
    result = "ok" if n["failed"] == 0 else "FAILED"
    print(f"test result: {result}. {n['passed']} passed; {n['failed']} failed; {n['ignored']} ignored ({name})")


def slowest(n, paths):
    rows = sorted((c for path in files(paths) for c in cases(path)), key=lambda c: -c.seconds)[:n]
    for c in rows:
        print(f"{c.seconds:8.2f} s  {c.suite:<8} {c.name}")


def failures(runs):
    failed = {}
    for run in runs:
        for path in files([run]):
            for c in cases(path):
                if c.outcome == "failed":
                    failed.setdefault((c.suite, c.name), []).append((Path(run).name, c.failure))
    if not failed:
        print("none")
    for (suite, name), seen in sorted(failed.items()):
        print(f"{suite} {name}: failed in run {', '.join(run for run, _ in seen)} of {len(runs)}")
        for run, failure in seen:
            text = failure.splitlines()
            print(f"  run {run}:")
            print("\n".join("    " + line for line in text[:40]))
            if len(text) > 40:
                print(f"    ... ({len(text) - 40} more lines in the run's report)")


def main(argv):
    if len(argv) >= 3 and argv[0] == "count":
        count(argv[1], argv[2:])
    elif len(argv) >= 3 and argv[0] == "slowest":
        slowest(int(argv[1]), argv[2:])
    elif len(argv) >= 2 and argv[0] == "failures":
        failures(argv[1:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
