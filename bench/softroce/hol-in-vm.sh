#!/bin/bash
# hol-in-vm.sh - issue 7's head-of-line measurement (build/bench/softroce/hol_bench)
# in one boot of the Soft-RoCE VM: on one rxe device (single) and across the
# veth pair (two hosts), verbs and TCP on the same addresses. Extra arguments
# go to hol_bench (e.g. --dir mix --streams 0,4 --large 16777216).
#   bench/softroce/hol-in-vm.sh BUILD_DIR [hol_bench args...]
# Inside the VM (or on a host with an RDMA device and VRPC_VERBS_IP, or
# VRPC_VERBS_IP_A/_B, set) run it with --inside.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ ${1:-} != --inside ]]; then
    (($# >= 1)) || { echo "usage: $0 BUILD_DIR [hol_bench args...]" >&2; exit 2; }
    BUILD=$(cd "$1" && pwd) || exit 2
    shift
    exec "$HERE/../../tests/softroce/vm.sh" --net both --no-share-cwd --timeout 1200 -v -- \
        "$HERE/hol-in-vm.sh" --inside "$BUILD" "$@"
fi
BUILD=$2
shift 2
rc=0
if [[ -n ${VRPC_VERBS_IP:-} ]]; then
    echo "== single: one rxe device ($VRPC_VERBS_IP)"
    "$BUILD/bench/softroce/hol_bench" --server-ip "$VRPC_VERBS_IP" --client-ip "$VRPC_VERBS_IP" "$@" || rc=1
fi
if [[ -n ${VRPC_VERBS_IP_A:-} && -n ${VRPC_VERBS_IP_B:-} ]]; then
    echo "== veth: client $VRPC_VERBS_IP_A -> server $VRPC_VERBS_IP_B"
    "$BUILD/bench/softroce/hol_bench" --server-ip "$VRPC_VERBS_IP_B" --client-ip "$VRPC_VERBS_IP_A" "$@" || rc=1
fi
exit $rc
