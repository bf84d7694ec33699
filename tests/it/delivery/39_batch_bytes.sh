#!/bin/bash
# Proves a claim holds at most --batch-bytes of payload whatever the rows' sizes
# (docs/operations.md#memory), and that a payload over the producer's message.max.bytes is failed
# without being loaded:
#  - 30 rows of ~150 KB over 5 aggregates, one of ~700 KB (over the budget of 500,000 bytes: it
#    goes alone) and one of ~2 MB in an aggregate of its own (over message.max.bytes, 1,000,000 by
#    default);
#  - every batch the relay claimed (its debug line "claimed batch ... bytes=N") holds at most
#    500,000 payload bytes, or a single row; the 2 MB payload never counts (it is not loaded);
#  - every row but the 2 MB one is delivered, first copies in order; that one is rejected with
#    last_error "message too large: N bytes ...", N its real size (payload, key and headers).
# B. The budget counts every column of a message, not the payload alone (on main 60 rows of
#    tiny payloads with 1 MB headers peaked at 71 MB with --batch-bytes 65536): 40 rows of
#    tiny payloads with ~30 KB headers, 20 with ~20 KB keys (aggregate ids) and ~20 KB additional
#    fields placed as headers, one whose headers column is ~1.1 MB (over message.max.bytes in
#    a column that is not the payload) and one whose additional field is: every batch of several rows holds at
#    most the budget by the relay's own count, neither oversized row is ever loaded (no batch of
#    1,000,000 bytes or more), both are rejected with their real size, the rest is delivered.
# D. A bytea payload (--payload-format binary) arrives in the claim's result as hex text, twice
#    its bytes: the budget counts that (on main: batches of 10 rows of 100,000 bytes held
#    2,000,490 bytes against a budget of 1,048,576), and every row is delivered byte for byte.
# C. Memory: 60 rows of tiny payloads whose headers columns hold ~1.05 MB each (each over
#    message.max.bytes), --sessions 1 --batch-bytes 65536, the normal build (ASan's shadow memory
#    would hide the difference): on main the claims loaded every header (peak RSS 71 MB); now
#    none is loaded, and the relay's peak RSS (VmHWM) stays under 40 MB.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"

BUDGET=500000
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'big', CASE g WHEN 20 THEN 'huge' ELSE 'big-' || (g % 5) END, 'changed',
               jsonb_build_object('seq', g, 'blob', repeat('x', CASE g WHEN 10 THEN 700000
                                                                      WHEN 20 THEN 2100000
                                                                      ELSE 150000 END))
        FROM generate_series(1, 32) AS g ORDER BY g"
HUGE=$(psql_q "SELECT id FROM outbox WHERE payload->>'seq' = '20'")
# message_bytes ID: the bytes of every column of row ID's message, as the claim counts them.
message_bytes() {
    psql_q "SELECT octet_length(event_id::text) + octet_length(aggregate_type)
                   + octet_length(aggregate_id) + octet_length(event_type)
                   + coalesce(octet_length(payload::text), 0)
                   + coalesce(octet_length(headers::text), 0) $1 FROM outbox WHERE id = $2"
}
HUGE_BYTES=$(message_bytes "" "$HUGE")
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --batch-bytes "$BUDGET" \
    --retry-backoff 60000 --log-level debug --kafka reconnect.backoff.max.ms=500
others_sent() {
    [ "$(psql_q "SELECT count(*) FROM outbox WHERE id <> $HUGE AND sent_at IS NULL")" = 0 ]
}
wait_for "every row but the 2 MB one is delivered" 60 others_sent
grep 'msg="claimed batch"' "$RELAY_LOG" | sed -E 's/.* rows=([0-9]+) .* bytes=([0-9]+) .*/\1 \2/' \
    >"$T/batches.txt"
echo "# batches (rows bytes): $(sort -n "$T/batches.txt" | uniq -c | tr -s ' ' | tr '\n' ';')"
check "batches were claimed" test -s "$T/batches.txt"
check_eq "no batch of several rows holds more than $BUDGET payload bytes" "" \
    "$(awk -v b="$BUDGET" '$1 > 1 && $2 > b' "$T/batches.txt")"
check "the ~700 KB row went alone" grep -qE '^1 7[0-9]{5}$' "$T/batches.txt"
check_eq "no batch held the 2 MB payload" "" "$(awk '$2 >= 2000000' "$T/batches.txt")"
check_eq "the 2 MB row is rejected with its real size" \
    "1|message too large: $HUGE_BYTES bytes with key and headers, over the producer's message.max.bytes of 1000000 (not sent)" \
    "$(psql_q "SELECT rejections, last_error FROM outbox WHERE id = $HUGE")"
consume --topic outbox.event.big --to-end --timeout-ms 30000 >"$T/big.json"
check "every row but the 2 MB one is in Kafka, and not that one" \
    diff <(jq -r .headers.id "$T/big.json" | sort -u) \
    <(psql_q "SELECT event_id FROM outbox WHERE id <> $HUGE" | sort)
check "first copies in order per aggregate" first_copies_in_order "$T/big.json"
relay_stop
check_eq "the relay exits 0" 0 "$?"

# --- B: bytes in headers, keys and additional fields --------------------------------------------
psql_q "ALTER TABLE outbox ADD COLUMN note text" || fail "B: add a column for additional fields"
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
        SELECT 'wide', 'wide-' || (g % 4), 'changed', jsonb_build_object('seq', g),
               jsonb_build_object('x-blob', repeat('h', 30000))
        FROM generate_series(1, 40) AS g ORDER BY g"
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, note)
        SELECT 'wide', repeat('k', 20000) || (g % 2), 'changed', jsonb_build_object('seq', g),
               repeat('n', 20000)
        FROM generate_series(41, 60) AS g ORDER BY g"
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
        VALUES ('wide', 'wide-h', 'changed', '{\"seq\": 61}',
                jsonb_build_object('x-blob', repeat('h', 1100000)))" || fail "B: insert"
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, note)
        VALUES ('wide', 'wide-n', 'changed', '{\"seq\": 62}', repeat('N', 1100000))" ||
    fail "B: insert"
WIDE_H=$(psql_q "SELECT id FROM outbox WHERE aggregate_id = 'wide-h'")
WIDE_N=$(psql_q "SELECT id FROM outbox WHERE payload->>'seq' = '62' AND aggregate_type = 'wide'")
NOTE_BYTES="+ octet_length(json_build_object('x-note', note::text)::text)" # the additional field, as claimed
WIDE_H_BYTES=$(message_bytes "$NOTE_BYTES" "$WIDE_H")
WIDE_N_BYTES=$(message_bytes "$NOTE_BYTES" "$WIDE_N")
BUDGET_B=200000
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --batch-bytes "$BUDGET_B" \
    --additional-fields note:header:x-note --retry-backoff 60000 --log-level debug \
    --kafka reconnect.backoff.max.ms=500
wide_sent() {
    [ "$(psql_q "SELECT count(*) FROM outbox WHERE aggregate_type = 'wide'
                 AND id NOT IN ($WIDE_H, $WIDE_N) AND sent_at IS NULL")" = 0 ]
}
wait_for "B: every row but the two oversized ones is delivered" 60 wide_sent
grep 'msg="claimed batch"' "$RELAY_LOG" | sed -E 's/.* rows=([0-9]+) .* bytes=([0-9]+) .*/\1 \2/' \
    >"$T/batches-b.txt"
echo "# B: batches (rows bytes): $(sort -n "$T/batches-b.txt" | uniq -c | tr -s ' ' | tr '\n' ';')"
check "B: batches were claimed" test -s "$T/batches-b.txt"
check_eq "B: no batch of several rows holds more than $BUDGET_B bytes by the relay's count" "" \
    "$(awk -v b="$BUDGET_B" '$1 > 1 && $2 > b' "$T/batches-b.txt")"
check "B: the header bytes are counted (batches of several rows hold over 100,000 bytes)" \
    awk '$1 > 1 && $2 > 100000 { found = 1 } END { exit !found }' "$T/batches-b.txt"
check_eq "B: no batch loaded an oversized row" "" "$(awk '$2 >= 1000000' "$T/batches-b.txt")"
both_rejected() {
    [ "$(psql_q "SELECT count(*) FROM outbox WHERE id IN ($WIDE_H, $WIDE_N)
                 AND rejections >= 1")" = 2 ]
}
wait_for "B: both oversized rows are rejected" 30 both_rejected
check_eq "B: the one with 1.1 MB headers, with its real size" \
    "message too large: $WIDE_H_BYTES bytes with key and headers, over the producer's message.max.bytes of 1000000 (not sent)" \
    "$(psql_q "SELECT last_error FROM outbox WHERE id = $WIDE_H")"
check_eq "B: the one with a 1.1 MB additional field, with its real size" \
    "message too large: $WIDE_N_BYTES bytes with key and headers, over the producer's message.max.bytes of 1000000 (not sent)" \
    "$(psql_q "SELECT last_error FROM outbox WHERE id = $WIDE_N")"
consume --topic outbox.event.wide --to-end --timeout-ms 30000 >"$T/wide.json"
check "B: every other row is in Kafka, with its headers" \
    diff <(jq -r 'select(.headers["x-blob"] != null or .headers["x-note"] != null) | .headers.id' \
        "$T/wide.json" | sort -u) \
    <(psql_q "SELECT event_id FROM outbox WHERE aggregate_type = 'wide'
              AND id NOT IN ($WIDE_H, $WIDE_N)" | sort)
check "B: first copies in order per aggregate" first_copies_in_order "$T/wide.json"
relay_stop
check_eq "B: the relay exits 0" 0 "$?"

# --- D: binary payloads, counted as the result holds them --------------------------------------
psql_q "CREATE TABLE bin_outbox (id uuid NOT NULL PRIMARY KEY DEFAULT gen_random_uuid(),
            aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL,
            payload bytea)" || fail "D: create bin_outbox"
printf '{"layout": "debezium", "table": "bin_outbox", "payload-format": "binary"}\n' >"$T/bin.json"
relay_migrate --config "$T/bin.json" 2>>"$T/migrate.log" || fail "D: migrate adopts bin_outbox"
psql_q "INSERT INTO bin_outbox (aggregatetype, aggregateid, type, payload)
        SELECT 'bin', 'b-' || (g % 4), 'Blob', (SELECT string_agg(decode(md5(g || '-' || i), 'hex'),
                                                                  ''::bytea ORDER BY i)
                                               FROM generate_series(1, 6250) i)
        FROM generate_series(1, 40) g ORDER BY g" || fail "D: insert 40 rows of 100,000 bytes"
relay_start --config "$T/bin.json" --database-url "$DATABASE_URL" --brokers "$BROKERS" \
    --batch-bytes 1048576 --log-level debug
bin_sent() { [ "$(psql_q "SELECT count(*) FROM bin_outbox WHERE sent_at IS NULL")" = 0 ]; }
wait_for "D: every binary row is delivered" 60 bin_sent
relay_stop
check_eq "D: the relay exits 0" 0 "$?"
grep 'msg="claimed batch"' "$RELAY_LOG" | sed -E 's/.* rows=([0-9]+) .* bytes=([0-9]+) .*/\1 \2/' \
    >"$T/bin-batches.txt"
echo "# D: batches (rows bytes): $(sort -n "$T/bin-batches.txt" | uniq -c | tr -s ' ' | tr '\n' ';')"
check "D: batches were claimed" test -s "$T/bin-batches.txt"
check_eq "D: no batch of several rows holds more than 1,048,576 bytes as loaded" "" \
    "$(awk '$1 > 1 && $2 > 1048576' "$T/bin-batches.txt")"
consume --topic outbox.event.bin --to-end --hex --timeout-ms 20000 >"$T/bin.out"
check_eq "D: each message is its row's 100,000 bytes" "" \
    "$(psql_q "SELECT id::text || ' ' || md5(encode(payload, 'hex')) FROM bin_outbox" |
        sort >"$T/bin.want" &&
        jq -r '.headers.id + " " + .value_hex' "$T/bin.out" |
        while read -r id hex; do echo "$id $(printf '%s' "$hex" | md5sum | cut -d ' ' -f 1)"; done |
            sort -u | diff - "$T/bin.want")"

# --- C: memory with oversized headers ------------------------------------------------------------
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
        SELECT 'fat', 'fat-' || g, 'changed', jsonb_build_object('seq', g),
               jsonb_build_object('x-blob', g || repeat(md5(g::text), 33000))
        FROM generate_series(1, 60) AS g ORDER BY g" || fail "C: insert"
RELAY_BIN=$BIN/outbox-relay
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --sessions 1 --batch-bytes 65536 \
    --retry-backoff 60000 --kafka reconnect.backoff.max.ms=500
fat_rejected() {
    [ "$(psql_q "SELECT count(*) FROM outbox WHERE aggregate_type = 'fat'
                 AND rejections >= 1")" = 60 ]
}
wait_for "C: all 60 rows with 1 MB headers are rejected" 180 fat_rejected
hwm_kb=$(awk '/^VmHWM:/ { print $2 }' "/proc/$RELAY_PID/status")
echo "# C: peak RSS ${hwm_kb} kB"
check "C: the relay's peak RSS stays under 40 MB (main: 71 MB)" test "${hwm_kb:-999999}" -lt 40960
relay_stop
check_eq "C: the relay exits 0" 0 "$?"
