#!/usr/bin/env bash
# `make test-servers`: the whole test suite (scripts/test.sh's phases rust
# and the clients named in CLIENTS) on each server named in the
# arguments (see scripts/server.sh), one after the other, then a line of test
# counts per server (with the names of any failed tests) and a total. Fails
# if any server fails a test.
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
summary=()
for name in "$@"; do
    log=target/servers/$name.log
    if ! bin=$(scripts/server.sh "$name"); then
        summary+=("$name: not available")
        status=1
        continue
    fi
    mkdir -p target/servers
    echo "==== $name: $("$bin" --version)"
    # shellcheck disable=SC2086 # CLIENTS is a list of words.
    FLOCK_SERVER=$bin FLOCK_TEST_REPORTS=$PWD/target/test-reports/$name scripts/test.sh rust ${CLIENTS:-} 2>&1 |
        tee "$log"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
    # cargo prints one "test result: ... N passed; N failed; N ignored" per test
    # binary, and scripts/test-clients.sh one per client.
    counts=$(grep -o '[0-9]* passed; [0-9]* failed; [0-9]* ignored' "$log" |
        awk '{p += $1; f += $3; i += $5} END {printf "%d passed, %d failed, %d ignored", p, f, i}')
    summary+=("$name ($("$bin" --version | grep -o 'v=[^ ]*')): $counts")
    # The names of failed tests, so that the last lines of the output say which:
    # cargo's "test x ... FAILED", pytest's "FAILED x", JUnit's "✘", node's "✖".
    while IFS= read -r line; do summary+=("  failed: $line"); done < <(
        grep -E '^test .* \.\.\. FAILED$|^FAILED |✘|^ *✖ ' "$log" | sed 's/^ *//' | sort -u | head -20)
done
echo "==== test counts per server"
printf '%s\n' "${summary[@]}"
# One closing line for all servers, in the form test runners print.
for name in "$@"; do cat "target/servers/$name.log" 2>/dev/null; done |
    grep -o '[0-9]* passed; [0-9]* failed' |
    awk '{p += $1; f += $3} END {printf "total: %d passed, %d failed\n", p, f}'
exit $status
