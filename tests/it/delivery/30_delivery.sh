#!/bin/bash
# Proves end-to-end delivery with a real PostgreSQL, the mock Kafka cluster and a real consumer:
# 20,000 rows over 500 aggregates, inserted before the relay starts, all arrive exactly as stored
# (key = aggregate_id, value = payload's jsonb text, `id` header = event_id, all distinct), in
# order per aggregate, and every row gets sent_at; the relay exits 0 on SIGTERM; its log lines
# have the documented format and never show the database password. Then, for one row, the topic
# template with {event_type} and every header (id, event_type, aggregate_type, the row's own).
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 3
relay_migrate 2>"$T/migrate.log" || fail "migrate"

ROWS=20000
AGGS=500
# seq grows with id within each aggregate, so Kafka order per key must follow seq.
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'order', 'order-' || (g % $AGGS), 'order.updated',
               jsonb_build_object('aggregate', 'order-' || (g % $AGGS), 'seq', g / $AGGS)
        FROM generate_series(0, $ROWS - 1) AS g ORDER BY g"
check_eq "$ROWS rows waiting" "$ROWS" "$(unsent_rows)"

# The password URL: the row data must flow, and the password must never reach the log.
relay_start --database-url "$DATABASE_URL_PW" --brokers "$BROKERS"
wait_for "every row gets sent_at" 120 no_unsent_rows
check "relay still running after delivering" relay_running

consume --topic outbox.event.order --to-end --timeout-ms 60000 >"$T/order.json"
check_eq "consumer reads $ROWS messages" "$ROWS" "$(grep -c '' "$T/order.json")"
check_eq "all id headers distinct" "$ROWS" \
    "$(jq -r '.headers.id' "$T/order.json" | sort -u | grep -c .)"

# Every message is exactly one row: (event_id, aggregate_id, payload text) on both sides.
psql_q "SELECT event_id, aggregate_id, payload::text FROM outbox" -F $'\t' | sort >"$T/rows.tsv"
jq -r '[.headers.id, .key, .value] | @tsv' "$T/order.json" | sort >"$T/msgs.tsv"
check "every message matches its row: id header, key = aggregate_id, value = payload" \
    diff -q "$T/rows.tsv" "$T/msgs.tsv"
check_eq "event_type and aggregate_type headers" "order.updated order" \
    "$(jq -r '"\(.headers.event_type) \(.headers.aggregate_type)"' "$T/order.json" | sort -u)"

# In consumed order (per partition), each key stays on one partition and its seq only grows.
order_check() {
    jq -r '[.key, .partition, (.value | fromjson | .seq)] | @tsv' "$T/order.json" | awk -F '\t' '
        ($1 in part) && part[$1] != $2 { print "key " $1 " on partitions " part[$1] " and " $2; bad++ }
        ($1 in seq) && $3 <= seq[$1] { print "key " $1 ": seq " $3 " after " seq[$1]; bad++ }
        { part[$1] = $2; seq[$1] = $3; n[$1]++ }
        END { for (k in n) keys++; if (keys != '"$AGGS"') { print keys " keys"; bad++ }; exit bad > 0 }'
}
check "per-aggregate order: one partition per key, seq strictly increasing" order_check

relay_stop
check_eq "SIGTERM: relay exits 0" 0 $?
check "log never shows the database password" lacks "$RELAY_LOG" "$PG_PASSWORD"
log_format() {
    local re='^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z level=(debug|info|warn|error) msg="[^"]*"( [a-z_]+=.*)?$'
    [ -s "$RELAY_LOG" ] && ! grep -vE "$re" "$RELAY_LOG"
}
check "every log line: timestamp level=... msg=\"...\" key=value..." log_format

# --- one row in detail: topic template with {event_type}, headers, payload text ---
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
        VALUES ('invoice', 'inv-42', 'invoice.paid',
                '{\"amount\": 12.5, \"currency\": \"EUR\", \"lines\": [{\"sku\": \"a\"}], \"note\": \"ünïcode \\\"q\\\"\"}',
                '{\"traceparent\": \"00-abc\", \"x\": \"y\"}')"
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" \
    --order-scope topic --topic-template 'events.{aggregate_type}.{event_type}'
wait_for "detail row gets sent_at" 60 no_unsent_rows
# --to-end reads everything the topic holds, so a duplicate would show as a second message.
consume --topic events.invoice.invoice.paid --to-end --timeout-ms 20000 >"$T/detail.json"
check_eq "exactly one message on events.invoice.invoice.paid (no duplicate)" 1 "$(grep -c '' "$T/detail.json")"
msg=$(head -n 1 "$T/detail.json")
check_eq "key is aggregate_id" inv-42 "$(jq -r .key <<<"$msg")"
check_eq "value is the payload's jsonb text" \
    "$(psql_q "SELECT payload::text FROM outbox WHERE aggregate_id = 'inv-42'")" \
    "$(jq -r .value <<<"$msg")"
check_eq "headers: id, event_type, aggregate_type, then the row's own" \
    "$(psql_q "SELECT event_id FROM outbox WHERE aggregate_id = 'inv-42'") invoice.paid invoice 00-abc y" \
    "$(jq -r '.headers | "\(.id) \(.event_type) \(.aggregate_type) \(.traceparent) \(.x)"' <<<"$msg")"
check_eq "no other or repeated headers" "aggregate_type event_type id traceparent x" \
    "$(jq -r '[.header_list[][0]] | sort | join(" ")' <<<"$msg")"
relay_stop
check_eq "second relay exits 0 on SIGTERM" 0 $?
check_eq "nothing else was published to the default topic" "$ROWS" \
    "$(consume --topic outbox.event.order --to-end --timeout-ms 20000 | grep -c '')"
