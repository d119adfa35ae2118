#!/bin/sh
# soak.sh BUILD - a bounded soak run (make soak; not part of make check): one
# server process under the fault-injecting transport (fault+tcp) and rounds of
# client processes running mixed load with faults against it, for
# SOAK_SECONDS (default 300). Between rounds, with no client connected, the
# server's RSS and fd count are sampled; the sample after the first round is
# the warm-up baseline. At the end it checks that
#   - every client process ended clean: each of its calls ended exactly once
#     with an allowed status, OK responses had the right bytes, its
#     large-buffer cache was empty, the layer saw no contract violation;
#   - the server's fds are exactly the baseline's, and its RSS less what its
#     large-buffer cache keeps registered (idle buffers stay mapped, up to
#     max_pinned, and grow with the peak of concurrent large messages; the
#     server prints the figure each second) is within SOAK_RSS_TOL_KB
#     (default 16384 KiB) or SOAK_RSS_TOL_PCT (default 10 %) of the
#     baseline's, whichever is larger;
#   - the server shuts down clean on SIGTERM (no contract violation).
# Knobs: SOAK_SECONDS, SOAK_CLIENTS (processes per round, 3), SOAK_ROUND (s, 20),
# SOAK_THREADS (per client, 3), SOAK_SEED (first seed, 1; each client process
# gets its own), SOAK_SPEC (fault rates, the test's default if unset).
set -eu
BUILD=${1:-build}
BIN=$BUILD/tests/fault/test_fault_rpc
SECONDS_TOTAL=${SOAK_SECONDS:-300}
CLIENTS=${SOAK_CLIENTS:-3}
ROUND=${SOAK_ROUND:-20}
THREADS=${SOAK_THREADS:-3}
SEED=${SOAK_SEED:-1}
TOL_KB=${SOAK_RSS_TOL_KB:-16384}
TOL_PCT=${SOAK_RSS_TOL_PCT:-10}
[ -x "$BIN" ] || { echo "soak: $BIN not built (make build)" >&2; exit 2; }
SPEC_ARGS=
[ -n "${SOAK_SPEC:-}" ] && SPEC_ARGS="--spec $SOAK_SPEC"

DIR=$(mktemp -d /tmp/vrpc-soak.XXXXXX)
SRV_PID=
cleanup() { [ -n "$SRV_PID" ] && kill "$SRV_PID" 2>/dev/null || true; }
trap cleanup EXIT INT TERM

VRPC_LOG=0 VRPC_FAULT_SEED=$SEED "$BIN" --threads "$THREADS" $SPEC_ARGS --serve fault+tcp://127.0.0.1:0 \
    >"$DIR/server.out" 2>"$DIR/server.err" &
SRV_PID=$!
i=0
while ! grep -q '^URI ' "$DIR/server.out" 2>/dev/null; do
    i=$((i + 1))
    [ $i -lt 100 ] || { echo "soak: the server did not start" >&2; cat "$DIR/server.err" >&2; exit 1; }
    sleep 0.1
done
URI=$(sed -n 's/^URI //p' "$DIR/server.out")

rss_kb() { awk '/^VmRSS:/ {print $2}' /proc/"$SRV_PID"/status; }
pinned_kb() { sed -n 's/^STATS pinned_kb \([0-9]*\) .*/\1/p' "$DIR/server.out" | tail -1; }
fds() { ls /proc/"$SRV_PID"/fd | wc -l; }

echo "soak: server pid $SRV_PID at $URI; ${SECONDS_TOTAL}s in rounds of ${ROUND}s, $CLIENTS client processes x $THREADS threads, faults on both sides"
START=$(date +%s)
round=0
fail=0
calls_ok=0
calls_all=0
base_rss=
base_fds=
while :; do
    now=$(date +%s)
    left=$((START + SECONDS_TOTAL - now))
    [ $left -ge 2 ] || break
    r=$ROUND
    [ $r -le $left ] || r=$left
    round=$((round + 1))
    pids=
    c=0
    while [ $c -lt "$CLIENTS" ]; do
        s=$((SEED + round * 1000 + c))
        VRPC_LOG=0 VRPC_FAULT_SEED=$s "$BIN" --threads "$THREADS" --ms $((r * 1000)) $SPEC_ARGS --connect "$URI" \
            >"$DIR/client.$round.$c.out" 2>"$DIR/client.$round.$c.err" &
        pids="$pids $!"
        c=$((c + 1))
    done
    c=0
    for p in $pids; do
        if ! wait "$p"; then
            echo "soak: round $round client $c FAILED:" >&2
            grep -E 'FAILED|REPLAY|calls' "$DIR/client.$round.$c.out" >&2 || true
            fail=1
        fi
        c=$((c + 1))
    done
    # tallies of this round's clients: "OK n" and the sync/async totals
    for f in "$DIR"/client.$round.*.out; do
        set -- $(sed -n 's/.*: \([0-9]*\) sync + \([0-9]*\) async calls.*; OK \([0-9]*\),.*/\1 \2 \3/p' "$f")
        [ $# -eq 3 ] || continue
        calls_all=$((calls_all + $1 + $2))
        calls_ok=$((calls_ok + $3))
    done
    sleep 2 # the server's side of the closed connections ends
    kill -0 "$SRV_PID" 2>/dev/null || { echo "soak: the server died" >&2; cat "$DIR/server.err" >&2; exit 1; }
    rss=$(rss_kb)
    fd=$(fds)
    pin=$(pinned_kb)
    pin=${pin:-0}
    echo "soak: round $round (${r}s): server RSS ${rss} KiB (large-buffer cache ${pin} KiB), ${fd} fds; calls so far $calls_all, OK $calls_ok"
    if [ -z "$base_rss" ]; then
        base_rss=$rss
        base_fds=$fd
        base_pin=$pin
    fi
    [ $fail -eq 0 ] || break
done
end_rss=$(rss_kb)
end_fds=$(fds)
end_pin=$(pinned_kb)
end_pin=${end_pin:-0}
kill -TERM "$SRV_PID"
srv_rc=0
wait "$SRV_PID" || srv_rc=$?
SRV_PID=
tol=$((base_rss * TOL_PCT / 100))
[ $tol -ge "$TOL_KB" ] || tol=$TOL_KB
growth=$(((end_rss - end_pin) - (base_rss - base_pin)))
echo "soak: $round rounds, $calls_all calls ($calls_ok OK); server after warm-up: RSS ${base_rss} KiB (cache ${base_pin} KiB), ${base_fds} fds; at the end: RSS ${end_rss} KiB (cache ${end_pin} KiB), ${end_fds} fds; RSS less cache grew ${growth} KiB (tolerance ${tol} KiB)"
grep -h 'fault: transport' "$DIR/server.err" | tail -1 | sed 's/^/soak: server /' || true
[ $fail -eq 0 ] || { echo "soak: FAILED (a client's checks; logs in $DIR)"; exit 1; }
[ "$end_fds" -eq "$base_fds" ] || { echo "soak: FAILED: server fds ${base_fds} -> ${end_fds}"; exit 1; }
[ "$growth" -le "$tol" ] || { echo "soak: FAILED: server RSS (less the large-buffer cache) grew beyond the tolerance"; exit 1; }
[ $srv_rc -eq 0 ] || { echo "soak: FAILED: the server's exit status $srv_rc (contract violation; $DIR/server.err)"; exit 1; }
echo "soak: PASSED (logs in $DIR)"
