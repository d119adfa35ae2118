#!/bin/bash
# run.sh - run the libFuzzer harnesses of a VRPC_FUZZ build, each for a bounded
# time, starting from its committed seeds (tests/fuzz/seeds/NAME).
#   tests/fuzz/run.sh BUILD_DIR SECONDS CORPUS_BASE [NAME...]
# New corpus entries go to CORPUS_BASE/NAME (outside the source tree), crash
# inputs to BUILD_DIR/artifacts/NAME/. One line per fuzzer:
#   fuzz-result: NAME passed|failed|skipped runs=N exec/s=E cov=C ft=F
# and for a failure the reproducer and the command that replays it. Exit
# status: the number of fuzzers that failed. Called by scripts/check.sh (stage
# fuzz) and `make fuzz`.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:?usage: run.sh BUILD_DIR SECONDS CORPUS_BASE [NAME...]}
SECS=${2:?seconds per fuzzer}
BASE=${3:?corpus directory}
shift 3
NAMES=("$@")
((${#NAMES[@]})) || NAMES=($(ls tests/fuzz/seeds))  # every fuzzer has a seed directory
fails=0
for n in "${NAMES[@]}"; do
    exe=$BUILD/tests/fuzz/$n corpus=$BASE/$n art=$BUILD/artifacts/$n/ log=$BUILD/artifacts/$n.log
    mkdir -p "$corpus" "$art"
    if [[ ! -x $exe && $n == fuzz_verbs_* ]] && grep -q 'VRPC_WITH_VERBS:BOOL=OFF' "$BUILD/CMakeCache.txt" 2>/dev/null; then
        echo "fuzz-result: $n skipped (built without the verbs backend, VRPC_WITH_VERBS=OFF)"
        continue
    fi
    if [[ ! -x $exe ]]; then
        echo "fuzz-result: $n failed (no $exe: build it with cmake --build $BUILD --target fuzzers)"
        fails=$((fails + 1)); continue
    fi
    # -timeout: one input taking this long is a hang (the TCP fuzzer waits
    # at most 5 s per input by itself)
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        "$exe" -max_total_time="$SECS" -timeout=30 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$art" "$corpus" "tests/fuzz/seeds/$n" >"$log" 2>&1
    rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    last=$(grep -E '^#[0-9]+[[:space:]]+(DONE|NEW|REDUCE|pulse|INITED)' "$log" | tail -1)
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last") ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
    stats="runs=${runs:-?} exec/s=${eps:-?} cov=${cov:-?} ft=${ft:-?}"
    if ((rc == 0)); then
        echo "fuzz-result: $n passed $stats"
    else
        echo "fuzz-result: $n failed $stats (rc=$rc, log $log)"
        grep -E 'check failed|ERROR:|SUMMARY:|runtime error' "$log" | head -5 | sed 's/^/    /'
        for c in $(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log"); do
            echo "    reproducer: $c"
            echo "    replay:     $exe $c"
        done
        fails=$((fails + 1))
    fi
done
exit "$fails"
