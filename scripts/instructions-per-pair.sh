#!/usr/bin/env bash
# Instructions redis-server executes per uncontended FLOCK.ACQUIRE +
# FLOCK.RELEASE pair, counted by callgrind: the server runs under valgrind
# twice, once fed N pairs and once none through `redis-cli --pipe`, and the
# difference of the two totals is divided by N. For comparison, the same is
# measured for `SET key token NX PX` with a Lua compare-and-delete, the lock
# FLOCK replaces. Usage: scripts/instructions-per-pair.sh [MODULE] [N]
# (default: the release build, 10000). Needs valgrind; takes about a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
module=$(realpath "${1:-target/release/libredis_flock.so}")
n=${2:-10000}
server=${FLOCK_SERVER:-redis-server}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Prints the instructions the server ran while `redis-cli --pipe` sent $1.
instructions() {
    local port
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    valgrind --tool=callgrind --callgrind-out-file="$work/out.%p" \
        "$server" --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
        --loadmodule "$module" >/dev/null 2>&1 &
    local pid=$!
    until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.2; done
    redis-cli -p "$port" --pipe <"$1" >/dev/null
    redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
    wait "$pid" || true
    grep -h '^summary:' "$work"/out.* | awk '{print $2}'
    rm -f "$work"/out.*
}

: >"$work/none"
# The pairs in the protocol `redis-cli --pipe` sends as it is.
python3 - "$work" "$n" <<'PY'
import sys
work, n = sys.argv[1], int(sys.argv[2])
cas = 'if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) end return 0'
def command(*words):
    return "*%d\r\n" % len(words) + "".join("$%d\r\n%s\r\n" % (len(w.encode()), w) for w in words)
pairs = {
    "flock": command("FLOCK.ACQUIRE", "lock", "worker", "30000") + command("FLOCK.RELEASE", "lock", "worker"),
    "setnx": command("SET", "lock", "token", "NX", "PX", "30000") + command("EVAL", cas, "1", "lock", "token"),
}
for name, pair in pairs.items():
    with open(f"{work}/{name}", "w", encoding="utf-8", newline="") as f:
        f.write(pair * n)
PY
base=$(instructions "$work/none")
flock=$(instructions "$work/flock")
setnx=$(instructions "$work/setnx")
echo "instructions per pair ($n pairs, $("$server" --version | grep -o 'v=[^ ]*'), callgrind):"
echo "  FLOCK.ACQUIRE + FLOCK.RELEASE:         $(((flock - base) / n))"
echo "  SET NX PX + Lua compare-and-delete:    $(((setnx - base) / n))"
