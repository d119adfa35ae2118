#!/bin/bash
# cpu.sh - user-space instructions per RPC over verbs, client and server, and
# per fi_pingpong round trip beside them (bench/rpc/callgrind.sh with
# VRPC_CG_BACKEND=verbs) in one boot of the Soft-RoCE VM. Instruction counts
# are exact: emulation makes the run slow, not the figures noisy.
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
