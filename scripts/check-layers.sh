#!/usr/bin/env bash
# Checks that the modules of each crate import one another without a cycle,
# and prints each one's level (0: imports no other module of the crate; n:
# imports modules of levels below n only). Four trees, each its own crate:
#   src                     the Redis layer
#   crates/flock-core/src   the pure core
#   crates/flock-bench/src  the benchmark
#   crates/flock-client/src the Rust client
# A module is a top-level file of the tree, or a directory (src/ffi/,
# methods/, scenarios/) as a whole; a file that a module includes with
# `#[path = "..."]` (the core's lock_tests.rs and shared_tests.rs) is folded
# into that module. The crate root (lib.rs, main.rs), which declares
# everything, is left out. An import is any `crate::name` path in a module's
# code (`use` lines and inline paths, `crate::{a, b}` groups too) that names
# another module of the same tree (the Redis layer names the core's modules
# `flock_core::...`: another crate, which cannot import the layer). A
# `crate::name` that is no module names an item of the crate root: the root
# imports every module, so that would be a cycle the levels cannot show;
# such imports are printed and fail the check too.
# On a cycle, prints the modules that import one another in a circle (their
# level is then the one they share) and, after all four trees, exits 1.
set -u
cd "$(dirname "$0")/.."

# The `crate::` names that a file's code mentions, one a line.
crate_names() {
    # Comments may name modules without importing them.
    sed 's|//.*||' "$1" | grep -oE 'crate::(\{[^}]*\}|[A-Za-z_][A-Za-z0-9_]*)' | sed -E 's/^crate:://; s/[{}]//g' |
        tr ',' '\n' | sed -E 's/^ *//; s/::.*//' | grep -E '^[A-Za-z_][A-Za-z0-9_]*$'
}

# Prints the modules that `$1` reaches through imports, itself only if it
# is on a cycle. Reads `imports` of check_tree.
reach() {
    local seen=" " todo=("$1") m to
    while [ ${#todo[@]} -gt 0 ]; do
        m=${todo[0]}
        todo=("${todo[@]:1}")
        for to in ${imports[$m]}; do
            [[ $seen == *" $to "* ]] || { seen+="$to "; todo+=("$to"); }
        done
    done
    echo "$seen"
}

# Sets level[$1]: one above the highest module that it, or its cycle, imports
# outside the cycle; the modules of a cycle share one level. Reads `imports`
# and `cycle` of check_tree.
set_level() {
    local l=0 members=${cycle[$1]:-$1} m to
    [ -n "${level[$1]:-}" ] && return
    for m in $members; do
        for to in ${imports[$m]}; do
            [[ " $members " == *" $to "* ]] && continue
            set_level "$to"
            [ "${level[$to]}" -ge "$l" ] && l=$((level[$to] + 1))
        done
    done
    for m in $members; do level[$m]=$l; done
}

# check_tree DIR ROOT TITLE: prints the levels of the modules of DIR (ROOT is
# its crate root, left out); returns 1 on a cycle or an import of an item of
# the root.
check_tree() {
    local dir=$1 root=$2 file rel name to m others
    local -A module=() imports=() rooted=() reached=() cycle=() level=()
    echo "== $dir ($3) =="
    # Files that a module includes with #[path], relative to its own directory.
    for file in $(find "$dir" -name '*.rs' | sort); do
        rel=${file#"$dir"/}
        [ "$rel" = "$root" ] && continue
        module[$file]=${rel%%/*}
        module[$file]=${module[$file]%.rs}
    done
    for file in "${!module[@]}"; do
        for rel in $(sed -nE 's/^ *#\[path *= *"([^"]+)"\].*/\1/p' "$file"); do
            module[$(dirname "$file")/$rel]=${module[$file]}
        done
    done
    for name in "${module[@]}"; do imports[$name]=""; done
    for file in "${!module[@]}"; do
        name=${module[$file]}
        for to in $(crate_names "$file"); do
            if [ -z "${imports[$to]+known}" ]; then
                [[ " ${rooted[$name]:-} " == *" $to "* ]] || rooted[$name]+=" $to"
            elif [ "$to" != "$name" ] && [[ " ${imports[$name]} " != *" $to "* ]]; then
                imports[$name]+=" $to"
            fi
        done
    done
    for name in "${!imports[@]}"; do
        imports[$name]=$(tr ' ' '\n' <<<"${imports[$name]}" | sort | xargs)
        reached[$name]=$(reach "$name")
    done
    # A cycle: the modules that reach one another, named by its sorted list.
    for name in "${!imports[@]}"; do
        [[ ${reached[$name]} == *" $name "* ]] || continue
        others=""
        for m in ${reached[$name]}; do
            [[ ${reached[$m]} == *" $name "* ]] && others+="$m "
        done
        cycle[$name]=$(tr ' ' '\n' <<<"$others" | sort | xargs)
    done
    for name in "${!imports[@]}"; do set_level "$name"; done
    for name in "${!imports[@]}"; do
        echo "${level[$name]} $name -> ${imports[$name]:-(nothing)}${cycle[$name]:+  (cycle)}"
    done | sort -n -k1,1 -k2,2
    for name in "${!rooted[@]}"; do
        echo "imports items of the crate root ($root): $name ->$(tr ' ' '\n' <<<"${rooted[$name]}" | sort | xargs -r printf ' %s')"
    done | sort
    if [ ${#cycle[@]} -eq 0 ] && [ ${#rooted[@]} -eq 0 ]; then
        echo "no import cycle"
        return 0
    fi
    printf '%s\n' "${cycle[@]}" | sort -u | while read -r others; do
        [ -n "$others" ] && echo "import cycle: $others"
    done
    return 1
}

status=0
check_tree src lib.rs "the Redis layer" || status=1
echo
check_tree crates/flock-core/src lib.rs "the core" || status=1
echo
check_tree crates/flock-bench/src main.rs "the benchmark" || status=1
echo
check_tree crates/flock-client/src lib.rs "the Rust client" || status=1
exit $status
