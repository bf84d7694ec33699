#!/bin/bash
# Proves that `status` and `check`, run as another role than the relays' (an operator's, a
# monitoring login), never name a relay's own session as a lane squatter, and still name a
# stranger's: a relay whose Kafka timed out while another relay's did not yet (that one's batch
# waits for Kafka, here for its --delivery-timeout of 10 min) is away: it holds its member slot
# and gives its lanes to the relay that still counts as reaching Kafka, which takes them only
# between batches. Its session holds a slot and no lanes while those lanes stay unowned, at both
# of the commands' looks 2 s apart, for as long as its away backoff (2 x --delivery-timeout, the
# second half random): on the old code status --json listed it (what=slot-without-lanes, role
# postgres) and check told the operator to pg_terminate_backend it. A session of a role that may
# UPDATE the table, as a relay's may, is no squatter; a stranger's slot without lanes, in the
# same state of the group, is still named (status, its role; check, the statement).
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"
# The watcher reads every table (status's counts) but not other roles' sessions' details
# (no pg_read_all_stats): as a monitoring login would.
psql_q "CREATE ROLE watcher LOGIN; GRANT pg_read_all_data TO watcher" ||
    fail "create the watcher's role"
psql_q "CREATE ROLE stranger LOGIN" || fail "create the stranger's role"
WATCHER_URL=postgresql://watcher@127.0.0.1:$PGPORT/outbox
STRANGER_URL=postgresql://stranger@127.0.0.1:$PGPORT/outbox

# json FILTER: status --json as the relays' role (postgres), read with jq.
json() { timeout 60 "$RELAY_BIN" status --json --database-url "$DATABASE_URL" | jq -r "$1"; }
sessions_are() { [ "$(json '.sessions | length')" = "$1" ]; }
each_owns_lanes() { [ "$(json '[.sessions[] | select(.lanes > 0)] | length')" = 2 ]; }
# away_and_unowned: relay A's session is away with no lanes, and some lane has no owner.
away_and_unowned() {
    [ "$(json "[.sessions[] | select(.pid == $A_PID and .kafka == \"away\" and .lanes == 0)]
               | length")" = 1 ] && [ "$(json '[.sessions[].lanes] | add')" -lt 64 ]
}

broker_down
COMMON=(--database-url "$DATABASE_URL" --brokers "$BROKERS" --kafka reconnect.backoff.max.ms=500
    --sessions 1 --min-sessions 1)
relay_start "${COMMON[@]}" --delivery-timeout 600000
B_RELAY=$RELAY_PID
wait_for "relay B is a member" 15 sessions_are 1
relay_start "${COMMON[@]}" --delivery-timeout 10000 --kafka-away-after 1
A_RELAY=$RELAY_PID
A_LOG=$RELAY_LOG
wait_for "relays A and B each own lanes" 20 each_owns_lanes
# Relay A's member session: the one on a client port of A's process.
A_PORTS=$(ss -tnpH "dport = :$PGPORT" | grep -F "pid=$A_RELAY," |
    awk '{ sub(/.*:/, "", $4); print $4 }' | paste -sd, -)
A_PID=$(json ".sessions[] | select(.client_port as \$p | [$A_PORTS] | index(\$p)) | .pid")
[ -n "$A_PID" ] || fail "find relay A's member session"
# Rows in every lane (500 aggregates): both relays claim a batch, which waits for Kafka.
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'away', 'a-' || g, 'changed', '{}' FROM generate_series(1, 500) AS g" ||
    fail "insert the rows"
wait_for "relay A goes away from Kafka, its lanes left to B, which waits for Kafka" 60 \
    away_and_unowned

timeout 60 "$RELAY_BIN" status --json --database-url "$WATCHER_URL" >"$T/status-watcher.json" \
    2>"$T/status-watcher.err"
check "status as another role: the lane squatters are listed" \
    jq -e '.lane_squatters | type == "array"' "$T/status-watcher.json"
check_eq "status as another role names no relay session" "" \
    "$(jq -r '.lane_squatters[] | "\(.pid) \(.what) \(.user)"' "$T/status-watcher.json")"
check "... while relay A still had no lanes and some lane no owner (after both looks)" \
    away_and_unowned
timeout 60 "$RELAY_BIN" check --database-url "$WATCHER_URL" --brokers "$BROKERS" \
    >"$T/check-watcher.out" 2>&1
check "check as another role: no session but relays holds the lane group's locks" grep -q \
    "^ok    lanes: no session but relays holds the lane group's locks" "$T/check-watcher.out"
check "check as another role suggests terminating no relay session" \
    lacks "$T/check-watcher.out" "pg_terminate_backend($A_PID)"

# The control: a stranger's slot without lanes, in the same state of the group, is named.
wait_for "relay A again away with no lanes, some lane unowned" 60 away_and_unowned
psql -XAtq "$STRANGER_URL" -c "SELECT pg_backend_pid()" \
    -c "SELECT count(pg_advisory_lock($MEMBER_NS, 900))" -c "SELECT pg_sleep(60)" >"$T/squat.out" 2>&1 &
SQUATTER=$!
_t_track "$SQUATTER"
_poll 10 eval '[ "$(sed -n 2p "$T/squat.out")" != "" ]' || fail "the stranger holds a slot"
S_PID=$(head -n 1 "$T/squat.out")
check_eq "status as another role names the stranger's slot without lanes" \
    "$S_PID slot-without-lanes stranger" \
    "$(timeout 60 "$RELAY_BIN" status --json --database-url "$WATCHER_URL" |
        jq -r '.lane_squatters[] | "\(.pid) \(.what) \(.user)"')"
psql_q "SELECT pg_terminate_backend($S_PID)" >/dev/null
wait "$SQUATTER" 2>/dev/null

broker_up
wait_for "every event is delivered once Kafka is back" 90 no_unsent_rows
RELAY_PID=$A_RELAY
relay_stop
check_eq "relay A exits 0" 0 "$?"
RELAY_PID=$B_RELAY
relay_stop 30
check_eq "relay B exits 0" 0 "$?"
check "relay A went away from Kafka" grep -q "kafka unreachable from this relay" "$A_LOG"
