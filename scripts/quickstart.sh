#!/bin/bash
# `make quickstart`: the relay end to end on an embedded default. Starts a throwaway PostgreSQL
# and the project's Kafka-protocol broker, applies the migrations, inserts sample events the way
# an application would, runs the relay, reads the events back from Kafka with a real consumer and
# shows them, then stops everything. Exits non-zero if any step fails.
RELAY_BIN=${RELAY_BIN:-$(cd "$(dirname "$0")/.." && pwd)/bin/outbox-relay}
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../tests/lib.sh"

step() { printf '\n== %s\n' "$*"; }

t_setup
step "1. a throwaway PostgreSQL"
pg_start
echo "   $DATABASE_URL"

step "2. the project's Kafka-protocol broker (librdkafka's mock cluster on loopback)"
broker_start 1
echo "   bootstrap servers: $BROKERS"

step "3. outbox-relay migrate"
relay_migrate || fail "migrate"

SQL="BEGIN;
-- your business change would go here, in the same transaction
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers) VALUES
  ('order', 'o-1001', 'OrderCreated',   '{\"id\": \"o-1001\", \"amount_cents\": 4200}', '{\"traceparent\": \"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\"}'),
  ('order', 'o-1002', 'OrderCreated',   '{\"id\": \"o-1002\", \"amount_cents\": 1999}', NULL),
  ('order', 'o-1001', 'OrderPaid',      '{\"id\": \"o-1001\", \"paid\": true}', NULL),
  ('customer', 'c-7', 'CustomerUpdated', '{\"id\": \"c-7\", \"tier\": \"gold\"}', NULL);
COMMIT;"
step "4. an application writes its events (the whole integration is this INSERT)"
echo "$SQL" | sed 's/^/   /'
psql -XAtq -v ON_ERROR_STOP=1 -c "$SQL" >/dev/null || fail "insert sample events"
psql_q "SELECT count(*) || ' rows waiting' FROM outbox WHERE sent_at IS NULL" | sed 's/^/   /'

step "5. outbox-relay run"
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS"
wait_for "every row acknowledged by Kafka and marked sent" 30 no_unsent_rows

step "6. read back from Kafka with a real consumer"
consume --topic outbox.event.order --topic outbox.event.customer --count 4 --timeout-ms 15000 \
    >"$T/events.json" || fail "consume the 4 events"
jq -r '"   \(.topic) key=\(.key) id=\(.headers.id[0:8])… event_type=\(.headers.event_type)"
       + (if .headers.traceparent then " traceparent=…" else "" end) + "  \(.value)"' \
    "$T/events.json"
check_eq "4 events read back" 4 "$(grep -c '' "$T/events.json")"

step "7. the outbox afterwards"
psql -X -c "SELECT id, aggregate_type, aggregate_id, event_type, attempts,
                   to_char(sent_at, 'HH24:MI:SS.MS') AS sent_at FROM outbox ORDER BY id" |
    sed 's/^/   /'

step "8. SIGTERM: graceful shutdown"
relay_stop
check_eq "relay exits 0" 0 "$?"
echo "   relay log:"
sed 's/^/   /' "$RELAY_LOG"
echo
echo "quickstart: events inserted in one transaction, published, read back and marked sent."
