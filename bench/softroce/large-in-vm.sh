#!/bin/bash
# large-in-vm.sh - large messages on verbs against perftest on the same
# Soft-RoCE device, same boot: ib_read_bw and ib_send_bw (-m 1024) of each
# size, alternating with rpc_bench --payload (requests of that size, 1 and 4
# outstanding), ROUNDS times; medians (the lower middle one for an even
# count), the better of 1 and 4 outstanding, and ratios (target: >= 0.80 of
# ib_read_bw), also round by round with their median. Inside the VM
# (tests/softroce/vm.sh), or on a host with an RDMA
# device and VRPC_VERBS_IP, VRPC_VERBS_DEV, VRPC_VERBS_GID set:
#   tests/softroce/vm.sh --net single --timeout 1500 -- bench/softroce/large-in-vm.sh BUILD_DIR [SIZES] [ROUNDS]
set -uo pipefail
BUILD=$1 SIZES=${2:-65536,1048576,16777216} ROUNDS=${3:-3}
DEV=$VRPC_VERBS_DEV GID=$VRPC_VERBS_GID IP=$VRPC_VERBS_IP
out=$(mktemp -d)
pair() { # TOOL ARGS... : perftest server in the background, client after it listens
    local tool=$1; shift
    timeout 300 "$tool" "$@" >"$out/srv" 2>&1 & local sp=$!
    sleep 1
    timeout 300 "$tool" "$@" "$IP" 2>&1; wait "$sp"
}
iters() { # enough iterations for ~2 s at ~20 MB/s, at least 8
    awk -v s="$1" 'BEGIN { n = int(40000000 / s); if (n < 8) n = 8; if (n > 2000) n = 2000; print n }'
}
med() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)]; else print "" }'; }
for ((r = 1; r <= ROUNDS; r++)); do
    for s in ${SIZES//,/ }; do
        n=$(iters "$s")
        # perftest prints MB/sec (2^20 bytes) in column 4 (BW average)
        pair ib_read_bw -d "$DEV" -x "$GID" -F -m 1024 -s "$s" -n "$n" | awk -v s="$s" '$1 == s && NF >= 5 { print $4 * 1048576 }' >>"$out/read_$s"
        pair ib_send_bw -d "$DEV" -x "$GID" -F -m 1024 -s "$s" -n "$n" | awk -v s="$s" '$1 == s && NF >= 5 { print $4 * 1048576 }' >>"$out/send_$s"
    done
    "$BUILD/bench/rpc/rpc_bench" --backend verbs --server-ip "$IP" --client-ip "$IP" --payload "$SIZES" \
        --duration-ms 2000 --json | tee -a "$out/rpc"
done
echo
echo "== medians over $ROUNDS rounds (bytes/s; same device, same boot)"
for s in ${SIZES//,/ }; do
    rd=$(med <"$out/read_$s") sd=$(med <"$out/send_$s")
    lab=$(awk -v s="$s" 'BEGIN { if (s % 1048576 == 0) printf "%dMiB", s / 1048576; else if (s % 1024 == 0) printf "%dKiB", s / 1024; else printf "%dB", s }')
    o1=$(grep "\"name\":\"rpc:upload_${lab}_out1\"" "$out/rpc" | sed -n 's/.*"bytes_per_s":\([0-9.e+]*\).*/\1/p' | med)
    o4=$(grep "\"name\":\"rpc:upload_${lab}_out4\"" "$out/rpc" | sed -n 's/.*"bytes_per_s":\([0-9.e+]*\).*/\1/p' | med)
    best=$(awk -v a="${o1:-0}" -v b="${o4:-0}" 'BEGIN { print (a > b ? a : b) }')
    printf '{"name":"baseline:ib_read_bw_%s","ops_per_s":null,"p50_us":null,"p99_us":null,"bytes_per_s":%s}\n' "$lab" "${rd:-null}"
    printf '{"name":"baseline:ib_send_bw_%s","ops_per_s":null,"p50_us":null,"p99_us":null,"bytes_per_s":%s}\n' "$lab" "${sd:-null}"
    awk -v l="$lab" -v b="$best" -v rd="$rd" -v sd="$sd" 'BEGIN {
        printf "%s: rpc %.1f MB/s, ib_read_bw %.1f MB/s, ib_send_bw %.1f MB/s -> rpc/ib_read_bw %.2f (target >= 0.80), rpc/ib_send_bw %.2f\n",
               l, b / 1e6, rd / 1e6, sd / 1e6, (rd > 0 ? b / rd : 0), (sd > 0 ? b / sd : 0) }'
    # the same ratio round by round (each rpc round against the ib_read_bw
    # run just before it), whose median drifts less with a machine whose load
    # changes between rounds
    # (files, not <(...): the VM's /dev has no /dev/fd)
    for o in 1 4; do
        grep "\"name\":\"rpc:upload_${lab}_out$o\"" "$out/rpc" | sed -n 's/.*"bytes_per_s":\([0-9.e+]*\).*/\1/p' >"$out/o$o"
    done
    pr=$(paste -d ' ' "$out/read_$s" "$out/o1" "$out/o4" |
        awk 'NF == 3 && $1 > 0 { printf "%.2f\n", ($2 > $3 ? $2 : $3) / $1 }')
    echo "$lab: rpc/ib_read_bw round by round: $(echo $pr) -> median $(med <<<"$pr")"
done
rm -rf "$out"
