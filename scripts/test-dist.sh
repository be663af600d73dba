#!/usr/bin/env bash
# `make test-dist` (and `make test`, CI): the packages that `make dist` put in
# dist/, each installed as a user would into a fresh project outside the
# repository (a temporary directory), then that client's README example,
# copied there, run against a redis-server with the module FLOCK_MODULE
# (default: target/release/libredis_flock.so) on the server FLOCK_SERVER
# (default: redis-server), started on a free loopback port:
# - Python: a virtualenv with the wheel (redis-py from PyPI) runs
#   examples/quickstart.py; a second one installs the sdist and imports it.
# - Node: `npm init`, then `npm install` of the tarball and ioredis, runs
#   examples/basic.mjs (it imports 'redis-flock' by name).
# - Java: examples/QuickStart.java compiled and run against the jar alone; the
#   Javadoc and sources jars hold the API, the jar's manifest the version.
# One line per check, "test <name> ... ok" (or FAILED, then its output), then
# one line of counts in the form cargo prints. Fails if any check fails.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
module=${FLOCK_MODULE:-$repo/target/release/libredis_flock.so}
server=${FLOCK_SERVER:-redis-server}
version=$(cat clients/VERSION)
dist=$repo/dist
work=$(mktemp -d)
pid=''
cleanup() {
    if [ -n "$pid" ]; then
        kill "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The server: a free port, then PING until PONG, for at most 10 s; another
# port if it exits (the port was taken meanwhile).
port=''
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
start_server() {
    local attempt deadline
    mkdir -p "$work/server"
    for attempt in 1 2 3; do
        port=$(free_port)
        "$server" --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$work/server" \
            --loadmodule "$module" >>"$work/server/log" 2>&1 &
        pid=$!
        deadline=$((SECONDS + 10))
        while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -le "$deadline" ]; do
            [ "$(redis-cli -p "$port" PING 2>/dev/null)" = PONG ] && return 0
            sleep 0.05
        done
        kill "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
        pid=''
        echo "attempt $attempt: $server on port $port did not answer PING" >>"$work/server/log"
    done
    return 1
}
if [ ! -f "$module" ] || ! start_server; then
    echo "could not start $server with the module $module (make build):"
    tail -n 5 "$work/server/log" 2>/dev/null
    echo "test result: FAILED. 0 passed; 1 failed; 0 ignored (dist)"
    exit 1
fi
url=redis://127.0.0.1:$port
echo "==== the packages in dist/ (version $version), installed in $work, against $("$server" --version | grep -o 'v=[^ ]*') on port $port"

# The lock `key` is free (FLOCK.INFO answers nil): the example released it.
released() {
    [ "$(redis-cli --no-raw -p "$port" FLOCK.INFO "$1")" = "(nil)" ] || { echo "$1 is still held"; return 1; }
}
# `text` has a line matching the extended regular expression `pattern`.
has_line() {
    grep -qE "$2" <<<"$1" || { echo "no line matches '$2' in:"; echo "$1"; return 1; }
}
pip_install() { # venv, what
    timeout 300 "$1/bin/pip" install --quiet --disable-pip-version-check "$2"
}

python_wheel() {
    mkdir "$work/python" && cd "$work/python"
    python3 -m venv venv
    pip_install venv "$dist/redis_flock-$version-py3-none-any.whl"
    cp "$repo/clients/python/examples/quickstart.py" .
    out=$(timeout 60 venv/bin/python quickstart.py "$url")
    has_line "$out" '^holding orders:42, fencing token [0-9]+, lost: False$'
    has_line "$out" '^held again with fencing token [0-9]+, owned: True$'
    released orders:42
    # Imported from the virtualenv, not from the checkout.
    where=$(venv/bin/python -c 'import redis_flock; print(redis_flock.__version__, redis_flock.__file__)')
    has_line "$where" "^$version $work/python/venv/lib/python[0-9.]+/site-packages/redis_flock/__init__.py$"
}

python_sdist() {
    mkdir "$work/python-sdist" && cd "$work/python-sdist"
    python3 -m venv venv
    pip_install venv "$dist/redis_flock-$version.tar.gz"
    where=$(venv/bin/python -c '
import redis_flock, redis_flock.asyncio
from redis_flock import Lock, ReadWriteLock, Semaphore
print(redis_flock.__version__, redis_flock.__file__)')
    has_line "$where" "^$version $work/python-sdist/venv/lib/python[0-9.]+/site-packages/redis_flock/__init__.py$"
}

node_tarball() {
    mkdir "$work/node" && cd "$work/node"
    npm init -y >/dev/null
    timeout 300 npm install --no-audit --no-fund --loglevel=error "$dist/redis-flock-$version.tgz" ioredis
    cp "$repo/clients/node/examples/basic.mjs" .
    has_line "$(cat basic.mjs)" "from 'redis-flock';$"
    out=$(REDIS_URL=$url timeout 60 node basic.mjs)
    has_line "$out" '^using returned 42$'
    has_line "$out" '^fencing token [0-9]+$'
    released invoice:42
    # A copy of the package, not a link to the checkout; require() works too.
    [ ! -L node_modules/redis-flock ] || { echo "node_modules/redis-flock is a link"; return 1; }
    has_line "$(node -p 'require("./node_modules/redis-flock/package.json").version')" "^$version$"
    has_line "$(node -p 'typeof require("redis-flock").Flock')" '^function$'
}

java_jar() {
    mkdir -p "$work/java/lib" "$work/java/classes" && cd "$work/java"
    cp "$dist/flock-client-$version.jar" lib/
    cp "$repo/clients/java/examples/QuickStart.java" .
    javac --release 17 -Xlint:all -Werror -cp "lib/flock-client-$version.jar" -d classes QuickStart.java
    out=$(timeout 60 java -cp "lib/flock-client-$version.jar:classes" QuickStart 127.0.0.1 "$port")
    has_line "$out" '^holding orders:42 with token [0-9]+$'
    released orders:42
    mkdir manifest && (cd manifest && jar xf "../lib/flock-client-$version.jar" META-INF/MANIFEST.MF)
    has_line "$(tr -d '\r' <manifest/META-INF/MANIFEST.MF)" "^Implementation-Version: $version$"
}

java_docs_sources() {
    has_line "$(jar tf "$dist/flock-client-$version-javadoc.jar")" '^io/flock/FlockClient\.html$'
    has_line "$(jar tf "$dist/flock-client-$version-sources.jar")" '^io/flock/FlockClient\.java$'
}

# Each check runs in a subshell, which stops at its first failed command and
# names it; its log and status go to files named after its function. The
# checks that use the server run one after another (the examples take the
# same lock names); the others meanwhile.
check() { # function
    (
        set -eE
        # (has_line and released say why they return 1)
        trap '[[ $BASH_COMMAND == return* ]] || echo "failed ($?): $BASH_COMMAND"' ERR
        "$1"
    ) >"$work/$1.log" 2>&1
    echo $? >"$work/$1.status"
}
start=$SECONDS
check python_sdist &
meanwhile=$!
check java_docs_sources &
meanwhile="$meanwhile $!"
check python_wheel
check node_tarball
check java_jar
# shellcheck disable=SC2086 # two pids (a bare wait would wait for the server too)
wait $meanwhile
passed=0 failed=0
report() { # name, function
    if [ "$(cat "$work/$2.status")" = 0 ]; then
        echo "test $1 ... ok"
        passed=$((passed + 1))
    else
        echo "test $1 ... FAILED"
        sed 's/^/    /' "$work/$2.log"
        failed=$((failed + 1))
    fi
}
report "python: the wheel in a virtualenv runs examples/quickstart.py" python_wheel
report "python: the sdist in a virtualenv imports" python_sdist
report "node: the tarball in an npm project runs examples/basic.mjs" node_tarball
report "java: examples/QuickStart.java on the jar alone" java_jar
report "java: the javadoc and sources jars" java_docs_sources
result=ok
[ "$failed" = 0 ] || result=FAILED
echo "the packages' checks took $((SECONDS - start)) s"
echo "test result: $result. $passed passed; $failed failed; 0 ignored (dist)"
[ "$failed" = 0 ]
