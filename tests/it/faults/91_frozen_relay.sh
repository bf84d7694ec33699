#!/bin/bash
# Proves that a relay frozen by SIGSTOP (its kernel still answers TCP, so keepalives never end its
# sessions) loses its lanes within the session timeout, on default settings, while rows arrive
# steadily for the first 25 s of the freeze over 400 aggregates:
#  1. every row is acknowledged within 40 s of the freeze, none waited more than 20 s from commit
#     to acknowledgement (p50/p99/max printed, with when the other relay took the lanes over);
#     the freeze ends once they are (it lasted 40 s whatever: 14 s of every run spent idle), and
#     the frozen relay holds no lane then;
#  2. after SIGCONT the frozen relay notices that its sessions are gone (PostgreSQL ended them:
#     idle timeouts), marks nothing with them, reconnects and takes its share again;
#  3. 0 lost, first copies in order per aggregate, duplicates printed; no "order broken".
# Both relays run on loopback; application_name in their URLs tells their sessions apart.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
# shellcheck source=tests/netns_lib.sh
source "$(dirname "$0")/../../netns_lib.sh"
t_setup
fault_init
fault_setup 1

FAULT_S=40
LOAD_S=25
relay_start --database-url "$DATABASE_URL?application_name=relay-a" "${FAULT_RELAY_OPTS[@]}"
A_PID=$RELAY_PID A_LOG=$RELAY_LOG
relay_start --database-url "$DATABASE_URL?application_name=relay-b" "${FAULT_RELAY_OPTS[@]}"
B_PID=$RELAY_PID B_LOG=$RELAY_LOG

split() { # both relays hold lanes, 64 in all
    local a b
    a=$(lanes_of_app relay-a) b=$(lanes_of_app relay-b)
    [ "$a" -gt 0 ] && [ "$b" -gt 0 ] && [ $((a + b)) = 64 ]
}
wait_for "the two relays split the 64 lanes" 30 split || fail "relays split the lanes"
echo "# lanes: relay A $(lanes_of_app relay-a), relay B $(lanes_of_app relay-b)"
load_for warm 2 100
wait_for "warm-up rows delivered by both relays" 30 load_done_and_sent warm

# --- the freeze ---
# Rows arrive from 2 s before the fault (so that it strikes batches under way) to 25 s into it.
load_for frz $((LOAD_S + 2))
sleep 2
t0=$(now_ms)
stop_pid "$B_PID"
fault_end=$((t0 + FAULT_S * 1000))
check_rows_during_fault frz freeze "relay A" "$t0" "$fault_end"
grep -c 'terminating connection due to idle' "$T/pg.log" | sed 's/^/# 1: sessions PostgreSQL ended for idleness: /'
check_eq "1: relay B holds no lane while frozen" 0 "$(lanes_of_app relay-b)"

# --- SIGCONT ---
cont_pid "$B_PID"
t1=$(now_ms)
wait_for "2: the frozen relay noticed its sessions gone" 30 \
    grep -qE 'msg="postgres connection lost"' "$B_LOG"
wait_for "2: the frozen relay reconnected" 30 grep -q 'msg="postgres reconnected"' "$B_LOG"
wait_for "2: both relays hold lanes again, 64 in all" 30 split
echo "# 2: relay B holds $(lanes_of_app relay-b) lanes again $(secs_since "$t1")s after SIGCONT"
check "2: relay B still running" kill -0 "$B_PID"
load_for after 2 100
wait_for "2: rows after the freeze delivered" 30 load_done_and_sent after

check_two_relays_after_fault frz freeze "relay A" "relay B"
