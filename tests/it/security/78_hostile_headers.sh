#!/bin/bash
# Proves a row cannot forge the headers the relay sets, and one row's oversized headers fail
# that row only (relay/outbox/route.c, docs/security.md). With --max-attempts 1
# --dead-letter-topic dlq:
#  1. a row whose headers hold `ID`, `Id`, `Event_Type`, `AGGREGATE_TYPE`, `dlq.error` and
#     `DLQ.Attempts` is delivered with exactly one header named id/event_type/aggregate_type
#     (any case), each the relay's own value, and no dlq.* header at all; its harmless header
#     arrives unchanged;
#  2. a row of 10,000 headers fails alone: it is dead with last_error naming the limit, it is on
#     dlq with the relay's dlq.error (not a forged one) and without its 10,000 headers, and
#     every other row (including later rows of its own aggregate type) is delivered;
#  3. a row whose headers hold 70 kB in one value fails the same way (the byte limit).
# And bin/consume --tsv (bench.sh's latency runs read it): one line of four fields a message,
# the header asked for with its tab and newline printed as spaces; bin/consume --to-end reads a
# topic that does not exist as empty at once (exit 0), but not one the cluster answers with an
# error (UNKNOWN_TOPIC_OR_PART for a topic that holds a message: exit 1 at the timeout).
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"

insert_good() { # insert_good FROM TO
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            SELECT 'hh', 'hh-' || (g % 5), 'changed', jsonb_build_object('seq', g)
            FROM generate_series($1, $2) AS g ORDER BY g"
}
insert_good 1 50
FORGED=$(psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
                 VALUES ('hh', 'forger', 'changed', '{\"seq\": 0}',
                         '{\"ID\": \"forged\", \"Id\": \"forged\", \"Event_Type\": \"forged\",
                           \"AGGREGATE_TYPE\": \"forged\", \"dlq.error\": \"forged\",
                           \"DLQ.Attempts\": \"forged\", \"tenant\": \"t-1\",
                           \"note\": \"a\\tb\\nc\"}')
                 RETURNING id")
MANY=$(psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
               SELECT 'hh', 'many', 'changed', '{\"seq\": 0}',
                      jsonb_object_agg('h' || g, 'v') || '{\"dlq.error\": \"forged\"}'
               FROM generate_series(1, 10000) AS g
               RETURNING id")
BIG=$(psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
              VALUES ('hh', 'big', 'changed', '{\"seq\": 0}',
                      jsonb_build_object('big', repeat('x', 70000)))
              RETURNING id")
insert_good 51 100
FORGED_EID=$(psql_q "SELECT event_id FROM outbox WHERE id = $FORGED")
MANY_EID=$(psql_q "SELECT event_id FROM outbox WHERE id = $MANY")
BIG_EID=$(psql_q "SELECT event_id FROM outbox WHERE id = $BIG")

relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --max-attempts 1 \
    --dead-letter-topic dlq --on-poison skip --kafka reconnect.backoff.max.ms=500
settled() {
    [ "$(psql_q "SELECT count(*) FROM outbox WHERE sent_at IS NULL AND dead_at IS NULL")" = 0 ]
}
wait_for "every row sent or dead" 60 settled

# --- 1. forged identity and dlq headers ---
consume --topic outbox.event.hh --to-end --timeout-ms 20000 >"$T/hh.json"
jq -c --arg e "$FORGED_EID" 'select(.headers.id == $e)' "$T/hh.json" | head -n 1 >"$T/forged.json"
check "1: the forged row was delivered" test -s "$T/forged.json"
check_eq "1: one id, one event_type, one aggregate_type header (any case), no dlq.*" \
    "aggregate_type event_type id" \
    "$(jq -r '[.header_list[][0] | select(ascii_downcase | test("^(id|event_type|aggregate_type)$|^dlq\\."))] | sort | join(" ")' "$T/forged.json")"
check_eq "1: id is the event id" "$FORGED_EID" "$(jq -r '.headers.id' "$T/forged.json")"
check_eq "1: event_type is the row's" changed "$(jq -r '.headers.event_type' "$T/forged.json")"
check_eq "1: aggregate_type is the row's" hh "$(jq -r '.headers.aggregate_type' "$T/forged.json")"
check "1: no header carries a forged value" \
    test "$(jq '[.header_list[][1] | select(. == "forged")] | length' "$T/forged.json")" = 0
check_eq "1: the harmless header arrives" t-1 "$(jq -r '.headers.tenant' "$T/forged.json")"
check_eq "1: its tab and newline arrive" $'a\tb\nc' "$(jq -r '.headers.note' "$T/forged.json")"
consume --topic outbox.event.hh --to-end --timeout-ms 20000 --tsv note >"$T/hh.tsv"
check_eq "consume --tsv: one line a message" "$(wc -l <"$T/hh.json")" "$(wc -l <"$T/hh.tsv")"
check_eq "consume --tsv: four fields on every line" 4 \
    "$(awk -F '\t' '{ print NF }' "$T/hh.tsv" | sort -u | tr '\n' ' ' | sed 's/ $//')"
check_eq "consume --tsv: received_us, timestamp_ms, the header (tab, newline as spaces), the value" \
    '16 13 a b c {"seq": 0}' \
    "$(awk -F '\t' '$3 == "a b c" && $1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ {
           print length($1), length($2), $3, $4 }' "$T/hh.tsv")"
consume --topic outbox.event.hh --to-end --timeout-ms 20000 --tsv id >"$T/hh-id.tsv"
check_eq "consume --tsv id: the forged row's line carries its event id" 1 \
    "$(awk -F '\t' -v e="$FORGED_EID" '$3 == e && $4 == "{\"seq\": 0}"' "$T/hh-id.tsv" | wc -l)"
consume --topic never.produced --to-end --timeout-ms 20000 >"$T/none.json"
check_eq "consume --to-end: a topic that does not exist reads as empty, exit 0" "0 0" \
    "$? $(grep -c '' "$T/none.json")"
printf '{"key": "k", "value": "v"}\n' | "$BIN/produce" --brokers "$BROKERS" --topic refused >/dev/null ||
    fail "produce a message to topic refused"
broker_cmd "topic-error refused 3"
consume --topic refused --to-end --timeout-ms 1500 >"$T/refused.json" 2>"$T/refused.err"
check_eq "consume --to-end: a topic answered with an error is not read as empty (exit 1)" "1 0" \
    "$? $(grep -c '' "$T/refused.json")"
broker_cmd "topic-error refused 0"

# --- 2./3. oversized headers ---
error_of() { psql_q "SELECT last_error FROM outbox WHERE id = $1"; }
check "2: the 10,000-header row is dead" \
    test "$(psql_q "SELECT dead_at IS NOT NULL AND sent_at IS NULL FROM outbox WHERE id = $MANY")" = t
check "2: its last_error names the limit" grep -q 'headers: 10001 entries, more than the limit of 100' <<<"$(error_of "$MANY")"
check "3: the 70 kB-header row is dead" \
    test "$(psql_q "SELECT dead_at IS NOT NULL AND sent_at IS NULL FROM outbox WHERE id = $BIG")" = t
check "3: its last_error names the byte limit" grep -q 'more than the limit of 65536 bytes' <<<"$(error_of "$BIG")"
check_eq "2: every other row was sent" 101 \
    "$(psql_q "SELECT count(*) FROM outbox WHERE sent_at IS NOT NULL")"
consume --topic dlq --to-end --timeout-ms 20000 >"$T/dlq.json"
jq -c --arg e "$MANY_EID" 'select(.headers.id == $e)' "$T/dlq.json" | head -n 1 >"$T/many.json"
check "2: the row is on the dead-letter topic" test -s "$T/many.json"
check "2: its dlq.error is the relay's, not the forged one" \
    grep -q 'more than the limit of 100' <<<"$(jq -r '.headers["dlq.error"]' "$T/many.json")"
check "2: one dlq.error header only" \
    test "$(jq '[.header_list[][0] | select(. == "dlq.error")] | length' "$T/many.json")" = 1
check "2: without the row's 10,000 headers" \
    test "$(jq '.header_list | length' "$T/many.json")" -lt 20
check "3: the 70 kB row is on the dead-letter topic too" \
    test "$(jq -c --arg e "$BIG_EID" 'select(.headers.id == $e)' "$T/dlq.json" | wc -l)" -ge 1
relay_stop
