#!/usr/bin/env bash
# Runs the libFuzzer harnesses of bin/fuzz/ (make fuzzers), TAP-like.
#
#   tests/fuzz/run.sh SECONDS [NAME...]
#
# For each harness (or the NAMEs given, e.g. fuzz_config): first every input of
# tests/fuzz/regressions/NAME/ once (each a crash found earlier, now fixed), then SECONDS of
# fuzzing starting from the committed seeds of tests/fuzz/corpus/NAME/ (never written to: new
# inputs go to a temp dir, kept with KEEP_FUZZ=DIR). A crash leaves its input in
# bin/fuzz/artifacts/ and fails the run: copy it to tests/fuzz/regressions/NAME/ with the fix.
# FUZZ_PARALLEL=2 runs two harnesses at once (no more on a 2-core machine).
# Prints "ok - fuzz NAME: N runs in S s" per harness; exits 1 if any failed.
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 1
SECONDS_EACH=${1:?usage: tests/fuzz/run.sh SECONDS [NAME...]}
shift
PARALLEL=${FUZZ_PARALLEL:-1}
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
    for f in tests/fuzz/fuzz_*.c; do
        n=$(basename "$f" .c)
        names+=("$n")
    done
fi
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
mkdir -p bin/fuzz/artifacts
work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-relay-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT

run_one() { # run_one NAME: prints one TAP line, returns its status
    local n=$1 bin=bin/fuzz/$1 log=$work/$1.log regs=() out=$work/$1.corpus runs
    if [ ! -x "$bin" ]; then
        echo "not ok - fuzz $n: $bin not built (make fuzzers)"
        return 1
    fi
    if [ -d "tests/fuzz/regressions/$n" ]; then
        mapfile -t regs < <(find "tests/fuzz/regressions/$n" -type f | sort)
    fi
    if [ ${#regs[@]} -gt 0 ] && ! "$bin" "${regs[@]}" >"$log.reg" 2>&1; then
        echo "not ok - fuzz $n: a regression input crashes again"
        tail -n 30 "$log.reg" | sed 's/^/#   /'
        return 1
    fi
    mkdir -p "$out"
    "$bin" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="bin/fuzz/artifacts/$n-" "$out" "tests/fuzz/corpus/$n" >"$log" 2>&1
    local rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    if [ "$rc" -ne 0 ]; then
        echo "not ok - fuzz $n: exit $rc after ${runs:-?} runs (input in bin/fuzz/artifacts/)"
        grep -E 'ERROR|SUMMARY|runtime error|deadly signal|Test unit written' "$log" | head -n 8 |
            sed 's/^/#   /'
        return 1
    fi
    [ -n "${KEEP_FUZZ:-}" ] && mkdir -p "$KEEP_FUZZ/$n" && cp -n "$out"/* "$KEEP_FUZZ/$n/" 2>/dev/null
    echo "ok - fuzz $n: ${runs:-?} runs in ${SECONDS_EACH} s, ${#regs[@]} regression inputs"
}

failed=0
pids=()
for n in "${names[@]}"; do
    if [ "$PARALLEL" -le 1 ]; then
        run_one "$n" || failed=1
    else
        run_one "$n" >"$work/$n.tap" &
        pids+=($!)
        if [ ${#pids[@]} -ge "$PARALLEL" ]; then
            wait "${pids[0]}" || failed=1
            pids=("${pids[@]:1}")
        fi
    fi
done
for p in "${pids[@]}"; do
    wait "$p" || failed=1
done
[ "$PARALLEL" -gt 1 ] && cat "$work"/*.tap
exit "$failed"
