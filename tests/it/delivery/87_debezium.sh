#!/bin/bash
# Proves the relay serves an existing Debezium-layout outbox table, configured with Debezium's
# own option names, and publishes what Debezium's Outbox Event Router documents:
#   topic   outbox.event.<aggregatetype>     (route.topic.replacement outbox.event.${routedByValue})
#   key     aggregateid                      (table.field.event.key)
#   value   payload                          (table.field.event.payload)
#   headers id = the row's id (uuid), plus the columns of table.fields.additional.placement
#           (type:header:eventType), and nothing of the relay's own
#  1. `migrate` adopts the table (twice: idempotent) — the application's INSERTs, which name only
#     Debezium's columns, keep working, and rows inserted before and after are all sent;
#  2. every message matches its row, per aggregate in insert order;
#  3. status and dead work on the adopted table;
#  4. names needing quotes (a schema, a table and columns with spaces, capitals and a double
#     quote) work through flags: identifiers are quoted, never pasted; the headers go out in
#     Debezium's order: id, then the placed ones in the order given;
#  5. bad mappings fail cleanly: an unknown placement, a reserved header name and a
#     non-integer order column, each with one line;
#  6. with the Debezium layout each key lands in the partition Kafka's Java producer, Kafka
#     Connect's and so Debezium's, gives it (tests/tools/java_partition.py): the layout's
#     default partitioner is murmur2 (docs/debezium.md, "Partitions"); with --kafka
#     partitioner=consistent, the relay layout's default, some keys land elsewhere.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1

# Debezium's documented outbox table, under Debezium's usual name.
psql_q "CREATE TABLE outbox (
            id uuid NOT NULL PRIMARY KEY,
            aggregatetype varchar(255) NOT NULL,
            aggregateid varchar(255) NOT NULL,
            type varchar(255) NOT NULL,
            payload jsonb)" || fail "create the Debezium table"
# insert_events FROM TO: the application's own INSERT, Debezium columns only; 3 aggregates.
insert_events() {
    psql_q "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
            SELECT gen_random_uuid(), 'order', 'o-' || (g % 3), 'OrderCreated',
                   jsonb_build_object('seq', g, 'note', 'caf' || chr(233))
            FROM generate_series($1, $2) AS g"
}
insert_events 1 20 || fail "insert rows before migrate"

cat >"$T/debezium.json" <<'EOF'
{
  "layout": "debezium",
  "table.field.event.id": "id",
  "table.field.event.key": "aggregateid",
  "table.field.event.type": "type",
  "table.field.event.payload": "payload",
  "route.by.field": "aggregatetype",
  "route.topic.replacement": "outbox.event.${routedByValue}",
  "table.fields.additional.placement": "type:header:eventType"
}
EOF
# --- 1. ---
relay_migrate --config "$T/debezium.json" 2>"$T/migrate1.log"
check_eq "1: migrate adopts the Debezium table" 0 $?
relay_migrate --config "$T/debezium.json" 2>"$T/migrate2.log"
check_eq "1: migrate again (idempotent)" 0 $?
check_eq "1: the relay's own layout was not applied to it" 0 \
    "$(psql_q "SELECT count(*) FROM information_schema.columns
               WHERE table_name = 'outbox' AND column_name IN ('event_id', 'aggregate_type')")"
check_eq "1: Debezium's columns are untouched" "id uuid,aggregatetype character varying,aggregateid character varying,type character varying,payload jsonb" \
    "$(psql_q "SELECT string_agg(column_name || ' ' || data_type, ',' ORDER BY ordinal_position)
               FROM information_schema.columns WHERE table_name = 'outbox' AND ordinal_position <= 5")"
check_eq "1: the wakeup trigger is on the table" 1 \
    "$(psql_q "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'outbox'::regclass
               AND tgname = 'outbox_wakeup'")"
insert_events 21 60 || fail "1: the application's INSERT still works after migrate"

relay_start --config "$T/debezium.json" --database-url "$DATABASE_URL" --brokers "$BROKERS"
wait_for "1: all 60 rows are sent" 30 no_unsent_rows
insert_events 61 70 || fail "1: insert while the relay runs"
wait_for "1: rows inserted while it runs are sent" 30 no_unsent_rows

# --- 2. ---
consume --topic outbox.event.order --to-end --timeout-ms 20000 >"$T/order.json"
psql_q "SELECT json_build_object('id', id::text, 'key', aggregateid, 'value', payload::text,
                                 'type', type)
        FROM outbox ORDER BY seq" >"$T/rows.json"
# First copies only: delivery is at least once.
jq -s 'group_by(.headers.id) | map(.[0])' "$T/order.json" >"$T/first.json"
check_eq "2: 70 distinct events on outbox.event.order" 70 "$(jq length "$T/first.json")"
check_eq "2: key, value, id header and eventType header match each row" "" \
    "$(jq -n --slurpfile rows "$T/rows.json" --slurpfile got "$T/first.json" '
        ($got[0] | map({key: .headers.id, value: .}) | from_entries) as $by_id
        | $rows[] | select(($by_id[.id] | [.key, .value, .headers.eventType]) != [.key, .value, .type])
        | .id')"
check_eq "2: headers are exactly id and eventType" '["eventType","id"]' \
    "$(jq -s -c 'map([.header_list[][0]] | sort) | unique | .[]' "$T/order.json")"
check "2: per aggregate in insert order" first_copies_in_order "$T/order.json"
relay_stop
check_eq "2: relay exits 0" 0 $?

# --- 3. ---
"$RELAY_BIN" status --json --config "$T/debezium.json" --database-url "$DATABASE_URL" \
    >"$T/status.json" 2>"$T/status.err"
check_eq "3: status on the adopted table: backlog 0, 70 sent in the last minute" "0 70" \
    "$(jq -r '"\(.backlog) \(.sent_last_minute)"' "$T/status.json")"
"$RELAY_BIN" dead --config "$T/debezium.json" --database-url "$DATABASE_URL" >"$T/dead.txt" 2>&1
check_eq "3: dead on the adopted table" "0 dead-lettered events" "$(tail -n 1 "$T/dead.txt")"

# --- 4. ---
psql_q 'CREATE SCHEMA app;
        CREATE TABLE app."Outbox ""Events""" (
            "Event Id" uuid NOT NULL DEFAULT gen_random_uuid(),
            "Stream" text NOT NULL, "Stream Key" text NOT NULL, "What" text NOT NULL,
            "Body" text, "Tenant" text)' || fail "4: create the oddly named table"
ODD=(--table 'app.Outbox "Events"' --layout debezium --event-id-column 'Event Id'
    --aggregate-type-column Stream --aggregate-id-column 'Stream Key'
    --event-type-column What --payload-column Body --seq-column 'Seq No'
    --additional-fields 'Tenant:header, What:header:kind')
relay_migrate "${ODD[@]}" 2>"$T/migrate-odd.log"
check_eq "4: migrate adopts app.\"Outbox \"\"Events\"\"\"" 0 $?
psql_q 'INSERT INTO app."Outbox ""Events""" ("Stream", "Stream Key", "What", "Body", "Tenant")
        VALUES ($$invoice$$, $$i-1$$, $$Issued$$, $$plain text body$$, $$acme$$),
               ($$invoice$$, $$i-1$$, $$Paid$$, NULL, NULL)' || fail "4: insert"
relay_start "${ODD[@]}" --database-url "$DATABASE_URL" --brokers "$BROKERS" \
    --order-scope topic --topic-template 'audit.{aggregate_type}.{event_type}'
odd_sent() {
    [ "$(psql_q 'SELECT count(*) FROM app."Outbox ""Events""" WHERE sent_at IS NULL')" = 0 ]
}
wait_for "4: both rows sent" 30 odd_sent
consume --topic audit.invoice.Issued --to-end --timeout-ms 20000 >"$T/issued.json"
consume --topic audit.invoice.Paid --to-end --timeout-ms 20000 >"$T/paid.json"
check_eq "4: each topic holds exactly its one event (no duplicate)" "1 1" \
    "$(grep -c '' "$T/issued.json") $(grep -c '' "$T/paid.json")"
check_eq "4: key, text value, Tenant and kind headers" "i-1|plain text body|acme|Issued" \
    "$(jq -r '[.key, .value, .headers.Tenant, .headers.kind] | join("|")' "$T/issued.json")"
check_eq "4: NULL payload and NULL header column" "null null Paid" \
    "$(jq -r '"\(.value) \(.headers.Tenant) \(.headers.kind)"' "$T/paid.json")"
# Debezium adds id first, then the placed headers in the order given (Tenant, then kind),
# whatever their names.
check_eq "4: id, then the additional headers in the order given" '["id","Tenant","kind"]' \
    "$(jq -c '[.header_list[][0]]' "$T/issued.json")"
relay_stop
check_eq "4: relay exits 0" 0 $?

# --- 5. ---
bad() {
    local name=$1
    shift
    "$RELAY_BIN" "$@" --database-url "$DATABASE_URL" --brokers "$BROKERS" >"$T/bad.out" 2>&1
    local rc=$?
    check_eq "5: $name: exit status" "${EXPECT_RC:-2}" "$rc"
    check_eq "5: $name: one line" 1 "$(grep -c '' "$T/bad.out")"
    check "5: $name: says why" grep -q "$PATTERN" "$T/bad.out"
}
PATTERN="placement 'offset'" bad "unknown placement" run --layout debezium \
    --additional-fields type:offset:eventType
PATTERN="header name 'id' is set by the relay" bad "reserved header" run --layout debezium \
    --additional-fields type:header:id
PATTERN="expected COLUMN:header" bad "malformed placement" run --additional-fields type
PATTERN="expected relay or debezium" bad "unknown layout" run --layout dbz
# The order column must be an integer: mapping it to Debezium's uuid id is refused, and the
# transaction rolls back.
"$RELAY_BIN" migrate --config "$T/debezium.json" --seq-column id --event-id-column seq \
    --database-url "$DATABASE_URL" >"$T/bad.out" 2>&1
check_eq "5: uuid order column: migrate exits 1" 1 $?
check "5: uuid order column: says so" grep -q "must be bigint or integer" "$T/bad.out"
"$RELAY_BIN" migrate --table no_such_table --layout debezium --database-url "$DATABASE_URL" \
    >"$T/bad.out" 2>&1
check_eq "5: missing table: migrate exits 1" 1 $?
check "5: missing table: names it" grep -q 'no_such_table' "$T/bad.out"

# --- 6. ---
# 40 keys on a 6-partition topic with the layout's default partitioner, 40 on another with consistent.
broker_cmd "create outbox.event.parity 6"
broker_cmd "create outbox.event.parity2 6"
insert_keys() { # AGGREGATE_TYPE
    psql_q "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
            SELECT gen_random_uuid(), '$1', 'key-' || g, 'Placed', '{}'
            FROM generate_series(1, 40) g" || fail "6: insert $1"
}
in_java_partition() { # FILE: how many of its first copies are where Java's producer puts them
    jq -c -s 'group_by(.headers.id) | map(.[0]) | .[]' "$1" |
        python3 "$(dirname "$0")/../../tools/java_partition.py" 6 | awk '$2 == $3' | grep -c ''
}
insert_keys parity
relay_start --config "$T/debezium.json" --database-url "$DATABASE_URL" --brokers "$BROKERS"
wait_for "6: the 40 rows sent (the layout's default partitioner)" 30 no_unsent_rows
relay_stop
check_eq "6: relay exits 0" 0 $?
consume --topic outbox.event.parity --to-end --timeout-ms 20000 >"$T/parity-default.json"
check_eq "6: default partitioner: 40 events" 40 \
    "$(jq -s 'map(.headers.id) | unique | length' "$T/parity-default.json")"
check_eq "6: the layout's default: every key in the partition Debezium's producer gives it" 40 \
    "$(in_java_partition "$T/parity-default.json")"
insert_keys parity2
relay_start --config "$T/debezium.json" --database-url "$DATABASE_URL" --brokers "$BROKERS" \
    --kafka partitioner=consistent
wait_for "6: the 40 rows sent (consistent)" 30 no_unsent_rows
relay_stop
consume --topic outbox.event.parity2 --to-end --timeout-ms 20000 >"$T/parity-consistent.json"
check_eq "6: consistent: 40 events" 40 \
    "$(jq -s 'map(.headers.id) | unique | length' "$T/parity-consistent.json")"
check "6: consistent (named) puts some keys elsewhere than Debezium did" \
    test "$(in_java_partition "$T/parity-consistent.json")" -lt 40
