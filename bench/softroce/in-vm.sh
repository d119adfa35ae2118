#!/bin/bash
# in-vm.sh - runs inside the Soft-RoCE VM (from bench/softroce/run.sh), or on
# a host with an RDMA device: perftest and our benchmarks on one device, then
# the ratios. Needs VRPC_VERBS_IP, VRPC_VERBS_DEV, VRPC_VERBS_GID.
#   in-vm.sh BUILD_DIR [--quick]
# Latency: ROUNDS alternating rounds of ib_send_lat and transport_bench's
# 32 B ping-pong (one round each), a ratio per round, the median of them
# (the host is shared and noisy). VRPC_BENCH_ROUNDS (default 5, --quick 3),
# VRPC_BENCH_BUSY_US (the busy-poll variant's spin, default 1000 us: longer
# than one round trip under emulation, so it polls like ib_send_lat does).
set -uo pipefail
BUILD=$1 QUICK=${2:-}
DEV=$VRPC_VERBS_DEV GID=$VRPC_VERBS_GID IP=$VRPC_VERBS_IP
N=5000 ROUNDS=${VRPC_BENCH_ROUNDS:-5} BUSY=${VRPC_BENCH_BUSY_US:-1000}
[[ $QUICK == --quick ]] && { N=1000; ROUNDS=${VRPC_BENCH_ROUNDS:-3}; }
out=$(mktemp -d)

# perftest pair: server in the background, client after it listens
pair() { # TOOL ARGS...
    local tool=$1; shift
    timeout 120 "$tool" "$@" >"$out/srv" 2>&1 & local sp=$!
    sleep 1
    timeout 120 "$tool" "$@" "$IP" 2>&1; wait "$sp"
}
field() { # FILE NAME KEY
    grep "\"name\":\"$2\"" "$1" | head -1 | sed -n "s/.*\"$3\":\([0-9.e+-]*\).*/\1/p"
}
ratio() { [[ -n $1 && -n $2 ]] && awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }' || echo n/a; }
half() { awk -v x="${1:-0}" 'BEGIN { printf "%.2f", x / 2 }'; }
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2); else print "n/a" }'; }

echo "== latency, 32 B, $ROUNDS alternating rounds: ib_send_lat -n $N (polling) vs transport_bench ping-pong"
echo "   (ib_send_lat reports half the round trip, so ours are halved too; busy-poll variant spins ${BUSY} us)"
: >"$out/r_busy"; : >"$out/r_ev"
for ((r = 1; r <= ROUNDS; r++)); do
    pair ib_send_lat -d "$DEV" -x "$GID" -F -s 32 -n "$N" >"$out/lat"
    lat=$(awk '$1 == 32 && NF >= 8 { print $5 }' "$out/lat")
    "$BUILD/bench/transport/transport_bench" --backend verbs --server "$IP" --client-src "$IP" --json \
        --pingpong-only --rounds 1 --iters "$N" --busy-us "$BUSY" >"$out/tb" 2>>"$out/tb.err"
    bp=$(half "$(field "$out/tb" "transport:verbs_pingpong_32B_busypoll" p50_us)")
    ev=$(half "$(field "$out/tb" "transport:verbs_pingpong_32B" p50_us)")
    rb=$(ratio "$bp" "$lat") re=$(ratio "$ev" "$lat")
    echo "round $r: ib_send_lat typical ${lat:-?} us; ping-pong p50/2 busy-poll $bp us (${rb} x), event-driven $ev us (${re} x)"
    [[ $rb != n/a ]] && echo "$rb" >>"$out/r_busy"
    [[ $re != n/a ]] && echo "$re" >>"$out/r_ev"
done

echo "== ib_send_bw -s 32 -n $((N * 4)) on $DEV"
pair ib_send_bw -d "$DEV" -x "$GID" -F -s 32 -n $((N * 4)) --report_gbits | tee "$out/bw"
bw_rate=$(awk '$1 == 32 && NF >= 5 { print $5 }' "$out/bw")   # Mpps
echo "== transport_bench --backend verbs (message rate)"
tb=()
[[ $QUICK == --quick ]] && tb=(--quick)
"$BUILD/bench/transport/transport_bench" --backend verbs --server "$IP" --client-src "$IP" --json "${tb[@]}" \
    --rounds 1 --busy-us "$BUSY" 2>>"$out/tb.err" | tee "$out/tb"
tb_rate=$(field "$out/tb" "transport:verbs_rate_32B_1t" ops_per_s)

echo
echo "== ratios (same device, same boot)"
echo "ping-pong p50/2 vs ib_send_lat typical, median of $ROUNDS rounds: busy-poll $(median <"$out/r_busy") x (target <= 1.5), event-driven $(median <"$out/r_ev") x"
echo "message rate 32 B: transport $(ratio "${tb_rate:-0}" "$(awk -v x="${bw_rate:-0}" 'BEGIN{print x*1e6}')") x ib_send_bw"
rm -rf "$out"
