#!/bin/bash
# Proves failover and joining with lanes:
#  1. two relays split the 64 lanes between them (each lane held by exactly one relay's session);
#  2. `kill -9` of one while it has a batch in flight: the rows of its lanes are inserted with
#     the brokers down, the test waits until the relay holds a claimed batch of them (which
#     cannot be acknowledged) and kills it then; no row is marked in between. Once the brokers
#     are back, the survivor delivers every row of the killed relay's lanes, the claimed ones
#     included, within seconds (the time is measured and printed), in order per aggregate, and
#     then holds all 64 lanes;
#  3. a third relay that joins logs `lanes owned` with lanes > 0, takes a disjoint share, and
#     delivers the rows of its lanes itself (its `stopped` line counts them).
# Lane ownership is read from pg_locks (advisory locks in the lane namespace), matched to a relay
# process through the client port of its PostgreSQL connection.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
fault_setup 3

FAILOVER_LIMIT=10  # "within a few seconds": the default --rebalance-interval is 1 s
OPTS=(--database-url "$DATABASE_URL" "${FAULT_RELAY_OPTS[@]}")

# lanes_of PID: the lanes held by the PostgreSQL session(s) of relay process PID, one per line.
lanes_of() {
    local ports
    ports=$(ss -tnpH "dport = :$PGPORT" | grep -F "pid=$1," | awk '{ sub(/.*:/, "", $4); print $4 }' |
        paste -sd, -)
    [ -n "$ports" ] || return 0
    psql_q "SELECT l.objid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
            WHERE $LANE_LOCK AND a.client_port IN ($ports) ORDER BY 1"
}

lane_count() {
    lanes_of "$1" | grep -c .
}

# split_between PID1 PID2: the two relays together hold all 64 lanes, each some, none twice.
split_between() {
    local a b
    a=$(lane_count "$1")
    b=$(lane_count "$2")
    [ "$a" -gt 0 ] && [ "$b" -gt 0 ] &&
        [ "$(sort -u <(lanes_of "$1") <(lanes_of "$2") | grep -c .)" = 64 ] &&
        [ $((a + b)) = 64 ]
}

# insert_in_lanes TYPE LANES N: N rows of type TYPE over up to 40 aggregates whose lane is in
# LANES (a PostgreSQL array literal); seq grows with id per aggregate.
insert_in_lanes() {
    psql_q "WITH aggs AS (
                SELECT row_number() OVER (ORDER BY i) - 1 AS k, '$1-' || i AS agg
                FROM generate_series(0, 9999) AS i
                WHERE outbox_lane('$1', '$1-' || i) = ANY('$2'::smallint[])
                ORDER BY i LIMIT 40),
            n AS (SELECT count(*) AS c FROM aggs)
            INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            SELECT '$1', a.agg, 'changed', jsonb_build_object('seq', g)
            FROM generate_series(0, $3 - 1) AS g JOIN aggs a ON a.k = g % (SELECT c FROM n)
            ORDER BY g"
}

pg_array() { # pg_array: stdin lines -> {a,b,c}
    echo "{$(paste -sd, -)}"
}

# --- 1. two relays split the lanes ---
relay_start "${OPTS[@]}"
A_PID=$RELAY_PID
relay_start "${OPTS[@]}"
B_PID=$RELAY_PID B_LOG=$RELAY_LOG
wait_for "1: two relays split the 64 lanes, each some, none twice" 20 split_between "$A_PID" "$B_PID"
echo "# 1: relay A holds $(lane_count "$A_PID") lanes, relay B $(lane_count "$B_PID")"
insert_in_lanes warm "{$(seq -s, 0 63)}" 2000
wait_for "1: rows over all lanes delivered by the pair" 30 none_unsent_of warm

# --- 2. kill -9 one of them with a batch in flight ---
a_lanes=$(lanes_of "$A_PID" | pg_array)
[ "$a_lanes" != "{}" ] || fail "2: relay A holds lanes before the kill"
broker_down
insert_in_lanes fo "$a_lanes" 1000 # only relay A may claim these
snap_claim() { # the sent count read just before A's claim is seen open
    SNAP=$(psql_q "SELECT count(*) FROM outbox WHERE aggregate_type = 'fo' AND sent_at IS NOT NULL")
    claim_open "$A_PID"
}
wait_for "2: relay A holds a claimed batch of its rows (brokers down: no acknowledgement)" 30 \
    snap_claim
kill -KILL "$A_PID"
wait "$A_PID" 2>/dev/null
check_eq "2: the kill hit the batch in flight (nothing of it marked before the kill)" \
    "0 0" "$SNAP $(psql_q "SELECT count(*) FROM outbox WHERE aggregate_type = 'fo'
                          AND sent_at IS NOT NULL")"
t0=$(date +%s%N)
broker_up
if _poll "$FAILOVER_LIMIT" none_unsent_of fo; then
    ms=$((($(date +%s%N) - t0) / 1000000))
    echo "# failover: rows of the killed relay's lanes delivered $((ms / 1000)).$(printf '%03d' $((ms % 1000)))s after kill -9 and brokers up"
    ok "2: rows of the killed relay's lanes delivered by the survivor within ${FAILOVER_LIMIT}s"
else
    not_ok "2: rows of the killed relay's lanes delivered by the survivor within ${FAILOVER_LIMIT}s" \
        "$(unsent_of fo) of 1000 still unsent"
    wait_for "2: ... delivered at all (30s more)" 30 none_unsent_of fo
fi
check_eq "2: the survivor holds all 64 lanes" 64 "$(lane_count "$B_PID")"
check_delivered fo "all 1000 rows in Kafka"
check "2: survivor logged its new lane count" grep -q 'msg="lanes owned" lanes=64 ' "$B_LOG"

# --- 3. a third relay joins ---
relay_start "${OPTS[@]}"
C_PID=$RELAY_PID C_LOG=$RELAY_LOG
joined() {
    grep -qE 'msg="lanes owned" lanes=[1-9]' "$C_LOG"
}
wait_for "3: the joining relay logs lanes owned with lanes > 0" 20 joined
grep -m 1 -E 'msg="lanes owned" lanes=[1-9]' "$C_LOG" | sed 's/^/# 3: /'
wait_for "3: survivor and newcomer split the 64 lanes" 20 split_between "$B_PID" "$C_PID"
c_lanes=$(lanes_of "$C_PID" | pg_array)
echo "# 3: relay B holds $(lane_count "$B_PID") lanes, relay C $(lane_count "$C_PID")"
insert_in_lanes join "$c_lanes" 500
wait_for "3: rows of the newcomer's lanes delivered" 30 none_unsent_of join
check_eq "3: newcomer still holds the same lanes" "$c_lanes" "$(lanes_of "$C_PID" | pg_array)"
relay_stop
check_eq "3: newcomer exits 0 on SIGTERM" 0 $?
c_sent=$(sed -n 's/.*msg="stopped" sent=\([0-9]*\).*/\1/p' "$C_LOG")
echo "# 3: newcomer sent ${c_sent:-?} events"
check "3: the newcomer delivered the 500 rows of its lanes itself (sent >= 500)" \
    test "${c_sent:-0}" -ge 500
check_delivered join "all 500 rows in Kafka"
RELAY_PID=$B_PID
relay_stop
check_eq "survivor exits 0 on SIGTERM" 0 $?
no_order_broken() {
    ! grep -l 'order broken' "$T"/relay.*.log
}
check "no relay logged 'order broken'" no_order_broken
