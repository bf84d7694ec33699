#!/bin/bash
# Proves that a relay cut off from Kafka while its peers are not gives its lanes up to them, and
# takes its share back once Kafka answers it again (docs/guarantees.md#failure-modes): relay A
# runs here on loopback, relay B inside a network namespace whose traffic to the mock brokers
# (only that: its PostgreSQL link stays up) nft drops silently, as a gray failure does.
#  1. With B cut off, 2,000 rows over 200 aggregates are all acknowledged (by A) within a bounded
#     wait; B logged that it gives its lanes up and holds none; A holds all 64. On the old code B
#     kept its share and its rows waited until its Kafka came back.
#  2. Once B's Kafka answers again, B takes its share back (its trial after the backoff), and rows
#     inserted then are delivered.
#  3. 0 lost, first copies in order per aggregate (read back from Kafka), duplicates printed; no
#     relay logged "order broken"; both exit 0.
#  4. Every relay's Kafka down (the mock's brokers down): after each relay's delivery timeouts
#     nobody holds all lanes alone (nobody gives up when no member is healthy), and once the
#     brokers are back everything is delivered, in order.
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

OPTS=("${FAULT_RELAY_OPTS[@]}" --delivery-timeout 2000)
relay_start --database-url "$DATABASE_URL" "${OPTS[@]}"
A_PID=$RELAY_PID A_LOG=$RELAY_LOG
RELAY_WRAP=(ip netns exec "$NS")
relay_start --database-url "$NS_DATABASE_URL" "${OPTS[@]}"
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
insert_rows warm 1 200 50
wait_for "warm-up rows delivered by both relays" 30 none_unsent_of warm

# --- 1: B cut off from the brokers only ---
PORTS=$(for b in ${BROKERS//,/ }; do printf '%s, ' "${b##*:}"; done)
PORTS=${PORTS%, }
netns_exec nft -f - <<EOF || fail "nft: drop the namespace's broker traffic"
table inet outbox_relay_kafka_cut {
    chain input { type filter hook input priority 0; policy accept; iifname "$NS_VETH_NS" tcp sport { $PORTS } drop; }
    chain output { type filter hook output priority 0; policy accept; oifname "$NS_VETH_NS" tcp dport { $PORTS } drop; }
}
EOF
on_exit "ip netns exec '$NS' nft delete table inet outbox_relay_kafka_cut"
t0=$(now_ms)
A_CUT=$(wc -l <"$A_LOG") B_CUT=$(wc -l <"$B_LOG") # lines before the cut
since_cut() { tail -n "+$(($2 + 1))" "$1" | grep -q "$3"; }
insert_rows cut 1 2000 200
if wait_for "1: every row acknowledged while the relay in the namespace is cut off" 60 \
    none_unsent_of cut; then
    ok "1: all $(rows_of cut) rows acknowledged with one relay cut off from Kafka"
    echo "# 1: every row acknowledged $(secs_since "$t0")s after the cut"
else
    not_ok "1: all rows acknowledged with one relay cut off from Kafka" \
        "$(unsent_of cut) of $(rows_of cut) unsent after 60 s"
fi
# From the logs, not the locks now: the cut-off relay's trial (after its backoff) takes its share
# back, and with no rows left to time out on it keeps it until rows come.
check "1: the relay in the namespace gave every lane up" \
    since_cut "$B_LOG" "$B_CUT" 'msg="lanes owned" lanes=0 of=64'
check "1: the relay here held all 64 lanes" \
    since_cut "$A_LOG" "$A_CUT" 'msg="lanes owned" lanes=64 of=64 .* live_sessions=2'
check "1: the cut-off relay said it gives its lanes up" \
    grep -q 'msg="kafka unreachable from this relay: its lanes go to the other relays that reach it, if any"' "$B_LOG"
check "1: the relay here never gave its lanes up" \
    bash -c "! grep -q 'its lanes go to the other relays' '$A_LOG'"
away=$(grep -m 1 'its lanes go to the other relays' "$B_LOG" | cut -d' ' -f1)
[ -n "$away" ] && echo "# 1: the cut-off relay went away $(ms_as_s $(($(date -d "$away" +%s%N) / 1000000 - t0)))s after the cut"

# --- 2: healed ---
# Rows arrive for 45 s, so that the cut-off relay's next trial (after its backoff) has rows of its
# share to get acknowledged.
netns_exec nft delete table inet outbox_relay_kafka_cut || fail "nft: heal"
t1=$(now_ms)
load_for after 45 100
wait_for "2: the relay in the namespace says Kafka answers it again" 90 \
    grep -q 'msg="kafka answers again: the relay keeps its share of the lanes"' "$B_LOG"
check "2: the relay in the namespace says Kafka answers it again" \
    grep -q 'msg="kafka answers again: the relay keeps its share of the lanes"' "$B_LOG"
echo "# 2: it said so $(secs_since "$t1")s after the heal (at most: the wait polls)"
wait_for "2: both relays hold lanes again, 64 in all" 30 split
check "2: the relay in the namespace takes its share again" split
wait_for "2: rows after the heal delivered" 90 load_done_and_sent after

check_delivered cut "3: every row of the cut in Kafka (0 lost)"
echo "# 3: duplicates in Kafka: $(duplicates_in "$T/cut.json") of $(grep -c . "$T/cut.json") messages"
check_delivered after

# --- 4: every relay's Kafka down: nobody gives its lanes up for good ---
away_lines() { grep -c 'msg="kafka unreachable from this relay' "$1"; }
a0=$(away_lines "$A_LOG") b0=$(away_lines "$B_LOG")
both_away() { [ "$(away_lines "$A_LOG")" -gt "$a0" ] && [ "$(away_lines "$B_LOG")" -gt "$b0" ]; }
broker_down
insert_rows down 1 1000 200
wait_for "4: both relays found their Kafka unreachable" 60 both_away
check "4: both relays found their Kafka unreachable" both_away
# Neither may hand its share to the other: no member reaches Kafka. Both hold lanes once each
# has looked at the group after its own finding (bounded wait, not a time).
wait_for "4: both relays hold lanes with every relay's Kafka down" 30 split
check "4: both relays hold lanes with every relay's Kafka down" split
broker_up
wait_for "4: rows of the outage delivered once the brokers are back" 60 none_unsent_of down
check_delivered down "4: every row of the outage in Kafka"
wait_for "4: both relays hold lanes after the outage" 60 split
check "4: both relays hold lanes after the outage" split

RELAY_PID=$B_PID
relay_stop
check_eq "3: the relay in the namespace exits 0" 0 $?
RELAY_PID=$A_PID
relay_stop
check_eq "3: the relay here exits 0" 0 $?
check "3: no relay logged 'order broken'" _no_order_broken
