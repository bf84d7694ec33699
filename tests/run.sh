#!/usr/bin/env bash
# Runs the unit tests (bin/asan/test_*, cmocka in TAP mode) and then the integration tests
# (tests/it/*.sh in sorted order), streaming their output and counting `ok`/`not ok` lines.
# A program that exits non-zero without a `not ok` line counts as one failure.
#
#   tests/run.sh [NAME...]     only programs whose file name contains one of the NAMEs
#
# The last line is "N passed, N failed"; the exit status is 1 if anything failed.
# TEST_TIMEOUT (seconds, default 300) bounds each program.

# `make test` runs this with sh; re-run under bash (arrays, PIPESTATUS).
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"

set -o pipefail
export LC_COLLATE=C # sorted order of tests/it/NN_*.sh
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1

# LeakSanitizer works in this container (it needs ptrace, which some sandboxes forbid; if it
# reports "does not work under ptrace", set detect_leaks=0 here).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# Leaks inside libraries, each explained in the file.
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$ROOT/tests/lsan.supp:print_suppressions=0}
export CMOCKA_MESSAGE_OUTPUT=TAP
TEST_TIMEOUT=${TEST_TIMEOUT:-300}

filters=("$@")
passed=0
failed=0
log=$(mktemp "${TMPDIR:-/tmp}/outbox-relay-run.XXXXXX")
trap 'rm -f "$log"' EXIT

selected() {
    local name=$1 f
    [ ${#filters[@]} -eq 0 ] && return 0
    for f in "${filters[@]}"; do
        [[ $name == *"$f"* ]] && return 0
    done
    return 1
}

# run_one NAME CMD...: streams CMD's output and adds its results to the totals.
run_one() {
    local name=$1 rc p f started=$SECONDS
    shift
    echo "# ==== $name"
    timeout -k 10 "$TEST_TIMEOUT" "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    # What each program takes, to see where make test's 20 minutes go (a figure, never a check).
    echo "# ---- $name took $((SECONDS - started)) s"
    p=$(grep -cE '^ok( [0-9]+)? - ' "$log")
    f=$(grep -cE '^not ok( [0-9]+)? - ' "$log")
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
            echo "not ok - $name: timed out after ${TEST_TIMEOUT}s"
        else
            echo "not ok - $name: exited with status $rc"
        fi
        f=1
    fi
    passed=$((passed + p))
    failed=$((failed + f))
}

for bin in bin/asan/test_*; do
    [ -x "$bin" ] || continue
    selected "$(basename "$bin")" && run_one "$(basename "$bin")" "$bin"
done
for script in tests/it/*.sh; do
    [ -f "$script" ] || continue
    selected "$(basename "$script")" && run_one "$(basename "$script")" bash "$script"
done

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
