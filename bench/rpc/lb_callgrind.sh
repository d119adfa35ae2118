#!/bin/bash
# lb_callgrind.sh - client instructions per unary call (32 B echo, synchronous)
# of a channel over several servers against a single-server channel, under
# `valgrind --tool=callgrind` (as callgrind.sh: (Ir(2N) - Ir(N)) / N, --no-spin).
# Three rpc_bench servers run natively; the client connects to
#   tcp://A                    a plain channel (the baseline)
#   list://A                   a channel over one server
#   list://A,B,C               round_robin, least_outstanding, ring_hash (no key: random)
# With BASE_BUILD (a build of the tree before the change) its plain channel is
# measured too: the single-server hot path must not get slower.
# TOGGLE=vrpc_call counts only inside vrpc_call on the calling thread (the
# call path itself, without the pollers' and workers' threads, whose counts
# vary by a few hundred instructions per call from run to run with how often
# they sleep).
#   bench/rpc/lb_callgrind.sh BUILD_DIR [N] [BASE_BUILD_DIR]
set -euo pipefail
BUILD=${1:?usage: $0 BUILD_DIR [N] [BASE_BUILD_DIR]}
N=${2:-2000}
BASE=${3:-}
RB=$BUILD/bench/rpc/rpc_bench
command -v valgrind >/dev/null || { echo "lb_callgrind.sh: valgrind not installed" >&2; exit 77; }
[[ -x $RB ]] || { echo "lb_callgrind.sh: $RB not built" >&2; exit 1; }
TMP=$(mktemp -d)
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true; rm -rf "$TMP"' EXIT

ADDR=()
for i in 0 1 2; do
    "$RB" --role server --listen tcp://127.0.0.1:0 --no-spin >"$TMP/addr$i" &
    PIDS+=($!)
    for _ in $(seq 1 600); do [[ -s $TMP/addr$i ]] && break; sleep 0.1; done
    ADDR+=("$(head -1 "$TMP/addr$i")")
done

ir() { awk '/^(summary|totals):/ { print $2; exit }' "$1"; }

measure() { # rpc_bench target [--lb policy] -> instructions per call
    local rb=$1 target=$2 n
    shift 2
    for n in "$N" $((2 * N)); do
        valgrind --tool=callgrind --quiet --callgrind-out-file="$TMP/out.$n" ${TOGGLE:+--toggle-collect=$TOGGLE} \
            "$rb" --role client --connect "$target" --calls "$n" --size 32 --no-spin "$@" >/dev/null
    done
    echo $((($(ir "$TMP/out.$((2 * N))") - $(ir "$TMP/out.$N")) / N))
}

A=${ADDR[0]}
THREE="list://${ADDR[0]},${ADDR[1]},${ADDR[2]}"
plain=$(measure "$RB" "$A")
printf '%-34s %8s instructions per call\n' "plain $A" "$plain"
if [[ -n $BASE ]]; then
    base=$(measure "$BASE/bench/rpc/rpc_bench" "$A")
    printf '%-34s %8s (after/before %s)\n' "plain, before the change" "$base" \
        "$(awk -v a="$plain" -v b="$base" 'BEGIN { printf "%.3f", a / b }')"
fi
one=$(measure "$RB" "list://$A")
printf '%-34s %8s (x%s of plain)\n' "list:// of 1" "$one" "$(awk -v a="$one" -v b="$plain" 'BEGIN { printf "%.3f", a / b }')"
for pol in round_robin least_outstanding ring_hash; do
    v=$(measure "$RB" "$THREE" --lb $pol)
    printf '%-34s %8s (x%s of plain)\n' "list:// of 3, $pol" "$v" \
        "$(awk -v a="$v" -v b="$plain" 'BEGIN { printf "%.3f", a / b }')"
done
