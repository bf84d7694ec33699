#!/bin/bash
# Proves that a relay whose host goes silent (no FIN, no RST: every packet of its network
# namespace dropped by nft) loses its lanes within the session timeout, on default settings,
# while rows arrive steadily for the first 25 s of the fault over 400 aggregates:
#  1. every row is acknowledged within 40 s of the fault, none waited more than 20 s from commit
#     to acknowledgement (sent_at - created_at; p50/p99/max printed, with when the survivor took
#     over the lanes); the fault ends once they are (it lasted 40 s whatever: 14 s of every run
#     spent idle), and the silent relay holds no lane then;
#  2. after the network heals the silent relay notices its sessions are gone, reconnects and
#     takes its share of the lanes again;
#  3. 0 lost, first copies in order per aggregate (read back from Kafka), duplicates printed;
#     no relay logged "order broken".
# Relay A runs here on loopback; relay B inside the namespace, reaching PostgreSQL through the
# veth and the mock broker through socat forwarders.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
# shellcheck source=tests/netns_lib.sh
source "$(dirname "$0")/../../netns_lib.sh"
t_setup
fault_init
netns_create
fault_setup 1
netns_pg_listen
netns_forward_brokers

FAULT_S=40
LOAD_S=25
relay_start --database-url "$DATABASE_URL" "${FAULT_RELAY_OPTS[@]}"
A_PID=$RELAY_PID A_LOG=$RELAY_LOG
RELAY_WRAP=(ip netns exec "$NS")
relay_start --database-url "$NS_DATABASE_URL" "${FAULT_RELAY_OPTS[@]}"
RELAY_WRAP=()
B_PID=$RELAY_PID B_LOG=$RELAY_LOG

split() { # both relays hold lanes, 64 in all
    local a b
    a=$(lanes_from 127.0.0.1) b=$(lanes_from "$NS_ADDR")
    [ "$a" -gt 0 ] && [ "$b" -gt 0 ] && [ $((a + b)) = 64 ]
}
wait_for "the relay here and the one in the namespace split the 64 lanes" 30 split ||
    fail "relays split the lanes"
echo "# lanes: here $(lanes_from 127.0.0.1), in the namespace $(lanes_from "$NS_ADDR")"
load_for warm 2 100
wait_for "warm-up rows delivered by both relays" 30 load_done_and_sent warm

# --- the fault ---
# Rows arrive from 2 s before the fault (so that it strikes batches under way) to 25 s into it.
load_for sil $((LOAD_S + 2))
sleep 2
t0=$(now_ms)
netns_block
fault_end=$((t0 + FAULT_S * 1000))
check_rows_during_fault sil fault "relay here" "$t0" "$fault_end"
check "1: relay here still running" kill -0 "$A_PID"
check_eq "1: the relay in the namespace holds no lane while silent" 0 "$(lanes_from "$NS_ADDR")"

# --- healed ---
netns_unblock
t1=$(now_ms)
wait_for "2: the silent relay noticed its connection gone" 30 \
    grep -qE 'msg="postgres connection lost"' "$B_LOG"
wait_for "2: the silent relay reconnected" 30 grep -q 'msg="postgres reconnected"' "$B_LOG"
wait_for "2: both relays hold lanes again, 64 in all" 30 split
echo "# 2: relay in the namespace holds $(lanes_from "$NS_ADDR") lanes again $(secs_since "$t1")s after the network healed"
check "2: relay in the namespace still running" kill -0 "$B_PID"
load_for after 2 100
wait_for "2: rows after the fault delivered" 30 load_done_and_sent after

check_two_relays_after_fault sil fault "relay here" "relay in the namespace"
