#!/usr/bin/env bash
# The Node client's suite (scripts/test-clients.sh, `make test-node`, `npm test`) against
# redis-servers it starts with the module FLOCK_MODULE on FLOCK_SERVER; the spec reporter on
# stdout and, when FLOCK_TEST_REPORTS is set, a JUnit report in $FLOCK_TEST_REPORTS/node/.
# Arguments (test files) replace test/*.test.js.
#
# Test files run side by side, FLOCK_TEST_JOBS at a time (each in a process of its own, with
# servers of its own on free ports). The tests mostly wait (on leases, failovers, replicas, child
# processes: under 30 s of CPU in about 2 minutes one file after another), so the default is four
# per core: on 2 cores 8 at a time took 20-35 s where 6 took 35-45 s (node's own default leaves a
# core and runs one file at a time on 2 cores). FLOCK_TEST_JOBS=1 runs them one after another.
set -euo pipefail
cd "$(dirname "$0")"
jobs=${FLOCK_TEST_JOBS:-$((4 * $(nproc)))}
report=()
if [ -n "${FLOCK_TEST_REPORTS:-}" ]; then
    mkdir -p "$FLOCK_TEST_REPORTS/node"
    report=(--test-reporter=junit --test-reporter-destination="$FLOCK_TEST_REPORTS/node/junit.xml")
fi
[ $# -gt 0 ] || set -- test/*.test.js
exec node --test --test-concurrency="$jobs" --test-reporter=spec --test-reporter-destination=stdout "${report[@]}" "$@"
