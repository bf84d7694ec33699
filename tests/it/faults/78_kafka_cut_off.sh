#!/bin/bash
# Proves that a relay cut off from Kafka while its peers are not gives its lanes up to them, and
# takes its share back once Kafka answers it again (docs/guarantees.md#failure-modes): relay A
# runs here on loopback, relay B inside a network namespace whose traffic to the mock brokers
# (only that: its PostgreSQL link stays up) nft drops silently, as a gray failure does.
#  1. With B cut off, 2,000 rows over 200 aggregates are all acknowledged (by A) within a bounded
#     wait; B logged that it gives its lanes up and holds none; A holds all 64. On the old code B
#     kept its share and its rows waited until its Kafka came back.
#     What an operator sees of it: while B is away its /metrics say outbox_kafka_away 1, its
#     /readyz answers 503 naming it ("kafka away"), and `outbox-relay status` shows B's sessions
#     away (KAFKA column, "kafka" in --json) and A's ok; once B tries again (its trial after the
#     backoff, with no rows left to send), 2 and "trying", and /readyz no longer names it. A's
#     gauge stays 0. On the old code none of these said anything (no such metric, reason or
#     column: only B's log lines).
#  2. Once B's Kafka answers again, B takes its share back (its trial after the backoff), and rows
#     inserted then are delivered.
#  3. 0 lost, first copies in order per aggregate (read back from Kafka), duplicates printed; no
#     relay logged "order broken"; both exit 0.
#  4. Every relay's Kafka down (the mock's brokers down): after each relay's delivery timeouts
#     nobody holds all lanes alone (nobody gives up when no member is healthy), and once the
#     brokers are back everything is delivered, in order. Both relays' gauges say away (1) then,
#     each keeping its lanes, and B's /readyz says so (on the old code it said its lanes go to
#     relays that reach Kafka).
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
relay_start --database-url "$DATABASE_URL" "${OPTS[@]}" --metrics-listen 127.0.0.1:0
A_PID=$RELAY_PID A_LOG=$RELAY_LOG
metrics_wait # A's: METRICS
RELAY_WRAP=(ip netns exec "$NS")
# B's metrics on the namespace's loopback, read from inside it: the cut drops only its traffic
# to the broker ports on the veth.
relay_start --database-url "$NS_DATABASE_URL" "${OPTS[@]}" --metrics-listen 127.0.0.1:0
RELAY_WRAP=()
B_PID=$RELAY_PID B_LOG=$RELAY_LOG
_poll 15 grep -q 'msg="metrics listening"' "$B_LOG" || fail "B logs its metrics address"
B_METRICS=$(sed -n 's/.*msg="metrics listening" address=\([^ ]*\).*/\1/p' "$B_LOG" | tail -n 1)
b_http() { netns_exec curl -s --max-time 5 "http://$B_METRICS$1"; }
away_of() { awk '$1 == "outbox_kafka_away" { print $2 }'; } # the gauge of a /metrics body
# The KAFKA states of the sessions connected from ADDR, as status --json says (sorted, unique).
status_kafka_of() {
    "$RELAY_BIN" status --database-url "$DATABASE_URL" --json |
        jq -r --arg a "$1" '[.sessions[] | select(.client_addr == $a) | .kafka] | unique | join(",")'
}
# B away as every view says so: its gauge 1, its /readyz 503 naming it, status showing its
# sessions away. Each view is read until it has said so once (a file each), so that a loaded
# machine's slow look at one does not use up the others' window.
_seen() { # _seen NAME CMD...: true once CMD has succeeded at some call
    [ -e "$T/seen.$1" ] || { "${@:2}" && touch "$T/seen.$1"; }
}
_b_gauge_is() { [ "$(b_http /metrics | away_of)" = "$1" ]; }
_b_readyz_away() { b_http /readyz | grep -q 'kafka away: deliveries time out from this relay'; }
_b_status_is() { [ "$(status_kafka_of "$NS_ADDR")" = "$1" ]; }
b_seen_away() {
    _seen gauge _b_gauge_is 1
    _seen readyz _b_readyz_away
    _seen status _b_status_is away
    [ -e "$T/seen.gauge" ] && [ -e "$T/seen.readyz" ] && [ -e "$T/seen.status" ]
}
b_seen_trying() {
    [ "$(b_http /metrics | away_of)" = 2 ] && [ "$(status_kafka_of "$NS_ADDR")" = trying ]
}

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
# B is away for its first trial's delay (2 x --delivery-timeout, its second half random: 2-4 s
# here), then tries with no rows left and stays trying: watched from before it goes away.
wait_for "1: B's gauge, /readyz and status say it is away" 60 b_seen_away
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
check_eq "1: the relay here is not away (its gauge)" 0 "$(http_get /metrics | away_of)"
check_eq "1: status shows the relay here's sessions ok" ok "$(status_kafka_of 127.0.0.1)"
status_text=$("$RELAY_BIN" status --database-url "$DATABASE_URL")
printf "# %s\n" "${status_text//$'\n'/$'\n# '}"
wait_for "1: B tries again (gauge 2, status trying) once its trial came" 30 b_seen_trying
b_readyz_not_away() { b_http /readyz >"$T/b_readyz.txt" && ! grep -q 'kafka away' "$T/b_readyz.txt"; }
check "1: B's /readyz does not name away while it tries" b_readyz_not_away
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
check_eq "2: B's gauge is 0 once Kafka answers it" 0 "$(b_http /metrics | away_of)"
# The gauge changes with the acknowledgement, before the log line; the session gives its trying
# mark up at its next look, after the batch that brought the acknowledgement is marked (46 ms
# after the line in two runs here, while the test reads it a lanes look and a /metrics read after
# seeing the line): waited for, bounded, so that a loaded machine's slower batch does not read
# as a mark left behind.
b_status_ok() { [ "$(status_kafka_of "$NS_ADDR")" = ok ]; }
wait_for "2: status shows B's sessions ok" 30 b_status_ok
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
# Each keeps its lanes, away (a relay whose share moved for that moment tries again, and its
# trial's rows time out: away again).
gauges_away() { [ "$(http_get /metrics | away_of) $(b_http /metrics | away_of)" = "1 1" ]; }
wait_for "4: both relays' gauges say away" 30 gauges_away
check "4: both relays' gauges say away" gauges_away
# And B's /readyz says it keeps its lanes, not that they went to relays that reach Kafka.
b_readyz_keeps() { b_http /readyz | grep -q 'no relay of its outbox reaches kafka: it keeps its lanes'; }
wait_for "4: B's /readyz says no relay reaches kafka and it keeps its lanes" 30 b_readyz_keeps
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
