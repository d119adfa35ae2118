#!/bin/bash
# stream_callgrind.sh - user-space instructions per streamed message (both
# sides, one process) of one rpc_bench_stream case, nothing busy-waiting
# (--no-spin) so idle spinning is not counted as work. The case runs under
# `valgrind --tool=callgrind` for D and for 2D ms; (Ir(2D) - Ir(D)) divided
# by the difference in messages removes start-up and shutdown. Also printed:
# the server's stream task, the client's stream task, the pollers and the
# workers, each inclusive per message of the longer run.
#   bench/rpc/stream_callgrind.sh BUILD_DIR [CASE] [D]
# CASE: an rpc_bench_stream --only name (default oneway_s1_32B); D default 3000.
# VRPC_CG_STREAM_ARGS: more rpc_bench_stream options (e.g. --on-poller).
set -euo pipefail
BUILD=${1:?usage: $0 BUILD_DIR [CASE] [D_MS]}
CASE=${2:-oneway_s1_32B}
D=${3:-3000}
command -v valgrind >/dev/null || { echo "stream_callgrind: valgrind not installed" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
run() { # DURATION -> "messages instructions" and $tmp/inc.DURATION
    local d=$1 line rate f
    line=$(timeout 900 valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.$d" \
        "$BUILD/bench/rpc/rpc_bench_stream" --no-spin --no-baseline --only "$CASE" --rounds 1 \
        --duration-ms "$d" ${VRPC_CG_STREAM_ARGS:-} 2>/dev/null | grep '^rpc:' | head -1)
    rate=$(awk '{print $2}' <<<"$line")
    callgrind_annotate --inclusive=yes "$tmp/cg.$d" >"$tmp/inc.$d"
    echo "$(python3 -c "print(int($rate * $d / 1000))") $(awk '/PROGRAM TOTALS/{gsub(",","",$1); print $1}' "$tmp/inc.$d")"
}
read -r m1 i1 < <(run "$D")
read -r m2 i2 < <(run $((2 * D)))
get() { grep -m1 "$1" "$tmp/inc.$((2 * D))" | awk '{gsub(",","",$1); print $1}'; }
python3 - "$CASE" "$m1" "$i1" "$m2" "$i2" "$(get 'server_stream.c:stream_task')" "$(get 'stream_recv.c:stream_task')" \
    "$(get 'transport.c:poller_main')" "$(get 'sched.c:worker_main')" <<'PY'
import sys
case = sys.argv[1]
m1, i1, m2, i2 = (int(x) for x in sys.argv[2:6])
parts = [int(x or 0) for x in sys.argv[6:]]
if m2 <= m1:
    sys.exit("stream_callgrind: the longer run carried no more messages (%d, %d)" % (m1, m2))
print("# stream_callgrind %s: %d and %d messages" % (case, m1, m2))
print("instructions per message (both sides): %.0f" % ((i2 - i1) / (m2 - m1)))
for name, v in zip(["server stream task", "client stream task", "pollers", "workers"], parts):
    print("  %-20s %.0f (inclusive, longer run)" % (name, v / m2))
PY
