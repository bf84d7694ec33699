#!/bin/bash
# Proves W3C trace context crosses the relay: a row whose `headers` hold `traceparent` and
# `tracestate` is published with both as Kafka headers, byte for byte and once each, next to the
# relay's own id/event_type/aggregate_type; a dead-lettered row carries them to the dead-letter
# topic as well.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"

TP=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
TS=congo=t61rcWkgMzE
HEADERS="{\"traceparent\": \"$TP\", \"tracestate\": \"$TS\"}"
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
        VALUES ('order', 'o-1', 'order.created', '{\"n\": 1}', '$HEADERS'),
               ('bad topic!', 'p-1', 'order.created', '{\"n\": 2}', '$HEADERS')" ||
    fail "insert the rows"

relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --max-attempts 1 \
    --dead-letter-topic dlq
one_where() { [ "$(psql_q "SELECT count(*) FROM outbox WHERE $1")" = 1 ]; }
wait_for "the good row is sent" 30 one_where "sent_at IS NOT NULL"
wait_for "the poison row is dead-lettered to dlq" 30 one_where "dead_letter_topic = 'dlq'"
relay_stop
check_eq "relay exits 0" 0 $?

# same_bytes FILE NAME EXPECTED: header NAME of the message in FILE is exactly EXPECTED.
same_bytes() {
    cmp -s <(jq -j --arg n "$2" '.headers[$n]' "$1") <(printf '%s' "$3")
}
for topic in outbox.event.order dlq; do
    consume --topic "$topic" --to-end --timeout-ms 20000 >"$T/$topic.json" # all it holds
    check_eq "$topic: exactly one message (no duplicate)" 1 "$(grep -c '' "$T/$topic.json")"
    check "$topic: traceparent header, byte for byte" same_bytes "$T/$topic.json" traceparent "$TP"
    check "$topic: tracestate header, byte for byte" same_bytes "$T/$topic.json" tracestate "$TS"
    check_eq "$topic: each exactly once" "1 1" \
        "$(jq -r '[.header_list[][0]] | "\(map(select(. == "traceparent")) | length) \(map(select(. == "tracestate")) | length)"' "$T/$topic.json")"
done
check_eq "outbox.event.order: the relay's headers too" "id event_type aggregate_type" \
    "$(jq -r '[.header_list[][0]] | map(select(. == "id" or . == "event_type" or . == "aggregate_type")) | join(" ")' "$T/outbox.event.order.json")"
