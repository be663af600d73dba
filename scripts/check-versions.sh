#!/usr/bin/env bash
# The clients' version is clients/VERSION; the Python and Node packages must
# say the same where their tools read it (pyproject.toml and
# redis_flock.__version__; package.json and package-lock.json), and the Java
# build reads it from there (clients/java/build.sh). Prints the version; fails,
# naming each file that differs, when one does. Run by `make dist` and
# `make lint`.
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(cat clients/VERSION)
[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "clients/VERSION: '$version' is not MAJOR.MINOR.PATCH" >&2; exit 1; }
status=0
check() { # file, the version found there
    [ "$2" = "$version" ] || { echo "$1 says version '$2', clients/VERSION says $version" >&2; status=1; }
}
check clients/python/pyproject.toml "$(sed -n 's/^version = "\(.*\)"$/\1/p' clients/python/pyproject.toml)"
check clients/python/src/redis_flock/__init__.py "$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' clients/python/src/redis_flock/__init__.py)"
json() { # file, a Python expression of its parsed JSON j
    python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"
}
check clients/node/package.json "$(json clients/node/package.json 'j["version"]')"
lock=$(json clients/node/package-lock.json 'j["version"] + " " + j["packages"][""]["version"]')
check clients/node/package-lock.json "${lock% *}"
check 'clients/node/package-lock.json (packages."")' "${lock#* }"
[ "$status" = 0 ] && echo "$version"
exit $status
