#!/usr/bin/env bash
# The Node client's suite (scripts/test-clients.sh, `make test-node`) against
# redis-servers it starts with the module FLOCK_MODULE on FLOCK_SERVER; the spec
# reporter on stdout and, when FLOCK_TEST_REPORTS is set, a JUnit report in
# $FLOCK_TEST_REPORTS/node/. Arguments (test files) replace test/*.test.js.
set -euo pipefail
cd "$(dirname "$0")"
report=()
if [ -n "${FLOCK_TEST_REPORTS:-}" ]; then
    mkdir -p "$FLOCK_TEST_REPORTS/node"
    report=(--test-reporter=junit --test-reporter-destination="$FLOCK_TEST_REPORTS/node/junit.xml")
fi
[ $# -gt 0 ] || set -- test/*.test.js
exec node --test --test-reporter=spec --test-reporter-destination=stdout "${report[@]}" "$@"
