#!/bin/bash
# Proves `outbox-relay verify` against a real broker and outbox:
#  1. after a clean run (600 rows over 30 aggregates delivered by the relay) it exits 0, every
#     row found, nothing out of order, in text and in --json;
#  2. a row marked sent that was never published: exit 1, that row named as missing;
#  3. two rows of one aggregate whose messages a hand-run producer wrote in the wrong order:
#     exit 1, the pair named as out of order; a message whose id no row has is counted unknown;
#  4. bad input (no brokers, a bad --since, a topic template or --kafka property run refuses)
#     exits 2 with one line;
#  5. on a table another session holds locked (a migration, a VACUUM FULL) it gives up after
#     10 s with exit 1 and one line, rather than wait as long as the lock is held;
#  6. an id header someone wrote to the topic with a terminal control sequence in it is shown
#     escaped, as the log escapes it: no control character reaches the operator's terminal;
#  7. the messages no row of the window has (sent before it, or unknown) are looked up through
#     the event id's unique index, not with a scan of the whole table each (0.2 s a message at a
#     million rows: hours for a topic read whole): counted by the rows sequential scans read;
#  9. a read of the window that takes longer than the 30 s the one-shot commands dead, status and
#     the like give a statement (a long window on a large table) still completes: verify bounds
#     its lock waits only, not its statements;
# 10. an order break between two rows of an aggregate with a missing row between them is still
#     reported out of order, beside the missing row;
# 11. an event id longer than 255 characters (a text column) is found whole.
# Read by time on a broker that cannot look offsets up by time (the mock cluster), rows missing
# prove nothing: "inconclusive", exit 3 (part 1), never FAILED.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 3
relay_migrate 2>"$T/migrate.log" || fail "migrate"

# verify [FLAGS...]: runs the command; stdout to $T/verify.out, stderr to $T/verify.err.
# --from-beginning: librdkafka's mock cluster cannot look offsets up by time (it answers "the
# end" for every timestamp), which the first check below also shows.
verify() {
    "$RELAY_BIN" verify --database-url "$DATABASE_URL" --brokers "$BROKERS" --since 1h \
        --from-beginning "$@" \
        >"$T/verify.out" 2>"$T/verify.err"
}

# --- 1. a clean run ---
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'order', 'o-' || (g % 30), 'Updated', jsonb_build_object('n', g)
        FROM generate_series(1, 600) g ORDER BY g"
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS"
wait_for "1: every row sent" 60 no_unsent_rows
relay_stop

verify
check_eq "1: verify exits 0 after a clean run" 0 $?
check "1: the summary says ok, 600 rows, none missing or out of order" grep -q \
    '^verify: ok: window=3600s rows=600 messages=600 missing=0 out_of_order=0 duplicates=0 unknown=0' \
    "$T/verify.out"
check_eq "1: nothing on stderr" "" "$(cat "$T/verify.err")"
verify --json
check_eq "1: --json: ok, 600 rows, 0 missing" "true 600 0 0" \
    "$(jq -r '"\(.ok) \(.rows) \(.missing) \(.out_of_order)"' "$T/verify.out")"

"$RELAY_BIN" verify --database-url "$DATABASE_URL" --brokers "$BROKERS" --since 1h \
    >"$T/bytime.out" 2>"$T/bytime.err"
check_eq "1: by time on the mock cluster: nothing read, inconclusive (exit 3), not FAILED" 3 $?
check "1: ... the summary says INCONCLUSIVE, not FAILED" grep -q \
    '^verify: INCONCLUSIVE: window=3600s rows=600 messages=0 missing=600' "$T/bytime.out"
check "1: ... and says what to run instead" grep -q \
    '^verify: inconclusive: .* partition(s) could not be positioned by time.*--from-beginning' \
    "$T/bytime.out"
check "1: ... and a warning says why and names --from-beginning" grep -q \
    'level=warn msg="by their timestamps, some partitions hold nothing.*--from-beginning' \
    "$T/bytime.err"

# --- 2. marked sent, never published ---
lost=$(psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
               VALUES ('order', 'o-lost', 'Created', '{}', now()) RETURNING event_id")
verify
check_eq "2: a row marked sent without a message: exit 1" 1 $?
check "2: the summary counts it missing" grep -q 'missing=1 out_of_order=0' "$T/verify.out"
check "2: the row is named" grep -q "verify: missing: id=[0-9]* event_id=$lost" "$T/verify.err"

# --- 3. out of order by hand, and an unknown message ---
read -r first second < <(psql_q "WITH r AS (
    INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
    SELECT 'order', 'o-hand', 'Step', jsonb_build_object('n', g), now()
    FROM generate_series(1, 2) g ORDER BY g RETURNING id, event_id)
    SELECT string_agg(event_id::text, ' ' ORDER BY id) FROM r")
printf '%s\n' \
    "{\"key\": \"o-hand\", \"value\": \"2\", \"headers\": [[\"id\", \"$second\"]]}" \
    "{\"key\": \"o-hand\", \"value\": \"1\", \"headers\": [[\"id\", \"$first\"]]}" \
    "{\"key\": \"o-x\", \"value\": \"?\", \"headers\": [[\"id\", \"no-such-event\"]]}" |
    "$BIN/produce" --brokers "$BROKERS" --topic outbox.event.order >/dev/null ||
    fail "produce the hand-made messages"
verify
check_eq "3: messages out of their aggregate's order: exit 1" 1 $?
check "3: the summary counts one pair out of order and one unknown message" grep -q \
    'out_of_order=1 duplicates=0 unknown=1' "$T/verify.out"
check "3: the pair is named" grep -q "out of order: id=[0-9]* event_id=$first .* comes after id=[0-9]* event_id=$second" "$T/verify.err"
check "3: the unknown message is named" grep -q 'unknown message: id=no-such-event' "$T/verify.err"

# --- 4. bad input ---
"$RELAY_BIN" verify --database-url "$DATABASE_URL" >"$T/bad.out" 2>"$T/bad.err"
check_eq "4: no brokers: exit 2" 2 $?
check_eq "4: one line" 1 "$(grep -c '' "$T/bad.err")"
"$RELAY_BIN" verify --database-url "$DATABASE_URL" --brokers "$BROKERS" --since 1y \
    >"$T/bad.out" 2>"$T/bad.err"
check_eq "4: a bad --since: exit 2" 2 $?
check "4: the error names --since" grep -q -- '--since' "$T/bad.err"
# A template run refuses is a typo, not data loss: it used to make every row "missing", FAILED.
"$RELAY_BIN" verify --database-url "$DATABASE_URL" --brokers "$BROKERS" --since 1h \
    --from-beginning --topic-template 'outbox.event.{bogus}' >"$T/bad.out" 2>"$T/bad.err"
check_eq "4: a topic template run refuses: exit 2, not FAILED" 2 $?
check_eq "4: ... one line, naming the placeholder" 1 "$(grep -c 'unknown placeholder' "$T/bad.err")"
check_eq "4: ... and nothing reported missing" "" "$(cat "$T/bad.out")"
"$RELAY_BIN" verify --database-url "$DATABASE_URL" --brokers "$BROKERS" --since 1h \
    --kafka no.such.prop=1 >"$T/bad.out" 2>"$T/bad.err"
check_eq "4: a --kafka property librdkafka refuses: exit 2, as run" 2 $?
check "4: ... naming it" grep -q 'kafka no.such.prop' "$T/bad.err"

# --- 5. a table someone else holds locked ---
table_lock_open
wait_for "5: the table locked by another session" 10 table_lock_held
timeout 40 "$RELAY_BIN" verify --database-url "$DATABASE_URL" --brokers "$BROKERS" --since 1h \
    --from-beginning >"$T/locked.out" 2>"$T/locked.err"
check_eq "5: verify on a locked table gives up: exit 1" 1 $?
check_eq "5: ... one line" 1 "$(grep -c '' "$T/locked.err")"
check "5: ... that names the lock timeout" grep -q 'lock timeout' "$T/locked.err"
table_lock_close

# --- 6. an id header with a terminal control sequence ---
# ESC ] 0 ; ... BEL sets a terminal's title; ESC [ 2 J clears the screen.
printf '%s\n' \
    '{"key": "o-x", "value": "?", "headers": [["id", "evil\u001b]0;pwned\u0007\u001b[2J"]]}' |
    "$BIN/produce" --brokers "$BROKERS" --topic outbox.event.order >/dev/null ||
    fail "produce the hostile message"
verify
check_eq "6: verify still fails on part 3's messages: exit 1" 1 $?
check "6: the hostile id is shown escaped" grep -qF 'unknown message: id=evil\x1b]0;pwned\x07\x1b[2J' \
    "$T/verify.err"
check_eq "6: no control character on stderr" 0 "$(LC_ALL=C grep -c $'[\x01-\x08\x0b-\x1f\x7f]' "$T/verify.err")"

# --- 7. messages outside the window and unknown ones, looked up through the index ---
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
        SELECT 'order', 'o-old-' || (g % 50), 'Old', '{}', now() - interval '2 days'
        FROM generate_series(1, 20000) g; ANALYZE outbox" >/dev/null
# produce_old_and_unknown SKIP OLD UNKNOWN: messages of OLD rows sent before the window (after the
# first SKIP of them), and of UNKNOWN ids no row has.
produce_old_and_unknown() {
    psql_q "(SELECT json_build_object('key', 'o-old', 'value', '?',
                                      'headers', json_build_array(json_build_array('id', event_id)))
             FROM outbox WHERE event_type = 'Old' ORDER BY id OFFSET $1 LIMIT $2)
            UNION ALL
            SELECT json_build_object('key', 'o-gone', 'value', '?', 'headers',
                                     json_build_array(json_build_array('id', gen_random_uuid())))
            FROM generate_series(1, $3)" |
        "$BIN/produce" --brokers "$BROKERS" --topic outbox.event.order >/dev/null
}
produce_old_and_unknown 0 100 300 || fail "produce the messages outside the window"
seq_read() { # rows read by sequential scans of the table (a rescan per lookup counts no scan)
    psql_q "SELECT seq_tup_read FROM pg_stat_user_tables WHERE relid = 'outbox'::regclass"
}
verify_gone() { # its session's statistics are flushed when it ends
    [ "$(psql_q "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'outbox-relay'")" = 0 ]
}
before=$(seq_read)
# work_mem 64 kB stands in for a table whose event ids are too many to hash in work_mem (the
# planner's other way for the text comparison: one scan, hashed), as at a million rows.
PGOPTIONS='-c work_mem=64kB' verify
check_eq "7: verify still fails on part 3's messages: exit 1" 1 $?
check "7: ... 100 messages of rows sent before the window, 302 unknown (300 here)" grep -q \
    'unknown=302 outside_window=100$' "$T/verify.out"
wait_for "7: verify's session ended" 10 verify_gone
read=$(($(seq_read) - before))
rows=$(psql_q "SELECT count(*) FROM outbox")
check "7: 400 lookups read $read rows by sequential scans, not the table ($rows rows) each" \
    test "$read" -lt $((5 * rows))

# --- 8. more such messages than one lookup takes ---
# The ids no row of the window has are looked up in chunks of 1,000 as the read goes, so that
# verify's memory does not grow with the topics (--from-beginning over a long retention): 2,400
# more of old rows and 150 more unknown ones make 2,952 lookups, three chunks, counted whole.
produce_old_and_unknown 100 2400 150 || fail "produce the messages of three lookups"
verify
check_eq "8: verify still fails on part 3's messages: exit 1" 1 $?
check "8: ... 2,500 messages of rows sent before the window, 452 unknown" grep -q \
    'unknown=452 outside_window=2500$' "$T/verify.out"
check_eq "8: ... 20 unknown ones named on stderr, the rest counted" 20 \
    "$(grep -c '^verify: unknown message' "$T/verify.err")"

# --- 9. a read of the window longer than the statement bound of dead and status ---
# A view of one row whose aggregate_id takes 31 s to read stands in for a window of millions of
# rows: only the read of the window's rows asks for that column (the lookups by event id do not,
# and the function, said to be stable, lets the planner leave it out of them).
psql_q "CREATE FUNCTION slow_text(t text) RETURNS text LANGUAGE plpgsql STABLE AS
            \$\$ BEGIN PERFORM pg_catalog.pg_sleep(31); RETURN t; END \$\$;
        CREATE VIEW slow_outbox AS SELECT o.id, o.event_id, o.aggregate_type,
            slow_text(o.aggregate_id) AS aggregate_id, o.event_type, o.payload, o.sent_at
        FROM outbox o WHERE o.id = (SELECT min(id) FROM outbox)"
verify --table slow_outbox
check "9: verify read the slow window through: its summary line" grep -q '^verify: ' "$T/verify.out"
check_eq "9: ... no statement timeout" 0 "$(grep -c 'statement timeout' "$T/verify.err")"

# --- 10. an order break across a row that is missing too ---
# Rows 1, 2, 3 of one aggregate, marked sent; messages of 3 then 1, none of 2. Only neighbours in
# the aggregate's order were compared, and a missing row stopped both comparisons around it: the
# break between 1 and 3 went unreported (out_of_order stayed part 3's 1).
read -r g1 g2 g3 < <(psql_q "WITH r AS (
    INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
    SELECT 'order', 'o-gap', 'Step', jsonb_build_object('n', g), now()
    FROM generate_series(1, 3) g ORDER BY g RETURNING id, event_id)
    SELECT string_agg(event_id::text, ' ' ORDER BY id) FROM r")
printf '%s\n' \
    "{\"key\": \"o-gap\", \"value\": \"3\", \"headers\": [[\"id\", \"$g3\"]]}" \
    "{\"key\": \"o-gap\", \"value\": \"1\", \"headers\": [[\"id\", \"$g1\"]]}" |
    "$BIN/produce" --brokers "$BROKERS" --topic outbox.event.order >/dev/null ||
    fail "produce the messages around the missing row"
verify
check_eq "10: a break around a missing row: exit 1" 1 $?
check "10: the summary counts part 3's pair and this one out of order" grep -q \
    'out_of_order=2 ' "$T/verify.out"
check "10: the row between is named missing" grep -q "verify: missing: id=[0-9]* event_id=$g2" \
    "$T/verify.err"
check "10: the pair either side of it is named" grep -q \
    "out of order: id=[0-9]* event_id=$g1 .* comes after id=[0-9]* event_id=$g3" "$T/verify.err"

# --- 11. long event ids ---
# A table whose event id column is text may hold ids of any length: the id header was read into
# 255 bytes, so a longer one was no row's, and its row was called missing. A view gives one row
# a 300-character id. A 5,000-byte id header (longer than verify looks up, 4,096) is counted
# unknown without a lookup (not named here: earlier parts' unknown messages fill the 20 shown).
long_row=$(psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
                   VALUES ('order', 'o-long', 'Step', '{}', now()) RETURNING id")
psql_q "CREATE VIEW long_ids AS SELECT o.id, repeat('x', 300) || o.event_id::text AS event_id,
            o.aggregate_type, o.aggregate_id, o.event_type, o.payload, o.sent_at
        FROM outbox o WHERE o.id = $long_row"
long_id=$(psql_q "SELECT event_id FROM long_ids")
huge_id=$(printf 'y%.0s' $(seq 5000))
printf '%s\n' \
    "{\"key\": \"o-long\", \"value\": \"1\", \"headers\": [[\"id\", \"$long_id\"]]}" \
    "{\"key\": \"o-huge\", \"value\": \"?\", \"headers\": [[\"id\", \"$huge_id\"]]}" |
    "$BIN/produce" --brokers "$BROKERS" --topic outbox.event.order >/dev/null ||
    fail "produce the messages with long ids"
verify --table long_ids
check_eq "11: the window's one row, its event id 300 characters long, found: exit 0" 0 $?
check "11: ... none missing" grep -q '^verify: ok: .* rows=1 .* missing=0 ' "$T/verify.out"
