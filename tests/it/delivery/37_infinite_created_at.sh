#!/bin/bash
# Proves that a row created at infinity or -infinity (a created_at the application wrote) is its
# own matter, not every row's: PostgreSQL 15 cannot subtract an infinite time from now().
#  1. the claims read each row's age for the latency metric: one such row failed every claim of
#     its session's lanes ("cannot subtract infinite timestamps"), so that nothing was sent; now
#     both rows and the 48 around them are sent, and no claim fails.
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
