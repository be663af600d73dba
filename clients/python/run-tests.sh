#!/usr/bin/env bash
# The Python client's suite (scripts/test-clients.sh, `make test-python`):
# installs the client into the virtualenv PYVENV (default: the repository's
# target/python-venv, made by `make deps-python`) and runs pytest on it against
# redis-servers it starts with the module FLOCK_MODULE on FLOCK_SERVER. The
# JUnit report goes to $FLOCK_TEST_REPORTS/python/ when that is set. Arguments
# go to pytest (a file, -k NAME, ...).
set -euo pipefail
cd "$(dirname "$0")"
venv=${PYVENV:-../../target/python-venv}
"$venv/bin/pip" install --quiet --disable-pip-version-check .
report=()
if [ -n "${FLOCK_TEST_REPORTS:-}" ]; then
    mkdir -p "$FLOCK_TEST_REPORTS/python"
    report=(--junitxml="$FLOCK_TEST_REPORTS/python/junit.xml")
fi
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "${report[@]}" "$@"
