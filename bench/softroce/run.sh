#!/bin/bash
# run.sh - the verbs backend against perftest on the same Soft-RoCE device, in
# one boot of the VM (tests/softroce/vm.sh): ib_send_lat vs our ping-pong,
# ib_send_bw's message rate vs ours, printed as ratios. Under TCG only ratios
# mean anything. On a machine with an RDMA device, run in-vm.sh directly with
# VRPC_VERBS_IP, VRPC_VERBS_DEV and VRPC_VERBS_GID set.
#   bench/softroce/run.sh BUILD_DIR [--quick]
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
(($# >= 1)) || { echo "usage: $0 BUILD_DIR [--quick]" >&2; exit 2; }
BUILD=$(cd "$1" && pwd) || exit 2
shift
exec "$HERE/../../tests/softroce/vm.sh" --net single --no-share-cwd --timeout 900 -v -- \
    "$HERE/in-vm.sh" "$BUILD" "$@"
