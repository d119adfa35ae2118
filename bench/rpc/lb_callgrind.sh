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
# With TOGGLE=vrpc_call it also prints the lb layer: the calling thread's
# instructions outside vrpc_ch_call (the plain channel's call, where the
# variation between runs is), per call, over the plain channel's own (the
# argument check and dispatch): the policy's own cost, which repeats to the
# instruction, as a share of a plain call. REPEAT=K measures everything K
# times, alternating, and prints each figure's median.
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
# inclusive instructions of vrpc_ch_call (0 if it never ran)
inner() { callgrind_annotate --inclusive=yes "$1" 2>/dev/null | awk '!f && /rpc\/call\.c:vrpc_ch_call( \[|$)/ { gsub(",", "", $1); v = $1; f = 1 } END { print f ? v : 0 }'; }

LAYER=0
measure() { # rpc_bench target [--lb policy] -> VAL: instructions per call, LAYER: outside vrpc_ch_call
    local rb=$1 target=$2 n
    shift 2
    for n in "$N" $((2 * N)); do
        valgrind --tool=callgrind --quiet --callgrind-out-file="$TMP/out.$n" ${TOGGLE:+--toggle-collect=$TOGGLE} \
            "$rb" --role client --connect "$target" --calls "$n" --size 32 --no-spin "$@" >/dev/null
    done
    local t1 t2
    t1=$(ir "$TMP/out.$N") t2=$(ir "$TMP/out.$((2 * N))")
    if [[ ${TOGGLE:-} == vrpc_call ]]; then
        LAYER=$(((t2 - $(inner "$TMP/out.$((2 * N))") - t1 + $(inner "$TMP/out.$N")) / N))
    fi
    [[ -n ${LB_CG_DEBUG:-} ]] && echo "t1 $t1 t2 $t2 i1 $(inner "$TMP/out.$N") i2 $(inner "$TMP/out.$((2 * N))")" >&2
    VAL=$(((t2 - t1) / N))
}

median() { tr ' ' '\n' | awk 'NF' | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }

A=${ADDR[0]}
THREE="list://${ADDR[0]},${ADDR[1]},${ADDR[2]}"
REPEAT=${REPEAT:-1}
NAMES=(plain base one round_robin least_outstanding ring_hash)
declare -A ALL LAY
for ((r = 0; r < REPEAT; r++)); do
    for name in "${NAMES[@]}"; do
        case $name in
        plain) measure "$RB" "$A" ;;
        base) [[ -n $BASE ]] || continue; measure "$BASE/bench/rpc/rpc_bench" "$A" ;;
        one) measure "$RB" "list://$A" ;;
        *) measure "$RB" "$THREE" --lb "$name" ;;
        esac
        ALL[$name]+="$VAL " LAY[$name]+="$LAYER "
    done
done
med() { echo "${ALL[$1]}" | median; }
lay() { echo "${LAY[$1]}" | median; }
plain=$(med plain)
[[ -n ${LB_CG_DEBUG:-} ]] && for k in "${!ALL[@]}"; do echo "$k: ${ALL[$k]}/ ${LAY[$k]}"; done
printf '%-34s %8s instructions per call (median of %d)\n' "plain $A" "$plain" "$REPEAT"
if [[ -n $BASE ]]; then
    printf '%-34s %8s (after/before %s)\n' "plain, before the change" "$(med base)" "$(ratio "$plain" "$(med base)")"
fi
for name in one round_robin least_outstanding ring_hash; do
    case $name in one) label="list:// of 1" ;; *) label="list:// of 3, $name" ;; esac
    printf '%-34s %8s (x%s of plain)' "$label" "$(med $name)" "$(ratio "$(med $name)" "$plain")"
    if [[ ${TOGGLE:-} == vrpc_call ]]; then
        pol=$(($(lay $name) - $(lay plain)))
        printf '  lb layer %4s instructions, %s%% of plain' "$pol" "$(awk -v a="$pol" -v b="$plain" 'BEGIN { printf "%.1f", 100 * a / b }')"
    fi
    echo
done
