#!/usr/bin/env bash
# `make test-clients` (and `make test`, `make test-servers`): the suites of the
# clients named in the arguments (java, python, node), one after the other,
# against redis-servers they start themselves with the module FLOCK_MODULE on
# the server FLOCK_SERVER (default: redis-server). Each client's own script
# runs its suite (clients/java/build.sh, clients/python/run-tests.sh,
# clients/node/run-tests.sh) and writes its JUnit report under
# FLOCK_TEST_REPORTS (default: target/test-reports); their dependencies come
# from `make deps-<client>`. After each suite, one line of counts read from
# that report, in the form cargo prints ("test result: ... N passed; N failed;
# N ignored"), so that scripts/test-servers.sh adds them up with the Rust
# tests. Fails if any fails.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${FLOCK_MODULE:=$PWD/target/release/libredis_flock.so}"
: "${FLOCK_TEST_REPORTS:=$PWD/target/test-reports}"
export FLOCK_MODULE FLOCK_TEST_REPORTS
status=0
for client in "$@"; do
    echo "==== the $client client (clients/$client)"
    rm -rf "${FLOCK_TEST_REPORTS:?}/$client"
    case $client in
    java) clients/java/build.sh ;;
    python | node) "clients/$client/run-tests.sh" ;;
    *) echo "unknown client $client (java, python, node)"; false ;;
    esac
    suite=$?
    [ "$suite" = 0 ] || status=1
    counts=$(scripts/test-report.py count "$client client" "$FLOCK_TEST_REPORTS/$client")
    # A suite that failed without reporting a failure (it crashed, or did not
    # build) counts as one.
    if [ "$suite" != 0 ] && [[ $counts == *" 0 failed;"* ]]; then
        counts=$(sed 's/^test result: ok\./test result: FAILED./; s/ 0 failed;/ 1 failed;/' <<<"$counts")
    fi
    echo "$counts"
done
exit $status
