#!/usr/bin/env bash
# Fails when git tracks a file over 1 MB: generated data, logs and
# measurements belong in target/ or a temp dir, never in a commit.
set -euo pipefail
cd "$(dirname "$0")/.."
limit=$((1024 * 1024))
big=$(git ls-files -z | xargs -0 -r stat -c '%s %n' -- 2>/dev/null | awk -v limit="$limit" '$1 > limit')
if [ -n "$big" ]; then
    echo "tracked files over 1 MB (move them out of the repository):" >&2
    echo "$big" >&2
    exit 1
fi
