#!/bin/bash
# Proves that relays logging in as different roles (each a member of outbox_relay, as
# docs/security.md's "CREATE ROLE relay_login ... GRANT outbox_relay TO relay_login" has it, one
# login per host) never name one another's session as a lane squatter: relay A (login relay_a) is
# away from Kafka, holding its member slot without lanes while relay B (login relay_b) finishes a
# batch that waits for Kafka (A's --delivery-timeout of 20 s makes its away backoff 20 to 40 s,
# longer than status and check take: check waits
# --statement-timeout for the brokers, which are down, so it gets 5s). B's own upkeep
# (outbox_lane_squatters, /readyz) and status and check run as a monitoring login must not count
# A's session: A's role may mark the table's rows as a relay does. On the old code (the role test
# excused only the caller's role and roles of a session holding lanes) B's upkeep logged A's
# session as a squatter and turned B, the relay delivering, unready, and status named it. The
# control: a stranger's slot without lanes (no grant on the table) in the same state is named by
# both, even while another session of the stranger holds a slot and a lane as a relay does.
# It replaces 44_lane_squatters_relays (cb5cec4), whose two relays shared one role: status and
# check as a monitoring login meet the same privilege test whatever the relays' roles (on the code
# before cb5cec4, which excused only the caller's role, both would name the away relay's session).
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"
psql_q "CREATE ROLE relay_a LOGIN IN ROLE outbox_relay; CREATE ROLE relay_b LOGIN IN ROLE outbox_relay;
        CREATE ROLE watcher LOGIN; GRANT pg_read_all_data TO watcher; CREATE ROLE stranger LOGIN" ||
    fail "create the roles"
URL_A=postgresql://relay_a@127.0.0.1:$PGPORT/outbox
URL_B=postgresql://relay_b@127.0.0.1:$PGPORT/outbox
WATCHER_URL=postgresql://watcher@127.0.0.1:$PGPORT/outbox
STRANGER_URL=postgresql://stranger@127.0.0.1:$PGPORT/outbox
SQUAT_LINE="a session that is not a relay holds the lane group's locks"

json() { timeout 60 "$RELAY_BIN" status --json --database-url "$DATABASE_URL" | jq -r "$1"; }
sessions_are() { [ "$(json '.sessions | length')" = "$1" ]; }
each_owns_lanes() { [ "$(json '[.sessions[] | select(.lanes > 0)] | length')" = 2 ]; }
away_and_unowned() {
    [ "$(json "[.sessions[] | select(.pid == $A_PID and .kafka == \"away\" and .lanes == 0)]
               | length")" = 1 ] && [ "$(json '[.sessions[].lanes] | add')" -lt 64 ]
}

broker_down
COMMON=(--brokers "$BROKERS" --kafka reconnect.backoff.max.ms=500 --sessions 1 --min-sessions 1)
relay_start --database-url "$URL_B" "${COMMON[@]}" --delivery-timeout 600000 \
    --metrics-listen 127.0.0.1:0
B_RELAY=$RELAY_PID
B_LOG=$RELAY_LOG
metrics_wait
wait_for "relay B is a member" 15 sessions_are 1
relay_start --database-url "$URL_A" "${COMMON[@]}" --delivery-timeout 20000 --kafka-away-after 1
A_RELAY=$RELAY_PID
A_LOG=$RELAY_LOG
wait_for "relays A and B each own lanes" 20 each_owns_lanes
A_PID=$(json '.sessions[] | select(.user == "relay_a") | .pid')
[ -n "$A_PID" ] || fail "find relay A's member session"
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'away', 'a-' || g, 'changed', '{}' FROM generate_series(1, 500) AS g" ||
    fail "insert the rows"
wait_for "relay A goes away from Kafka, its lanes left to B, which waits for Kafka" 60 \
    away_and_unowned

timeout 60 "$RELAY_BIN" status --json --database-url "$WATCHER_URL" >"$T/status-watcher.json" \
    2>"$T/status-watcher.err"
check "status as a monitoring login: the lane squatters are listed" \
    jq -e '.lane_squatters | type == "array"' "$T/status-watcher.json"
check_eq "status as a monitoring login names no relay session" "" \
    "$(jq -r '.lane_squatters[] | "\(.pid) \(.what) \(.user)"' "$T/status-watcher.json")"
check "... while relay A still had no lanes and some lane no owner (after both looks)" \
    away_and_unowned
CHECK_FROM=$(date +%s)
timeout 60 "$RELAY_BIN" check --database-url "$WATCHER_URL" --brokers "$BROKERS" \
    --statement-timeout 5s >"$T/check-watcher.out" 2>&1
echo "# check took $(($(date +%s) - CHECK_FROM)) s"
check "check as a monitoring login: no session but relays holds the lane group's locks" grep -q \
    "^ok    lanes: no session but relays holds the lane group's locks" "$T/check-watcher.out"
check "check as a monitoring login suggests terminating no relay session" \
    lacks "$T/check-watcher.out" "pg_terminate_backend($A_PID)"
check "... while relay A still had no lanes and some lane no owner (after both looks)" \
    away_and_unowned
check "relay B's upkeep counts no squatter" metric_is outbox_lane_squatters 0
check "relay B's upkeep never named relay A's session" lacks "$B_LOG" "pid=$A_PID "

# The control: a stranger's slot without lanes, in the same state of the group, is named by
# status and by B's upkeep (whose looks therefore ran while A was away), though another session
# of the stranger holds a slot and a lane to pass for a relay (cb5cec4 excused the role then).
wait_for "relay A again away with no lanes, some lane unowned" 60 away_and_unowned
psql -XAtq "$STRANGER_URL" -c "SELECT count(pg_advisory_lock($MEMBER_NS, 901))" \
    -c "SELECT l FROM generate_series(0, 63) AS l WHERE pg_try_advisory_lock($LANE_NS, l) LIMIT 1" \
    -c "SELECT pg_sleep(60)" >"$T/like.out" 2>&1 &
LIKE=$!
_t_track "$LIKE"
_poll 10 eval '[ "$(sed -n 2p "$T/like.out")" != "" ]' || fail "the stranger passes for a relay"
psql -XAtq "$STRANGER_URL" -c "SELECT pg_backend_pid()" \
    -c "SELECT count(pg_advisory_lock($MEMBER_NS, 900))" -c "SELECT pg_sleep(60)" >"$T/squat.out" 2>&1 &
SQUATTER=$!
_t_track "$SQUATTER"
_poll 10 eval '[ "$(sed -n 2p "$T/squat.out")" != "" ]' || fail "the stranger holds a slot"
S_PID=$(head -n 1 "$T/squat.out")
check_eq "status as a monitoring login names the stranger's slot without lanes" \
    "$S_PID slot-without-lanes stranger" \
    "$(timeout 60 "$RELAY_BIN" status --json --database-url "$WATCHER_URL" |
        jq -r '.lane_squatters[] | "\(.pid) \(.what) \(.user)"')"
wait_for "relay B's upkeep names the stranger" 30 \
    grep -q "$SQUAT_LINE.*pid=$S_PID what=slot-without-lanes" "$B_LOG"
psql_q "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'stranger'" \
    >/dev/null
wait "$SQUATTER" "$LIKE" 2>/dev/null
check "relay B's upkeep never named relay A's session" lacks "$B_LOG" "pid=$A_PID "

broker_up
wait_for "every event is delivered once Kafka is back" 90 no_unsent_rows
RELAY_PID=$A_RELAY
relay_stop
check_eq "relay A exits 0" 0 "$?"
RELAY_PID=$B_RELAY
relay_stop 30
check_eq "relay B exits 0" 0 "$?"
check "relay A went away from Kafka" grep -q "kafka unreachable from this relay" "$A_LOG"
