#!/bin/bash
# Proves --on-sent delete: a delivered row is deleted, never before Kafka acknowledged it (nothing
# goes while the brokers are down), every event still arrives exactly as stored and in order per
# aggregate, and a row that is not delivered (here one dead-lettered at once, then published to
# the dead-letter topic) stays. Then
# `status --on-sent delete` says it cannot count throughput rather than printing 0.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 3
relay_migrate 2>"$T/migrate.log" || fail "migrate"

ROWS=3000
AGGS=30
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'order', 'order-' || (g % $AGGS), 'order.updated', jsonb_build_object('seq', g)
        FROM generate_series(0, $ROWS - 1) AS g ORDER BY g"
# An aggregate type that makes an illegal topic name: rejected before Kafka, dead at once.
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        VALUES ('bad type!', 'x-1', 'x.created', '{\"seq\": 0}')"
# The rows will be gone: keep what Kafka must receive.
psql_q "CREATE TABLE expected AS SELECT event_id, aggregate_id, payload::text AS payload
        FROM outbox WHERE aggregate_type = 'order'"
rows() { psql_q "SELECT count(*) FROM outbox"; }
no_order_rows() { [ "$(psql_q "SELECT count(*) FROM outbox WHERE aggregate_type = 'order'")" = 0 ]; }

broker_down
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --on-sent delete \
    --max-attempts 1 --dead-letter-topic dlq --log-level debug
wait_for "the relay claims rows while Kafka is down" 30 grep -q 'msg="claimed batch"' "$RELAY_LOG"
sleep 2
check "relay keeps running while Kafka is down" relay_running
check_eq "no row deleted while Kafka is down" "$((ROWS + 1))" "$(rows)"
check_eq "no row marked either" 0 "$(psql_q "SELECT count(*) FROM outbox WHERE sent_at IS NOT NULL")"
broker_up
wait_for "every delivered row is deleted once Kafka is up" 60 no_order_rows
dead_row() { psql_q "SELECT aggregate_type, dead_at IS NOT NULL, sent_at IS NULL, dead_letter_topic
                     FROM outbox"; }
dead_lettered() { [ "$(dead_row)" = "bad type!|t|t|dlq" ]; }
wait_for "the dead row stays, published to the dead-letter topic and unsent" 30 dead_lettered
check_eq "the dead-letter topic holds it once" 1 \
    "$(consume --topic dlq --to-end --timeout-ms 20000 | grep -c '')"

consume --topic outbox.event.order --to-end --timeout-ms 30000 >"$T/order.json"
psql_q "SELECT event_id, aggregate_id, payload FROM expected" -F $'\t' | sort >"$T/rows.tsv"
jq -r '[.headers.id, .key, .value] | @tsv' "$T/order.json" | sort -u >"$T/msgs.tsv"
check "every deleted row arrived as stored: id header, key, value" \
    diff -q "$T/rows.tsv" "$T/msgs.tsv"
check "first copies in order per aggregate" first_copies_in_order "$T/order.json"
check "the log names no failure of the deletes" lacks "$RELAY_LOG" "marking rows failed"

status() { "$RELAY_BIN" status --database-url "$DATABASE_URL" "$@"; }
check "status --on-sent delete: throughput not counted" \
    grep -q '^throughput: *- (--on-sent delete' <<<"$(status --on-sent delete)"
check_eq "status --json --on-sent delete: throughput null" "null null" \
    "$(status --json --on-sent delete | jq -r '"\(.sent_last_minute) \(.throughput_per_second)"')"
check_eq "status --json (mark): throughput counted (0: the sent rows are gone)" 0 \
    "$(status --json | jq -r .sent_last_minute)"

relay_stop
check_eq "SIGTERM: relay exits 0" 0 $?
