#!/usr/bin/env bash
# `make bench-clients`: what one process's waiting threads (or tasks, or promises) cost the
# server through each client, and how soon a holder hears that the server ended its grant.
# Each client runs against a fresh redis-server with the module (FLOCK_MODULE, on
# FLOCK_SERVER) on a free loopback port; one Markdown table row per client. Argument:
# waiters per process (default 300). BENCH_SECTIONS (space-separated; default all) picks
# what runs: waiters, pairs, grants, knows-first (Python and Node), java-rust, silences.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${FLOCK_MODULE:=$PWD/target/release/libredis_flock.so}"
n=${1:-300}
server=${FLOCK_SERVER:-redis-server}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

want() { [[ " ${BENCH_SECTIONS:-waiters pairs grants knows-first java-rust silences} " == *" $1 "* ]]; }

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Runs "$@" with PORT set to a fresh server's port, and stops the server after.
with_server() {
    local port pid
    port=$(free_port)
    "$server" --port "$port" --bind 127.0.0.1 --save '' --appendonly no --loadmodule "$FLOCK_MODULE" \
        --dir "$scratch" >/dev/null 2>&1 &
    pid=$!
    for _ in $(seq 100); do redis-cli -p "$port" ping 2>/dev/null | grep -q PONG && break; sleep 0.05; done
    PORT=$port "$@" || { kill "$pid"; return 1; }
    kill "$pid"
    wait "$pid" 2>/dev/null || true
}

venv=target/python-venv
if want waiters; then
echo "| client | waiters | connections added | server memory per waiter | a holder hears of FORCERELEASE |"
echo "|---|---:|---:|---:|---:|"
clients/java/build.sh jar >/dev/null
javac -d "$scratch" -cp clients/java/build/flock-client.jar clients/java/bench/Waiters.java
with_server sh -c "java -cp clients/java/build/flock-client.jar:$scratch Waiters \$PORT $n"
with_server sh -c "cd clients/node && node bench/waiters.js \$PORT $n"
"$venv/bin/pip" install --quiet --disable-pip-version-check ./clients/python
with_server sh -c "$venv/bin/python clients/python/bench/waiters.py \$PORT $n"
fi

# ---- Clients: overhead and who knows first -- Python and Node ----------------------------
# Each measurement is a header, then a function per client printing its rows (each on a fresh
# server); the Java and Rust rows belong in the same tables. docs/benchmark.md, "Clients:
# overhead and who knows first", says what each measures.

python_ready() {
    [[ -n "${python_installed:-}" ]] && return
    "$venv/bin/pip" install --quiet --disable-pip-version-check ./clients/python
    python_installed=1
}

load() { echo; echo "Load average: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores)."; }

pairs_header() {
    echo
    echo "Uncontended acquire + release through the public API, one thread or task, one lock, beside the library it replaces in the same run (blocks of 100 pairs taken in turn, after warm-up):"
    echo
    echo "| client | replaces | pairs | p50 ms | p99 ms | replaced p50 ms | replaced p99 ms | p50 ratio | p99 ratio |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
}
pairs_python() {
    python_ready
    with_server sh -c "$venv/bin/python clients/python/bench/overhead.py \$PORT pairs"
}
pairs_node() {
    # node-redlock v5, which the Node client stands in for: only prereleases carry 5 (redlock@5
    # matches none), so the last one is named.
    npm install --no-save --silent --prefix "$scratch/redlock" redlock@5.0.0-beta.2 >/dev/null
    # The row of the median p50 ratio of five processes: the two are level, and one process's
    # ratio strays from another's by up to 3% (V8's compiling, where the heap lies).
    with_server sh -c "cd clients/node && for run in 1 2 3 4 5; do node bench/overhead.js \$PORT pairs $scratch/redlock; done" |
        sort -t '|' -k9,9 | sed -n 3p
}

grants_header() {
    echo
    echo "Contended: 8 threads (or async loops) of one process on one lock, each holding it 100 us then releasing, for 3 s: the client's public API against the same workers sending the raw FLOCK.ACQUIRE ... WAIT 0 (a connection each) and FLOCK.RELEASE, in six rounds taken in turn:"
    echo
    echo "| client | workers | hold | raw grants/s | client grants/s | client/raw | grants per worker (client) |"
    echo "|---|---|---|---:|---:|---:|---:|"
}
grants_python() {
    python_ready
    with_server sh -c "$venv/bin/python clients/python/bench/overhead.py \$PORT grants"
}
grants_node() {
    with_server sh -c "cd clients/node && node bench/overhead.js \$PORT grants"
}

knows_first_header() {
    echo
    echo "Who knows first: a holder process cut off by scripts/partition-proxy.py (holding a closed connection's FIN while cut: see clients/python/bench/knows_first.py) holds one lock per key, with a waiter queued behind each on a direct connection; per trial (a key), the waiter's grant time less the time the holder's client reported the loss (CLOCK_MONOTONIC):"
    echo
    echo "| client | grant | runs x keys | trials | grant - loss min ms | p50 ms | p99 ms | grant first | loss - local deadline p99 ms | loss reasons |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"
}
knows_first_python() {
    python_ready
    with_server sh -c "$venv/bin/python clients/python/bench/knows_first.py \$PORT 'Python \`redis_flock.Lock\`' -- $venv/bin/python clients/python/bench/holder.py"
}
knows_first_node() {
    python_ready
    with_server sh -c "$venv/bin/python clients/python/bench/knows_first.py \$PORT 'Node \`Flock\` (ioredis)' -- node clients/node/bench/holder.js"
}

if want pairs || want grants || want knows-first; then load; fi
if want pairs; then pairs_header; pairs_python; pairs_node; fi
if want grants; then grants_header; grants_python; grants_node; fi
if want knows-first; then knows_first_header; knows_first_python; knows_first_node; fi
if want pairs || want grants || want knows-first; then load; fi

# ---- Java and Rust: what the API costs over the raw commands, and who knows first ----------------------------
# clients/java/bench/ClientBench.java and crates/flock-client/examples/bench_client.rs, on a fresh server per
# measurement: (1) uncontended acquire + release through the API against the raw commands it sends, (2) grants/s
# of 8 threads on one lock through the API against raw blocking waits, (3) a holder cut off by
# scripts/partition-proxy.py (PARTITION_PROXY: another script of the same interface) against the next waiter's
# grant. BENCH_SECTIONS java-rust runs it; JR_SECTIONS: which of "overhead contended first" run (default all). See docs/benchmark.md, "Clients:
# overhead and who knows first". About 4 minutes.
jr_load() { echo; echo "Load average before this table (1, 5, 15 min): $(cut -d' ' -f1-3 /proc/loadavg)"; echo; }

jr_build() {
    clients/java/build.sh jar >/dev/null
    mkdir -p "$scratch/jr"
    javac --release 17 -Xlint:all -Werror -d "$scratch/jr" -cp clients/java/build/flock-client.jar \
        clients/java/bench/ClientBench.java
    cargo build --release --quiet --package flock-client --example bench_client
}

# Runs both clients' $1 section, each on a fresh server.
jr_section() {
    with_server sh -c "java -cp clients/java/build/flock-client.jar:$scratch/jr ClientBench \$PORT $1"
    with_server sh -c "target/release/examples/bench_client \$PORT $1"
}

jr_overhead() {
    jr_load
    echo "| client | pairs each | API try p50 / p99 us | API wait p50 / p99 us | raw session + IDs p50 / p99 us | raw session p50 / p99 us | raw \`30000\` p50 / p99 us | API try / raw session (p50 / p99) | API try / raw session + IDs (p50 / p99) |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    jr_section overhead
}

jr_contended() {
    jr_load
    echo "| client | threads | runs | API grants/s | raw session grants/s | raw blocking grants/s | API / raw blocking (median, range) | hand-off mean us: API / raw session / raw blocking |"
    echo "|---|---:|---|---:|---:|---:|---:|---:|"
    jr_section contended
}

jr_first() {
    jr_load
    echo "| client | configuration | trials (rounds x keys) | grant - loss min ms | p50 ms | p99 ms | grant first | p99 loss - local deadline ms | loss reasons |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|---|"
    jr_section first
}

if want java-rust; then
    jr_build
    for section in ${JR_SECTIONS:-overhead contended first}; do
        "jr_$section"
    done
fi

# ---- No false expiry: a busy server and holders that pause -----------------------------------------------------
# clients/python/bench/silences.py: one holder process per client holds session grants while two redis-benchmarks
# keep the server busy, and is stopped (SIGSTOP) again and again for up to a third of its session timeout, for
# SILENCE_SECONDS (default 180); nothing may be lost. See docs/benchmark.md, "No false expiry".
silences() {
    "$venv/bin/python" clients/python/bench/silences.py "$PORT" "${SILENCE_SECONDS:-180}" -- \
        "Python=$venv/bin/python clients/python/bench/holder.py" \
        "Node=node clients/node/bench/holder.js" \
        "Java=java -cp clients/java/build/flock-client.jar:$scratch/holder Holder" \
        "Rust=target/release/examples/holder"
}
if want silences; then
    python_ready
    clients/java/build.sh jar >/dev/null
    mkdir -p "$scratch/holder"
    javac --release 17 -Xlint:all -Werror -d "$scratch/holder" -cp clients/java/build/flock-client.jar \
        clients/java/bench/Holder.java
    cargo build --release --quiet --package flock-client --example holder
    load
    echo
    echo "| client | T ms | seconds | grants held | pauses | mean pause ms | longest pause ms | grants lost | sessions expired (server) | PING p50/p99/max ms | server CPU |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    with_server silences
fi
