#!/bin/bash
# demo.sh - `make demo`. Until the RPC examples exist this runs the scheduler
# demo: a short sched_bench run (a few seconds) that shows the work-stealing
# scheduler's throughput and wake-up latency next to a mutex+condvar pool and
# a bare futex wake, measured on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
prog=$BUILD/bench/sched/sched_bench
if [[ ! -x $prog ]]; then
    echo "demo: $prog not found; build first (make)" >&2
    exit 1
fi
echo "verbrpc demo: the scheduler (the RPC examples come later)"
echo "Empty tasks through the work-stealing scheduler vs. baselines, quick run:"
"$prog" --quick
