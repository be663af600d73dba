#!/usr/bin/env bash
# Checks that the modules of the Redis layer import one another without a
# cycle, and prints each one's level (0: imports no other module of the
# layer; n: imports modules of levels below n only). A module is a file of
# src/, or src/ffi/ as a whole; an import is any `crate::name` path in its
# code (`use` lines and inline paths, `crate::{a, b}` groups too). The pure
# core's modules, which lib.rs re-exports (`pub use flock_core::{...}`), are
# another crate that cannot import the layer, so they are left out; so is
# lib.rs, the crate root that registers everything. Exits 1 on a cycle.
set -u
cd "$(dirname "$0")/../src"

core=$(sed -nE 's/^pub use flock_core::\{(.*)\};/\1/p' lib.rs | tr -d ' ' | tr ',' '|')
outside="^(lib|$core)\$"

edges() {
    for file in *.rs ffi/*.rs; do
        from=$(basename "${file%%/*}" .rs)
        grep -qE "$outside" <<<"$from" && continue
        # Comments may name modules without importing them.
        sed 's|//.*||' "$file" | grep -oE 'crate::(\{[^}]*\}|[a-z_]+)' | sed -E 's/^crate:://; s/[{}]//g' |
            tr ',' '\n' | sed -E 's/^ *//; s/::.*//' | grep -E '^[a-z_]+$' | grep -vE "$outside" | sort -u |
            while read -r to; do [ "$to" != "$from" ] && echo "$from $to"; done
        echo "$from $from" # every module appears, even one without imports
    done | sort -u
}

edges=$(edges)
if ! order=$(tsort <<<"$edges" 2>/tmp/check-layers.$$); then
    echo "import cycle:" >&2
    cat /tmp/check-layers.$$ >&2
    rm -f /tmp/check-layers.$$
    exit 1
fi
rm -f /tmp/check-layers.$$

# tsort lists importers before what they import: assign levels bottom-up.
declare -A level
for module in $(tac <<<"$order"); do
    l=0
    while read -r from to; do
        if [ "$from" = "$module" ] && [ "$to" != "$module" ] && [ "${level[$to]}" -ge "$l" ]; then
            l=$((level[$to] + 1))
        fi
    done <<<"$edges"
    level[$module]=$l
done
for module in "${!level[@]}"; do
    imports=$(awk -v m="$module" '$1 == m && $2 != m { printf "%s ", $2 }' <<<"$edges")
    echo "${level[$module]} $module -> ${imports:-(nothing)}"
done | sort -n -k1,1 -k2,2
echo "no import cycle"
