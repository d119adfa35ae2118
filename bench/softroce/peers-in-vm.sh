#!/bin/bash
# peers-in-vm.sh - verbrpc against what a user would pick instead, on one RDMA
# device in one boot: perftest (ib_send_lat, ib_send_bw), libfabric's verbs
# provider (fi_pingpong over FI_EP_MSG, and over FI_EP_RDM with ofi_rxm), and
# verbrpc's transport ping-pong and message rate and RPC echo at 1 and 64
# outstanding (one at a time both synchronously, vrpc_call, and
# asynchronously, each callback starting the next call), in ROUNDS
# alternating rounds; prints the medians and the ratios
# the data-path issue sets as targets. Runs inside the Soft-RoCE VM (through
# bench/softroce/peers.sh) or on a host with an RDMA device (set
# VRPC_VERBS_IP, VRPC_VERBS_DEV, VRPC_VERBS_GID). Under emulation only
# ratios mean anything.
#   peers-in-vm.sh BUILD_DIR
# VRPC_BENCH_ROUNDS (default 3), VRPC_BENCH_N (iterations of perftest and
# fabtests per round, default 3000), VRPC_BENCH_RPC_ARGS (extra rpc_bench
# arguments of the default mode, default none), VRPC_BENCH_LAT_ARGS (those of
# the latency mode, default "--on-poller": handlers and async callbacks run
# on the pollers, with the adaptive spin; "none": the latency mode is not run).
# Every latency figure here is a full round trip (perftest and fabtests print
# half of one: doubled).
set -uo pipefail
BUILD=$(cd "$1" && pwd) || exit 2
DEV=$VRPC_VERBS_DEV GID=$VRPC_VERBS_GID IP=$VRPC_VERBS_IP
ROUNDS=${VRPC_BENCH_ROUNDS:-3} N=${VRPC_BENCH_N:-3000}
read -r -a RPC_ARGS <<<"${VRPC_BENCH_RPC_ARGS:-}"
LAT=${VRPC_BENCH_LAT_ARGS:---on-poller}
[[ $LAT == none ]] && LAT=
read -r -a LAT_ARGS <<<"$LAT"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

pair() { # TOOL ARGS... : the server in the background, the client once it listens
    local tool=$1
    shift
    timeout 120 "$tool" "$@" >"$out/srv" 2>&1 &
    local sp=$!
    sleep 1
    timeout 120 "$tool" "$@" "$IP" 2>&1
    wait "$sp"
}
field() { # FILE NAME KEY: a number from our benchmarks' JSON lines
    grep "\"name\":\"$2\"" "$1" | head -1 | sed -n "s/.*\"$3\":\([0-9.e+-]*\).*/\1/p"
}
keep() { [[ -n ${2:-} && $2 != null ]] && echo "$2" >>"$out/$1"; } # SERIES VALUE
median() { [[ -s $out/$1 ]] && sort -g "$out/$1" | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }' || echo n/a; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a != "n/a" && b != "n/a" && b > 0) printf "%.2f", a / b; else print "n/a" }'; }
rmed() { # SERIES_A SERIES_B: the median of the rounds' ratios a/b (rounds that have both)
    [[ -s $out/$1 && -s $out/$2 && $(wc -l <"$out/$1") == $(wc -l <"$out/$2") ]] || { echo n/a; return; }
    paste "$out/$1" "$out/$2" | awk '$2 > 0 { printf "%.4f\n", $1 / $2 }' | sort -g |
        awk '{ v[NR] = $1 } END { if (!NR) print "n/a"; else printf "%.2f", (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'
}
have() { command -v "$1" >/dev/null || { echo "note: $1 not installed (apt-get install ${2:-$1}): its rows are n/a"; return 1; }; }

perftest_round() {
    local s
    pair ib_send_lat -d "$DEV" -x "$GID" -F -s 32 -n "$N" >"$out/lat"
    keep ib_send_lat_rtt_us "$(awk '$1 == 32 && NF >= 8 { printf "%.2f", $5 * 2 }' "$out/lat")"
    for s in 32 4096; do
        pair ib_send_bw -d "$DEV" -x "$GID" -F -s "$s" -n $((N * 4)) >"$out/bw"
        keep "ib_send_bw_${s}_msgs" "$(awk -v s="$s" '$1 == s && NF >= 5 { printf "%.0f", $5 * 1e6 }' "$out/bw")"
    done
}

fabric_round() { # fi_pingpong prints usec/xfer, half a round trip, in column 7
    have fi_pingpong libfabric-bin || return
    pair fi_pingpong -p verbs -e msg -I "$N" -S 32 >"$out/fp"
    keep fi_pingpong_rtt_us "$(awk '$1 == 32 && NF >= 8 { printf "%.2f", $7 * 2 }' "$out/fp")"
    # Debian packages no fabtests (fi_rdm_pingpong): fi_pingpong's RDM
    # endpoint over the same provider stack (verbs under ofi_rxm) is that test
    # ofi_rxm sizes its verbs CQ for FI_UNIVERSE_SIZE peers (default 256):
    # (rx + tx size) * 256 entries is beyond rxe's max_cqe (32767), so without
    # this fi_enable failed ("Unable to create verbs CQ") and no figure came;
    # two peers need far fewer
    FI_UNIVERSE_SIZE=16 pair fi_pingpong -p "verbs;ofi_rxm" -e rdm -I "$N" -S 32 >"$out/frp"
    keep fi_rdm_pingpong_rtt_us "$(awk '$1 == 32 && NF >= 8 { printf "%.2f", $7 * 2 }' "$out/frp")"
    local f
    for f in fp frp; do # say why a run printed no figure
        grep -q '^32 ' "$out/$f" || { echo "  fi_pingpong ($f) printed no result:"; tail -3 "$out/$f" | sed 's/^/    /'; }
    done
}

verbrpc_round() { # MODE ARGS...: the transport, then the RPC echo
    local mode=$1
    shift
    if [[ $mode == default ]]; then # once per round: the rounds' ratios pair it with perftest's
        "$BUILD/bench/transport/transport_bench" --backend verbs --server "$IP" --client-src "$IP" --json --quick \
            --rounds 1 --busy-us 1000 >"$out/tb" 2>>"$out/err"
        keep "tp_pingpong_rtt_us" "$(field "$out/tb" transport:verbs_pingpong_32B_busypoll p50_us)"
        keep "tp_rate_32_msgs" "$(field "$out/tb" transport:verbs_rate_32B_1t ops_per_s)"
        keep "tp_rate_list_32_msgs" "$(field "$out/tb" transport:verbs_rate_list_32B_1t ops_per_s)"
    fi
    "$BUILD/bench/rpc/rpc_bench" --backend verbs --json --rounds 1 --duration-ms 1000 "$@" >"$out/rb" 2>>"$out/err"
    keep "${mode}_echo_out1_p50_us" "$(field "$out/rb" rpc:echo_32_out1 p50_us)"
    keep "${mode}_echo_async1_p50_us" "$(field "$out/rb" rpc:echo_32_out1_async p50_us)"
    keep "${mode}_echo_out64_calls" "$(field "$out/rb" rpc:echo_32_out64 ops_per_s)"
    keep "${mode}_echo_out1_cs_calls" "$(field "$out/rb" rpc:echo_32_out1 ctxsw_per_call)"
    keep "${mode}_echo_async1_cs_calls" "$(field "$out/rb" rpc:echo_32_out1_async ctxsw_per_call)"
}

have ib_send_lat perftest || exit 1
for ((r = 1; r <= ROUNDS; r++)); do
    echo "== round $r of $ROUNDS"
    perftest_round
    fabric_round
    verbrpc_round default "${RPC_ARGS[@]}"
    ((${#LAT_ARGS[@]})) && verbrpc_round latency "${LAT_ARGS[@]}"
    for f in "$out"/*_us "$out"/*_msgs "$out"/*_calls; do
        [[ -f $f ]] && printf '  %-28s %s\n' "$(basename "$f")" "$(tail -1 "$f")"
    done
done

lat=$(median ib_send_lat_rtt_us) fp=$(median fi_pingpong_rtt_us) frp=$(median fi_rdm_pingpong_rtt_us)
bw=$(median ib_send_bw_32_msgs)
echo
echo "== medians of $ROUNDS rounds (round trips in us, rates in messages or calls per second)"
for s in ib_send_lat_rtt_us fi_pingpong_rtt_us fi_rdm_pingpong_rtt_us tp_pingpong_rtt_us \
    default_echo_out1_p50_us latency_echo_out1_p50_us default_echo_async1_p50_us latency_echo_async1_p50_us \
    ib_send_bw_32_msgs ib_send_bw_4096_msgs tp_rate_32_msgs tp_rate_list_32_msgs \
    default_echo_out64_calls latency_echo_out64_calls \
    default_echo_out1_cs_calls latency_echo_out1_cs_calls default_echo_async1_cs_calls latency_echo_async1_cs_calls; do
    printf '  %-28s %s\n' "$s" "$(median "$s")"
done
echo "== ratios (of the medians; [in brackets: the median of the rounds' own ratios])"
for mode in latency default; do
    e64=$(median ${mode}_echo_out64_calls)
    [[ $e64 == n/a ]] && continue
    for c in out1 async1; do
        e1=$(median ${mode}_echo_${c}_p50_us)
        [[ $c == out1 ]] && what="synchronous" || what="asynchronous, next call from the callback"
        echo "  $mode: RPC echo p50 ($what) / ib_send_lat $(ratio "$e1" "$lat") [$(rmed ${mode}_echo_${c}_p50_us ib_send_lat_rtt_us)]" \
            "(target <= 1.5 in the latency mode), / fi_pingpong $(ratio "$e1" "$fp") [$(rmed ${mode}_echo_${c}_p50_us fi_pingpong_rtt_us)]" \
            "(target < 1), / fi_rdm_pingpong $(ratio "$e1" "$frp")"
    done
    echo "  $mode: RPC calls/s at 64 out / ib_send_bw msgs/s $(ratio "$e64" "$bw") [$(rmed ${mode}_echo_out64_calls ib_send_bw_32_msgs)] (target >= 0.4)"
done
echo "  transport 32 B one-way rate / ib_send_bw $(ratio "$(median tp_rate_32_msgs)" "$bw") [$(rmed tp_rate_32_msgs ib_send_bw_32_msgs)] (target >= 0.8)"
echo "  transport 32 B one-way rate, 16 per vrpc_ep_send_list / ib_send_bw $(ratio "$(median tp_rate_list_32_msgs)" "$bw") [$(rmed tp_rate_list_32_msgs ib_send_bw_32_msgs)]"
[[ -s $out/err ]] && { echo "== stderr of our benchmarks (last lines)"; tail -5 "$out/err"; }
exit 0
