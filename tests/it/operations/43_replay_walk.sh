#!/bin/bash
# Proves `outbox-relay replay` reads, for its batches, the rows where the selection lies, not the
# table from its start to its end: a replay by time of events sent between 20,000 rows sent
# before them (the table's history) and 20,000 sent after them. The summary reads such a window
# on the sent_at index; the batches walk the id index from the last batch's end, and started at 0
# and ended at the highest id when replay started: the first batch fetched and filtered out every
# row of the history (on a table kept for months, past the batches' bound: "PostgreSQL did not
# answer", nothing replayed), and the last ones every row after the window. auto_explain logs
# each batch's plan with its row counts: the rows the batches' scans read (returned plus removed
# by their filters) stay near the window's 5,000, where they were over 40,000.
# Also: events of ids 0 and below are replayed, by a selection (--aggregate-type) and by
# --from-id/--to-id.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
relay_migrate 2>"$T/migrate.log" || fail "migrate"

# Sent long ago, sent in the window, sent after it: ids grow with the time they were sent.
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
        SELECT 'order', 'o-' || (g % 100), 'Updated', jsonb_build_object('part', 'history'),
               now() - interval '300 days' + g * interval '1 s'
        FROM generate_series(1, 20000) g ORDER BY g"
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
        SELECT 'order', 'o-' || (g % 100), 'Updated', jsonb_build_object('part', 'window'),
               now() - interval '2 days' + g * interval '1 s'
        FROM generate_series(1, 5000) g ORDER BY g"
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
        SELECT 'order', 'o-' || (g % 100), 'Updated', jsonb_build_object('part', 'after'),
               now() - interval '1 day' + g * interval '1 s'
        FROM generate_series(1, 20000) g ORDER BY g"
psql_q "ANALYZE outbox"
after=$(psql_q "SELECT to_char((now() - interval '3 days') AT TIME ZONE 'UTC',
                               'YYYY-MM-DD HH24:MI:SS+00')")
before=$(psql_q "SELECT to_char((now() - interval '36 hours') AT TIME ZONE 'UTC',
                                'YYYY-MM-DD HH24:MI:SS+00')")
first_after=$(psql_q "SELECT min(id) FROM outbox WHERE payload->>'part' = 'after'")

# Replay's session logs the plan of each of its statements, with row counts.
opts="-c%20session_preload_libraries%3Dauto_explain%20-c%20auto_explain.log_min_duration%3D0"
opts="$opts%20-c%20auto_explain.log_analyze%3Don%20-c%20auto_explain.log_timing%3Doff"
log_from=$(wc -l <"$T/pg.log")
"$RELAY_BIN" replay --database-url "postgresql://postgres@127.0.0.1:$PGPORT/outbox?options=$opts" \
    --sent-after "$after" --sent-before "$before" --batch-rows 1000 >"$T/replay.out" 2>"$T/replay.err"
check_eq "exit 0" 0 $?
check "... 5,000 events replayed" grep -q '^replay: 5000 events replayed in ' "$T/replay.out"
check_eq "... exactly the window's rows made unsent, with new ids after every other" \
    "5000|5000" "$(psql_q "SELECT count(*), count(*) FILTER (WHERE id > $first_after + 19999)
                         FROM outbox WHERE sent_at IS NULL AND payload->>'part' = 'window'")"
check_eq "... the others untouched" 40000 "$(psql_q "SELECT count(*) FROM outbox
                                                    WHERE sent_at IS NOT NULL")"

# The batches' plans (their SELECT ... FOR UPDATE OF o), one block each; of each scan node the
# rows it returned and those its filter removed.
tail -n +"$((log_from + 1))" "$T/pg.log" | awk '/^20[0-9][0-9]-/ { on = 0 }
    /Query Text:/ && /FOR UPDATE OF o/ { on = 1; n++ } on { print n ": " $0 }' >"$T/batch-plans.txt"
batches=$(grep -c 'Query Text:' "$T/batch-plans.txt")
check "every batch's plan logged, with row counts (5 batches of 1,000 and the empty last: $batches)" \
    test "$batches" -ge 6
read_rows=$(awk '/Scan .*actual rows=/ { sub(/.*actual rows=/, ""); sub(/ .*/, ""); n += $0 }
    /Rows Removed by (Filter|Index Recheck):/ { n += $NF } END { print n + 0 }' "$T/batch-plans.txt")
check "the batches read the window's rows, not the history before it and the rows after it ($read_rows rows read)" \
    test "$read_rows" -lt 10000

# --- ids 0 and below ---
# A sequence may start at 0 or below (an adopted table's own ids, MINVALUE -n): every statement
# of replay selected ids above 0 only, so such events were never replayed ("nothing to replay"),
# and --from-id/--to-id refused 0 and negative ids. Now a selection takes them as any other id.
neg_rows() {
    psql_q "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, sent_at)
            OVERRIDING SYSTEM VALUE
            SELECT g, 'negative', 'n-1', 'Updated', jsonb_build_object('n', g), now() - interval '1 h'
            FROM generate_series(-3, 0) g ORDER BY g" >/dev/null || fail "insert ids -3 to 0"
}
neg_rows
"$RELAY_BIN" replay --database-url "$DATABASE_URL" --aggregate-type negative --batch-rows 2 \
    >"$T/neg.out" 2>"$T/neg.err"
check_eq "ids -3 to 0, by aggregate type: exit 0" 0 $?
check "... 4 events replayed" grep -q '^replay: 4 events replayed in ' "$T/neg.out"
check_eq "... all four made unsent, with new ids above every other, in their order" "4|4|t" \
    "$(psql_q "SELECT count(*), count(*) FILTER (WHERE id > $first_after + 19999),
                      array_agg((payload->>'n')::int ORDER BY id) = '{-3,-2,-1,0}'
               FROM outbox WHERE aggregate_type = 'negative' AND sent_at IS NULL")"
psql_q "DELETE FROM outbox WHERE aggregate_type = 'negative'" >/dev/null
neg_rows
"$RELAY_BIN" replay --database-url "$DATABASE_URL" --from-id -2 --to-id 0 >"$T/neg2.out" 2>"$T/neg2.err"
check_eq "--from-id -2 --to-id 0: exit 0" 0 $?
check "... 3 events replayed" grep -q '^replay: 3 events replayed in ' "$T/neg2.out"
check_eq "... those three made unsent, id -3 kept as it was" "3|-3" \
    "$(psql_q "SELECT count(*) FILTER (WHERE sent_at IS NULL),
                      min(id) FILTER (WHERE sent_at IS NOT NULL)
               FROM outbox WHERE aggregate_type = 'negative'")"
