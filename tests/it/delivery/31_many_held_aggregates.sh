#!/bin/bash
# Proves a relay whose claims find 120,000 aggregates held back by failed rows (as a long topic
# outage leaves them) still delivers the rows of other aggregates. The claim builds the held-back
# aggregates into one jsonb value once (statements.c SQL_BLOCKED); built as an object of objects,
# {type: {id: first held seq}}, PostgreSQL 15's jsonb_object_agg took time quadratic in the ids of
# one type (it copies each key of a jsonb value it is given with a snprintf("%s") that reads on
# past the following keys): about 23 s a claim with 100,000 ids of 64 bytes, beyond the
# --session-timeout (15 s) that bounds every round trip, so every claim was given up and nothing
# was delivered. One level, {type-and-id: seq}, grows with the ids (under a second here).
# Bounded waits only: the claim's time is not measured.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"

HELD=120000
# One failed row per aggregate, each waiting a day for its retry: every aggregate is held back.
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'order', md5(g::text) || md5((g + 1)::text), 'order.updated', '{}'
        FROM generate_series(1, $HELD) AS g ORDER BY g" || fail "insert the rows"
psql_q "UPDATE outbox SET attempts = 1, next_attempt_at = now() + interval '1 day'" ||
    fail "fail the rows"
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        VALUES ('order', 'other', 'order.created', '{}')" || fail "insert the other row"
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --sessions 1
other_sent() {
    [ "$(psql_q "SELECT count(*) FROM outbox WHERE aggregate_id = 'other'
                 AND sent_at IS NOT NULL")" = 1 ]
}
wait_for "the row of another aggregate is delivered with $HELD aggregates held back" 90 other_sent
check_eq "the held rows stay unsent" "$HELD" "$(unsent_rows)"
relay_stop
check_eq "the relay exits 0" 0 "$?"
