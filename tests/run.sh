#!/usr/bin/env bash
# Runs the unit tests (bin/asan/test_*, cmocka in TAP mode) and then the integration tests
# (tests/it/GROUP/NN_*.sh: the groups in the order of IT_GROUPS below), each longest first by
# tests/it/durations, TEST_JOBS at a time, counting `ok`/`not ok` lines. A program that exits
# non-zero without a `not ok` line counts as one failure.
#
#   tests/run.sh [NAME...]             only programs whose name (test_NAME, GROUP/NN_name.sh)
#                                      contains one of the NAMEs
#   tests/run.sh --group GROUP [NAME...]   only the group GROUP (repeat for more; TEST_GROUP=
#                                      GROUP[,GROUP...] does the same): `unit` is the unit
#                                      tests, the others are the directories of tests/it/
#   tests/run.sh --list [--group GROUP] [NAME...]   lists the groups and their tests, runs none
#
# A group that does not exist is refused with exit 2, as is a directory of tests/it/ missing from
# IT_GROUPS or a test outside a group (neither would ever run). tests/it/README.md says what each
# group holds.
#
# The last line is "N passed, N failed"; the exit status is 1 if anything failed.
# TEST_TIMEOUT (seconds, default 300) bounds each program; one still running then gets SIGTERM
# (its cleanup runs) and, TEST_KILL_AFTER seconds later (default 10), SIGKILL.
# TEST_JOBS (1 to 4, default 3): programs running at once, unit and integration tests alike
# (an integration test starts as soon as a unit test frees its slot). The latter spend most of their
# time waiting on faults and timeouts (a serial `make test` keeps 2 cores about a third busy;
# with two at a time a whole `make test` took 21-25 minutes, with three 16, on 2 cores, using
# 15 CPU minutes either way). Each runs under its own TEST_SLOT (0 to TEST_JOBS-1), which
# gives it ports and private subnets no other slot uses (tests/lib.sh `free_port`,
# tests/netns_lib.sh). A parallel test's output is printed whole when it ends. A test whose
# header has a line starting "# run.sh: alone" (it keeps the cores busy on purpose) runs
# with no other test beside it.

# `make test` runs this with sh; re-run under bash (arrays, PIPESTATUS, `wait -n -p`).
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"

set -o pipefail
export LC_COLLATE=C # sorted order of tests/it/GROUP/NN_*.sh
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
TEST_KILL_AFTER=${TEST_KILL_AFTER:-10}
[[ $TEST_KILL_AFTER =~ ^[1-9][0-9]*$ ]] ||
    { echo "tests/run.sh: TEST_KILL_AFTER must be a whole number of seconds, not '$TEST_KILL_AFTER'" >&2 && exit 2; }
TEST_JOBS=${TEST_JOBS:-3}
case $TEST_JOBS in
[1-4]) ;;
*)
    echo "tests/run.sh: TEST_JOBS must be 1 to 4, not '$TEST_JOBS'" >&2
    exit 2
    ;;
esac
# `wait -n -p` came with bash 5.1 (Debian 12 has 5.2): an older bash runs the tests one by one.
if [ "$TEST_JOBS" -gt 1 ] && ((BASH_VERSINFO[0] * 100 + BASH_VERSINFO[1] < 501)); then
    echo "# tests/run.sh: bash $BASH_VERSION cannot wait for the first of several tests; TEST_JOBS=1"
    TEST_JOBS=1
fi
export TEST_JOBS

# The groups of integration tests, in the order they run: quick checks of the set-up and of what
# ships first, the long fault tests last (tests/it/README.md).
IT_GROUPS=(setup packaging security delivery order operations demos faults)

usage_error() {
    echo "tests/run.sh: $1" >&2
    exit 2
}

groups=()
listing=0
filters=()
while [ $# -gt 0 ]; do
    case $1 in
    --group)
        [ $# -ge 2 ] || usage_error "--group needs a group"
        groups+=("$2")
        shift
        ;;
    --group=*) groups+=("${1#--group=}") ;;
    --list) listing=1 ;;
    --) shift && filters+=("$@") && break ;;
    -*) usage_error "unknown option '$1' (--group GROUP, --list, or NAMEs)" ;;
    *) filters+=("$1") ;;
    esac
    shift
done
[ -n "${TEST_GROUP:-}" ] && IFS=', ' read -r -a more <<<"$TEST_GROUP" && groups+=("${more[@]}")

# Every directory of tests/it/ must be a group of IT_GROUPS and every test must be in a group:
# anything else would never run, silently.
for d in tests/it/*; do
    if [ -d "$d" ]; then
        [[ " ${IT_GROUPS[*]} " == *" ${d#tests/it/} "* ]] ||
            usage_error "$d/ is not in IT_GROUPS: add it there and to tests/it/README.md"
    elif [[ $d == *.sh ]]; then
        usage_error "$d is in no group: move it into one of tests/it/*/ (tests/it/README.md)"
    fi
done
for g in "${groups[@]}"; do
    [[ " unit ${IT_GROUPS[*]} " == *" $g "* ]] ||
        usage_error "no group '$g' (groups: unit ${IT_GROUPS[*]})"
done

# in_group GROUP: GROUP is selected (every group is, without --group or TEST_GROUP).
in_group() {
    [ ${#groups[@]} -eq 0 ] && return 0
    [[ " ${groups[*]} " == *" $1 "* ]]
}

# selected NAME: NAME contains one of the NAMEs given (all are, without NAMEs).
selected() {
    local name=$1 f
    [ ${#filters[@]} -eq 0 ] && return 0
    for f in "${filters[@]}"; do
        [[ $name == *"$f"* ]] && return 0
    done
    return 1
}

# Within a group the tests start longest first, by the seconds tests/it/durations gives them (a
# test it does not list first of all: it may be long), so that no long test starts last and
# leaves the other slots idle while it ends; ties in sorted order. Tests run alone come last in
# their group, when the group's others have ended. In name order a 141 s test that started
# near a group's end kept two slots idle for minutes (make test: 872 s of integration tests
# in name order, 797 s this way, simulated from the same run's per-test seconds).
declare -A seconds_of
if [ -f tests/it/durations ]; then
    while read -r name secs _; do
        [[ $name == \#* || -z $name ]] || seconds_of[$name]=$secs
    done <tests/it/durations
fi
# The unit tests selected, longest first the same way (tests/it/durations lists them by name,
# test_NAME): test_db, 20 of the unit tests' 28 s, starts first and the short ones fill the other
# slots beside it; the integration tests then take each slot a unit test frees.
units=()
if in_group unit; then
    while IFS=$'\t' read -r _ bin; do
        units+=("$bin")
    done < <(for bin in bin/asan/test_*; do
        [ -x "$bin" ] && selected "$(basename "$bin")" || continue
        printf '%s\t%s\n' "${seconds_of[$(basename "$bin")]:-999999}" "$bin"
    done | sort -t$'\t' -k1,1nr -k2,2)
fi
scripts=()
for g in "${IT_GROUPS[@]}"; do
    in_group "$g" || continue
    while IFS=$'\t' read -r _ _ script; do
        scripts+=("$script")
    done < <(for script in tests/it/"$g"/*.sh; do
        [ -f "$script" ] && selected "${script#tests/it/}" || continue
        alone=0
        grep -qE '^# run\.sh: alone( |$)' "$script" && alone=1
        printf '%s\t%s\t%s\n' "$alone" "${seconds_of[${script#tests/it/}]:-999999}" "$script"
    done | sort -t$'\t' -k1,1n -k2,2nr -k3,3)
done

# --list: the groups with a test selected, each with them in the order they start (unit tests by
# source: they may not be built yet), "(alone)" after a test that runs with no other beside it.
if [ "$listing" = 1 ]; then
    list=()
    if in_group unit; then
        for src in tests/unit/test_*.c; do
            [ -f "$src" ] && selected "$(basename "$src" .c)" && list+=("unit $(basename "$src" .c)")
        done
    fi
    for script in "${scripts[@]}"; do
        name=${script#tests/it/}
        grep -qE '^# run\.sh: alone( |$)' "$script" && name+=" (alone)"
        list+=("${name%%/*} $name")
    done
    last=
    for line in "${list[@]}"; do
        [ "${line%% *}" = "$last" ] || echo "${line%% *}"
        last=${line%% *}
        echo "    ${line#* }"
    done
    exit 0
fi

# Nothing to run fails the run, never "0 passed, 0 failed": a NAME that matches no test, or a
# unit group whose binaries were never built (`make all asan` builds none of them; `make unit`
# and `make test` do).
if [ $((${#units[@]} + ${#scripts[@]})) -eq 0 ]; then
    unbuilt=0
    if in_group unit; then
        for src in tests/unit/test_*.c; do
            selected "$(basename "$src" .c)" && unbuilt=1
        done
    fi
    if [ "$unbuilt" = 1 ]; then
        echo "tests/run.sh: no unit test is built (bin/asan/test_*): run 'make unit' first" >&2
    else
        echo "tests/run.sh: no test matches the names and groups given: nothing to run" >&2
    fi
    exit 2
fi

passed=0
failed=0
out=$(mktemp -d "${TMPDIR:-/tmp}/outbox-relay-run.XXXXXX") || exit 1
mkdir -p "${IT_GROUPS[@]/#/$out/}" || exit 1 # logs by name: GROUP/NN_name.sh.log
declare -A name_of slot_of started_of # by the pid of a running integration test's wrapper
trap 'rm -rf "$out"' EXIT
# The cluster every test's pg_start copies (tests/lib.sh _pg_template makes it at the first one):
# the postgres user, who runs it when root runs the tests, must reach it.
chmod 711 "$out" && mkdir -m 755 "$out/pg-template" || exit 1
export OUTBOX_TEST_PG_TEMPLATE=$out/pg-template
trap 'stop_running; exit 143' TERM
trap 'stop_running; exit 130' INT

# count NAME RC LOG SECONDS: adds a finished program's results to the totals.
count() {
    local name=$1 rc=$2 log=$3 p f
    # What each program takes, to see where make test's 20 minutes go (a figure, never a check).
    echo "# ---- $name took $4 s"
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

# run_now NAME CMD...: runs CMD alone, streaming its output.
run_now() {
    local name=$1 rc started=$SECONDS
    shift
    echo "# ==== $name"
    timeout -k "$TEST_KILL_AFTER" "$TEST_TIMEOUT" "$@" 2>&1 | tee "$out/$name.log"
    rc=${PIPESTATUS[0]}
    count "$name" "$rc" "$out/$name.log" $((SECONDS - started))
}

# start NAME SLOT CMD...: starts CMD in the background under TEST_SLOT=SLOT, output to a file.
# `timeout` runs in a subshell that always exits (with its status: 124 timed out, 137 killed):
# bash forgets a background job killed by a signal as soon as it has reported it, and `wait`
# would then never see that test end. `timeout` puts itself and the test in a process group of
# their own; its pid, in NAME.timeout, is that group's.
start() {
    local name=$1 slot=$2
    shift 2
    (
        TEST_SLOT=$slot timeout -k "$TEST_KILL_AFTER" "$TEST_TIMEOUT" "$@" >"$out/$name.log" 2>&1 &
        echo $! >"$out/$name.timeout"
        wait $!
    ) 2>/dev/null & # (not bash's "Killed" notice: the log says it)
    name_of[$!]=$name
    slot_of[$!]=$slot
    started_of[$!]=$SECONDS
}

# Stopped from outside (CI's own timeout, ^C): each running test's `timeout` passes SIGTERM on
# to its test, whose cleanup then runs. A test run alone (run_now) ends before the trap runs.
stop_running() {
    local pid f
    for pid in "${!name_of[@]}"; do
        f=$out/${name_of[$pid]}.timeout
        [ -s "$f" ] && kill -TERM "$(cat "$f")" 2>/dev/null
    done
}

# finish_one: waits for one running test to end, prints its output and counts it.
finish_one() {
    local pid='' rc name
    wait -n -p pid "${!name_of[@]}"
    rc=$?
    if [ -z "$pid" ] || [ -z "${name_of[$pid]:-}" ]; then
        # Cannot happen with the wrappers of start(); if it does, fail rather than lose a test.
        echo "not ok - tests/run.sh lost track of its running tests (wait: status $rc)"
        stop_running
        echo "$passed passed, $((failed + 1)) failed"
        exit 1
    fi
    name=${name_of[$pid]}
    echo "# ==== $name"
    cat "$out/$name.log"
    count "$name" "$rc" "$out/$name.log" $((SECONDS - ${started_of[$pid]}))
    unset "name_of[$pid]" "slot_of[$pid]" "started_of[$pid]"
}

# finish_all: waits for every running test (finish_one each).
finish_all() {
    while [ ${#name_of[@]} -gt 0 ]; do
        finish_one
    done
}

# free_slot: the lowest slot no running test holds (call with fewer than TEST_JOBS running).
free_slot() {
    local slot
    for ((slot = 0; ; slot++)); do
        [[ " ${slot_of[*]} " == *" $slot "* ]] || break
    done
    echo "$slot"
}

# A unit test is named test_NAME in the output, an integration test GROUP/NN_name.sh. A single
# program, or TEST_JOBS=1, runs in the foreground with its output streamed.
if [ "$TEST_JOBS" -eq 1 ] || [ $((${#units[@]} + ${#scripts[@]})) -le 1 ]; then
    for bin in "${units[@]}"; do
        run_now "$(basename "$bin")" "$bin"
    done
    for script in "${scripts[@]}"; do
        TEST_SLOT=0 run_now "${script#tests/it/}" bash "$script"
    done
else
    # The unit tests run TEST_JOBS at a time as well (one after the other they took 28 s, test_db
    # 20 of them asleep on connect timeouts), and the integration tests start in the slots they
    # free: the slot's TEST_SLOT means nothing to a unit test, which takes no fixed port or path.
    for bin in "${units[@]}"; do
        [ ${#name_of[@]} -lt "$TEST_JOBS" ] || finish_one
        start "$(basename "$bin")" "$(free_slot)" "$bin"
    done
    for script in "${scripts[@]}"; do
        if grep -qE '^# run\.sh: alone( |$)' "$script"; then
            finish_all
            TEST_SLOT=0 run_now "${script#tests/it/}" bash "$script"
            continue
        fi
        [ ${#name_of[@]} -lt "$TEST_JOBS" ] || finish_one
        start "${script#tests/it/}" "$(free_slot)" bash "$script"
    done
    finish_all
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
