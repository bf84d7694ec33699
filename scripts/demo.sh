#!/usr/bin/env bash
# make demo: the whole chain on throwaway infrastructure, printing what happens at each step.
#
#   producer-demo (HTTP API) --tx--> orders + outbox --outbox-relay--> Kafka --consumer-demo--> shipments
#
# Starts a PostgreSQL cluster (initdb in a temp dir, as the postgres user when run as root) and
# the project's mock Kafka broker, runs the three programs, sends orders through the API (a
# retried request and a key reused with another body among them), lets the relay publish and
# the consumer apply them, PATCHes an order (and shows a stale If-Match refused), replays a few
# events as a crashed relay would, and ends with a final check: orders = shipments, outbox events =
# processed events, every shipment at its order's version. Redis runs as both demos' fast path. Everything it started is stopped on every exit
# path. KEEP_TMP=1 keeps the temp dir with the logs.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$ROOT/bin}
MOCK_BROKER=${MOCK_BROKER:-$BIN/mock-broker}
PGBIN=${PGBIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}
PATH=$PGBIN:$PATH
WAIT_S=${WAIT_S:-60}

W=$(mktemp -d "${TMPDIR:-/tmp}/outbox-demo.XXXXXX")
chmod 755 "$W"
PIDS=()
PG_STARTED=0

as_pg() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

cleanup() {
    local rc=$? i t pid
    trap - EXIT INT TERM
    # Newest first: the programs stop before the broker they talk to. Each gets 30 s (the relay's
    # own shutdown bound is 40 s at most, well under that on a demo's few rows), then SIGKILL: a
    # cleanup never waits without a bound.
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
        pid=${PIDS[$i]}
        kill -TERM "$pid" 2>/dev/null || true
        for ((t = 0; t < 300; t++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    [ "$PG_STARTED" = 1 ] && as_pg pg_ctl -D "$W/pg" -m fast -w stop >/dev/null 2>&1
    if [ "$rc" -ne 0 ]; then
        for f in "$W"/*.log; do
            [ -f "$f" ] && { echo "--- last lines of $(basename "$f")"; tail -n 15 "$f"; }
        done
    fi
    if [ "${KEEP_TMP:-0}" = 1 ]; then echo "(kept $W)"; else rm -rf "$W"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Bold, red and green on a terminal; plain text in logs.
if [ -t 1 ]; then
    BOLD=$'\033[1m' RED=$'\033[1;31m' GREEN=$'\033[1;32m' OFF=$'\033[0m'
else
    BOLD='' RED='' GREEN='' OFF=''
fi
step() { printf '\n%s== %s%s\n' "$BOLD" "$*" "$OFF"; }
say() { printf '   %s\n' "$*"; }
die() {
    printf '\n%sdemo failed: %s%s\n' "$RED" "$*" "$OFF"
    exit 1
}

# wait_until DESCRIPTION CMD...: polls CMD every 0.2 s for up to WAIT_S seconds.
wait_until() {
    local desc=$1 deadline=$((SECONDS + WAIT_S))
    shift
    until "$@" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$deadline" ] || die "$desc: not true after ${WAIT_S}s"
        sleep 0.2
    done
}

# shellcheck source=scripts/free_port.sh
source "$ROOT/scripts/free_port.sh"

sql() { psql -XAtq -v ON_ERROR_STOP=1 -d "$DATABASE_URL" -c "$1"; }
# sql_is SQL VALUE: true when the query returns VALUE (for wait_until, which re-runs it).
sql_is() { [ "$(sql "$1")" = "$2" ]; }

for b in outbox-relay producer-demo consumer-demo; do
    [ -x "$BIN/$b" ] || die "$BIN/$b is missing: run 'make' first"
done
[ -x "$MOCK_BROKER" ] || die "$MOCK_BROKER is missing: run 'make tools' first"
for tool in curl initdb pg_ctl psql redis-server redis-cli; do
    command -v "$tool" >/dev/null || die "$tool is missing: run 'make deps'"
done

step "1. Throwaway PostgreSQL and the project's Kafka broker"
mkdir -p "$W/pg" "$W/pgsock"
[ "$(id -u)" = 0 ] && chown postgres: "$W/pg" "$W/pgsock"
as_pg initdb -D "$W/pg" -U postgres -A trust -E UTF8 --locale=C --no-sync >"$W/initdb.log" 2>&1 ||
    die "initdb failed (see $W/initdb.log)"
PGPORT=$(free_port) || die "no free port for PostgreSQL"
cat >>"$W/pg/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $PGPORT
unix_socket_directories = '$W/pgsock'
fsync = off
EOF
touch "$W/postgres.log"
[ "$(id -u)" = 0 ] && chown postgres: "$W/postgres.log"
as_pg pg_ctl -D "$W/pg" -l "$W/postgres.log" -w -t 30 start >/dev/null || die "pg_ctl start failed"
PG_STARTED=1
export DATABASE_URL=postgresql://postgres@127.0.0.1:$PGPORT/postgres
sql "CREATE DATABASE orders" >/dev/null
export DATABASE_URL=postgresql://postgres@127.0.0.1:$PGPORT/orders
say "PostgreSQL $(sql 'SHOW server_version') on 127.0.0.1:$PGPORT, database 'orders'"

mkfifo "$W/broker.ctl"
"$MOCK_BROKER" --brokers 1 --control "$W/broker.ctl" >"$W/broker.out" 2>"$W/broker.log" &
PIDS+=($!)
wait_until "the broker prints its address" test -s "$W/broker.out"
BROKERS=$(head -n 1 "$W/broker.out")
say "mock Kafka cluster (librdkafka's mock, real protocol) at $BROKERS"

# Redis: the optional fast path of both demos (never the source of truth), no persistence.
REDIS_PORT=$(free_port) || die "no free port for Redis"
mkdir -p "$W/redis"
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$W/redis" \
    --logfile "$W/redis.log" >/dev/null 2>&1 &
PIDS+=($!)
wait_until "Redis answers" redis-cli -p "$REDIS_PORT" PING
REDIS_URL=redis://127.0.0.1:$REDIS_PORT
say "Redis $(redis-cli -p "$REDIS_PORT" INFO server | sed -n 's/^redis_version:\(.*\)\r$/\1/p') at $REDIS_URL (cache in front of PostgreSQL)"

step "2. Schemas: the relay's outbox, then each demo's own tables"
"$BIN/outbox-relay" migrate --database-url "$DATABASE_URL" 2>"$W/migrate.log"
"$BIN/producer-demo" migrate --database-url "$DATABASE_URL" 2>>"$W/migrate.log"
"$BIN/consumer-demo" migrate --database-url "$DATABASE_URL" 2>>"$W/migrate.log"
say "tables: $(sql "SELECT string_agg(tablename, ', ' ORDER BY tablename) FROM pg_tables
                    WHERE schemaname = 'public'")"

step "3. Start producer-demo (API), outbox-relay and consumer-demo"
"$BIN/producer-demo" serve --database-url "$DATABASE_URL" --listen 127.0.0.1:0 \
    --redis-url "$REDIS_URL" 2>"$W/producer.log" &
PIDS+=($!)
wait_until "producer-demo listens" grep -q 'msg="producer-demo listening"' "$W/producer.log"
API=http://127.0.0.1:$(grep -o 'msg="producer-demo listening".* port=[0-9]*' "$W/producer.log" |
    grep -o '[0-9]*$')
say "producer-demo serving $API"
"$BIN/outbox-relay" run --database-url "$DATABASE_URL" --brokers "$BROKERS" 2>"$W/relay.log" &
PIDS+=($!)
say "outbox-relay publishing outbox rows to topic outbox.event.order"
"$BIN/consumer-demo" --database-url "$DATABASE_URL" --brokers "$BROKERS" \
    --topic outbox.event.order --group shipping --stats-interval 1 --redis-url "$REDIS_URL" \
    2>"$W/consumer.log" &
CONSUMER_PID=$!
PIDS+=("$CONSUMER_PID")
say "consumer-demo in group 'shipping', creating one shipment per order (both demos on Redis too)"

# post NAME KEY BODY: POST /orders, prints status, the replay header and the body.
post() {
    local name=$1 key=$2 body=$3 hdr=()
    [ -n "$key" ] && hdr=(-H "Idempotency-Key: $key")
    curl -sS --max-time 10 -o "$W/$name.body" -D "$W/$name.headers" -X POST "$API/orders" \
        -H 'Content-Type: application/json' "${hdr[@]}" -d "$body" >/dev/null
    local status replayed
    status=$(head -n 1 "$W/$name.headers" | cut -d' ' -f2)
    replayed=$(grep -i '^Idempotency-Replayed:' "$W/$name.headers" | tr -d '\r' | cut -d' ' -f2 ||
        true)
    say "POST /orders key=${key:-(none)} $body"
    say "  -> $status${replayed:+ (Idempotency-Replayed: $replayed)} $(cat "$W/$name.body")"
    echo "$status" >"$W/$name.status"
}
expect_status() {
    [ "$(cat "$W/$1.status")" = "$2" ] || die "$1: expected HTTP $2, got $(cat "$W/$1.status")"
}

step "4. Orders through the API"
post first demo-order-1 '{"customer_id": "c-7", "amount_cents": 4200, "currency": "EUR"}'
expect_status first 201
say "(the client never saw that answer and retries with the same key and body:)"
post retry demo-order-1 '{"customer_id": "c-7", "amount_cents": 4200, "currency": "EUR"}'
expect_status retry 201
cmp -s "$W/first.body" "$W/retry.body" || die "the replayed body differs from the original"
grep -qi '^Idempotency-Replayed: true' "$W/retry.headers" || die "replay not marked"
say "  same status, byte-identical body, nothing written a second time"
grep -q 'status=201 replayed=true redis=hit' "$W/producer.log" ||
    die "the retry was not served from Redis"
say "  served from Redis (producer log: redis=hit): the response was cached after its commit,"
say "  fingerprint checked, no PostgreSQL round trip"
say "(the same key reused for a different order:)"
post reuse demo-order-1 '{"customer_id": "c-7", "amount_cents": 9900, "currency": "EUR"}'
expect_status reuse 422
say "(no key, and a bad body:)"
post nokey "" '{"customer_id": "c-8", "amount_cents": 100, "currency": "USD"}'
expect_status nokey 400
post badbody demo-order-2 '{"customer_id": "c-8", "amount_cents": 0, "currency": "USD"}'
expect_status badbody 422
post second demo-order-3 '{"customer_id": "c-8", "amount_cents": 1999, "currency": "USD"}'
expect_status second 201
post third demo-order-4 '{"customer_id": "c-9", "amount_cents": 350, "currency": "GBP"}'
expect_status third 201
id=$(grep -o '"id":"[^"]*"' "$W/first.body" | cut -d'"' -f4)
say "GET /orders/$id -> $(curl -sS --max-time 10 -w ' (%{http_code})' "$API/orders/$id")"
say "orders: $(sql 'SELECT count(*) FROM orders'), outbox rows: $(sql 'SELECT count(*) FROM outbox')"

step "4b. Versioned update: PATCH with If-Match (optimistic locking)"
etag=$(curl -sS --max-time 10 -o /dev/null -D - "$API/orders/$id" | grep -i '^ETag:' | tr -d '\r' | cut -d' ' -f2)
say "GET /orders/$id -> ETag: $etag"
patch() {
    local name=$1 match=$2 body=$3
    curl -sS --max-time 10 -o "$W/$name.body" -D "$W/$name.headers" -X PATCH "$API/orders/$id" \
        -H "If-Match: $match" -d "$body" >/dev/null
    head -n 1 "$W/$name.headers" | cut -d' ' -f2 >"$W/$name.status"
    say "PATCH If-Match: $match $body"
    say "  -> $(cat "$W/$name.status") ETag: $(grep -i '^ETag:' "$W/$name.headers" | tr -d '\r' |
        cut -d' ' -f2) $(cat "$W/$name.body")"
}
patch patch1 "$etag" '{"amount_cents": 4500, "status": "confirmed"}'
expect_status patch1 200
say "(a second client still holding the old ETag tries its own change:)"
patch stale "$etag" '{"amount_cents": 1}'
expect_status stale 412
say "  412 Precondition Failed with the current ETag: the stale update changed nothing"
say "order row: $(sql "SELECT amount_cents || ' ' || status || ' version ' || version FROM orders
                        WHERE id = '$id'"), outbox: OrderCreated + OrderUpdated"

step "5. A burst from the load generator (real transactions: order row + outbox row each)"
"$BIN/producer-demo" load --database-url "$DATABASE_URL" --count 50 --aggregates 50 \
    --rate 500 2>>"$W/load.log" | sed 's/^/   load: /'

ORDERS=$(sql 'SELECT count(*) FROM orders')
step "6. The relay publishes, the consumer applies"
wait_until "the relay publishes every outbox row" \
    sql_is 'SELECT count(*) FROM outbox WHERE sent_at IS NULL' 0
say "outbox: $(sql 'SELECT count(*) FROM outbox WHERE sent_at IS NOT NULL') of $(sql 'SELECT count(*) FROM outbox') rows acknowledged by Kafka"
wait_until "the consumer ships every order" sql_is 'SELECT count(*) FROM shipments' "$ORDERS"
say "shipments: $(sql 'SELECT count(*) FROM shipments') for $ORDERS orders"
wait_until "the consumer applies the update" \
    sql_is "SELECT order_version FROM shipments WHERE order_id = '$id'" 2
say "the patched order's shipment: $(sql "SELECT 'version ' || order_version || ', amount ' ||
    amount_cents || ', order ' || order_status FROM shipments WHERE order_id = '$id'")"
say "  (OrderUpdated applied because version 2 is newer than the 1 it held)"

step "7. At least once: the relay sends 5 events again (as after a crash before its commit)"
sql "UPDATE outbox SET sent_at = NULL WHERE id IN (SELECT id FROM outbox ORDER BY id LIMIT 5)"
wait_until "the relay re-publishes them" \
    sql_is 'SELECT count(*) FROM outbox WHERE sent_at IS NULL' 0
wait_until "the consumer sees the duplicates" \
    grep -Eq 'msg="consumer progress".* duplicates=([5-9]|[1-9][0-9])' "$W/consumer.log"
say "consumer: $(grep 'msg="consumer progress"' "$W/consumer.log" | tail -n 1 | sed 's/.*progress" //')"
say "shipments still $(sql 'SELECT count(*) FROM shipments'): the processed_events dedupe absorbed them"
say "  (redis_hits: duplicates skipped on Redis's word, without a transaction: ids are written there"
say "  only after their transaction committed)"

step "8. Final check"
kill -0 "$CONSUMER_PID" 2>/dev/null || die "consumer-demo is not running"
OUTBOX=$(sql 'SELECT count(*) FROM outbox')
SHIPMENTS=$(sql 'SELECT count(*) FROM shipments')
PROCESSED=$(sql 'SELECT count(*) FROM processed_events')
KEYS=$(sql 'SELECT count(*) FROM idempotency_keys')
say "orders           $ORDERS"
say "outbox events    $OUTBOX"
say "shipments        $SHIPMENTS"
say "processed events $PROCESSED"
say "idempotency keys $KEYS (one per accepted key)"
CURRENT=$(sql "SELECT count(*) FROM shipments s JOIN orders o ON o.id::text = s.order_id
               WHERE s.order_version = o.version AND s.amount_cents = o.amount_cents")
say "shipments at their order's current version: $CURRENT"
if [ "$ORDERS" = "$SHIPMENTS" ] && [ "$OUTBOX" = "$PROCESSED" ] && [ "$CURRENT" = "$ORDERS" ]; then
    printf '\n%sFINAL CHECK PASSED: orders = shipments = %s, outbox events = processed events = %s, every shipment at its order'"'"'s version%s\n' \
        "$GREEN" "$ORDERS" "$OUTBOX" "$OFF"
else
    die "FINAL CHECK FAILED: orders=$ORDERS outbox=$OUTBOX shipments=$SHIPMENTS processed=$PROCESSED current=$CURRENT"
fi
