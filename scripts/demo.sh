#!/bin/bash
# demo.sh - `make demo`: runs the kvstore example (server and client) on the
# best transport this machine has: RDMA verbs when an RDMA device is up with an
# IPv4 address (and memory can be registered), else TCP on 127.0.0.1.
#   scripts/demo.sh [BUILD_DIR]        (make demo builds first)
# VRPC_DEMO_TRANSPORT=tcp|verbs forces one; VRPC_DEMO_SECONDS sets the load's length.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
SECONDS_LOAD=${VRPC_DEMO_SECONDS:-3}
SERVER=$BUILD/examples/kvstore_server
CLIENT=$BUILD/examples/kvstore_client
TOOL=$BUILD/tools/verbrpc/verbrpc
for p in "$SERVER" "$CLIENT"; do
    [[ -x $p ]] || { echo "demo: $p is missing: build first (make demo does)" >&2; exit 1; }
done

# An RDMA device's IPv4 address: first ACTIVE link from `rdma link`, its netdev's address.
verbs_ip() {
    command -v rdma >/dev/null || return 1
    local netdev
    netdev=$(rdma link show 2>/dev/null | awk '/state ACTIVE/ { for (i = 1; i < NF; i++) if ($i == "netdev") { print $(i + 1); exit } }')
    [[ -n $netdev ]] || return 1
    ip -4 -o addr show dev "$netdev" 2>/dev/null | awk '{ split($4, a, "/"); print a[1]; exit }' | grep .
}

tmp=$(mktemp -d)
server_pid=
cleanup() {
    if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then
        kill -INT "$server_pid"; wait "$server_pid" 2>/dev/null || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT

start_server() { # start_server URI: 0 once it listens
    rm -f "$tmp/uri"
    "$SERVER" --listen "$1" --uri-file "$tmp/uri" >"$tmp/server.log" 2>&1 &
    server_pid=$!
    for _ in $(seq 100); do
        [[ -s $tmp/uri ]] && return 0
        kill -0 "$server_pid" 2>/dev/null || break
        sleep 0.1
    done
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=
    return 1
}

want=${VRPC_DEMO_TRANSPORT:-auto}
why=
if [[ $want != tcp ]] && ip=$(verbs_ip); then
    if start_server "verbs://$ip:0"; then
        transport="RDMA verbs (device address $ip)"
    else
        why="verbs server failed: $(tail -1 "$tmp/server.log")"
    fi
elif [[ $want == verbs ]]; then
    echo "demo: VRPC_DEMO_TRANSPORT=verbs but no RDMA device is up with an IPv4 address" >&2; exit 1
else
    why="no RDMA device is up with an IPv4 address"
fi
if [[ -z $server_pid ]]; then
    start_server "tcp://127.0.0.1:0" || { cat "$tmp/server.log"; echo "demo: the kvstore server did not start" >&2; exit 1; }
    transport="TCP (fallback: $why)"
fi
URI=$(cat "$tmp/uri")
kv() { "$CLIENT" --connect "$URI" "$@"; }

echo "=== verbrpc demo: kvstore server and client over $transport"
echo "--- server: $(head -1 "$tmp/server.log")"
echo "--- single calls"
kv health
kv put alpha "first value"
kv put beta "second value"
kv put alpha "replaced value"
kv get alpha
echo "--- a 4 MiB value: above the 8 KiB eager size, it travels by rendezvous"
echo "    (the receiver pulls it with RDMA READ on verbs, a read request on TCP)"
kv fill big 4194304
kv get big
kv scan "" "" 10
kv delete beta
kv get beta || true
echo "--- load: ${SECONDS_LOAD} s, 16 calls in flight, 80% Get / 20% Put of 64 B values"
kv --threads 2 load --keys 10000 --value-size 64 --outstanding 16 --duration "$SECONDS_LOAD"
echo "--- the server's own statistics (built-in verbrpc.stats.v1.Stats)"
kv stats /examples.kvstore
if [[ -x $TOOL ]]; then
    echo "--- the verbrpc tool against the same server (docs/GUIDE.md, section 12)"
    echo "\$ verbrpc health $URI"; "$TOOL" health "$URI"
    echo "\$ verbrpc list $URI"; "$TOOL" list "$URI"
    echo "\$ verbrpc call $URI examples.kvstore.v1.KvStore/Get '{\"key\": \"alpha\"}'"
    "$TOOL" call "$URI" examples.kvstore.v1.KvStore/Get '{"key": "alpha"}'
    echo "\$ verbrpc stats --prometheus --prefix /examples.kvstore.v1.KvStore/Get $URI"
    "$TOOL" stats --prometheus --prefix /examples.kvstore.v1.KvStore/Get "$URI" | grep -v '^#'
fi
kill -INT "$server_pid"; wait "$server_pid" 2>/dev/null || true
server_pid=
echo "--- server: $(tail -1 "$tmp/server.log")"
