#!/bin/bash
# Runs inside the Soft-RoCE VM (see large-messages.md section 1):
#   gcc -O2 -Wall -Wextra -o /tmp/lmprobe/rdma_read_probe docs/design/probes/rdma_read_probe.c -libverbs -lrdmacm
#   cp docs/design/probes/run_probe.sh /tmp/lmprobe/
#   cd /tmp/lmprobe && /work/main/tests/softroce/vm.sh --net single -- ./run_probe.sh
# Every probe section once, then three rounds of READ bandwidth alternating
# with perftest's ib_read_bw on the same device (the VM is noisy: compare
# within a round).
cd "$(dirname "$0")" || exit 1
timeout 300 ./rdma_read_probe "$VRPC_VERBS_IP" 32 | grep -v 'connect request'
for round in 1 2 3; do
    echo "### round $round"
    PROBE_ONLY=bw timeout 200 ./rdma_read_probe "$VRPC_VERBS_IP" 16 | grep 'msg '
    timeout 60 ib_read_bw -d "$VRPC_VERBS_DEV" -x "$VRPC_VERBS_GID" -s 1048576 -n 16 -m 1024 -F >/dev/null 2>&1 &
    sleep 1
    echo -n "ib_read_bw 1 MiB (bytes iters peak avg MB/s): "
    timeout 60 ib_read_bw -d "$VRPC_VERBS_DEV" -x "$VRPC_VERBS_GID" -s 1048576 -n 16 -m 1024 -F "$VRPC_VERBS_IP" 2>&1 |
        grep -A1 '#bytes' | tail -1
    wait
done
