#!/bin/bash
# Every verbrpc subcommand against a running kvstore_server, each checked for
# its output and its exit code.
#   run_tool_test.sh TOOL KVSTORE_SERVER PROTOC KVSTORE_PROTO_DIR tcp|verbs
# verbs reads VRPC_VERBS_IP (the Soft-RoCE VM sets it) and exits 77 without it.
set -uo pipefail
TOOL=$1 SERVER=$2 PROTOC=$3 PROTO_DIR=$4 BACKEND=$5
case $BACKEND in
tcp) LISTEN=tcp://127.0.0.1:0 ;;
verbs)
    [[ -n ${VRPC_VERBS_IP:-} ]] || { echo "SKIP: VRPC_VERBS_IP unset (run in the Soft-RoCE VM)"; exit 77; }
    LISTEN=verbs://$VRPC_VERBS_IP:0 ;;
*) echo "usage: $0 TOOL SERVER PROTOC PROTO_DIR tcp|verbs" >&2; exit 2 ;;
esac
tmp=$(mktemp -d)
server_pid=
cleanup() { [[ -n $server_pid ]] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

"$SERVER" --listen "$LISTEN" --uri-file "$tmp/uri" >"$tmp/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 100); do [[ -s $tmp/uri ]] && break; sleep 0.1; done
[[ -s $tmp/uri ]] || { echo "FAIL: the server did not start:"; cat "$tmp/server.log"; exit 1; }
URI=$(cat "$tmp/uri")
echo "kvstore_server at $URI"
KV=examples.kvstore.v1.KvStore
fail=0

# run WANT_RC ARGS...: runs the tool, output in $tmp/out, errors in $tmp/err
run() {
    local want=$1
    shift
    "$TOOL" "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$?
    if [[ $rc != "$want" ]]; then
        echo "FAIL verbrpc $*: exit $rc, want $want"; sed 's/^/  out: /' "$tmp/out"; sed 's/^/  err: /' "$tmp/err"
        fail=1
        return 1
    fi
    echo "ok   verbrpc $* (exit $rc)"
}
# has FILE TEXT: the last run's out or err contains TEXT
has() {
    if ! grep -qF -- "$2" "$tmp/$1"; then
        echo "FAIL   its $1 lacks '$2':"; sed 's/^/  | /' "$tmp/$1"; fail=1
    fi
}

# usage and exit code 1 for bad arguments
run 0 --help && has out "Exit codes"
for cmd in health stats list describe call; do
    run 0 "$cmd" --help && has out "usage: verbrpc $cmd"
done
run 0 --version && has out "verbrpc "
run 1 && has err "usage: verbrpc COMMAND"
run 1 frobnicate && has err "unknown command 'frobnicate'"
run 1 health && has err "usage: verbrpc health"
run 1 health --timeout soon "$URI" && has err "bad --timeout"
run 1 health bogus://nowhere:1 && has err "bogus://nowhere:1"

# health: grpc_health_probe's codes
run 0 health "$URI" && has out "status: SERVING"
run 0 health "$URI" $KV && has out "status: SERVING"
run 3 health "$URI" no.such.Service && has err "NOT_FOUND"
# a port nobody listens on (the server's own port on 127.0.0.1, after it; TCP only)
if [[ $BACKEND == tcp ]]; then
    run 2 health --timeout 2s tcp://127.0.0.1:1 && has err "failed to connect"
fi

# list / describe through reflection
run 0 list "$URI" && for s in $KV verbrpc.health.v1.Health verbrpc.stats.v1.Stats verbrpc.reflection.v1.Reflection; do
    has out "$s"
done
run 0 list "$URI" $KV && has out "$KV.Scan"
run 3 list "$URI" no.Such && has err "NOT_FOUND"
run 0 describe "$URI" $KV && has out "rpc Get(examples.kvstore.v1.GetRequest) returns (examples.kvstore.v1.GetReply);"
run 0 describe "$URI" $KV/Scan && has out "repeated examples.kvstore.v1.KeyValue items = 1;"
run 0 describe "$URI" examples.kvstore.v1.PutRequest && has out "bytes value = 2;"
run 0 describe "$URI" verbrpc.health.v1.HealthCheckResponse.ServingStatus && has out "NOT_SERVING = 2;"
run 3 describe "$URI" examples.kvstore.v1.Nope && has err "NOT_FOUND"

# call: JSON in, JSON out, status and exit code 3 on failure
run 0 call "$URI" $KV/Put '{"key": "tool-k\"1", "value": "aGVsbG8="}' && has out '"created": true'
run 0 call "$URI" $KV.Put '{"key": "tool-k\"1", "value": "d29ybGQ="}' && has out '{}'
run 0 call "$URI" /$KV/Get '{"key": "tool-k\"1"}' && has out '"value": "d29ybGQ="'
echo '{"key": "tool-k\"1"}' | run 0 call "$URI" $KV/Get - && has out '"value": "d29ybGQ="'
run 3 call "$URI" $KV/Get '{"key": "missing"}' && has err "NOT_FOUND: no such key"
run 0 call --compact "$URI" $KV/Scan '{"start_key": "tool-", "limit": 5}' && \
    has out '{"items":[{"key":"tool-k\"1","value":"d29ybGQ="}]}'
run 0 call --metadata trace-id=abc --metadata x=1 --timeout 5s "$URI" $KV/Delete '{"key": "tool-k\"1"}' && \
    has out '"existed": true'
run 3 call --metadata "Bad Key=1" "$URI" $KV/Delete '{}' && has err "INVALID_ARGUMENT"
run 1 call "$URI" $KV/Get '{"key": ' && has err "not JSON"
run 1 call "$URI" $KV/Get '{"nokey": 1}' && has err "nokey: no such field in examples.kvstore.v1.GetRequest"
run 1 call "$URI" $KV/Get '{"key": 5}' && has err "key: expected a string"
run 1 call "$URI" $KV/Nope '{}' && has err "no method"
run 3 call "$URI" no.Such/Get '{}' && has err "NOT_FOUND" && has err "--descriptor-set FILE"
run 1 call "$URI" NoMethodName && has err "not a method name"
# the descriptors from a descriptor set instead of reflection
"$PROTOC" -I"$PROTO_DIR" --include_imports --descriptor_set_out="$tmp/kv.pb" kvstore.proto || fail=1
run 0 call --descriptor-set "$tmp/kv.pb" "$URI" $KV/Put '{"key": "set", "value": ""}' && has out '"created": true'
run 0 describe --descriptor-set "$tmp/kv.pb" unused://x examples.kvstore.v1.ScanReply && has out "bool more = 2;"
run 1 call --descriptor-set "$tmp/missing.pb" "$URI" $KV/Put '{}' && has err "cannot read descriptor set"
# the built-ins are callable like any method
run 0 call "$URI" verbrpc.health.v1.Health/Check '{}' && has out '"status": "SERVING"'

# stats: the calls above, as a table and as JSON
run 0 stats "$URI" && has out "METHOD" && has out "/$KV/Get" && has out "NOT_FOUND="
run 0 stats --json --prefix /$KV/Put "$URI" && has out "\"method\": \"/$KV/Put\"" && has out '"calls": "'
grep -qF '"/examples.kvstore.v1.KvStore/Get"' "$tmp/out" && { echo "FAIL --prefix kept Get"; fail=1; }
run 0 stats --prometheus --prefix /$KV/ "$URI" && has out "# TYPE vrpc_stats_calls_total counter" &&
    has out "vrpc_stats_errors_total{method=\"/$KV/Get\",code=\"NOT_FOUND\"}" &&
    has out "vrpc_stats_latency_seconds{method=\"/$KV/Get\",quantile=\"0.99\"}"

# doctor (verbs builds): this host's RDMA setup; without RDMA it names the problem, exit 1
if "$TOOL" --help | grep -q "^  doctor"; then
    run 0 doctor --help && has out "usage: verbrpc doctor"
    if [[ -n ${VRPC_VERBS_IP:-} ]]; then
        run 0 doctor && has out "RoCE v2" && has out "no problems found"
    elif ! ls /sys/class/infiniband/* >/dev/null 2>&1; then
        run 1 doctor && has out "problem(s)"
    fi
fi

kill "$server_pid" && wait "$server_pid" 2>/dev/null
server_pid=
run 2 health --timeout 2s "$URI" && has err "failed to connect"
exit $fail
