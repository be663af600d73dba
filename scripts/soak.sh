#!/usr/bin/env bash
# `make soak`: the long runs at full scale (FLOCK_SOAK=1) on FLOCK_SERVER
# (default: redis-server): from the integration tests the fuzzer, the random
# clients, the contending clients and the failover measurement, each for
# FLOCK_SOAK_SECS seconds (default 20), and the memory and backlog tests at
# 100,000+ locks and waiters; then the Python suite's mixed fleet of legacy
# and FLOCK processes and the Java suite's random interrupts and session
# kills, for as long, and the Jepsen-style run (fenced and plain writes under
# pauses, kills and partitions) for as long each. Fails if any fails.
set -uo pipefail
cd "$(dirname "$0")/.."
export FLOCK_SOAK=1 FLOCK_SOAK_SECS=${FLOCK_SOAK_SECS:-20}
started=$SECONDS
status=0
cargo test --release --test integration -- --test-threads="${FLOCK_TEST_JOBS:-4}" \
    fuzz:: random_clients:: fairness::contending failover:: memory:: backlog:: || status=1
clients/python/run-tests.sh tests/test_mixed_fleet.py || status=1
JEPSEN_SECONDS=$FLOCK_SOAK_SECS FLOCK_TEST_JOBS=1 clients/python/run-tests.sh -s tests/test_jepsen.py || status=1
clients/java/build.sh test \
    --select-method 'io.flock.SessionTest#interruptsTimeoutsAndSessionKillsLeaveNothingBehind()' || status=1
echo "soak ($FLOCK_SOAK_SECS s runs) took $((SECONDS - started)) s"
exit $status
