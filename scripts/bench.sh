#!/bin/bash
# bench.sh - `make bench`: runs every benchmark program found under BUILD/bench
# (default build/) one after the other and prints what each measured.
#   scripts/bench.sh [BUILD] [--json] [--quick]
# Options after BUILD go to every program. With --json the output is only the
# programs' JSON lines (one object per measured case), ready to collect.
# The machine is shared and noisy: run it a few times and compare the spread.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=build
if [[ $# -gt 0 && $1 != -* ]]; then BUILD=$1; shift; fi
json=0
for a in "$@"; do [[ $a == --json ]] && json=1; done

if [[ ! -d $BUILD/bench ]]; then
    echo "bench: $BUILD/bench does not exist; build first (make)" >&2
    exit 1
fi
mapfile -t progs < <(find "$BUILD/bench" -name CMakeFiles -prune -o -type f -perm -u+x -print | sort)
if ((${#progs[@]} == 0)); then
    echo "bench: no benchmark programs under $BUILD/bench" >&2
    exit 1
fi
rc=0
for p in "${progs[@]}"; do
    ((json)) || printf '\n==== %s\n' "${p#"$BUILD"/}"
    "$p" "$@" || { echo "bench: ${p#"$BUILD"/} failed (exit $?)" >&2; rc=1; }
done
exit $rc
