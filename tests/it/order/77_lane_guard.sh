#!/bin/bash
# Proves, deterministically, the two rules lanes rest on (a relay stands in for another relay by
# taking the same advisory locks from the test's own sessions):
#  1. a relay claims only from lanes it holds: with lanes 0-7 held by someone else, rows of those
#     lanes, inserted before rows of the relay's lanes, stay unsent while the later rows are
#     delivered (the claim takes rows in id order, so one that ignored lane ownership would take
#     the held-lane rows first); once those lanes are free, the relay takes them and sends the rows;
#  2. a lane is handed over only between batches: while the relay's only session holds a claimed
#     batch that cannot be acknowledged (brokers down), a relay joining the group (a member slot
#     taken) does not make it give up any lane — observed for 3 s, i.e. ten rebalance intervals
#     of 300 ms, with the batch still open at the end; after the batch, the relay hands the
#     newcomer its share (so the join was seen).
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 3
relay_migrate 2>"$T/migrate.log" || fail "migrate"

# insert_lanes TYPE LANES N: N rows of type TYPE, one per aggregate, aggregates whose lane is in
# LANES (a PostgreSQL array literal), in id order.
insert_lanes() {
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            SELECT '$1', a, 'changed', jsonb_build_object('seq', 0)
            FROM (SELECT '$1-' || i AS a, i FROM generate_series(0, 99999) AS i
                  WHERE outbox_lane('$1', '$1-' || i) = ANY('$2'::smallint[])
                  ORDER BY i LIMIT $3) s ORDER BY i"
}
count_of() { # count_of TYPE CONDITION
    psql_q "SELECT count(*) FROM outbox WHERE aggregate_type = '$1' AND ($2)"
}
none_unsent_of() { [ "$(count_of "$1" "sent_at IS NULL")" = 0 ]; }
# lane_locks [APP]: lane locks granted to the test's session named APP, or without APP to the
# relay (every session but the test's two)
lane_locks() {
    local who="a.application_name NOT IN ('other-relay', 'newcomer')"
    [ -n "${1:-}" ] && who="a.application_name = '$1'"
    psql_q "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
            WHERE $LANE_LOCK AND $who"
}
lane_locks_are() { [ "$(lane_locks "$1")" = "$2" ]; }
# hold APP SQL: a background session named APP that runs SQL and then holds on (its locks with it)
hold() {
    psql -XAtq -v ON_ERROR_STOP=1 -c "SET application_name = '$1'" -c "$2" \
        -c "SELECT pg_sleep(300)" >/dev/null 2>&1 &
    _t_track $!
}
release() { # release APP: ends the background session APP (its locks go with it)
    psql_q "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
            WHERE application_name = '$1'" >/dev/null
}

# --- 1. lanes held elsewhere are not claimed from ---
hold other-relay "SELECT count(*) FROM generate_series(0, 7) AS l
                  WHERE pg_try_advisory_lock($LANE_NS, l)"
wait_for "1: another session holds lanes 0-7" 10 lane_locks_are other-relay 8
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --sessions 1 \
    --rebalance-interval 300 --delivery-timeout 60000 --kafka reconnect.backoff.max.ms=500
wait_for "1: the relay holds the other 56 lanes" 20 lane_locks_are "" 56
insert_lanes held "{$(seq -s, 0 7)}" 80
insert_lanes free "{$(seq -s, 8 63)}" 200
wait_for "1: rows of the relay's lanes, inserted after the others, are delivered" 30 \
    none_unsent_of free
check_eq "1: no row of the lanes held elsewhere was claimed" "80 0" \
    "$(count_of held "sent_at IS NULL") $(count_of held "attempts > 0")"
release other-relay
wait_for "1: once lanes 0-7 are free, the relay takes them and sends their rows" 30 \
    none_unsent_of held

# --- 2. no lane handed over with a batch in flight ---
wait_for "2: the relay holds all 64 lanes" 20 lane_locks_are "" 64
broker_down
insert_lanes inflight "{$(seq -s, 0 63)}" 300
wait_for "2: the relay holds a claimed batch it cannot get acknowledged" 30 claim_open
hold newcomer "SELECT pg_advisory_lock($MEMBER_NS, 1)" # member slot 1: a relay joins
joined() {
    psql_q "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = $MEMBER_NS
            AND objsubid = 2 AND granted" | grep -qx 2
}
wait_for "2: a second relay joined the group (two member slots taken)" 10 joined
gave_up_lanes() { [ "$(lane_locks "")" -lt 64 ]; }
if _poll 3 gave_up_lanes; then
    not_ok "2: no lane given up while the batch is in flight" \
        "$(lane_locks "") lanes held, claim open: $(claim_open && echo yes || echo no)"
else
    ok "2: no lane given up while the batch is in flight (3 s, ten rebalance intervals)"
fi
check "2: the batch was still in flight throughout" claim_open
check_eq "2: nothing of it was marked" 0 "$(count_of inflight "sent_at IS NOT NULL")"
broker_up
wait_for "2: once the brokers are back, the batch is delivered" 60 none_unsent_of inflight
wait_for "2: after the batch, the relay hands the newcomer its share of the lanes" 20 gave_up_lanes
relay_stop
check_eq "relay exits 0" 0 $?
release newcomer
check "no 'order broken' in the log" lacks "$RELAY_LOG" "order broken"
