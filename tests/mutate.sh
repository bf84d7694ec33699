#!/usr/bin/env bash
# make mutate: proves the tests bite. Each tests/mutants/NN_name.patch is a deliberate bug of a
# few lines against the relay or the demos; its first line names the tests that must catch it
# ("tests: NAME..."), its second says what the bug is (docs/mutation.md has the table).
#
# For each patch: a scratch copy of the working tree (tracked and untracked files, not bin/),
# seeded with a build of the unpatched copy so only what the patch touches is rebuilt; the patch
# applied with `patch -p1` (fuzz allowed: relay sources move under it); `make -j2 asan tools all`
# and the unit tests it names (test_NAME);
# the named tests run with tests/run.sh. Outcome per mutant:
#   caught          in every run, one of the named tests failed (they run in the order named,
#                   and a run stops at the first that fails; with MUTATE_EACH=1, every named
#                   test failed)
#   missed          all of them passed in some run (a probabilistic catch counts as missed);
#                   with MUTATE_EACH=1, one of them passed
# Name the unit test first (test_engine, test_floor): it fails in seconds and the slow
# integration test then does not run; MUTATE_EACH=1 proves the integration tests still bite.
#   does not apply  the patch no longer applies: refresh it (a failure, but not a miss)
#   build failed    the patched tree does not build: fix the patch
#
#   tests/mutate.sh [NAME...]    only mutants whose file name contains one of the NAMEs
#   MUTANTS="NAME..."            the same, for `make mutate MUTANTS="08_ 18_"`
#   MUTATE_REPEAT=N              run the named tests N times per mutant (default 1)
#   MUTATE_EACH=1                run every named test, each must fail (not only the first)
#   MUTATE_KEEP=1                keep the scratch directories and logs
# Exit status 0 only when every selected mutant was caught.

[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
REPEAT=${MUTATE_REPEAT:-1}
EACH=${MUTATE_EACH:-0}
filters=("$@")
# shellcheck disable=SC2206 # MUTANTS is a list of words
[ ${#filters[@]} -eq 0 ] && [ -n "${MUTANTS:-}" ] && filters=(${MUTANTS})

WORK=$(mktemp -d "${TMPDIR:-/tmp}/outbox-relay-mutate.XXXXXX") || exit 1
cleanup() {
    if [ "${MUTATE_KEEP:-0}" = 1 ]; then
        echo "# kept $WORK"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# copy_tree DIR: the working tree's files (tracked and untracked, not ignored: no bin/) into DIR.
copy_tree() {
    mkdir -p "$1" &&
        git ls-files -z --cached --others --exclude-standard |
        while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
            tar -cf - --null -T - | tar -xf - -C "$1"
}

selected() {
    local name=$1 f
    [ ${#filters[@]} -eq 0 ] && return 0
    for f in "${filters[@]}"; do
        [[ $name == *"$f"* ]] && return 0
    done
    return 1
}

echo "# mutate: scratch $WORK"
BASE=$WORK/base
copy_tree "$BASE" || { echo "mutate: cannot copy the tree" >&2; exit 1; }
echo "# building the unpatched copy (seeds every mutant's build)"
if ! make -C "$BASE" -j2 asan tools all >"$WORK/base.build.log" 2>&1; then
    tail -n 20 "$WORK/base.build.log"
    echo "mutate: the unpatched tree does not build" >&2
    exit 1
fi

# unit_targets "TESTS": the binaries of the unit tests (test_NAME) among a mutant's tests, which
# `asan tools all` does not build (run.sh would then find nothing to run, and pass).
unit_targets() {
    local t
    for t in $1; do
        case $t in test_*) printf 'bin/asan/%s ' "$t" ;; esac
    done
}

declare -a names results
caught=0 total=0
for patch in tests/mutants/*.patch; do
    name=$(basename "$patch" .patch)
    selected "$name" || continue
    total=$((total + 1))
    tests=$(sed -n '1s/^tests: *//p' "$patch")
    what=$(sed -n '2p' "$patch")
    dir=$WORK/$name
    echo "# ==== $name: $what"
    echo "# tests: $tests"
    cp -a "$BASE" "$dir"
    if [ -z "$tests" ]; then
        result="no tests named"
    elif ! patch -d "$dir" -p1 --fuzz=3 --no-backup-if-mismatch -s <"$patch" \
        >"$WORK/$name.patch.log" 2>&1; then
        sed 's/^/#   /' "$WORK/$name.patch.log"
        result="does not apply"
    elif ! make -C "$dir" -j2 asan tools all $(unit_targets "$tests") >"$WORK/$name.build.log" 2>&1; then
        tail -n 20 "$WORK/$name.build.log" | sed 's/^/#   /'
        result="build failed"
    else
        result=caught
        for run in $(seq 1 "$REPEAT"); do
            log=$WORK/$name.run$run.log
            : >"$log"
            by='' passed=''
            for t in $tests; do
                if ! bash "$dir/tests/run.sh" "$t" >>"$log" 2>&1; then
                    by="$by $t"
                    [ "$EACH" = 1 ] || break
                else
                    passed="$passed $t"
                fi
            done
            if [ -z "$by" ]; then
                result=missed
                echo "#   run $run: every named test passed"
                break
            fi
            if [ "$EACH" = 1 ] && [ -n "$passed" ]; then
                result="missed by$passed"
                echo "#   run $run: passed:$passed (failed:$by)"
                break
            fi
            by=${by# }
            echo "#   run $run: $by failed, $(grep -cE '^not ok' "$log") failed checks, e.g.:"
            grep -E '^not ok' "$log" | head -n 3 | sed 's/^/#     /'
        done
    fi
    [ "$result" = caught ] && caught=$((caught + 1))
    echo "$name: $result"
    names+=("$name")
    results+=("$result")
    [ "${MUTATE_KEEP:-0}" = 1 ] || rm -rf "$dir"
done

echo "# ---- summary"
for i in "${!names[@]}"; do
    printf '%-32s %s\n' "${names[$i]}" "${results[$i]}"
done
echo "$caught of $total mutants caught"
[ "$caught" -eq "$total" ] && [ "$total" -gt 0 ]
