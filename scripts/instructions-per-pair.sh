#!/usr/bin/env bash
# Instructions redis-server executes per uncontended FLOCK.ACQUIRE +
# FLOCK.RELEASE pair, counted by callgrind: the server runs under valgrind
# once per form, fed N pairs on one connection (sent at once, then every
# reply read), and once fed nothing; the difference of the totals is divided
# by N. Measured: the bare pair; the form the clients send (a session grant
# taken through the connection's session, each command with a request ID);
# and for comparison `SET key token NX PX` with a Lua compare-and-delete,
# the lock FLOCK replaces. Then what FLOCK.FENCED adds to the command it
# runs: a `SET` alone, and the same `SET` through FLOCK.FENCED with the
# token of a held lock. Usage: scripts/instructions-per-pair.sh [MODULE]
# [N] (default: the release build, 10000). Needs valgrind; takes about two
# minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
module=$(realpath "${1:-target/release/libredis_flock.so}")
n=${2:-10000}
server=${FLOCK_SERVER:-redis-server}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Prints the instructions the server ran while fed form $1 (none, flock,
# client, setnx) $n times.
instructions() {
    local port
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    valgrind --tool=callgrind --callgrind-out-file="$work/out.%p" \
        "$server" --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
        --loadmodule "$module" >/dev/null 2>&1 &
    local pid=$!
    until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.2; done
    python3 - "$port" "$1" "$n" <<'PY'
import socket, sys
port, form, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
cas = 'if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) end return 0'
def command(*words):
    return "*%d\r\n" % len(words) + "".join("$%d\r\n%s\r\n" % (len(w.encode()), w) for w in words)
conn = socket.create_connection(("127.0.0.1", port))
reader = conn.makefile("rb")
def reply():
    line = reader.readline()
    if line[:1] == b"$" and line[1:3] != b"-1":
        return reader.read(int(line[1:]) + 2)[:-2]
    assert line[:1] not in (b"-", b"*"), line
    return line
sid = None
if form == "client":
    conn.sendall(command("FLOCK.SESSION").encode())
    sid = reply().decode()
token = None
if form in ("set", "fenced"):
    # A held lock, and one of each command first: what a first call sets up
    # (FLOCK.FENCED's look at COMMAND INFO) is not counted per call.
    conn.sendall(command("FLOCK.ACQUIRE", "fence", "worker", "1000000").encode())
    token = int(reply()[1:])
    for warm in (command("SET", "warm", "x"), command("FLOCK.FENCED", "fence", str(token), "SET", "warm", "x")):
        conn.sendall(warm.encode())
        reply()
pair = {
    "none": lambda i: "",
    "flock": lambda i: command("FLOCK.ACQUIRE", "lock", "worker", "30000") + command("FLOCK.RELEASE", "lock", "worker"),
    "client": lambda i: command("FLOCK.ACQUIRE", "lock", "worker", "0", "WAIT", "1000", "INBOX", sid, "ID", f"a{i:020}")
    + command("FLOCK.RELEASE", "lock", "worker", "ID", f"r{i:020}"),
    "setnx": lambda i: command("SET", "lock", "token", "NX", "PX", "30000") + command("EVAL", cas, "1", "lock", "token"),
    "set": lambda i: command("SET", "data", f"v{i % 10}") * 2,
    "fenced": lambda i: command("FLOCK.FENCED", "fence", str(token), "SET", "data", f"v{i % 10}") * 2,
}[form]
sent = "".join(pair(i) for i in range(n)).encode()
conn.sendall(sent)
for _ in range(2 * n if sent else 0):
    reply()
PY
    redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
    wait "$pid" || true
    grep -h '^summary:' "$work"/out.* | awk '{print $2}'
    rm -f "$work"/out.*
}

base=$(instructions none)
echo "instructions per pair ($n pairs, $("$server" --version | grep -o 'v=[^ ]*'), callgrind):"
echo "  FLOCK.ACQUIRE + FLOCK.RELEASE:                  $((($(instructions flock) - base) / n))"
echo "  the same as the clients send (session, IDs):    $((($(instructions client) - base) / n))"
echo "  SET NX PX + Lua compare-and-delete:             $((($(instructions setnx) - base) / n))"
set=$((($(instructions set) - base) / n / 2))
fenced=$((($(instructions fenced) - base) / n / 2))
echo "instructions per command:"
echo "  SET key value:                                  $set"
echo "  FLOCK.FENCED lock token SET key value:          $fenced ($(python3 -c "print(f'{$fenced / $set:.2f}')")x)"
