#!/bin/bash
# Proves `outbox-relay replay --missing` sends each batch only its slice of verify's list: the
# whole list went with every batch's SELECT (with 100,000 ids some 5 MB a batch, parsed again by
# the server each time), where the batches, in id order and --batch-rows at a time, need only the
# next --batch-rows ids of the sorted list.
# The slices are cut from the listed events the selection still holds (read once, beside the
# summary): cut from the whole list, a slice of rows deleted or unsent since cost a transaction
# that selected nothing, one per slice (a list of mostly deleted rows: almost one per batch-rows
# entries), and the last line did not say how many listed events were not found.
#  1. a list of 6 events, 2 of them unsent since (not selected), --batch-rows 2: every batch's
#     SELECT carries at most 2 ids (the server's log of its parameters), two batches, none for
#     the 2 not selected, and exactly the 4 still sent are replayed, in id order, the rows
#     outside the list untouched; the last line says 2 of the 6 listed were not found.
#  2. a list of 40 events, 36 of them deleted since, --batch-rows 2: two batches (not 20), the 4
#     left replayed, and the last line says 36 of the 40 were not found.
#  3. a list of 4 events still sent, 2 of them of another aggregate type, with --aggregate-type:
#     the 2 of that type replayed, and neither the line before the batches nor the last one says
#     the other 2 are not in the table as sent (they are: outside --aggregate-type); the last line
#     said "2 of the 4 events listed not in the table as sent".
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
relay_migrate 2>"$T/migrate.log" || fail "migrate"

psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
        SELECT 'order', 'o-1', 'Updated', jsonb_build_object('n', g), now()
        FROM generate_series(1, 8) g" >/dev/null
# Listed in reverse: the slices follow the ids' order, not the list's.
psql_q "SELECT json_build_object('result', 'failed', 'missing_events',
          json_agg(json_build_object('id', id, 'event_id', event_id, 'topic', 'outbox.event.order')
                   ORDER BY id DESC))
        FROM outbox WHERE id <= 6" >"$T/missing.json"
# Rows 3 and 4 unsent since verify ran (the relay took them again): the second slice selects none.
psql_q "UPDATE outbox SET sent_at = NULL WHERE id IN (3, 4)"

# --- 1. ---
# Every statement of replay's session and its parameters in the server's log.
"$RELAY_BIN" replay \
    --database-url "postgresql://postgres@127.0.0.1:$PGPORT/outbox?options=-c%20log_statement%3Dall" \
    --missing "$T/missing.json" --batch-rows 2 --yes >"$T/replay.out" 2>"$T/replay.err"
check_eq "1: exit 0" 0 $?
check "1: ... 4 events replayed, 2 of the list not found" grep -q \
    '^replay: 4 events replayed in .* (as selected; 2 of the 6 events listed not in the table as sent)$' \
    "$T/replay.out"
# The parameters of each batch's SELECT ($11: the ids), one line each.
grep -A1 'FOR UPDATE OF o' "$T/pg.log" | sed -n 's/.*parameters: .*\$11 = '"'"'{\([0-9,]*\)}'"'"'.*/\1/p' \
    >"$T/slices"
check_eq "1: ... every batch's SELECT logged with its ids, two of them" 2 "$(grep -c '' "$T/slices")"
check_eq "1: ... each with its slice of the events still sent alone" "1,2 5,6 " \
    "$(awk '{printf "%s ", $0}' "$T/slices")"
# n_of CONDITION: the rows' payload numbers in id order.
n_of() {
    psql_q "SELECT string_agg(payload->>'n', ',' ORDER BY id) FROM outbox WHERE $1"
}
check_eq "1: ... the 4 still sent replayed, new ids in their order" "1,2,5,6" "$(n_of 'id > 8')"
check_eq "1: ... unsent, all of them" "1,2,5,6" "$(n_of 'id > 8 AND sent_at IS NULL')"
check_eq "1: ... the 2 unsent since as they were" "3,4" "$(n_of 'id <= 8 AND sent_at IS NULL')"
check_eq "1: ... the rows outside the list untouched" "7,8" "$(n_of 'sent_at IS NOT NULL')"

# --- 2. a list of mostly deleted rows ---
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
        SELECT 'order', 'o-2', 'Updated', jsonb_build_object('n', 100 + g), now()
        FROM generate_series(1, 40) g" >/dev/null
psql_q "SELECT json_build_object('result', 'failed', 'missing_events',
          json_agg(json_build_object('id', id, 'event_id', event_id, 'topic', 'outbox.event.order')))
        FROM outbox WHERE aggregate_id = 'o-2'" >"$T/missing2.json"
psql_q "DELETE FROM outbox WHERE aggregate_id = 'o-2' AND (payload->>'n')::int NOT IN (105, 117, 123, 140)"
batch_selects() {
    grep -c 'FOR UPDATE OF o' "$T/pg.log"
}
before=$(batch_selects)
"$RELAY_BIN" replay \
    --database-url "postgresql://postgres@127.0.0.1:$PGPORT/outbox?options=-c%20log_statement%3Dall" \
    --missing "$T/missing2.json" --batch-rows 2 --yes >"$T/replay2.out" 2>"$T/replay2.err"
check_eq "2: exit 0" 0 $?
check "2: ... 4 events replayed, 36 of the 40 listed not found" grep -q \
    '^replay: 4 events replayed in .* (as selected; 36 of the 40 events listed not in the table as sent)$' \
    "$T/replay2.out"
check_eq "2: ... in two batches, none for the deleted rows" 2 "$(($(batch_selects) - before))"
check_eq "2: ... the 4 left replayed, in their order" "105,117,123,140" \
    "$(n_of "aggregate_id = 'o-2' AND sent_at IS NULL")"

# --- 3. the list and another option ---
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
        SELECT CASE WHEN g % 2 = 0 THEN 'order' ELSE 'user' END, 'o-3', 'Updated',
               jsonb_build_object('n', 200 + g), now()
        FROM generate_series(1, 4) g" >/dev/null
psql_q "SELECT json_build_object('result', 'failed', 'missing_events',
          json_agg(json_build_object('id', id, 'event_id', event_id, 'topic', 'outbox.event.order')))
        FROM outbox WHERE aggregate_id = 'o-3'" >"$T/missing3.json"
"$RELAY_BIN" replay --database-url "$DATABASE_URL" --missing "$T/missing3.json" \
    --aggregate-type order --yes >"$T/replay3.out" 2>"$T/replay3.err"
check_eq "3: exit 0" 0 $?
check_eq "3: ... the 2 of that type replayed" "202,204" \
    "$(n_of "aggregate_id = 'o-3' AND sent_at IS NULL")"
check_eq "3: ... the other 2 still sent" "201,203" \
    "$(n_of "aggregate_id = 'o-3' AND sent_at IS NOT NULL")"
check "3: ... the last line: 2 not selected, outside the other options" grep -q \
    '^replay: 2 events replayed in .* (as selected; 2 of the 4 events listed not selected: outside the other options, or not in the table as sent)$' \
    "$T/replay3.out"
check "3: ... the line before the batches: 2 selected, not 2 still in the table" grep -q \
    '^replay: 4 events listed, 2 of them selected (the others are outside the other options, were deleted, or are unsent already)$' \
    "$T/replay3.err"
