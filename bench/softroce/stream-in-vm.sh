#!/bin/bash
# stream-in-vm.sh - verbrpc streaming message rates on verbs (issue 19)
# against ib_send_bw's message rate and the transport's one-way rate on the
# same Soft-RoCE device, same boot, ROUNDS alternating rounds: ib_send_bw
# (32 B and 4 KiB), then rpc_bench_stream --backend verbs (its own transport
# baseline inside each of its rounds); medians and ratios. Inside the VM
# (tests/softroce/vm.sh), or on a host with an RDMA device and VRPC_VERBS_IP,
# VRPC_VERBS_DEV, VRPC_VERBS_GID set:
#   tests/softroce/vm.sh --net single --no-share-cwd --timeout 900 -- \
#       bench/softroce/stream-in-vm.sh BUILD_DIR [ROUNDS [RPC_BENCH_STREAM_ARGS...]]
# (e.g. --on-poller: callbacks and small writes on the pollers).
# Under TCG only the ratios mean anything.
set -uo pipefail
BUILD=$1 ROUNDS=${2:-3}
shift $(($# < 2 ? $# : 2))
DEV=$VRPC_VERBS_DEV GID=$VRPC_VERBS_GID IP=$VRPC_VERBS_IP
N=20000
out=$(mktemp -d)
pair() { # TOOL ARGS... : perftest server in the background, client after it listens
    local tool=$1; shift
    timeout 120 "$tool" "$@" >"$out/srv" 2>&1 & local sp=$!
    sleep 1
    timeout 120 "$tool" "$@" "$IP" 2>&1; wait "$sp"
}
med() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)]; else print "" }'; }
vals() { # NAME: the ops_per_s of every line of that name in the rpc output
    grep "\"name\":\"$1\"" "$out/rpc" | sed -n 's/.*"ops_per_s":\([0-9.e+]*\).*/\1/p'
}
for ((r = 1; r <= ROUNDS; r++)); do
    for s in 32 4096; do
        # perftest prints the message rate in Mpps in column 5
        pair ib_send_bw -d "$DEV" -x "$GID" -F -s "$s" -n "$N" --report_gbits |
            awk -v s="$s" '$1 == s && NF >= 5 { print $5 * 1e6 }' >>"$out/ib_$s"
    done
    "$BUILD/bench/rpc/rpc_bench_stream" --backend verbs --server-ip "$IP" --client-ip "$IP" --no-grpc \
        --rounds 1 --duration-ms 2000 --json "$@" | tee -a "$out/rpc"
done
echo
echo "== medians over $ROUNDS rounds (messages/s; same device, same boot)"
for s in 32 4096; do
    ib=$(med <"$out/ib_$s") tp=$(vals "baseline:transport_verbs_oneway_${s}B" | med)
    printf '{"name":"baseline:ib_send_bw_rate_%sB","ops_per_s":%s,"p50_us":null,"p99_us":null}\n' "$s" "${ib:-null}"
    for c in oneway_sync_s1 oneway_s1 oneway_s16 bidi_s1 bidi_s16; do
        v=$(vals "rpc:stream_${c}_${s}B" | med)
        awk -v c="$c" -v s="$s" -v v="${v:-0}" -v ib="${ib:-0}" -v tp="${tp:-0}" 'BEGIN {
            printf "%s %sB: %.0f msg/s -> /ib_send_bw %.2f, /transport %.2f (transport %.0f, ib_send_bw %.0f msg/s)\n",
                   c, s, v, (ib > 0 ? v / ib : 0), (tp > 0 ? v / tp : 0), tp, ib }'
    done
done
rm -rf "$out"
