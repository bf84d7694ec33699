#!/bin/bash
# Proves Schema Registry output (--value-format avro | json-schema), checked by a client no one
# here wrote: Confluent's JavaScript client @confluentinc/schemaregistry (npm, installed from
# tests/tools/schemaregistry/'s lockfile into /var/cache/outbox-relay) decodes what the relay
# produced, fetching each schema by the id in the message from the stand-in registry
# (tests/tools/schema-registry.js, Confluent's REST API, with basic auth):
#  1. Avro: every message decodes to its row's payload, field by field (records, a nested array
#     of records, an enum, a nullable union, a long); first copies in order per aggregate;
#  2. a payload that does not fit the schema is dead-lettered (--max-attempts 1) with an error
#     naming the field and the schema id; the dead-letter topic carries its payload as JSON;
#     verify finds the Avro events (it reads ids, not values);
#  3. JSON Schema: the same for --value-format json-schema, and its non-conforming payload;
#  4. a wrong registry password is one clear line at start-up, exit 1, with one database or a
#     --databases list; a 403 on GET /subjects alone (a user who may read its subjects but not
#     list them) is a warning: check exits 0 with a warn line, run starts and sends;
#  5. the registry stopped for 30 s while rows of a new subject keep coming (10 a second): none
#     is sent, none counts an attempt or dies; once it is back all are sent, decoded, in order;
#  6. the same while the registry answers 503;
#  7. Avro fields the payload lacks are their schema's defaults, and a union of a string and a
#     map takes the map {"string": "x"} written wrapped ({"map": {...}}) and refuses it unwrapped
#     (ambiguous: the string "x" wrapped, or that map): Confluent's client decodes the defaults,
#     the map and the string.
# Needs node and npm (tools/packages.txt: Debian 12's node 18 runs the client).
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
TOOLS=$ROOT/tests/tools
SR=$(npm_client schemaregistry) || fail "the npm client schemaregistry: $(tail -n 3 "$T/npm.log")"
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"

# --- the registry ---
ORDER_AVRO='{"type": "record", "name": "Order", "namespace": "shop", "fields": [
  {"name": "id", "type": "string"}, {"name": "seq", "type": "long"},
  {"name": "amount", "type": "long"},
  {"name": "note", "type": ["null", "string"], "default": null},
  {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
  {"name": "lines", "type": {"type": "array", "items": {"type": "record", "name": "Line",
     "fields": [{"name": "sku", "type": "string"}, {"name": "qty", "type": "int"}]}}}]}'
EVO_AVRO='{"type": "record", "name": "Evo", "namespace": "shop", "fields": [
  {"name": "id", "type": "string"}, {"name": "currency", "type": "string", "default": "EUR"},
  {"name": "attrs", "type": ["null", "string", {"type": "map", "values": "string"}],
   "default": null}]}'
DOC_JSON='{"type": "object", "additionalProperties": false, "required": ["seq", "title"],
  "properties": {"seq": {"type": "integer"}, "title": {"type": "string"},
                 "tags": {"type": "array", "items": {"type": "string"}}}}'
jq -n --arg order "$ORDER_AVRO" --arg doc "$DOC_JSON" --arg evo "$EVO_AVRO" '{
    "outbox.event.order-value": [{schema: $order}],
    "outbox.event.order2-value": [{schema: $order}],
    "outbox.event.order3-value": [{schema: $order}],
    "outbox.event.doc-value": [{schema: $doc, schemaType: "JSON"}],
    "outbox.event.evo-value": [{schema: $evo}]}' >"$T/schemas.json"
SR_PORT=$(free_port) || fail "a port for the registry"
SR_URL=http://127.0.0.1:$SR_PORT
registry_start() {
    node "$TOOLS/schema-registry.js" --port "$SR_PORT" --auth relay:s3cret \
        --schemas "$T/schemas.json" >"$T/registry.out" 2>&1 &
    SR_PID=$!
    _t_track "$SR_PID"
    _poll 10 grep -q '^listening' "$T/registry.out" || fail "the registry listens"
}
registry_start
printf 'relay:s3cret\n' >"$T/sr-auth"
chmod 600 "$T/sr-auth"
SR_ARGS=(--schema-registry-url "$SR_URL" --schema-registry-auth-file "$T/sr-auth")
decode() { # decode FORMAT < consume output: Confluent's client, one {id, value} per message
    node "$TOOLS/schemaregistry_read.js" "$SR" "$SR_URL" "$1" relay:s3cret
}
# same_values ROWS DECODED: the ids whose first decoded value differs from the row's payload.
same_values() {
    jq -n --slurpfile rows "$1" --slurpfile got "$2" '
        ($got | group_by(.id) | map({key: .[0].id, value: .[0].value}) | from_entries) as $by_id
        | $rows[] | select($by_id[.id] != .payload) | .id'
}

# --- 1. Avro ---
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'order', 'o-' || (g % 3), 'OrderPlaced',
               jsonb_build_object('id', 'o-' || (g % 3), 'seq', g, 'amount', g::bigint * 1000000000,
                   'note', CASE WHEN g % 2 = 0 THEN 'caf' || chr(233) END,
                   'status', CASE WHEN g % 4 = 0 THEN 'PAID' ELSE 'NEW' END,
                   'lines', jsonb_build_array(jsonb_build_object('sku', 's' || g, 'qty', g)))
        FROM generate_series(1, 60) g" || fail "insert Avro rows"
# 2: amount as text does not fit a long.
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        VALUES ('order', 'bad-1', 'OrderPlaced', '{\"id\": \"b\", \"seq\": 1, \"amount\": \"x\",
                \"note\": null, \"status\": \"NEW\", \"lines\": []}')" || fail "insert a bad row"
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --value-format avro \
    "${SR_ARGS[@]}" --max-attempts 1 --dead-letter-topic dead.letters
all_done() {
    [ "$(psql_q "SELECT count(*) FROM outbox WHERE sent_at IS NULL AND (dead_at IS NULL
                  OR dead_letter_topic IS NULL)")" = 0 ]
}
all_done_nodlq() {
    [ "$(psql_q "SELECT count(*) FROM outbox WHERE sent_at IS NULL AND dead_at IS NULL")" = 0 ]
}
wait_for "1: every row sent or dead-lettered" 60 all_done
relay_stop
check_eq "1: relay exits 0" 0 $?
check "1: the password is not in the log" lacks s3cret "$RELAY_LOG"

consume --topic outbox.event.order --to-end --hex --timeout-ms 20000 >"$T/order.out"
decode avro <"$T/order.out" >"$T/order.dec" 2>"$T/order.err"
check_eq "1: Confluent's client decodes every message" "0 $(grep -c '' "$T/order.out")" \
    "$? $(grep -c '' "$T/order.dec")"
psql_q "SELECT json_build_object('id', event_id, 'payload', payload) FROM outbox
        WHERE aggregate_type = 'order' AND dead_at IS NULL ORDER BY id" >"$T/order.rows"
check_eq "1: 60 events" 60 "$(jq -s 'map(.id) | unique | length' "$T/order.dec")"
check_eq "1: each decoded value equals its row's payload" "" "$(same_values "$T/order.rows" "$T/order.dec")"
check_eq "1: the wire format: magic byte 0, schema id 1 (4 bytes big-endian)" 0000000001 \
    "$(jq -r '.value_hex[0:10]' "$T/order.out" | sort -u)"
check "1: first copies in order per aggregate" first_copies_in_order \
    <(jq -c '{headers: {id: .id}, key: .value.id, value: (.value | tojson)}' "$T/order.dec")

# --- 2. ---
check "2: the bad row is dead, its error naming the field and the schema id" \
    grep -q "schema id 1 .*field amount: expected long, got string" \
    <(psql_q "SELECT last_error FROM outbox WHERE aggregate_id = 'bad-1' AND dead_at IS NOT NULL")
consume --topic dead.letters --to-end --timeout-ms 20000 >"$T/dead.out"
check_eq "2: the dead-letter topic carries its JSON payload and the error" "x|1" \
    "$(jq -r '[(.value | fromjson | .amount), (.headers["dlq.error"] | test("field amount") | if . then 1 else 0 end)] | join("|")' "$T/dead.out")"

# verify reads the topics back by the id header: the values' format is no matter to it.
"$RELAY_BIN" verify --database-url "$DATABASE_URL" --brokers "$BROKERS" --since 1h \
    --from-beginning --json >"$T/verify.out" 2>"$T/verify.err"
check_eq "2: verify finds the 60 Avro events, in order" "true 60 0 0" \
    "$(jq -r '"\(.ok) \(.rows) \(.missing) \(.out_of_order)"' "$T/verify.out")"

# --- 3. JSON Schema ---
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'doc', 'd-' || (g % 2), 'Written',
               jsonb_build_object('seq', g, 'title', 'doc ' || g, 'tags', jsonb_build_array('a', 'b'))
        FROM generate_series(1, 20) g" || fail "insert JSON Schema rows"
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        VALUES ('doc', 'bad-2', 'Written', '{\"seq\": 1, \"title\": \"t\", \"tags\": [1]}')" ||
    fail "insert a bad JSON Schema row"
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --value-format json-schema \
    "${SR_ARGS[@]}" --max-attempts 1
wait_for "3: every row sent or dead" 60 all_done_nodlq
relay_stop
consume --topic outbox.event.doc --to-end --hex --timeout-ms 20000 >"$T/doc.out"
decode json <"$T/doc.out" >"$T/doc.dec" 2>"$T/doc.err"
check_eq "3: Confluent's client decodes every message" "0 20" "$? $(grep -c '' "$T/doc.dec")"
psql_q "SELECT json_build_object('id', event_id, 'payload', payload) FROM outbox
        WHERE aggregate_type = 'doc' AND dead_at IS NULL ORDER BY id" >"$T/doc.rows"
check_eq "3: each decoded value equals its row's payload" "" "$(same_values "$T/doc.rows" "$T/doc.dec")"
check "3: the bad row is dead, naming the field and the schema id" \
    grep -q "schema id 2 .*field tags\[0\]: expected string, got integer" \
    <(psql_q "SELECT last_error FROM outbox WHERE aggregate_id = 'bad-2' AND dead_at IS NOT NULL")

# --- 4. a wrong password ---
printf 'relay:wrong\n' >"$T/sr-bad"
chmod 600 "$T/sr-bad"
"$RELAY_BIN" run --database-url "$DATABASE_URL" --brokers "$BROKERS" --value-format avro \
    --schema-registry-url "$SR_URL" --schema-registry-auth-file "$T/sr-bad" >"$T/bad.out" 2>&1
check_eq "4: exit 1" 1 $?
check_eq "4: one line" 1 "$(grep -c '' "$T/bad.out")"
check "4: says the registry refuses the credentials" grep -q "refuses the credentials (HTTP 401)" \
    "$T/bad.out"
check "4: and never the password" lacks wrong "$T/bad.out"
# The same with a --databases list: the registry's settings are the process's, probed once
# before anything connects (b, the database whose rows use it; a's are JSON).
printf '{"brokers": "%s", "schema-registry-url": "%s", "schema-registry-auth-file": "%s",
"databases": [{"name": "a", "database-url": "%s"},
{"name": "b", "database-url": "%s", "value-format": "avro"}]}\n' \
    "$BROKERS" "$SR_URL" "$T/sr-bad" "$DATABASE_URL" \
    "postgresql://postgres@127.0.0.1:$PGPORT/sr_b" >"$T/dbs-bad.json"
timeout -k 5 30 env -u DATABASE_URL "$RELAY_BIN" run --config "$T/dbs-bad.json" >"$T/dbs-bad.out" 2>&1
check_eq "4: with --databases: exit 1" 1 $?
check "4: ... saying the registry refuses the credentials" \
    grep -q "schema registry .*refuses the credentials (HTTP 401)" "$T/dbs-bad.out"
check "4: ... and never the password" lacks wrong "$T/dbs-bad.out"
"$RELAY_BIN" check --database-url "$DATABASE_URL" --brokers "$BROKERS" --value-format avro \
    --schema-registry-url "$SR_URL" --schema-registry-auth-file "$T/sr-bad" >"$T/check.out" 2>&1
check_eq "4: check: exit 1" 1 $?
check "4: ... naming the registry's refusal" grep -q "^FAIL  schema registry: .*refuses the credentials" \
    "$T/check.out"
"$RELAY_BIN" check --database-url "$DATABASE_URL" --brokers "$BROKERS" --value-format avro \
    "${SR_ARGS[@]}" >"$T/check.out" 2>&1
check "4: check with the right password: the registry answers" \
    grep -q "^ok    schema registry: answers and takes the credentials" "$T/check.out"
# A URL whose /subjects answers 404 as no registry does (a wrong path prefix): check says it
# answered, and how, not that nothing answered.
"$RELAY_BIN" check --database-url "$DATABASE_URL" --brokers "$BROKERS" --value-format avro \
    --schema-registry-url "$SR_URL/no-such-prefix" --schema-registry-auth-file "$T/sr-auth" \
    >"$T/check404.out" 2>&1
check "4: check with a URL answering 404: FAIL saying it is not a registry's answer" \
    grep -q "^FAIL  schema registry: answers, but not as a Schema Registry: HTTP 404" "$T/check404.out"
# A user who may read its subjects but not list them (Confluent's ACL authorizer asks
# GLOBAL_SUBJECTS_READ for GET /subjects, SUBJECT_READ for a subject's versions): the right
# credentials, and the relay used to refuse to start ("refuses the credentials (HTTP 403)").
kill -USR2 "$SR_PID"
_poll 10 grep -q '^list refused' "$T/registry.out" || fail "4: the registry refuses the list"
"$RELAY_BIN" check --database-url "$DATABASE_URL" --brokers "$BROKERS" --value-format avro \
    "${SR_ARGS[@]}" >"$T/check403.out" 2>&1
check_eq "4: list refused: check exits 0" 0 $?
check "4: ... with a warn line saying the credentials are taken and the list refused" \
    grep -q "^warn  schema registry: answers and takes the credentials, but HTTP 403 on /subjects" \
    "$T/check403.out"
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --value-format avro \
    "${SR_ARGS[@]}" --delivery-timeout 5000
_poll 30 grep -q "lanes owned" "$RELAY_LOG" || fail "4: list refused: the relay starts"
check "4: ... warning that the list is refused" \
    grep -q "schema registry refuses to list subjects at start-up" "$RELAY_LOG"
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES
        ('order', 'lr-1', 'OrderPlaced', '{\"id\": \"lr-1\", \"seq\": 1, \"amount\": 1,
          \"note\": null, \"status\": \"NEW\", \"lines\": []}')" || fail "4: insert"
lr_sent() {
    [ "$(psql_q "SELECT count(*) FROM outbox WHERE aggregate_id = 'lr-1' AND sent_at IS NOT NULL")" = 1 ]
}
wait_for "4: ... and sends a row (its subject's own lookup is allowed)" 30 lr_sent
relay_stop
check_eq "4: ... relay exits 0" 0 $?
kill -USR2 "$SR_PID"
_poll 10 grep -q '^list allowed' "$T/registry.out" || fail "4: the registry lists again"

# --- 5. the registry down for 30 s under load ---
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --value-format avro \
    "${SR_ARGS[@]}" --delivery-timeout 5000 --metrics-listen 127.0.0.1:0
_poll 30 grep -q "lanes owned" "$RELAY_LOG" || fail "5: the relay owns its lanes"
metrics_wait
check_eq "5: the registry is up: outbox_schema_registry_up 1" 1 "$(metric outbox_schema_registry_up)"
kill -KILL "$SR_PID"
wait "$SR_PID" 2>/dev/null
for s in $(seq 1 30); do
    lo=$((s * 10 - 9)) hi=$((s * 10))
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            SELECT 'order2', 'p-' || (g % 4), 'OrderPlaced',
                   jsonb_build_object('id', 'p-' || (g % 4), 'seq', g, 'amount', g, 'note', NULL,
                       'status', 'NEW', 'lines', '[]'::jsonb)
            FROM generate_series($lo, $hi) g" ||
        fail "5: insert while the registry is down"
    sleep 1
done
check_eq "5: after 30 s down: none sent, no attempt counted, none dead" "300 0 0 0" \
    "$(psql_q "SELECT count(*) FILTER (WHERE sent_at IS NULL), count(*) FILTER (WHERE sent_at IS NOT NULL),
                      coalesce(sum(attempts), 0), count(dead_at) FROM outbox WHERE aggregate_type = 'order2'" |
        tr '|' ' ')"
check "5: the relay said the registry is unavailable" grep -q "schema registry unavailable" "$RELAY_LOG"
check_eq "5: /readyz says so (503)" 503 "$(http_code /readyz)"
check "5: ... naming the registry" grep -q "schema registry unavailable" <(curl -s --max-time 5 "http://$METRICS/readyz")
check_eq "5: outbox_schema_registry_up 0" 0 "$(metric outbox_schema_registry_up)"
registry_start
order2_sent() {
    [ "$(psql_q "SELECT count(*) FROM outbox WHERE aggregate_type = 'order2' AND sent_at IS NULL")" = 0 ]
}
wait_for "5: once it is back, every row is sent" 60 order2_sent
check "5: and the relay said so" grep -q "schema registry available again" "$RELAY_LOG"
check_eq "5: outbox_schema_registry_up 1 again" 1 "$(metric outbox_schema_registry_up)"
relay_stop
check_eq "5: no row died" 0 "$(psql_q "SELECT count(dead_at) FROM outbox WHERE aggregate_type = 'order2'")"
consume --topic outbox.event.order2 --to-end --hex --timeout-ms 20000 >"$T/order2.out"
decode avro <"$T/order2.out" >"$T/order2.dec" 2>"$T/order2.err"
check_eq "5: Confluent's client decodes every message" "0 $(grep -c '' "$T/order2.out")" \
    "$? $(grep -c '' "$T/order2.dec")"
check_eq "5: 300 events, none lost" 300 "$(jq -s 'map(.id) | unique | length' "$T/order2.dec")"
check "5: first copies in order per aggregate" first_copies_in_order \
    <(jq -c '{headers: {id: .id}, key: .value.id, value: (.value | tojson)}' "$T/order2.dec")

# --- 6. the registry answering 503 ---
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --value-format avro \
    "${SR_ARGS[@]}" --delivery-timeout 5000
_poll 30 grep -q "lanes owned" "$RELAY_LOG" || fail "6: the relay owns its lanes"
kill -USR1 "$SR_PID"
_poll 10 grep -q '^failing' "$T/registry.out" || fail "6: the registry fails"
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'order3', 'q-' || (g % 2), 'OrderPlaced',
               jsonb_build_object('id', 'q-' || (g % 2), 'seq', g, 'amount', g, 'note', NULL,
                   'status', 'NEW', 'lines', '[]'::jsonb)
        FROM generate_series(1, 20) g" || fail "6: insert"
_poll 30 grep -q 'schema registry unavailable.*HTTP 503' "$RELAY_LOG"
check "6: the relay says the registry answers 503" grep -q 'schema registry unavailable.*HTTP 503' \
    "$RELAY_LOG"
sleep 5 # a few retries (1 s, 2 s, ...) go by: still nothing sent, nothing counted
check_eq "6: while it fails: none sent, no attempt counted" "20 0" \
    "$(psql_q "SELECT count(*) FILTER (WHERE sent_at IS NULL), coalesce(sum(attempts), 0)
               FROM outbox WHERE aggregate_type = 'order3'" | tr '|' ' ')"
kill -USR1 "$SR_PID"
order3_sent() {
    [ "$(psql_q "SELECT count(*) FROM outbox WHERE aggregate_type = 'order3' AND sent_at IS NULL")" = 0 ]
}
wait_for "6: once it answers again, every row is sent" 60 order3_sent
relay_stop
check_eq "6: relay exits 0" 0 $?

# --- 7. defaults, and a one-key map in a union with a string ---
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES
        ('evo', 'e1', 'Evolved', '{\"id\": \"e1\"}'),
        ('evo', 'e2', 'Evolved', '{\"id\": \"e2\", \"currency\": \"USD\", \"attrs\": {\"map\": {\"string\": \"x\"}}}'),
        ('evo', 'e3', 'Evolved', '{\"id\": \"e3\", \"attrs\": \"x\"}'),
        ('evo', 'e4', 'Evolved', '{\"id\": \"e4\", \"attrs\": {\"string\": \"x\"}}')" ||
    fail "7: insert"
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --value-format avro \
    "${SR_ARGS[@]}" --max-attempts 1
wait_for "7: every row sent or dead" 60 all_done_nodlq
relay_stop
check_eq "7: relay exits 0" 0 $?
consume --topic outbox.event.evo --to-end --hex --timeout-ms 20000 >"$T/evo.out"
decode avro <"$T/evo.out" >"$T/evo.dec" 2>"$T/evo.err"
check_eq "7: Confluent's client decodes the three" "0 3" "$? $(grep -c '' "$T/evo.dec")"
check_eq "7: the defaults, the map, the string" \
    '{"id":"e1","currency":"EUR","attrs":null}|{"id":"e2","currency":"USD","attrs":{"string":"x"}}|{"id":"e3","currency":"EUR","attrs":"x"}' \
    "$(jq -c '.value' "$T/evo.dec" | sort | paste -sd '|')"
check "7: the unwrapped one-key map is dead, the error saying how to write it" \
    grep -q 'field attrs: {"string": ...} is ambiguous (a wrapped string, or a map with that key)' \
    <(psql_q "SELECT last_error FROM outbox WHERE aggregate_id = 'e4' AND dead_at IS NOT NULL")
