#!/usr/bin/env bash
# The state rule (src/state.rs): every callback borrows the state once, at
# its entry (`state::with`, `state::try_with`, `state::now_or_after`), and
# passes `&mut State` down. A function that is handed `&mut State` and
# borrows it again would abort redis-server (a RefCell borrowed twice), so
# this fails on any such borrow inside a function whose signature takes
# `&mut State`. A function's body ends at the first `}` line indented as
# its `fn` line (rustfmt's layout).
set -u
cd "$(dirname "$0")/../src"
bad=$(awk '
    FNR == 1 { inside = 0; sig = "" }
    /^[[:space:]]*(pub(\([a-z]+\))? )?fn [a-z_0-9]+/ {
        match($0, /^[[:space:]]*/); indent = RLENGTH; sig = $0; collecting = 1; inside = 0
    }
    collecting && !/^[[:space:]]*(pub(\([a-z]+\))? )?fn / { sig = sig $0 }
    collecting && /\{[[:space:]]*$/ { collecting = 0; inside = (sig ~ /[a-z_]+: &mut State[,)]/) }
    inside && /state::(with|try_with|now_or_after)\(/ { printf "%s:%d: %s\n", FILENAME, FNR, $0 }
    inside && /^[[:space:]]*\}/ { match($0, /^[[:space:]]*/); if (RLENGTH == indent) inside = 0 }
' $(ls ./*.rs ffi/*.rs | grep -v '^./state.rs$'))
if [ -n "$bad" ]; then
    echo "the state is borrowed again inside a function that is handed it (&mut State):" >&2
    echo "$bad" >&2
    exit 1
fi
echo "the state is borrowed once per callback: no function handed &mut State borrows it again"
