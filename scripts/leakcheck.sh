#!/usr/bin/env bash
# `make leakcheck`: FLOCK inside a redis-server run under valgrind memcheck.
#
# 1. Self-test: a probe module (scripts/leakprobe.c) that leaks one block and
#    writes past another through RedisModule_Alloc must be caught, or the
#    check below could not see FLOCK's allocations either.
# 2. The randomized multi-client test (small scale), the memory tests (10 %
#    scale), the hostile-input tests, and those of locks of other clients
#    (timers, keyspace events, shadow locks) and deadlock detection (keys
#    opened across the wait-for graph) run against valgrind-run servers
#    (FLOCK_REDIS_WRAPPER in tests/common/mod.rs); they shut their servers
#    down cleanly, so valgrind writes a leak report for each (a forked child,
#    such as a full sync's, writes one too). scripts/valgrind.supp holds
#    redis-server's own known false positives.
# 3. Fails on any memory error (invalid read/write/free, uninitialised value,
#    ...) in any server, and on any definite leak whose allocation stack
#    passes through the module; also if no leak report was written or a
#    test failed.
#
# Environment: LEAKCHECK_SECS (randomized test, default 20), LEAKCHECK_CLIENTS
# (default 50), LEAKCHECK_MEMORY_SCALE (percent, default 10), LEAKCHECK_DIR
# (logs, default target/leakcheck).
set -uo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
out=${LEAKCHECK_DIR:-target/leakcheck}
rm -rf "$out" && mkdir -p "$out"
out=$(cd "$out" && pwd)
# No spaces inside an argument: the harness splits the wrapper on spaces.
valgrind_cmd="valgrind --tool=memcheck --leak-check=full --show-leak-kinds=definite --errors-for-leak-kinds=definite \
--num-callers=40 --suppressions=$PWD/scripts/valgrind.supp"

# Prints the valgrind records of log $1 whose first line matches $2 and
# whose text matches $3 (records are separated by "==pid== " lines).
records() {
    awk -v head="$2" -v body="$3" '
        function flush() { if (rec != "" && first ~ head && rec ~ body) print rec "\n"; rec = ""; first = "" }
        /^==[0-9]+== $/ { flush(); next }
        { if (first == "") first = $0; rec = rec $0 "\n" }
        END { flush() }' "$1"
}
memory_errors='^==[0-9]+== (Invalid (read|write|free)|Conditional jump|Use of uninitialised|Syscall param|Mismatched free|Source and destination overlap|Jump to the invalid|Argument .* of function|Process terminating)'

# A port the kernel just gave out to a bind: one that no Redis answering
# PING on (the earlier test) could still be taken by any other listener, and
# the probe's server then exited before loading it, failing the self-test.
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

echo "== leakcheck self-test: a module that leaks and overflows on purpose"
gcc -shared -fPIC -O0 -g -Wall -o "$out/leakprobe.so" scripts/leakprobe.c || exit 1
port=$(free_port)
# shellcheck disable=SC2086
$valgrind_cmd --log-file="$out/selftest.log" redis-server --port "$port" --bind 127.0.0.1 --save "" \
    --appendonly no --loadmodule "$out/leakprobe.so" >/dev/null 2>&1 &
probe=$!
for _ in $(seq 300); do redis-cli -p "$port" ping 2>/dev/null | grep -q PONG && break; sleep 0.2; done
redis-cli -p "$port" shutdown nosave >/dev/null 2>&1
wait "$probe"
if [ -z "$(records "$out/selftest.log" 'definitely lost in loss record' leakprobe_leak)" ] \
    || [ -z "$(records "$out/selftest.log" 'Invalid write' leakprobe_overflow)" ]; then
    echo "leakcheck: valgrind did not catch the probe module's leak and overflow: see $out/selftest.log"
    exit 1
fi
echo "caught: the probe's 4242-byte leak and its 1-byte overflow"

echo "== tests against valgrind-run servers (logs in $out)"
export FLOCK_REDIS_WRAPPER="$valgrind_cmd --log-file=$out/vg.%p.log"
failed=0
# One run of the integration binary over those modules; a Cluster of six
# valgrind-run nodes would take minutes to form: that test runs in make test.
FLOCK_RANDOM_SECS=${LEAKCHECK_SECS:-20} FLOCK_RANDOM_CLIENTS=${LEAKCHECK_CLIENTS:-50} \
    FLOCK_MEMORY_SCALE=${LEAKCHECK_MEMORY_SCALE:-10} \
    cargo test --release --test integration -- --test-threads=2 \
    random_clients:: memory:: hostile:: legacy_locks:: deadlocks:: acquire_all:: operator_view:: --skip in_a_cluster || failed=1

echo "== valgrind reports"
bad=0
reports=0
# Prints $2 under the title $1 and marks the run failed, if $2 is not empty.
flag() {
    [ -n "$2" ] || return 0
    echo "$1:"
    echo "$2" | head -100
    bad=1
}
for log in "$out"/vg.*.log; do
    [ -e "$log" ] || continue
    flag "$log: memory errors" "$(records "$log" "$memory_errors" '.')"
    flag "$log: definite leaks in the module" "$(records "$log" 'definitely lost in loss record' 'redis_flock')"
    if grep -q 'LEAK SUMMARY' "$log"; then
        reports=$((reports + 1))
        echo "$(basename "$log"): $(grep -o 'definitely lost: .*' "$log" | head -1); $(grep -o 'ERROR SUMMARY: [0-9]* errors' "$log")"
    fi
done
servers=$(find "$out" -name 'vg.*.log' | wc -l)
echo "$servers valgrind-run servers, $reports shut down cleanly with a leak report"
[ "$reports" -ge 1 ] || { echo "leakcheck: no leak report was written"; bad=1; }
[ "$failed" = 0 ] || echo "leakcheck: a test failed under valgrind"
echo "leakcheck took $((SECONDS - started)) s"
if [ "$bad" = 0 ] && [ "$failed" = 0 ]; then
    echo "leakcheck: no memory error, no definite leak in the module"
    exit 0
fi
exit 1
