#!/bin/bash
# Proves tests/run.sh counts what CI trusts, with fake integration tests in a scratch copy of
# the tree (tests/run.sh and tests/it/GROUP/ only), run two at a time:
#  1. every ok and not ok line is counted, and a test that exits non-zero without a not ok line
#     counts as one failure; the exit status is 1 when anything failed;
#  2. a test past TEST_TIMEOUT that ignores SIGTERM is killed and counted as timed out (bash
#     forgets a background job killed by a signal: the runner must not lose it);
#  3. each test's output is printed whole, never interleaved with another's;
#  4. two tests running at once have different slots, and so different port ranges and subnets
#     (tests/lib.sh, tests/netns_lib.sh), and lib.sh refuses a slot at or past TEST_JOBS; a test
#     marked "# run.sh: alone" runs with no other;
#  5. the same tests one at a time (TEST_JOBS=1) give the same totals; TEST_JOBS out of range is
#     refused with exit 2;
#  6. --group GROUP (and TEST_GROUP) runs that group's tests only, --list lists them and runs
#     none; a group that does not exist, a test outside any group, a name that matches nothing
#     and a unit group with nothing built are refused with exit 2;
#  7. each group's tests start longest first by tests/it/durations (one it does not list first),
#     a test run alone last in its group;
#  8. the unit tests run TEST_JOBS at a time too, longest first, each one's output whole; one that
#     fails (a not ok line, or a non-zero exit without one) fails the run; the integration tests
#     start in the slots the unit tests free, beside a long unit test still running.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup

unset TEST_GROUP # (the group this test runs in, when run by group: the runs below choose theirs)
# The runs below that name no TEST_JOBS take run.sh's default (3), whatever this test ran under
# (TEST_JOBS=8 by hand gave "TEST_JOBS must be 1 to 4" in place of their output).
unset TEST_JOBS
R=$T/root
mkdir -p "$R/tests/it/setup" "$R/tests/it/delivery" "$R/tests/it/faults" "$R/bin/asan" "$T/running"
cp "$ROOT/tests/run.sh" "$R/tests/"

# fake GROUP/NAME BODY: a fake integration test. Each notes its pid in $T/running/NAME, and lists
# the other fakes alive when it starts and when it ends in $T/NAME.others.
fake() {
    _fake_file "$R/tests/it/${1%/*}/${1#*/}.sh" "${1#*/}" "$2"
}
# fake_unit test_NAME BODY: a fake unit test (bin/asan/test_NAME), noted as fake() notes its own.
fake_unit() {
    _fake_file "$R/bin/asan/$1" "$1" "$2" && chmod +x "$R/bin/asan/$1"
}
# _fake_file PATH NAME BODY: writes the fake NAME to PATH.
_fake_file() {
    local path=$1
    shift
    cat >"$path" <<EOF
#!/bin/bash
others() { # (a killed fake may stay a zombie: alive is a state other than Z)
    local f state
    for f in "$T/running/"*; do
        state=\$(sed 's/.*) //' "/proc/\$(cat "\$f")/stat" 2>/dev/null | cut -c1)
        [ "\${f##*/}" != "$1" ] && [ -n "\$state" ] && [ "\$state" != Z ] && echo "\${f##*/}"
    done
    return 0
}
echo \$\$ >"$T/running/$1"
echo "\$TEST_SLOT" >"$T/$1.slot"
others >"$T/$1.others"
$2
others >>"$T/$1.others"
exit 0
EOF
}
fake setup/10_pass 'echo "ok - p1"; sleep 1; echo "ok - p2"'
fake setup/20_fail 'echo "ok - f1"; echo "not ok - f2"; sleep 2; exit 1'
fake delivery/30_hang 'trap "" TERM; echo "ok - h1"; sleep 60'
fake delivery/40_exit 'sleep 1; exit 3'
fake faults/50_alone '# run.sh: alone (a fake)
echo "ok - a1"; sleep 1'
fake faults/60_last 'echo "ok - l1"; sleep 2; echo "ok - l2"'

# The runner's output goes to a file: its ok/not ok lines are the fakes', not this test's.
# A timeout well above the fakes' 2 s sleeps: a loaded machine starts them late (it once cut
# one short at 4 s). The hanging fake ignores SIGTERM: SIGKILL comes TEST_KILL_AFTER seconds
# after it (10 by default, 9 s of this test spent waiting).
TEST_TIMEOUT=10 TEST_KILL_AFTER=1 TEST_JOBS=2 bash "$R/tests/run.sh" >"$T/par.out" 2>&1
rc=$?
sed 's/^/#   /' "$T/par.out"
check_eq "1. every ok and not ok counted, a silent non-zero exit and a timeout as failures" \
    "7 passed, 3 failed" "$(tail -n 1 "$T/par.out")"
check_eq "1. exit status 1 when something failed" 1 "$rc"
check_eq "1. a non-zero exit without a not ok line is one failure" 1 \
    "$(grep -c '^not ok - delivery/40_exit.sh: exited with status 3$' "$T/par.out")"
check_eq "2. the test that ignored SIGTERM is counted as timed out" 1 \
    "$(grep -c '^not ok - delivery/30_hang.sh: timed out after 10s$' "$T/par.out")"
check_eq "3. each test's output whole under its header" \
    "setup/10_pass.sh ok - p1 ok - p2 faults/60_last.sh ok - l1 ok - l2" \
    "$(grep -A2 -E '^# ==== [a-z]+/(10_pass|60_last)' "$T/par.out" | grep -v '^--' |
        sed 's/^# ==== //' | paste -sd' ' -)"
check "4. a test runs beside another (20_fail beside 10_pass)" grep -qx 20_fail "$T/10_pass.others"
check "4. tests running at once have different slots" \
    test "$(cat "$T/10_pass.slot")" != "$(cat "$T/20_fail.slot")"
check_eq "4. the test marked alone ran with no other" "" "$(sort -u "$T/50_alone.others" | paste -sd, -)"
ranges() { # ranges SLOT: the port range and subnet base tests/lib.sh and netns_lib.sh give SLOT
    (TEST_JOBS=2 TEST_SLOT=$1 && source "$ROOT/tests/lib.sh" &&
        echo "$FREE_PORT_BASE-$((FREE_PORT_BASE + FREE_PORT_SPAN - 1))")
}
check_eq "4. slots 0 and 1 pick ports from disjoint ranges" "20000-25999 26000-31999" \
    "$(ranges 0) $(ranges 1)"
# By hand, a slot past TEST_JOBS took a range past the end (TEST_SLOT=6 alone: port 92000 and up,
# subnet 10.231.1302.1): lib.sh refuses it, saying what to set.
(TEST_JOBS=2 TEST_SLOT=2 && source "$ROOT/tests/lib.sh" && echo "sourced $FREE_PORT_BASE") >"$T/slot.out" 2>&1
check_eq "4. a slot at or past TEST_JOBS refused with exit 2" "2" "$?"
check "4. ... saying to raise TEST_JOBS" grep -q 'TEST_SLOT=2 needs TEST_JOBS above it' "$T/slot.out"

rm -f "$R/tests/it/delivery/30_hang.sh"
TEST_JOBS=1 bash "$R/tests/run.sh" >"$T/ser.out" 2>&1
rc=$?
check_eq "5. one at a time: the same totals without the hanging test" "6 passed, 2 failed" \
    "$(tail -n 1 "$T/ser.out")"
check_eq "5. one at a time: exit status 1" 1 "$rc"
TEST_JOBS=9 bash "$R/tests/run.sh" >"$T/bad.out" 2>&1
check_eq "5. TEST_JOBS=9 is refused with exit 2" 2 $?
check "5. ... saying why" grep -q 'TEST_JOBS must be 1 to 4' "$T/bad.out"
TEST_KILL_AFTER=0 bash "$R/tests/run.sh" >"$T/bad.out" 2>&1
check_eq "5. TEST_KILL_AFTER=0 is refused with exit 2, saying why" "2 1" \
    "$? $(grep -c 'TEST_KILL_AFTER must be a whole number of seconds' "$T/bad.out")"

TEST_JOBS=2 bash "$R/tests/run.sh" --group setup >"$T/setup.out" 2>&1
check_eq "6. --group setup: its two tests' totals only" "3 passed, 1 failed" "$(tail -n 1 "$T/setup.out")"
check_eq "6. --group setup: its tests ran, no other" "setup/10_pass.sh setup/20_fail.sh" \
    "$(sed -n 's/^# ==== //p' "$T/setup.out" | sort | paste -sd' ' -)"
TEST_GROUP=faults bash "$R/tests/run.sh" >"$T/faults.out" 2>&1
check_eq "6. TEST_GROUP=faults: its two tests' totals, exit 0" "3 passed, 0 failed 0" \
    "$(tail -n 1 "$T/faults.out") $?"
rm -f "$T/running/"*
bash "$R/tests/run.sh" --list >"$T/list.out" 2>&1
check_eq "6. --list: the groups and their tests, the alone one marked (last of its group), nothing run" \
    "setup|    setup/10_pass.sh|    setup/20_fail.sh|delivery|    delivery/40_exit.sh|faults|    faults/60_last.sh|    faults/50_alone.sh (alone)" \
    "$(paste -sd'|' "$T/list.out")"
check_eq "6. --list ran no test" "" "$(ls "$T/running")"
# 7. tests/it/durations orders each group longest first, a test it does not list first of all.
printf '%s\n' '# a comment' 'setup/10_pass.sh 3' 'setup/20_fail.sh 40' 'faults/60_last.sh 1' \
    >"$R/tests/it/durations"
fake setup/15_new 'echo "ok - n1"'
bash "$R/tests/run.sh" --list >"$T/order.out" 2>&1
check_eq "7. --list: longest first within a group, an unlisted test first, groups in order" \
    "setup|    setup/15_new.sh|    setup/20_fail.sh|    setup/10_pass.sh|delivery|    delivery/40_exit.sh|faults|    faults/60_last.sh|    faults/50_alone.sh (alone)" \
    "$(paste -sd'|' "$T/order.out")"
TEST_JOBS=1 bash "$R/tests/run.sh" --group setup >"$T/order_run.out" 2>&1
check_eq "7. ... and they run in that order" "setup/15_new.sh setup/20_fail.sh setup/10_pass.sh" \
    "$(sed -n 's/^# ==== //p' "$T/order_run.out" | paste -sd' ' -)"
rm -f "$R/tests/it/durations" "$R/tests/it/setup/15_new.sh"
bash "$R/tests/run.sh" --group nope >"$T/nope.out" 2>&1
check_eq "6. --group nope is refused with exit 2" 2 $?
check_eq "6. ... in one line naming the groups" \
    "tests/run.sh: no group 'nope' (groups: unit setup packaging security delivery order operations demos faults)" \
    "$(cat "$T/nope.out")"
# Nothing to run fails the run: it printed "0 passed, 0 failed" and exited 0 (a unit group whose
# binaries `make all asan` had not built, or a name that matches no test).
bash "$R/tests/run.sh" no_such_test >"$T/none.out" 2>&1
check_eq "6. a name that matches no test is refused with exit 2, saying why" "2 1" \
    "$? $(grep -c 'no test matches the names and groups given' "$T/none.out")"
mkdir -p "$R/tests/unit" && touch "$R/tests/unit/test_unbuilt.c"
bash "$R/tests/run.sh" --group unit >"$T/unbuilt.out" 2>&1
check_eq "6. a unit group with no unit test built is refused with exit 2, saying why" "2 1" \
    "$? $(grep -c "no unit test is built (bin/asan/test_\*): run 'make unit' first" "$T/unbuilt.out")"
rm -f "$R/tests/unit/test_unbuilt.c"
touch "$R/tests/it/90_stray.sh"
bash "$R/tests/run.sh" >"$T/stray.out" 2>&1
check_eq "6. a test outside any group is refused with exit 2" 2 $?
check "6. ... naming it" grep -q 'tests/it/90_stray.sh is in no group' "$T/stray.out"

# 8. Fake unit tests in bin/asan/. test_zslow, the longest by durations (and last by name), waits
# (30 s at most) until the fake named by GO_BY has started: run first and beside the others, it
# is still running when that one starts; run one after the other, in name order, it is not.
rm -f "$R/tests/it/90_stray.sh" "$T/running/"*
printf '%s\n' 'test_zslow 20' 'test_bfail 1' 'test_csilent 1' 'test_dquick 0' >"$R/tests/it/durations"
fake_unit test_zslow "for _ in \$(seq 300); do [ -e '$T/go' ] && break; sleep 0.1; done
echo 'ok 1 - slow'"
fake_unit test_bfail 'echo "ok 1 - b1"; echo "not ok 2 - b2"; exit 1'
fake_unit test_csilent 'exit 3'
fake_unit test_dquick "[ \"\$GO_BY\" = test_dquick ] && touch '$T/go'; echo 'ok 1 - q1'"
fake setup/10_pass "[ \"\$GO_BY\" = 10_pass ] && touch '$T/go'; echo 'ok - p1'; echo 'ok - p2'"
GO_BY=test_dquick TEST_JOBS=2 bash "$R/tests/run.sh" --group unit >"$T/unit.out" 2>&1
rc=$?
sed 's/^/#   /' "$T/unit.out"
check_eq "8. --group unit: every ok and not ok counted, a silent non-zero exit as a failure" \
    "3 passed, 2 failed" "$(tail -n 1 "$T/unit.out")"
check_eq "8. a failing unit test makes the run exit 1" 1 "$rc"
check_eq "8. a non-zero exit without a not ok line is one failure" 1 \
    "$(grep -c '^not ok - test_csilent: exited with status 3$' "$T/unit.out")"
check_eq "8. each unit test's output whole under its header" "test_bfail ok 1 - b1 not ok 2 - b2" \
    "$(grep -A2 '^# ==== test_bfail$' "$T/unit.out" | sed 's/^# ==== //' | paste -sd' ' -)"
check "8. the longest unit test starts first and runs beside the others" \
    grep -qx test_zslow "$T/test_dquick.others"
rm -f "$T/running/"* "$T/go"
GO_BY=10_pass TEST_JOBS=2 bash "$R/tests/run.sh" --group unit --group setup >"$T/both.out" 2>&1
sed 's/^/#   /' "$T/both.out"
check_eq "8. unit and setup tests: both counted" "6 passed, 3 failed" "$(tail -n 1 "$T/both.out")"
check "8. an integration test starts beside a unit test still running" \
    grep -qx test_zslow "$T/10_pass.others"
