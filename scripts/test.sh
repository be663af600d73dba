#!/usr/bin/env bash
# `make test`: every test on one server (FLOCK_SERVER, a path; default the
# redis-server on PATH), phase by phase, then the time of each phase and the
# 20 slowest tests. The phases (arguments, in this order; all by default):
#   deps      installs what is missing (make deps deps-clients deps-dist)
#   build     the module and every test binary (cargo, release)
#   checks    no tracked file over 1 MB, the Redis layer's imports one way,
#             the Python client's blocking code generated from its asyncio
#             code as it is now (clients/python/scripts/unasync.py --check)
#   rust      every crate's tests: the core's unit and property tests, the
#             client's and the benchmark's, the integration tests
#             (tests/integration, one binary) on FLOCK_TEST_JOBS threads
#             (default 4: they mostly wait on servers), then the doc tests
#   java python node   the clients' suites (scripts/test-clients.sh)
#   dist      the packages, installed as users install them (scripts/test-dist.sh)
# Each suite leaves a report under FLOCK_TEST_REPORTS (default
# target/test-reports): the clients' JUnit XML, the Rust tests' libtest log.
# Prints one "test result: ..." line per suite (scripts/test-servers.sh adds
# them up). Fails if any phase fails; every phase runs regardless.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${FLOCK_TEST_REPORTS:=$PWD/target/test-reports}"
: "${FLOCK_MODULE:=$PWD/target/release/libredis_flock.so}"
export FLOCK_TEST_REPORTS FLOCK_MODULE
jobs=${FLOCK_TEST_JOBS:-4}
[ $# -gt 0 ] || set -- deps build checks rust java python node dist
rm -rf "$FLOCK_TEST_REPORTS" && mkdir -p "$FLOCK_TEST_REPORTS"

# libtest prints each test's time with --report-time, an option it accepts
# only when RUSTC_BOOTSTRAP is set. The runner sets it for the test binary
# alone: cargo counts it in every crate's fingerprint, so setting it for
# cargo would rebuild everything, and again at the next plain build.
timed_runner="target.'cfg(all())'.runner = ['env', 'RUSTC_BOOTSTRAP=1']"

run_phase() {
    case $1 in
    deps) make --no-print-directory deps deps-clients deps-dist ;;
    # Every cargo command here selects the whole workspace and the test
    # targets, so that they resolve one feature set and build it once.
    build) cargo build --release && cargo test --workspace --release --tests --no-run ;;
    checks)
        scripts/check-file-sizes.sh && scripts/check-layers.sh && scripts/check-state-borrow.sh &&
            python3 clients/python/scripts/unasync.py --check
        ;;
    rust)
        mkdir -p "$FLOCK_TEST_REPORTS/rust"
        # The doc tests run without the runner, and so without the option.
        cargo test --workspace --release --tests --config "$timed_runner" -- \
            -Z unstable-options --report-time --test-threads="$jobs" 2>&1 |
            tee "$FLOCK_TEST_REPORTS/rust/tests.log" &&
            cargo test --workspace --release --doc
        ;;
    java | python | node) scripts/test-clients.sh "$1" ;;
    dist) make --no-print-directory dist >/dev/null && scripts/test-dist.sh ;;
    *) echo "unknown phase $1"; false ;;
    esac
}

status=0
times=()
for phase in "$@"; do
    echo "==== $phase"
    started=$SECONDS
    run_phase "$phase"
    rc=$?
    result=ok
    [ "$rc" = 0 ] || { result=FAILED; status=1; }
    times+=("$(printf '%-7s %4d s  %s' "$phase" $((SECONDS - started)) "$result")")
done

echo "==== the 20 slowest tests"
scripts/test-report.py slowest 20 "$FLOCK_TEST_REPORTS"
server=${FLOCK_SERVER:-redis-server}
echo "==== time per phase (${server##*/} $("$server" --version 2>/dev/null | grep -o 'v=[^ ]*'))"
printf '%s\n' "${times[@]}"
total=0
for t in "${times[@]}"; do total=$((total + $(awk '{print $2}' <<<"$t"))); done
printf '%-7s %4d s\n' total "$total"
exit $status
