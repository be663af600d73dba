#!/usr/bin/env bash
# Makes the persistence fixtures of tests/integration/fixtures.rs with a given module build:
#
#   scripts/make-fixtures.sh MODULE.so NAME
#
# writes tests/fixtures/NAME-rdb/dump.rdb (SAVE, appendonly no) and
# tests/fixtures/NAME-aof/appendonlydir (appendonly yes, aof-use-rdb-preamble no:
# phase 1 below, BGREWRITEAOF, phase 2, so the AOF holds both rewritten and
# propagated records), and prints every holder (key owner holds token session
# permits) and the tokens in the order of the tests' expected tables. Each
# directory is made by its own server run, so RDB and AOF tokens differ.
#
# Leases and the request-ID window are 2^40 ms, so the locks are still held
# when the tests load the files. The locks (tests/integration/fixtures.rs checks each):
#   phase 1
#     held2            alice acquires twice (exclusive, holds 2)
#     bin\x00\xffkey   carol (binary key name)
#     ids              dave with ID acq-1
#     linger           erin with ID lin-a, released with ID lin-r (free, kept by its IDs)
#     rw               frank SHARED SESSION (connection open until the save),
#                      grace SHARED, mallory SHARED
#     sem              heidi PERMITS 2 LIMIT 5
#     semids           judy PERMITS 1 LIMIT 3 ID sj-a, ken PERMITS 2 LIMIT 3 ID sk-a;
#                      judy releases with ID sj-r
#     semold           pat PERMITS 3 LIMIT 4 ID so-a, released with ID so-r
#                      (a semaphore kept by its IDs, all before the rewrite)
#     handoff          quinn (exclusive); nina and omar wait for it SHARED
#   phase 2 (after the BGREWRITEAOF in the AOF run)
#     sess             bob with SESSION (connection open until the save)
#     ids              dave again with ID acq-2, released once with ID rel-1 (holds 1)
#     rw               grace SHARED again (holds 2); mallory releases (holds nothing)
#     sem              ivan PERMITS 1 LIMIT 5
#     semids           ken releases with ID sk-r (a semaphore kept by its IDs)
#     handoff          quinn releases: nina and omar are granted shared together
#
# Fixtures made with it (tests/integration/fixtures.rs has their tokens):
#   v3-rdb, v3-aof  module of commit ee21794 (RDB encoding 3; AOF of FLOCK.STATE,
#                   FLOCK.HOLDER and FLOCK.ID), Redis 7.0.15
#   v4-rdb, v4-aof  module of the persistence rewrite on top of ee21794 (working
#                   tree of 2026-11-24 20:21 UTC, before its commit; RDB
#                   encoding 4; AOF of FLOCK.HOLDER and FLOCK.ID), Redis 7.0.15
# (v2-rdb and v2-aof were made by hand with the module of commit 9da2252.)
set -euo pipefail

if [ $# -ne 2 ] || [ ! -f "$1" ]; then
    echo "usage: $0 MODULE.so NAME   (writes tests/fixtures/NAME-rdb and NAME-aof)" >&2
    exit 2
fi
so=$(realpath "$1")
name=$2
root=$(cd "$(dirname "$0")/.." && pwd)
LEASE=1099511627776
work=$(mktemp -d /tmp/flock-fixtures-XXXXXX)
pids=()

cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

sock=""
cli() { redis-cli -s "$sock" "$@"; }
# Commands as redis-cli lines (quoted strings may hold \x escapes), one connection.
lines() { printf '%s\n' "$@" | redis-cli -s "$sock"; }
expect() { # expect WANT LINE...: runs the lines, fails unless the output is WANT
    local got
    got=$(lines "${@:2}" | tr '\n' ' ' | sed 's/ $//')
    [ "$got" = "$1" ] || { echo "unexpected reply to ${*:2}: '$got' (want '$1')" >&2; exit 1; }
}

start() { # start DIR CONFIG...: a server with the module on a unix socket in DIR
    local dir=$1
    shift
    sock=$dir/redis.sock
    redis-server --port 0 --unixsocket "$sock" --dir "$dir" --save '' --logfile "$dir/server.log" \
        --loadmodule "$so" retry-window-ms "$LEASE" "$@" &
    server_pid=$!
    pids+=("$server_pid")
    for _ in $(seq 100); do
        [ "$(cli PING 2>/dev/null)" = PONG ] && return
        sleep 0.05
    done
    echo "redis-server did not start:" >&2
    cat "$dir/server.log" >&2
    exit 1
}

stop() {
    kill "$server_pid"
    wait "$server_pid" 2>/dev/null || true
}

# A connection kept open (for SESSION): session NAME LINE.
session() {
    local fifo=$work/$1.fifo
    mkfifo "$fifo"
    redis-cli -s "$sock" <"$fifo" >"$work/$1.out" &
    pids+=($!)
    eval "exec {fd_$1}>\"\$fifo\""
    local fd_var=fd_$1
    echo "$2" >&"${!fd_var}"
    for _ in $(seq 100); do
        [ -s "$work/$1.out" ] && break
        sleep 0.05
    done
    grep -qE '^[0-9]+$' "$work/$1.out" || { echo "session $1: $(cat "$work/$1.out")" >&2; exit 1; }
}

# A FLOCK.INFO field of KEY (a redis-cli string: quoted, \x escapes). Python
# reads the JSON: jq 1.6 rounds tokens (above 2^53) to doubles.
field() {
    printf '%s\n' "FLOCK.INFO \"$1\"" | redis-cli -s "$sock" --json |
        python3 -c 'import json, sys; print(json.load(sys.stdin)[sys.argv[1]])' "$2"
}
waiters_of() { field "$1" waiters; }

phase1() {
    cli FLOCK.ACQUIRE held2 alice "$LEASE" >/dev/null
    cli FLOCK.ACQUIRE held2 alice "$LEASE" >/dev/null
    [ "$(field held2 holds)" = 2 ]
    [ -n "$(lines "FLOCK.ACQUIRE \"bin\\x00\\xffkey\" carol $LEASE")" ]
    cli FLOCK.ACQUIRE ids dave "$LEASE" ID acq-1 >/dev/null
    cli FLOCK.ACQUIRE linger erin "$LEASE" ID lin-a >/dev/null
    expect 0 "FLOCK.RELEASE linger erin ID lin-r"
    session frank "FLOCK.ACQUIRE rw frank $LEASE SESSION SHARED"
    cli FLOCK.ACQUIRE rw grace "$LEASE" SHARED >/dev/null
    cli FLOCK.ACQUIRE rw mallory "$LEASE" SHARED >/dev/null
    cli FLOCK.ACQUIRE sem heidi "$LEASE" PERMITS 2 LIMIT 5 >/dev/null
    cli FLOCK.ACQUIRE semids judy "$LEASE" ID sj-a PERMITS 1 LIMIT 3 >/dev/null
    cli FLOCK.ACQUIRE semids ken "$LEASE" ID sk-a PERMITS 2 LIMIT 3 >/dev/null
    expect 0 "FLOCK.RELEASE semids judy ID sj-r"
    cli FLOCK.ACQUIRE semold pat "$LEASE" ID so-a PERMITS 3 LIMIT 4 >/dev/null
    expect 0 "FLOCK.RELEASE semold pat ID so-r"
    cli FLOCK.ACQUIRE handoff quinn "$LEASE" >/dev/null
    cli FLOCK.ACQUIRE handoff nina "$LEASE" WAIT 0 SHARED >"$work/nina.out" &
    nina_pid=$!
    until [ "$(waiters_of handoff)" = 1 ]; do sleep 0.05; done
    cli FLOCK.ACQUIRE handoff omar "$LEASE" WAIT 0 SHARED >"$work/omar.out" &
    omar_pid=$!
    until [ "$(waiters_of handoff)" = 2 ]; do sleep 0.05; done
}

phase2() {
    session bob "FLOCK.ACQUIRE sess bob $LEASE SESSION"
    expect "$(field ids token)" "FLOCK.ACQUIRE ids dave $LEASE ID acq-2"
    expect 1 "FLOCK.RELEASE ids dave ID rel-1"
    cli FLOCK.ACQUIRE rw grace "$LEASE" SHARED >/dev/null
    expect 0 "FLOCK.RELEASE rw mallory"
    cli FLOCK.ACQUIRE sem ivan "$LEASE" PERMITS 1 LIMIT 5 >/dev/null
    expect 0 "FLOCK.RELEASE semids ken ID sk-r"
    expect 0 "FLOCK.RELEASE handoff quinn"
    wait "$nina_pid" "$omar_pid"
    grep -qE '^[0-9]+$' "$work/nina.out" && grep -qE '^[0-9]+$' "$work/omar.out"
}

# Every holder, then the tokens in the order of tests/integration/fixtures.rs's tables.
report() {
    local key
    for key in held2 'bin\x00\xffkey' ids rw sem handoff sess; do
        printf '%s\n' "FLOCK.INFO \"$key\"" | redis-cli -s "$sock" --json | tr -d '\n'
        printf '\t%s\n' "$key"
    done | python3 -c '
import json, sys
tokens = []
for line in sys.stdin:
    text, key = line.rstrip("\n").split("\t")
    info = json.loads(text)
    print("  %s mode %s limit %s" % (key, info["mode"], info["limit"]))
    for h in info["holders"]:
        print("    %(owner)s holds %(holds)s token %(token)s session %(session)s permits %(permits)s" % h)
        tokens.append(str(h["token"]))
print("  tokens: " + ", ".join(tokens))
'
    for key in linger semids semold; do
        echo "  $key (free) pttl $(cli PTTL "$key") info $(cli FLOCK.INFO "$key")"
    done
}

# Closes the SESSION connections (after the files were copied).
end_sessions() {
    exec {fd_frank}>&- {fd_bob}>&-
    rm -f "$work"/*.fifo
}

# Waits until no AOF rewrite runs or is scheduled, and the last one succeeded.
wait_rewrite() {
    until cli INFO persistence | grep -q '^aof_rewrite_in_progress:0' &&
        cli INFO persistence | grep -q '^aof_rewrite_scheduled:0' &&
        cli INFO persistence | grep -q '^aof_last_bgrewrite_status:ok'; do
        sleep 0.05
    done
}

# The RDB.
dir=$work/rdb
mkdir -p "$dir"
start "$dir" --appendonly no
phase1
phase2
echo "$name-rdb:"
report
[ "$(cli SAVE)" = OK ]
out=$root/tests/fixtures/$name-rdb
rm -rf "$out"
mkdir -p "$out"
cp "$dir/dump.rdb" "$out/"
end_sessions
stop

# The AOF.
dir=$work/aof
mkdir -p "$dir"
start "$dir" --appendonly yes --aof-use-rdb-preamble no --appendfsync always
wait_rewrite
phase1
[[ "$(cli BGREWRITEAOF)" == Background* ]]
wait_rewrite
phase2
echo "$name-aof:"
report
out=$root/tests/fixtures/$name-aof
rm -rf "$out"
mkdir -p "$out"
cp -r "$dir/appendonlydir" "$out/"
end_sessions
stop

ls -l "$root/tests/fixtures/$name-rdb" "$root/tests/fixtures/$name-aof/appendonlydir"
