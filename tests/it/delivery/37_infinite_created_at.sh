#!/bin/bash
# Proves that a row created at infinity or -infinity (a created_at the application wrote) is its
# own matter, not every row's: PostgreSQL 15 cannot subtract an infinite time from now().
#  1. the claims read each row's age for the latency metric: one such row failed every claim of
#     its session's lanes ("cannot subtract infinite timestamps"), so that nothing was sent; now
#     both rows and the 48 around them are sent, and no claim fails;
#  2. the backlog count (status, the backlog gauges) read the oldest unsent row's age: a row
#     created at -infinity failed it (status exit 1, the gauges stood still); now it is counted,
#     its age left out (status --json: oldest_unsent_age_seconds null while it is the only one).
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"

psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at)
        VALUES ('inf', 'a-1', 'changed', '{}', 'infinity'),
               ('inf', 'a-2', 'changed', '{}', '-infinity')" || fail "insert infinite times"
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'inf', 'a-' || g, 'changed', '{}' FROM generate_series(3, 50) g" ||
    fail "insert rows"

# --- 1. ---
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS"
wait_for "1: every row is sent, the two created at infinite times among them" 30 no_unsent_rows
relay_stop
check_eq "1: relay exits 0" 0 $?
check "1: no claim failed" lacks "$RELAY_LOG" 'claiming rows failed'
consume --topic outbox.event.inf --to-end --timeout-ms 20000 >"$T/inf.out"
check_eq "1: 50 distinct events on the topic" 50 \
    "$(jq -r '.headers.id' "$T/inf.out" | sort -u | wc -l)"

# --- 2. ---
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at)
        VALUES ('inf', 'b-1', 'changed', '{}', '-infinity')" || fail "insert a row at -infinity"
"$RELAY_BIN" status --database-url "$DATABASE_URL" >"$T/status.out" 2>&1
check_eq "2: status exits 0 with a row created at -infinity unsent" 0 $?
check "2: ...counting it" grep -q '^backlog: *1 unsent events' "$T/status.out"
"$RELAY_BIN" status --json --database-url "$DATABASE_URL" >"$T/status.json" 2>&1
check_eq "2: status --json: backlog 1, its age left out (null)" "1 null" \
    "$(jq -r '"\(.backlog) \(.oldest_unsent_age_seconds)"' "$T/status.json")"
