#!/usr/bin/env bash
# `make test-clients` (and `make test`, `make test-servers`): the suites of the
# clients named in the arguments (java, python, node), one after the other,
# against redis-servers they start themselves with the module FLOCK_MODULE on
# the server FLOCK_SERVER (default: redis-server). Their dependencies come
# from `make deps-<client>`. After each suite, one line of counts in the form
# cargo prints ("test result: ... N passed; N failed; N ignored"), so that
# scripts/test-servers.sh adds them up with the Rust tests. Fails if any fails.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${FLOCK_MODULE:=$PWD/target/release/libredis_flock.so}"
export FLOCK_MODULE
venv=target/python-venv
status=0
for client in "$@"; do
    log=$(mktemp)
    passed='' failed='' ignored=''
    echo "==== the $client client (clients/$client)"
    case $client in
    java) clients/java/build.sh ;;
    python) "$venv/bin/pip" install --quiet --disable-pip-version-check ./clients/python &&
        "$venv/bin/python" -m pytest clients/python -q -p no:cacheprovider ;;
    node) (cd clients/node && node --test --test-reporter=spec test/*.test.js) ;;
    *) echo "unknown client $client (java, python, node)"; false ;;
    esac 2>&1 | tee "$log"
    suite=${PIPESTATUS[0]}
    [ "$suite" = 0 ] || status=1
    # Each runner's own summary: JUnit's "[ N tests successful ]", pytest's
    # "N passed, M failed, K skipped", node's "ℹ pass N".
    case $client in
    java) passed=$(grep -o '[0-9]* tests successful' "$log" | grep -o '^[0-9]*')
        failed=$(grep -o '[0-9]* tests failed' "$log" | grep -o '^[0-9]*')
        ignored=$(grep -o '[0-9]* tests skipped' "$log" | grep -o '^[0-9]*') ;;
    python) summary=$(tail -n 1 "$log")
        passed=$(grep -o '[0-9]* passed' <<<"$summary" | grep -o '^[0-9]*')
        failed=$(grep -oE '[0-9]+ (failed|errors?)' <<<"$summary" | awk '{n += $1} END {print n + 0}')
        ignored=$(grep -o '[0-9]* skipped' <<<"$summary" | grep -o '^[0-9]*') ;;
    node) passed=$(grep -o 'pass [0-9]*' "$log" | tail -n 1 | grep -o '[0-9]*')
        failed=$(grep -o 'fail [0-9]*' "$log" | tail -n 1 | grep -o '[0-9]*')
        ignored=$(grep -o 'skipped [0-9]*' "$log" | tail -n 1 | grep -o '[0-9]*') ;;
    esac
    rm -f "$log"
    # A suite that failed without counting a failure (it crashed, or did not
    # build) counts as one.
    [ "$suite" = 0 ] || [ "${failed:-0}" != 0 ] || failed=1
    result=ok
    [ "${failed:-0}" = 0 ] || result=FAILED
    echo "test result: $result. ${passed:-0} passed; ${failed:-0} failed; ${ignored:-0} ignored ($client client)"
done
exit $status
