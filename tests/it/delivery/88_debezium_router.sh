#!/bin/bash
# Proves the rest of Debezium's Outbox Event Router, configured by Debezium's option names:
#  1. a bytea payload column (--payload-format binary) is published byte for byte: NUL, 0xff,
#     CR/LF, every byte value, an empty value and a NULL (a tombstone); as CloudEvents, with
#     content-type application/octet-stream (application/json, the default once, told SDKs to
#     parse the bytes as JSON);
#  2. table.field.event.timestamp: the column's time is each message's timestamp (ms); a row
#     timed infinity or -infinity is dead, naming the column, and the others are sent;
#  3. the partition placement (COLUMN:partition) puts each message in the partition its row
#     names, also when an aggregate's rows name different partitions (with --order-scope
#     partition: order then holds per aggregate within each partition, which the first copies
#     show, and verify, holding order to the same scope, finds nothing out of order); without
#     --order-scope partition it is refused at start-up with one line; a value
#     that is no partition number is the row's fault, dead-lettered naming the column;
#  4. the envelope placement (COLUMN:envelope[:NAME]): the value becomes
#     {"payload": <payload>, NAME: <column>}, a NULL payload null in it (Debezium's default);
#     with route.tombstone.on.empty.payload a NULL or blank payload is a tombstone instead; with
#     a binary payload the envelope is refused at start-up;
#  5. route.tombstone.on.empty.payload costs a claim no conversion of the payloads the byte
#     budget leaves out: with rows of 200 KB, one to a claim, the payloads' TOAST is read about
#     once in all (pg_statio's TOAST block reads), not once per claim each row waited through;
#  6. nor does the envelope placement: the envelope of a row the budget leaves out is not built
#     (the same count, on a table with an envelope field), and the envelope is what the budget
#     counts: with --batch-bytes below two envelopes, each claim returns one;
#  7. nor do the headers: the headers column and the fields placed as headers of a row the
#     budget leaves out are not converted to text (the same count, on a table with both).
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1

# --- 1, 2, 3: a Debezium table with a bytea payload, a time and a partition column ---
psql_q "CREATE TABLE bin_outbox (
            id uuid NOT NULL PRIMARY KEY DEFAULT gen_random_uuid(),
            aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL,
            payload bytea, occurred_at timestamptz, part int)" || fail "create bin_outbox"
cat >"$T/bin.json" <<'EOF'
{
  "layout": "debezium",
  "table": "bin_outbox",
  "payload-format": "binary",
  "table.field.event.timestamp": "occurred_at",
  "table.fields.additional.placement": "type:header:eventType,part:partition",
  "order-scope": "partition"
}
EOF
relay_migrate --config "$T/bin.json" 2>"$T/migrate.log"
check_eq "1: migrate adopts the bytea table" 0 $?
# 40 rows over 4 aggregates; every byte value appears (row 1 holds 0..255), then NULs, 0xff and
# line breaks around an md5; row 5 is empty, row 6 NULL. Aggregate a-0's rows move between
# partitions (g % 3), the others stay in theirs. Times: 2020-01-02 03:04:05.678 UTC + g seconds.
psql_q "INSERT INTO bin_outbox (aggregatetype, aggregateid, type, payload, occurred_at, part)
        SELECT 'bin', 'a-' || (g % 4), 'Blob',
               CASE WHEN g = 1 THEN (SELECT string_agg(set_byte('\\x00'::bytea, 0, b), ''::bytea
                                                       ORDER BY b) FROM generate_series(0, 255) b)
                    WHEN g = 5 THEN ''::bytea WHEN g = 6 THEN NULL
                    ELSE '\\x00ff0d0a'::bytea || decode(md5(g::text), 'hex') || '\\x00'::bytea END,
               timestamptz '2020-01-02 03:04:05.678+00' + g * interval '1 s',
               CASE WHEN g % 4 = 0 THEN g % 3 ELSE g % 4 END
        FROM generate_series(1, 40) g" || fail "insert binary rows"
# A partition number no topic has: the row's fault (max-attempts 1: dead at once).
psql_q "INSERT INTO bin_outbox (aggregatetype, aggregateid, type, payload, part)
        VALUES ('bin', 'bad', 'Blob', '\\x01', -1)" || fail "insert a bad partition row"
# Times with no epoch in milliseconds: each row's own fault, not the claim's (which would stop
# every row of the session's lanes).
psql_q "INSERT INTO bin_outbox (aggregatetype, aggregateid, type, payload, occurred_at, part)
        VALUES ('bin', 'inf', 'Blob', '\\x02', 'infinity', 0),
               ('bin', 'ninf', 'Blob', '\\x03', '-infinity', 0)" || fail "insert infinite times"

"$RELAY_BIN" check --config "$T/bin.json" --database-url "$DATABASE_URL" --brokers "$BROKERS" \
    >"$T/check.out" 2>&1
check "1: check: the bytea column goes out byte for byte" \
    grep -q "^ok    payload: column payload is bytea: published byte for byte" "$T/check.out"
"$RELAY_BIN" check --config "$T/bin.json" --payload-format text --database-url "$DATABASE_URL" \
    --brokers "$BROKERS" >"$T/check.out" 2>&1
check_eq "1: check without --payload-format binary: exit 1" 1 $?
check "1: ... saying to set it" grep -q "^FAIL  payload: column payload is bytea: set --payload-format binary" \
    "$T/check.out"
relay_start --config "$T/bin.json" --database-url "$DATABASE_URL" --brokers "$BROKERS" \
    --max-attempts 1 --message-format cloudevents
bin_done() {
    [ "$(psql_q "SELECT count(*) FROM bin_outbox WHERE sent_at IS NULL AND dead_at IS NULL")" = 0 ]
}
wait_for "1: every row sent or dead" 30 bin_done
relay_stop
check_eq "1: relay exits 0" 0 $?

consume --topic outbox.event.bin --to-end --hex --timeout-ms 20000 >"$T/bin.out"
jq -s 'group_by(.headers.id) | map(.[0])' "$T/bin.out" >"$T/bin.first.json"
psql_q "SELECT json_build_object('id', id::text, 'hex', encode(payload, 'hex'), 'null', payload IS NULL,
                                 'ts', floor(extract(epoch FROM occurred_at) * 1000)::bigint,
                                 'part', part)
        FROM bin_outbox WHERE dead_at IS NULL ORDER BY seq" >"$T/bin.rows.json"
check_eq "1: 40 distinct events" 40 "$(jq length "$T/bin.first.json")"
check_eq "1: every value is its row's bytes (hex compared), NULL a tombstone" "" \
    "$(jq -n --slurpfile rows "$T/bin.rows.json" --slurpfile got "$T/bin.first.json" '
        ($got[0] | map({key: .headers.id, value: .}) | from_entries) as $by_id
        | $rows[] | select(if .null then $by_id[.id].value_hex != null
                           else $by_id[.id].value_hex != .hex end) | .id')"
check_eq "1: the 256-byte row arrived whole" 512 \
    "$(jq -r 'select(.value_hex != null) | .value_hex | length' "$T/bin.out" | sort -n | tail -n 1)"
check_eq "1: the empty payload is an empty value, not a tombstone" 1 \
    "$(jq -s '[.[] | select(.value_hex == "")] | map(.headers.id) | unique | length' "$T/bin.out")"
check_eq "1: as CloudEvents, each says its data is bytes (content-type), not JSON" \
    application/octet-stream "$(jq -r '.headers["content-type"]' "$T/bin.out" | sort -u)"

# --- 2. ---
check_eq "2: each message's timestamp is its row's occurred_at in ms" "" \
    "$(jq -n --slurpfile rows "$T/bin.rows.json" --slurpfile got "$T/bin.first.json" '
        ($got[0] | map({key: .headers.id, value: .}) | from_entries) as $by_id
        | $rows[] | select($by_id[.id].timestamp_ms != .ts) | .id')"

# --- 3. ---
check_eq "3: each message is in the partition its row names" "" \
    "$(jq -n --slurpfile rows "$T/bin.rows.json" --slurpfile got "$T/bin.first.json" '
        ($got[0] | map({key: .headers.id, value: .}) | from_entries) as $by_id
        | $rows[] | select($by_id[.id].partition != .part) | .id')"
check_eq "3: aggregate a-0 spans three partitions" 3 \
    "$(jq -s '[.[] | select(.key == "a-0") | .partition] | unique | length' "$T/bin.out")"
# Per aggregate within each partition, the first copies come in row (timestamp) order.
check_eq "3: first copies in order per aggregate and partition" "" \
    "$(jq -r '[.headers.id, .key, .partition, .timestamp_ms] | @tsv' "$T/bin.out" | awk -F '\t' '
        $1 in seen { next }
        { seen[$1] = 1; k = $2 "/" $3 }
        (k in last) && $4 <= last[k] { print "key " k ": " $4 " after " last[k] }
        { last[k] = $4 }')"
# verify holds the order to the same scope: a-0's rows in different partitions are not out of
# order (it used to compare them across partitions and report FAILED).
"$RELAY_BIN" verify --config "$T/bin.json" --database-url "$DATABASE_URL" --brokers "$BROKERS" \
    --since 1h >"$T/verify.out" 2>"$T/verify.err"
check_eq "3: verify with --order-scope partition: exit 0" 0 $?
check "3: ... every row found, none out of order" grep -q \
    '^verify: ok: window=3600s rows=40 messages=40 missing=0 out_of_order=0' "$T/verify.out"
check "3: the row with partition -1 is dead, its error naming the column" \
    grep -q "partition column part: '-1'" \
    <(psql_q "SELECT last_error FROM bin_outbox WHERE aggregateid = 'bad' AND dead_at IS NOT NULL")

for agg in inf:infinity ninf:-infinity; do
    check "2: the row timed ${agg#*:} is dead, its error naming the column" \
        grep -q "timestamp column occurred_at: '${agg#*:}'" \
        <(psql_q "SELECT last_error FROM bin_outbox WHERE aggregateid = '${agg%%:*}' AND dead_at IS NOT NULL")
done

bad() {
    local name=$1
    shift
    "$RELAY_BIN" run "$@" --database-url "$DATABASE_URL" --brokers "$BROKERS" >"$T/bad.out" 2>&1
    check_eq "$name: exits 2" 2 $?
    check_eq "$name: one line" 1 "$(grep -c '' "$T/bad.out")"
    check "$name: says why" grep -q "$PATTERN" "$T/bad.out"
}
PATTERN="part:partition needs --order-scope partition" bad "3: partition without the scope" \
    --config "$T/bin.json" --order-scope aggregate
PATTERN="envelope placement needs a text payload" bad "4: envelope with a binary payload" \
    --config "$T/bin.json" --additional-fields type:envelope

# --- 4: envelope ---
psql_q "CREATE TABLE env_outbox (
            id uuid NOT NULL PRIMARY KEY DEFAULT gen_random_uuid(),
            aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL,
            payload jsonb, tenant int)" || fail "create env_outbox"
ENV=(--layout debezium --table env_outbox
    --table.fields.additional.placement 'type:envelope:eventType,tenant:envelope,type:header:eventType')
relay_migrate "${ENV[@]}" 2>"$T/migrate-env.log"
check_eq "4: migrate adopts env_outbox" 0 $?
psql_q "INSERT INTO env_outbox (aggregatetype, aggregateid, type, payload, tenant)
        VALUES ('env', 'e-1', 'Created', '{\"seq\": 1, \"n\": [1, 2]}', 7),
               ('env', 'e-1', 'Deleted', NULL, NULL)" || fail "4: insert"
relay_start "${ENV[@]}" --database-url "$DATABASE_URL" --brokers "$BROKERS"
env_done() {
    [ "$(psql_q "SELECT count(*) FROM env_outbox WHERE sent_at IS NULL")" = 0 ]
}
wait_for "4: both rows sent" 30 env_done
relay_stop
consume --topic outbox.event.env --to-end --timeout-ms 20000 >"$T/env.out"
check_eq "4: the value is the envelope: payload and the fields" \
    '{"payload":{"n":[1,2],"seq":1},"eventType":"Created","tenant":7}' \
    "$(jq -c 'select(.headers.eventType == "Created") | .value | fromjson' "$T/env.out" | head -n 1)"
check_eq "4: a NULL payload is null in the envelope (Debezium's default), not a tombstone" \
    '{"payload":null,"eventType":"Deleted","tenant":null}' \
    "$(jq -c 'select(.headers.eventType == "Deleted") | .value | fromjson' "$T/env.out" | head -n 1)"

# route.tombstone.on.empty.payload: a NULL payload and a blank one (Java's trim() leaves
# nothing: spaces, a tab, a line break) are tombstones, with the envelope too; others are not.
psql_q "CREATE TABLE env_text (
            id uuid NOT NULL PRIMARY KEY DEFAULT gen_random_uuid(),
            aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL,
            payload text)" || fail "create env_text"
ENVT=(--layout debezium --table env_text --route.tombstone.on.empty.payload=true
    --table.fields.additional.placement 'type:envelope:eventType,type:header:eventType')
relay_migrate "${ENVT[@]}" 2>"$T/migrate-envt.log"
check_eq "4: migrate adopts env_text" 0 $?
psql_q "INSERT INTO env_text (aggregatetype, aggregateid, type, payload)
        VALUES ('envt', 't-1', 'Null', NULL), ('envt', 't-1', 'Blank', E' \\t\\n '),
               ('envt', 't-1', 'Text', ' x ')" || fail "4: insert into env_text"
relay_start "${ENVT[@]}" --database-url "$DATABASE_URL" --brokers "$BROKERS"
envt_done() {
    [ "$(psql_q "SELECT count(*) FROM env_text WHERE sent_at IS NULL")" = 0 ]
}
wait_for "4: the three env_text rows sent" 30 envt_done
relay_stop
consume --topic outbox.event.envt --to-end --timeout-ms 20000 >"$T/envt.out"
check_eq "4: tombstone.on.empty.payload: NULL and blank payloads are tombstones, text is not" \
    'Blank null|Null null|Text {"payload":" x ","eventType":"Text"}' \
    "$(jq -r '"\(.headers.eventType) \(.value | if . == null then "null" else (fromjson | tojson) end)"' \
        "$T/envt.out" | sort -u | paste -sd '|')"

# --- 5: the tombstone test converts no payload the budget leaves out ---
# 16 jsonb rows of about 200 KB: --batch-bytes 64 KiB returns one a claim, so claims that
# converted every claimed row to text would read the TOAST of rows they did not return, each
# several times over (measured: 3.9 times the table's TOAST); claims that convert only what they
# return read it about once (1.03).
psql_q "CREATE TABLE big_outbox (
            id uuid NOT NULL PRIMARY KEY DEFAULT gen_random_uuid(),
            aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL,
            payload jsonb)" || fail "create big_outbox"
BIG=(--layout debezium --table big_outbox --route.tombstone.on.empty.payload=true
    --table.fields.additional.placement 'type:header:eventType')
relay_migrate "${BIG[@]}" 2>"$T/migrate-big.log"
check_eq "5: migrate adopts big_outbox" 0 $?
psql_q "INSERT INTO big_outbox (aggregatetype, aggregateid, type, payload)
        SELECT 'big', 'b-1', 'Big', (SELECT pg_catalog.jsonb_object_agg('k' || i,
                    pg_catalog.md5((g * 10000 + i)::text)) FROM generate_series(1, 4500) i)
        FROM generate_series(1, 16) g" || fail "5: insert"
toast_blocks_read() { # the TOAST blocks of table $1 read so far (from the buffers or the disk)
    psql_q "SELECT coalesce(toast_blks_read, 0) + coalesce(toast_blks_hit, 0)
            FROM pg_statio_user_tables WHERE relname = '$1'"
}
other_backends_gone() { # ended sessions have flushed their statistics
    [ "$(psql_q "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'
                 AND pid <> pg_backend_pid()")" = 0 ]
}
# send_counting_toast PART TABLE ROWS RELAY_ARGS...: with no other session open, a relay (RELAY_ARGS,
# one session, batches of ROWS, --batch-bytes 64 KiB) sends every row of TABLE; sets READ to the
# TOAST blocks of TABLE read meanwhile and TOAST_BLOCKS to the size of TABLE's TOAST in blocks.
send_counting_toast() {
    local part=$1 table=$2 rows=$3 before
    shift 3
    wait_for "$part: no other session before the count" 30 other_backends_gone
    before=$(toast_blocks_read "$table")
    TOAST_BLOCKS=$(psql_q "SELECT pg_catalog.pg_relation_size(reltoastrelid) / 8192 FROM pg_class
                           WHERE relname = '$table'")
    relay_start "$@" --database-url "$DATABASE_URL" --brokers "$BROKERS" \
        --batch-size "$rows" --batch-bytes 65536 --sessions 1
    all_sent() { [ "$(psql_q "SELECT count(*) FROM $table WHERE sent_at IS NULL")" = 0 ]; }
    wait_for "$part: the $rows rows sent" 60 all_sent
    relay_stop
    check_eq "$part: relay exits 0" 0 $?
    wait_for "$part: the relay's sessions ended" 30 other_backends_gone
    READ=$(($(toast_blocks_read "$table") - before))
    echo "$part: TOAST blocks read while sending: $READ; the table's TOAST: $TOAST_BLOCKS blocks"
}
send_counting_toast 5 big_outbox 16 "${BIG[@]}"
check "5: each payload's TOAST read about once ($READ blocks read, $TOAST_BLOCKS in the table)" \
    test "$READ" -le $((2 * TOAST_BLOCKS))
check "5: the count is no zero: the reads were seen ($READ blocks)" test "$READ" -ge "$TOAST_BLOCKS"

# --- 6: nor does the envelope: it is built for the rows the budget returns only ---
# The same 16 rows of about 200 KB, with an envelope field and no tombstone test: claims that
# built every claimed row's envelope (json_build_object converts the payload to text) read the
# TOAST of rows they did not return, each several times over; claims that build it after the
# budget's cut read it about once. 64 KiB holds one envelope (the payload's text and the field),
# never two: a claim returning two would be over --batch-bytes.
psql_q "CREATE TABLE big_env (
            id uuid NOT NULL PRIMARY KEY DEFAULT gen_random_uuid(),
            aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL,
            payload jsonb, tenant int)" || fail "create big_env"
BIGE=(--layout debezium --table big_env
    --table.fields.additional.placement 'tenant:envelope,type:header:eventType')
relay_migrate "${BIGE[@]}" 2>"$T/migrate-bige.log"
check_eq "6: migrate adopts big_env" 0 $?
psql_q "INSERT INTO big_env (aggregatetype, aggregateid, type, payload, tenant)
        SELECT 'bige', 'e-1', 'Big', (SELECT pg_catalog.jsonb_object_agg('k' || i,
                    pg_catalog.md5((g * 10000 + i)::text)) FROM generate_series(1, 4500) i), g
        FROM generate_series(1, 16) g" || fail "6: insert"
send_counting_toast 6 big_env 16 "${BIGE[@]}"
check "6: each payload's TOAST read about once ($READ blocks read, $TOAST_BLOCKS in the table)" \
    test "$READ" -le $((2 * TOAST_BLOCKS))
check "6: the count is no zero: the reads were seen ($READ blocks)" test "$READ" -ge "$TOAST_BLOCKS"
consume --topic outbox.event.bige --to-end --timeout-ms 20000 >"$T/bige.out"
check_eq "6: each value is its envelope: the payload whole and the field" "16 16" \
    "$(jq -r '.value | fromjson | "\(.tenant) \(.payload | length)"' "$T/bige.out" | sort -un \
        | awk '{ n++; k += ($2 == 4500) } END { print n, k }')"

# --- 7: nor do the headers: the headers column and the fields placed as headers are converted
# to text for the rows the budget returns only ---
# 32 rows, each with a headers column of about 45 KB (jsonb), a field placed as a header of about
# 19 KB (a message takes 64 KiB of headers) and a payload of about 12 KB (all stored uncompressed),
# one to a claim (--batch-bytes 64 KiB): claims that converted every claimed row's
# headers (o.headers::text, json_build_object over the field) read the TOAST of rows they did not
# return, each several times over; claims that convert them after the budget's cut read it about
# once.
psql_q "CREATE TABLE big_hdr (
            id uuid NOT NULL PRIMARY KEY DEFAULT gen_random_uuid(),
            aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL,
            payload jsonb, hdrs jsonb, note text)" || fail "create big_hdr"
psql_q "ALTER TABLE big_hdr ALTER COLUMN hdrs SET STORAGE EXTERNAL,
            ALTER COLUMN note SET STORAGE EXTERNAL, ALTER COLUMN payload SET STORAGE EXTERNAL" ||
    fail "7: storage"
BIGH=(--layout debezium --table big_hdr --headers-column hdrs
    --table.fields.additional.placement 'note:header:x-note,type:header:eventType')
relay_migrate "${BIGH[@]}" 2>"$T/migrate-bigh.log"
check_eq "7: migrate adopts big_hdr" 0 $?
psql_q "INSERT INTO big_hdr (aggregatetype, aggregateid, type, payload, hdrs, note)
        SELECT 'bigh', 'h-1', 'Big', (SELECT pg_catalog.jsonb_object_agg('k' || i,
                    pg_catalog.md5((g * 10000 + i)::text)) FROM generate_series(1, 300) i),
               jsonb_build_object('x-blob', (SELECT string_agg(pg_catalog.md5((g * 10000 + i)::text), '')
                                             FROM generate_series(1, 1400) i)),
               (SELECT string_agg(pg_catalog.md5((g * 10000 + i)::text), '')
                FROM generate_series(5001, 5600) i)
        FROM generate_series(1, 32) g" || fail "7: insert"
send_counting_toast 7 big_hdr 32 "${BIGH[@]}"
# At most 1.5 times, not twice as in 5 and 6: claims converting only the field early read 1.96
# times the table (628 of 320 blocks), only the headers column 2.3 times (750), both 3.1 times
# (994); converting neither, 1.2 times (384).
check "7: each row's headers' TOAST read about once ($READ blocks read, $TOAST_BLOCKS in the table)" \
    test "$READ" -le $((3 * TOAST_BLOCKS / 2))
check "7: the count is no zero: the reads were seen ($READ blocks)" test "$READ" -ge "$TOAST_BLOCKS"
consume --topic outbox.event.bigh --to-end --timeout-ms 20000 >"$T/bigh.out"
check_eq "7: each message carries both headers and its payload whole" "32 32 32 32" \
    "$(jq -r '"\(.headers["x-blob"] | length) \(.headers["x-note"] | length) \(.value | fromjson | length)"' \
        "$T/bigh.out" | awk '{ n++; b += ($1 == 44800); t += ($2 == 19200); p += ($3 == 300) }
                             END { print n, b, t, p }')"
