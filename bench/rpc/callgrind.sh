#!/bin/bash
# callgrind.sh - user-space instructions per unary RPC (32 B echo), on the
# client and on the server, for verbrpc (rpc_bench --role) and for gRPC C++
# (grpc_echo_bench --role) when built. Each side runs under
# `valgrind --tool=callgrind` once with N and once with 2N calls while the
# other side runs natively; (Ir(2N) - Ir(N)) / N removes start-up and
# shutdown. Busy-waiting is switched off on the verbrpc side (--no-spin) so
# idle spinning is not counted as work; gRPC does not spin.
#   bench/rpc/callgrind.sh BUILD_DIR [N] [--json]
# VRPC_CG_RPC_ARGS: more rpc_bench arguments for both verbrpc sides (e.g.
# --on-poller: handlers and callbacks on the pollers, the client's calls a
# chain of async callbacks).
# VRPC_CG_BACKEND=verbs (in the Soft-RoCE VM, bench/softroce/cpu-in-vm.sh, or
# on a host with an RDMA device; VRPC_VERBS_IP set): the same over verbs,
# and beside it libfabric's fi_pingpong (verbs provider, FI_EP_MSG) per
# round trip, instead of gRPC. A run's counts are exact, but the number of
# sleeps and wake-ups per call depends on timing: on TCP here runs of one
# binary agree within about 4%, over verbs in the VM they differed by a
# third between boots (see bench/softroce/cpu.sh). fi_pingpong busy-polls
# and cannot be told not to: its count includes the polling while it waits
# for the other side, so it is an upper bound, and a side whose set-up
# polling varies more than the calls cost (seen on the client) gives no
# figure ("n/a").
set -euo pipefail
BUILD=${1:?usage: $0 BUILD_DIR [N] [--json]}
N=${2:-2000}
JSON=${3:-}
RB=$BUILD/bench/rpc/rpc_bench
GB=$BUILD/bench/rpc/grpc_echo_bench
command -v valgrind >/dev/null || { echo "callgrind.sh: valgrind not installed" >&2; exit 77; }
[[ -x $RB ]] || { echo "callgrind.sh: $RB not built" >&2; exit 1; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"; kill $(jobs -p) 2>/dev/null || true' EXIT
VG=(valgrind --tool=callgrind --quiet)
read -r -a RPC_ARGS <<<"${VRPC_CG_RPC_ARGS:-}"
BACKEND=${VRPC_CG_BACKEND:-tcp}
LISTEN=tcp://127.0.0.1:0
if [[ $BACKEND == verbs ]]; then
    [[ -n ${VRPC_VERBS_IP:-} ]] || { echo "callgrind.sh: VRPC_CG_BACKEND=verbs needs VRPC_VERBS_IP" >&2; exit 2; }
    LISTEN=verbs://$VRPC_VERBS_IP:0
fi

ir() { awk '/^(summary|totals):/ { print $2; exit }' "$1"; }

# start_server IMPL CALLS [valgrind-out]: starts a server in the background
# (SERVER_PID), sets ADDR once it listens.
start_server() {
    local impl=$1 calls=$2 out=${3:-} pre=()
    [[ -n $out ]] && pre=("${VG[@]}" --callgrind-out-file="$out")
    rm -f "$TMP/addr"
    if [[ $impl == verbrpc ]]; then
        "${pre[@]}" "$RB" --role server --listen "$LISTEN" --exit-after "$calls" --no-spin "${RPC_ARGS[@]}" >"$TMP/addr" &
    elif [[ $impl == fabric ]]; then # listens on its fixed control port
        "${pre[@]}" fi_pingpong -p verbs -e msg -I "$calls" -S 32 >"$TMP/fabric.srv" &
        sleep $((${#pre[@]} ? 15 : 2)) # no readiness signal: give it time to listen
        echo "$VRPC_VERBS_IP" >"$TMP/addr"
    else
        "${pre[@]}" "$GB" --role server --listen 127.0.0.1:0 --exit-after "$calls" >"$TMP/addr" &
    fi
    SERVER_PID=$!
    for _ in $(seq 1 600); do [[ -s $TMP/addr ]] && break; sleep 0.1; done
    ADDR=$(head -1 "$TMP/addr")
}

run_client() { # impl addr calls [valgrind-out]
    local impl=$1 addr=$2 calls=$3 out=${4:-} pre=()
    [[ -n $out ]] && pre=("${VG[@]}" --callgrind-out-file="$out")
    if [[ $impl == verbrpc ]]; then
        "${pre[@]}" "$RB" --role client --connect "$addr" --calls "$calls" --size 32 --no-spin "${RPC_ARGS[@]}"
    elif [[ $impl == fabric ]]; then
        "${pre[@]}" fi_pingpong -p verbs -e msg -I "$calls" -S 32 "$addr" >/dev/null
    else
        "${pre[@]}" "$GB" --role client --connect "$addr" --calls "$calls" --size 32
    fi
}

measure() { # impl side -> instructions per call
    local impl=$1 side=$2 n ir1 ir2
    for n in "$N" $((2 * N)); do
        if [[ $side == client ]]; then
            start_server "$impl" "$n"
            run_client "$impl" "$ADDR" "$n" "$TMP/$impl.$side.$n" >&2
        else
            start_server "$impl" "$n" "$TMP/$impl.$side.$n"
            run_client "$impl" "$ADDR" "$n" >&2
        fi
        wait "$SERVER_PID"
    done
    ir1=$(ir "$TMP/$impl.$side.$N")
    ir2=$(ir "$TMP/$impl.$side.$((2 * N))")
    echo $(((ir2 - ir1) / N))
}

impls=(verbrpc)
if [[ $BACKEND == verbs ]]; then
    command -v fi_pingpong >/dev/null && impls+=(fabric)
elif [[ -x $GB ]]; then
    impls+=(grpc)
fi
declare -A R
for impl in "${impls[@]}"; do
    for side in client server; do
        measure "$impl" "$side" >"$TMP/result"
        R[$impl.$side]=$(cat "$TMP/result")
        [[ $impl == fabric && ${R[$impl.$side]} -le 0 ]] && R[$impl.$side]=n/a
        if [[ $JSON == --json ]]; then
            name="cpu:${impl}_${side}_instr_per_call"
            [[ $BACKEND == verbs ]] && name="cpu:${impl}_verbs_${side}_instr_per_call"
            [[ $impl != verbrpc ]] && name="baseline:$name"
            printf '{"name":"%s","ops_per_s":null,"p50_us":null,"p99_us":null,"instr_per_call":%s,"calls":%s,"payload":32}\n' \
                "$name" "${R[$impl.$side]/n\/a/null}" "$N"
        else
            printf '%-8s %-7s %10s instructions per call (N=%s, 32 B echo, %s)\n' "$impl" "$side" "${R[$impl.$side]}" "$N" "$BACKEND"
        fi
    done
done
if [[ -n ${R[fabric.client]:-} ]]; then
    for side in client server; do
        ratio=$(awk -v a="${R[verbrpc.$side]}" -v b="${R[fabric.$side]}" 'BEGIN { if (b + 0 > 0) printf "%.2f", a / b; else print "n/a" }')
        [[ $JSON == --json ]] || echo "verbrpc RPC / fi_pingpong round trip (an upper bound: it busy-polls) on the $side: $ratio"
    done
fi
if [[ -n ${R[grpc.client]:-} ]]; then
    for side in client server; do
        ratio=$(awk -v a="${R[verbrpc.$side]}" -v b="${R[grpc.$side]}" 'BEGIN { printf "%.3f", a / b }')
        [[ $JSON == --json ]] || echo "verbrpc/gRPC on the $side: $ratio (target <= 0.1)"
    done
fi
