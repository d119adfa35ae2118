#!/bin/bash
# in-vm.sh - runs inside the Soft-RoCE VM (from bench/softroce/run.sh), or on
# a host with an RDMA device: perftest and our benchmarks on one device, then
# the ratios. Needs VRPC_VERBS_IP, VRPC_VERBS_DEV, VRPC_VERBS_GID.
#   in-vm.sh BUILD_DIR [--quick]
set -uo pipefail
BUILD=$1 QUICK=${2:-}
DEV=$VRPC_VERBS_DEV GID=$VRPC_VERBS_GID IP=$VRPC_VERBS_IP
N=5000; [[ $QUICK == --quick ]] && N=1000
out=$(mktemp -d)

# perftest pair: server in the background, client after it listens
pair() { # TOOL ARGS...
    local tool=$1; shift
    timeout 120 "$tool" "$@" >"$out/srv" 2>&1 & local sp=$!
    sleep 1
    timeout 120 "$tool" "$@" "$IP" 2>&1; wait "$sp"
}
echo "== ib_send_lat -s 32 -n $N on $DEV (polling)"
pair ib_send_lat -d "$DEV" -x "$GID" -F -s 32 -n "$N" | tee "$out/lat"
lat_typ=$(awk '$1 == 32 && NF >= 8 { print $5 }' "$out/lat")
echo "== ib_send_bw -s 32 -n $((N * 4)) on $DEV"
pair ib_send_bw -d "$DEV" -x "$GID" -F -s 32 -n $((N * 4)) --report_gbits | tee "$out/bw"
bw_rate=$(awk '$1 == 32 && NF >= 5 { print $5 }' "$out/bw")   # Mpps

echo "== transport_bench --backend verbs"
tb=()
[[ $QUICK == --quick ]] && tb=(--quick)
"$BUILD/bench/transport/transport_bench" --backend verbs --server "$IP" --client-src "$IP" --json "${tb[@]}" \
    2>"$out/tb.err" | tee "$out/tb"
field() { # FILE NAME KEY
    grep "\"name\":\"$2\"" "$1" | head -1 | sed -n "s/.*\"$3\":\([0-9.e+-]*\).*/\1/p"
}
tb_p50=$(field "$out/tb" "transport:verbs_pingpong_32B_busypoll" p50_us)
tb_ev_p50=$(field "$out/tb" "transport:verbs_pingpong_32B" p50_us)
tb_rate=$(field "$out/tb" "transport:verbs_rate_32B_1t" ops_per_s)
ratio() { [[ -n $1 && -n $2 ]] && awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }' || echo n/a; }
echo
echo "== ratios (same device, same boot; ib_send_lat reports half the round trip, so ours are halved too)"
echo "ib_send_lat typical 32 B: ${lat_typ:-?} us; ib_send_bw 32 B: ${bw_rate:-?} Mpps"
echo "transport_bench verbs ping-pong busy-poll p50/2: $(awk -v x="${tb_p50:-0}" 'BEGIN{printf "%.2f", x/2}') us -> $(ratio "$(awk -v x="${tb_p50:-0}" 'BEGIN{print x/2}')" "$lat_typ") x ib_send_lat (target <= 1.5)"
echo "transport_bench verbs ping-pong event-driven p50/2: $(awk -v x="${tb_ev_p50:-0}" 'BEGIN{printf "%.2f", x/2}') us -> $(ratio "$(awk -v x="${tb_ev_p50:-0}" 'BEGIN{print x/2}')" "$lat_typ") x"
echo "message rate 32 B: transport $(ratio "${tb_rate:-0}" "$(awk -v x="${bw_rate:-0}" 'BEGIN{print x*1e6}')") x ib_send_bw"
rm -rf "$out"
