#!/bin/bash
# check.sh - every verbrpc test, as `make check` runs it:
#   1. build/       normal build, all tests that need no RDMA device
#   2. build-asan/  AddressSanitizer+UBSan build, tests labelled "unit"
#   3. build-tsan/  ThreadSanitizer build, tests labelled "concurrency"
#   4. build-fuzz/  clang with libFuzzer (VRPC_FUZZ=ON): every fuzzer of
#      tests/fuzz runs FUZZ_CHECK_SECONDS (default 30) from its committed
#      seeds, one test each; skipped (with a message) when clang is missing
#   5. the tests labelled "verbs", on real verbs: on this machine's RDMA device
#      if it has one, else inside the Soft-RoCE VM (tests/softroce/run.sh)
# Ends with one line "N passed, N failed" over all stages; exit 0 only when
# nothing failed. WERROR=ON turns warnings into errors. VRPC_CHECK_STAGES
# limits the stages (e.g. "normal asan").
set -uo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
WERROR=${WERROR:-OFF}
STAGES=${VRPC_CHECK_STAGES:-normal asan tsan fuzz verbs}
PASSED=0 FAILED=0 SKIPPED=0 FAILURES=()

log() { printf '\n==== %s\n' "$*"; }

build() { # build DIR cmake-args...
    local dir=$1; shift
    cmake -S . -B "$dir" -DVRPC_WERROR="$WERROR" "$@" >/dev/null || return 1
    cmake --build "$dir" -j "$JOBS" >"$dir/build.log" 2>&1 || { cat "$dir/build.log"; return 1; }
}

# ctest_stage NAME DIR ctest-args...: runs ctest and adds its counts to the totals.
ctest_stage() {
    local name=$1 dir=$2 out rc total failed skipped; shift 2
    out=$(mktemp)
    ctest --test-dir "$dir" --output-on-failure --no-tests=error "$@" 2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
    total=$(sed -n 's/.* tests failed out of \([0-9]*\).*/\1/p' "$out" | tail -1)
    failed=$(sed -n 's/.*, \([0-9]*\) tests failed out of.*/\1/p' "$out" | tail -1)
    skipped=$(grep -c '\*\*\*Skipped\|Not Run' "$out")
    rm -f "$out"
    if [[ -z $total ]]; then
        FAILED=$((FAILED + 1)); FAILURES+=("$name: ctest did not run (rc=$rc)"); return
    fi
    PASSED=$((PASSED + total - failed - skipped)); FAILED=$((FAILED + failed)); SKIPPED=$((SKIPPED + skipped))
    ((rc == 0)) || FAILURES+=("$name: $failed failed")
}

stage_failed() { FAILED=$((FAILED + 1)); FAILURES+=("$1"); }

for s in $STAGES; do
    case $s in
    normal)
        log "normal build: all tests that need no RDMA device"
        if build build; then ctest_stage normal build -LE 'verbs|open_issue' -j "$JOBS"
        else stage_failed "normal: build failed"; fi ;;
    asan)
        log "AddressSanitizer + UndefinedBehaviorSanitizer: unit tests"
        if build build-asan -DVRPC_SANITIZE=address -DVRPC_BUILD_BENCH=OFF -DVRPC_BUILD_EXAMPLES=OFF
        then ctest_stage asan build-asan -L unit -LE verbs -j "$JOBS"
        else stage_failed "asan: build failed"; fi ;;
    tsan)
        log "ThreadSanitizer: concurrency tests"
        if build build-tsan -DVRPC_SANITIZE=thread -DVRPC_BUILD_BENCH=OFF -DVRPC_BUILD_EXAMPLES=OFF
        then ctest_stage tsan build-tsan -L concurrency -LE verbs
        else stage_failed "tsan: build failed"; fi ;;
    fuzz)
        log "libFuzzer: every fuzzer for ${FUZZ_CHECK_SECONDS:-30} s from its seeds"
        nf=$(ls tests/fuzz/seeds | wc -l)
        if ! command -v clang >/dev/null || ! compgen -G "/usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a" >/dev/null; then
            echo "fuzz: SKIPPED: clang or libFuzzer missing (scripts/install-deps.sh installs clang and libfuzzer-14-dev)"
            SKIPPED=$((SKIPPED + nf))
        elif CC=clang build build-fuzz -DVRPC_FUZZ=ON -DVRPC_BUILD_BENCH=OFF -DVRPC_BUILD_EXAMPLES=OFF \
                -DVRPC_BUILD_TESTS=OFF; then
            out=$(mktemp)
            rm -rf build-fuzz/check-corpus  # from the seeds only, every time
            tests/fuzz/run.sh build-fuzz "${FUZZ_CHECK_SECONDS:-30}" build-fuzz/check-corpus 2>&1 | tee "$out"
            p=$(grep -c '^fuzz-result: [a-z_]* passed' "$out"); f=$(grep -c '^fuzz-result: [a-z_]* failed' "$out")
            k=$(grep -c '^fuzz-result: [a-z_]* skipped' "$out")
            rm -f "$out"
            PASSED=$((PASSED + p)); FAILED=$((FAILED + f)); SKIPPED=$((SKIPPED + k))
            ((f == 0 && p > 0)) || FAILURES+=("fuzz: $f of $((p + f)) fuzzers failed")
        else stage_failed "fuzz: build failed"; fi ;;
    verbs)
        if [[ -x tests/softroce/run.sh ]]; then
            log "verbs: real RDMA verbs (device, or the Soft-RoCE VM)"
            [[ -d build ]] || build build || stage_failed "verbs: build failed"
            out=$(mktemp)
            tests/softroce/run.sh build 2>&1 | tee "$out"; rc=${PIPESTATUS[0]}
            line=$(grep -E '^verbs: [0-9]+ passed, [0-9]+ failed' "$out" | tail -1)
            rm -f "$out"
            if [[ $line =~ ([0-9]+)\ passed,\ ([0-9]+)\ failed(,\ ([0-9]+)\ skipped)? ]]; then
                PASSED=$((PASSED + BASH_REMATCH[1])); FAILED=$((FAILED + BASH_REMATCH[2]))
                SKIPPED=$((SKIPPED + ${BASH_REMATCH[4]:-0}))
                ((BASH_REMATCH[2] == 0 && rc == 0)) || FAILURES+=("verbs: rc=$rc, ${BASH_REMATCH[2]} failed")
            else
                stage_failed "verbs: no result from tests/softroce/run.sh (rc=$rc)"
            fi
        fi ;;
    *) echo "check: unknown stage $s" >&2; exit 2 ;;
    esac
done

log "summary"
for f in "${FAILURES[@]}"; do echo "FAILED: $f"; done
echo "$PASSED passed, $FAILED failed, $SKIPPED skipped"
((FAILED == 0))
