#!/usr/bin/env bash
# `make bench-clients`: what one process's waiting threads (or tasks, or promises) cost the
# server through each client, and how soon a holder hears that the server ended its grant.
# Each client runs against a fresh redis-server with the module (FLOCK_MODULE, on
# FLOCK_SERVER) on a free loopback port; one Markdown table row per client. Argument:
# waiters per process (default 300).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${FLOCK_MODULE:=$PWD/target/release/libredis_flock.so}"
n=${1:-300}
server=${FLOCK_SERVER:-redis-server}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

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

echo "| client | waiters | connections added | server memory per waiter | a holder hears of FORCERELEASE |"
echo "|---|---:|---:|---:|---:|"
clients/java/build.sh jar >/dev/null
javac -d "$scratch" -cp clients/java/build/flock-client.jar clients/java/bench/Waiters.java
with_server sh -c "java -cp clients/java/build/flock-client.jar:$scratch Waiters \$PORT $n"
with_server sh -c "cd clients/node && node bench/waiters.js \$PORT $n"
venv=target/python-venv
"$venv/bin/pip" install --quiet --disable-pip-version-check ./clients/python
with_server sh -c "$venv/bin/python clients/python/bench/waiters.py \$PORT $n"
