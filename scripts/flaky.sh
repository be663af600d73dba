#!/usr/bin/env bash
# `make flaky RUNS=n`: every suite (scripts/test.sh's phases after the build)
# n times in a row on FLOCK_SERVER (default: redis-server), then every test
# that failed at least once: in which runs, and its failure as its runner
# reported it; and the phases of each run (a phase can fail without a test
# failing: a crash, a build). Run n's log is target/flaky/n.log, its reports
# are in target/flaky/n/. Fails if anything failed in any run.
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
out=$PWD/target/flaky
rm -rf "$out" && mkdir -p "$out"
scripts/test.sh deps build >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
status=0
for run in $(seq "$runs"); do
    FLOCK_TEST_REPORTS=$out/$run scripts/test.sh rust java python node dist >"$out/$run.log" 2>&1 || status=1
    # The phase table that closes the run's log.
    echo "run $run of $runs: $(sed -n '/^==== time per phase/,$p' "$out/$run.log" | tail -n +2 | paste -sd ' ' | tr -s ' ')"
done
echo "==== tests that failed at least once in $runs runs"
scripts/test-report.py failures "$out"/*/
exit $status
