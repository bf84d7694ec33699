#!/bin/bash
# Proves `producer-demo load`: it writes exactly --count events over --aggregates orders, each
# event's business row and outbox row together (the first event of an order creates it, later
# ones amend it), one aggregate's events in version order, with --connections writers in
# parallel; it reports what it wrote as one JSON line; the relay publishes all of it; bad input
# exits 2 and an unreachable database exits 1.
source "$(dirname "$0")/../../lib.sh"
source "$(dirname "$0")/../../demo_lib.sh"
demo_setup
pg_start
relay_migrate 2>"$T/migrate.log" || fail "outbox-relay migrate"

out=$("$PRODUCER_BIN" load --database-url "$DATABASE_URL" --count 300 --aggregates 20 \
    --connections 3 2>"$T/producer.load.log")
check_eq "load exits 0" 0 $?
check_eq "the report counts what was written" "300 20 280 0" \
    "$(jq -r '[.events, .created, .amended, .failed] | join(" ")' <<<"$out")"
check "the report has a duration and a rate" jq -e '.seconds >= 0 and .events_per_second > 0' \
    <<<"$out"
check_eq "20 orders" 20 "$(psql_q "SELECT count(*) FROM orders")"
check_eq "300 outbox rows: 20 OrderCreated, 280 OrderAmended" "OrderAmended=280 OrderCreated=20" \
    "$(psql_q "SELECT string_agg(event_type || '=' || n, ' ' ORDER BY event_type)
               FROM (SELECT event_type, count(*) n FROM outbox GROUP BY 1) s")"
check_eq "every outbox row belongs to an order" 0 \
    "$(psql_q "SELECT count(*) FROM outbox o LEFT JOIN orders r ON r.id::text = o.aggregate_id
               WHERE r.id IS NULL")"
check_eq "each order's events are versions 1..n in outbox id order" 0 \
    "$(psql_q "SELECT count(*) FROM (
                   SELECT aggregate_id, (payload->>'version')::int AS v,
                          row_number() OVER (PARTITION BY aggregate_id ORDER BY id) AS n
                   FROM outbox) s WHERE v <> n")"
check_eq "each order's version equals its number of events" 0 \
    "$(psql_q "SELECT count(*) FROM orders r
               WHERE version <> (SELECT count(*) FROM outbox WHERE aggregate_id = r.id::text)")"

out=$("$PRODUCER_BIN" load --database-url "$DATABASE_URL" --count 30 --rate 100 \
    --aggregates 30 2>>"$T/producer.load.log")
check_eq "a paced run (--rate 100) writes all its events" "30 30" \
    "$(jq -r '[.events, .created] | join(" ")' <<<"$out")"

broker_start 1
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS"
wait_for "the relay publishes all 330 events" 60 no_unsent_rows
relay_stop
check_eq "relay stops cleanly" 0 $?
consume --topic outbox.event.order --to-end --timeout-ms 20000 >"$T/order.json"
echo "# $(grep -c '' "$T/order.json") messages on outbox.event.order for 330 rows"
check "Kafka holds exactly the table's 330 events (ids compared)" \
    diff <(jq -r .headers.id "$T/order.json" | sort -u) <(psql_q "SELECT event_id FROM outbox" | sort)
check_eq "the table has the 330 events" 330 "$(psql_q "SELECT count(*) FROM outbox")"

usage() {
    local desc=$1 err rc
    shift
    err=$("$PRODUCER_BIN" load "$@" 2>&1 >/dev/null)
    rc=$?
    check_eq "$desc: exit 2 with one line" "2 1" "$rc $(printf '%s\n' "$err" | wc -l)"
}
usage "--aggregates 0" --database-url "$DATABASE_URL" --aggregates 0
usage "--rate -1" --database-url "$DATABASE_URL" --rate -1
usage "--connections 65" --database-url "$DATABASE_URL" --connections 65
usage "--count abc" --database-url "$DATABASE_URL" --count abc
"$PRODUCER_BIN" load --database-url "postgresql://postgres@127.0.0.1:1/outbox" --count 1 \
    >/dev/null 2>"$T/producer.unreachable.log"
check_eq "an unreachable database: exit 1" 1 $?
