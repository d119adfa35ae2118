#!/bin/bash
# peers.sh - runs peers-in-vm.sh (verbrpc against perftest and libfabric on
# one Soft-RoCE device) in one boot of the VM (tests/softroce/vm.sh).
#   bench/softroce/peers.sh BUILD_DIR
# The environment knobs of peers-in-vm.sh pass through (VRPC_BENCH_*).
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
(($# == 1)) || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
BUILD=$(cd "$1" && pwd) || exit 2
envs=()
for v in VRPC_BENCH_ROUNDS VRPC_BENCH_N VRPC_BENCH_RPC_ARGS VRPC_BENCH_LAT_ARGS; do
    [[ -n ${!v:-} ]] && envs+=(--env "$v=${!v}")
done
exec "$HERE/../../tests/softroce/vm.sh" --net single --no-share-cwd --timeout 1500 "${envs[@]}" -v -- \
    "$HERE/peers-in-vm.sh" "$BUILD"
