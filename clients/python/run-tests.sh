#!/usr/bin/env bash
# The Python client's suite (scripts/test-clients.sh, `make test-python`):
# installs the client into the virtualenv PYVENV (default: the repository's
# target/python-venv, made by `make deps-python`) and runs pytest on it against
# redis-servers it starts with the module FLOCK_MODULE on FLOCK_SERVER. The
# JUnit report goes to $FLOCK_TEST_REPORTS/python/ when that is set. Arguments
# go to pytest (a file, -k NAME, ...).
#
# FLOCK_TEST_JOBS pytest-xdist workers run the tests, each with servers of its
# own (default twice the cores, at most 8: 4 on a 2-core machine); 1 runs them
# in this process. The suite mostly waits (on leases, sessions, failovers), so
# more workers than cores pay. Work stealing keeps a file's tests together on
# one worker while they last, so a Cluster or Sentinel setup (session
# fixtures) is started by few workers.
set -euo pipefail
cd "$(dirname "$0")"
venv=${PYVENV:-../../target/python-venv}
# pip builds and installs the client (5-10 s) only when the installed copy is
# not src/'s, or pyproject.toml changed since.
installed=$("$venv/bin/python" -c 'import os, redis_flock; print(os.path.dirname(redis_flock.__file__))' 2>/dev/null || true)
if [ -z "$installed" ] || [ pyproject.toml -nt "$installed" ] \
    || ! diff -rq -x __pycache__ src/redis_flock "$installed" >/dev/null; then
    "$venv/bin/pip" install --quiet --disable-pip-version-check .
fi
report=()
if [ -n "${FLOCK_TEST_REPORTS:-}" ]; then
    mkdir -p "$FLOCK_TEST_REPORTS/python"
    report=(--junitxml="$FLOCK_TEST_REPORTS/python/junit.xml")
fi
cores=$(nproc)
jobs=${FLOCK_TEST_JOBS:-$((2 * cores < 8 ? 2 * cores : 8))}
parallel=()
if [ "$jobs" -gt 1 ]; then
    if "$venv/bin/python" -c "import xdist" 2>/dev/null; then
        parallel=(-n "$jobs" --dist worksteal)
    else
        echo "run-tests.sh: pytest-xdist is not in $venv (make deps-python installs it): one process runs the tests" >&2
    fi
fi
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "${parallel[@]}" "${report[@]}" "$@"
