#!/bin/bash
# cpu.sh - user-space instructions per RPC over verbs, client and server, and
# per fi_pingpong round trip beside them (bench/rpc/callgrind.sh with
# VRPC_CG_BACKEND=verbs) in one boot of the Soft-RoCE VM. A run's counts are
# exact, but how often the threads sleep and wake (each a few hundred
# instructions) follows the VM's speed: on 2026-12-07 one binary's client
# count was 6,599 in one boot and 8,823 in another. Compare builds in one
# boot, alternating, and trust only differences larger than that.
#   bench/softroce/cpu.sh BUILD_DIR [N]
# VRPC_CG_RPC_ARGS passes through (e.g. --on-poller).
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
(($# >= 1)) || { echo "usage: $0 BUILD_DIR [N]" >&2; exit 2; }
BUILD=$(cd "$1" && pwd) || exit 2
envs=(--env VRPC_CG_BACKEND=verbs)
[[ -n ${VRPC_CG_RPC_ARGS:-} ]] && envs+=(--env "VRPC_CG_RPC_ARGS=$VRPC_CG_RPC_ARGS")
exec "$HERE/../../tests/softroce/vm.sh" --net single --no-share-cwd --timeout 1500 "${envs[@]}" -v -- \
    "$HERE/../rpc/callgrind.sh" "$BUILD" "${2:-500}"
