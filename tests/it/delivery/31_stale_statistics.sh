#!/bin/bash
# Proves the claim walks the unsent index in id order even when the table's statistics say almost
# nothing is unsent (a backlog that arrived since autovacuum last analyzed the table). With such
# statistics PostgreSQL's cheapest-looking plan was a bitmap scan of every unsent row plus a sort,
# so each claim read the whole backlog. auto_explain logs the plan of every claim; none may scan
# the table by bitmap or sort its rows, and every claim must use the unsent index.
# Part 2: after a dead history kept by an old snapshot, on statistics from when the table was
# small, no look-up of failed rows (claim, floor, dead-letter claim, the claim's recheck) walks the unsent index from
# its start, the failed rows come from the retry index, and no mark scans the whole table.
# Part 3: with 1,000 aggregates held back by failed rows that the statistics have not seen (they
# failed after the last ANALYZE), the claim looks each row's aggregate up once: no plan compares
# every candidate row with every held-back aggregate (a nested loop over them, 800,000 join-filter
# comparisons a claim of 800), and the rows behind the failed ones still wait.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 3
relay_migrate 2>"$T/migrate.log" || fail "migrate"

# Statistics that never see the backlog: autovacuum off for the table, one row sent, then the
# backlog inserted; the table is never analyzed.
psql_q "ALTER TABLE outbox SET (autovacuum_enabled = false)"
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        VALUES ('order', 'first', 'order.created', '{}')"
psql_q "UPDATE outbox SET sent_at = now()"
ROWS=20000
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'order', 'order-' || (g % 100), 'order.updated', jsonb_build_object('seq', g)
        FROM generate_series(1, $ROWS) AS g ORDER BY g"
check_eq "the table has no statistics" -1 \
    "$(psql_q "SELECT reltuples::bigint FROM pg_class WHERE relname = 'outbox'")"

# Every statement of the relay's sessions gets its plan logged.
cat >>"$T/pg/postgresql.conf" <<'EOF'
session_preload_libraries = 'auto_explain'
auto_explain.log_min_duration = 0
EOF
psql_q "SELECT pg_reload_conf()" >/dev/null
# plans_of REGEX [LINE]: the plans logged from line LINE of pg.log on (default: the first) whose
# Query Text matches REGEX (extended), one block per plan, each line prefixed with its number.
plans_of() {
    tail -n +"${2:-1}" "$T/pg.log" | RE="Query Text: ($1)" awk '/^20[0-9][0-9]-/ { on = 0 }
        /Query Text:/ && $0 ~ ENVIRON["RE"] { on = 1; n++ } on { print n ": " $0 }'
}
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --batch-size 1000
wait_for "every row gets sent_at" 120 no_unsent_rows
relay_stop
check_eq "relay exits 0" 0 $?

# The plans of the claim (the statement with the held-back aggregates), one block per claim.
plans_of 'SELECT w\.seq, CASE WHEN w\.too_big' >"$T/claim-plans.txt"
claims=$(grep -c 'Query Text: SELECT w.seq, CASE WHEN w.too_big' "$T/claim-plans.txt")
check "at least 20 claims had their plan logged ($claims)" test "$claims" -ge 20
lacks_re() { # lacks_re FILE REGEX: no line of FILE matches REGEX
    ! grep -qE -e "$2" "$1"
}
# The claim's parts are CTEs, so PostgreSQL names the table's scans o, o_1, o_2...
check_eq "every claim walks the unsent index" "$claims" \
    "$(grep -E 'Index Scan using outbox_unsent_idx on outbox o(_[0-9]+)? ' "$T/claim-plans.txt" |
        cut -d: -f1 | sort -u | grep -c .)"
check "no claim scans the table by bitmap" lacks_re "$T/claim-plans.txt" \
    'Bitmap Heap Scan on outbox o(_[0-9]+)? '
# Sorted are only the rows already claimed (a batch) and the failed rows below the floor (the
# retry index), never the table's unsent rows.
check "no claim sorts the table's rows by id" lacks_re "$T/claim-plans.txt" 'Sort Key: o(_[0-9]+)?\.id$'

# Part 2: the look-ups of failed rows read the retry index, and the marks the primary key, whatever
# the statistics say. Statistics taken while the table held 1,000 rows, all sent; then an old
# snapshot (an open REPEATABLE READ transaction) keeps every version that 40,000 sent rows leave in
# the unsent index (vacuum may not remove them). Walking those versions from the start of the
# unsent index is what made each claim slower with every minute such a snapshot stayed
# (docs/operations.md#dead-rows-and-old-snapshots):
# the planner costs both partial indexes alike on such statistics, and picked the unsent one.
psql_q "TRUNCATE outbox"
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
        SELECT 'order', 'order-' || (g % 100), 'order.updated', '{}', now()
        FROM generate_series(1, 1000) AS g ORDER BY g"
psql_q "ANALYZE outbox"
old_snapshot_open
wait_for "the old snapshot is open" 30 old_snapshot_held
for _ in 1 2; do
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            SELECT 'order', 'order-' || (g % 100), 'order.updated', '{}'
            FROM generate_series(1, 20000) AS g ORDER BY g"
    psql_q "UPDATE outbox SET sent_at = now() WHERE sent_at IS NULL"
done
# Failed rows of three aggregates: two waiting for their retry (their later events wait too), one
# dead (for the dead-letter claim); then 1,000 events of other aggregates to deliver.
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, attempts,
            next_attempt_at, dead_at)
        VALUES ('order', 'waits-1', 'order.updated', '{}', 1, now() + interval '1 hour', NULL),
               ('order', 'waits-2', 'order.updated', '{}', 1, now() + interval '1 hour', NULL),
               ('order', 'dead-1', 'order.updated', '{}', 10, NULL, now())"
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'order', 'later-' || (g % 50), 'order.updated', '{}' FROM generate_series(1, 1000) g
        UNION ALL SELECT 'order', 'waits-1', 'order.updated', '{}'::jsonb"
log_from=$(wc -l <"$T/pg.log")
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --dead-letter-topic dlq
held_back() { # the rows still unsent are the failed ones and the one that waits behind them
    [ "$(psql_q "SELECT count(*) FROM outbox WHERE sent_at IS NULL")" = 4 ] &&
        [ "$(psql_q "SELECT count(*) FROM outbox WHERE dead_letter_topic = 'dlq'")" = 1 ]
}
wait_for "all but the failed rows and the one behind them sent; the dead one dead-lettered" 60 \
    held_back
relay_stop
check_eq "relay exits 0" 0 $?

# The plans of the statements that look for failed rows: the claim, the floor's look, the
# dead-letter claim, the claim's recheck.
plans_of 'SELECT w\.seq, CASE WHEN w\.too_big|SELECT \(SELECT pg_catalog\.min\(|WITH n AS MATERIALIZED' \
    "$((log_from + 1))" >"$T/look-plans.txt"
claims=$(grep -c 'Query Text: SELECT w.seq, CASE WHEN w.too_big' "$T/look-plans.txt")
check "claims had their plan logged ($claims)" test "$claims" -ge 3
check "the floor's look had its plan logged" grep -q 'Query Text: SELECT (SELECT pg_catalog.min(' \
    "$T/look-plans.txt"
check "the dead-letter claim had its plan logged" grep -q 'o.last_error' "$T/look-plans.txt"
check "the claim's recheck had its plan logged" grep -q 'Query Text: WITH n AS MATERIALIZED' \
    "$T/look-plans.txt"
check "no look for failed rows scans the whole table" lacks_re "$T/look-plans.txt" \
    'Seq Scan on outbox'
# Every scan of the unsent index in those plans starts somewhere (the claim's part above the
# floor, an Index Cond); none walks it from its start.
unbounded_unsent_scans() {
    awk '/Index Scan using outbox_unsent_idx/ { if (open) n++; open = 1; next }
         open && /Index Cond:/ { open = 0 } open && /->/ { n++; open = 0 }
         /Query Text:/ { if (open) n++; open = 0 } END { if (open) n++; print n + 0 }' "$1"
}
check_eq "no look for failed rows walks the unsent index from its start" 0 \
    "$(unbounded_unsent_scans "$T/look-plans.txt")"
check "the failed rows come from the retry index" grep -q 'Index Scan using outbox_retry_idx' \
    "$T/look-plans.txt"
plans_of 'UPDATE "outbox" SET (sent_at|dead_letter_topic)' "$((log_from + 1))" >"$T/mark-plans.txt"
check "marks had their plan logged" test -s "$T/mark-plans.txt"
check "no mark scans the whole table" lacks_re "$T/mark-plans.txt" 'Seq Scan on outbox'

# Part 3: 20,000 rows of 1,000 aggregates (20 each, round robin), analyzed; then the 18th and 19th
# events of every aggregate fail (attempts 1, a retry a day away) after the ANALYZE, as a topic
# outage leaves them: the statistics still say no row has failed. The plans are logged with their
# row counts (log_analyze; no timings).
old_snapshot_close
psql_q "TRUNCATE outbox"
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'order', 'held-' || (g % 1000), 'order.updated', '{}'
        FROM generate_series(0, 19999) AS g ORDER BY g"
psql_q "ANALYZE outbox"
first=$(psql_q "SELECT min(id) FROM outbox")
psql_q "UPDATE outbox SET attempts = 1, next_attempt_at = now() + interval '1 day'
        WHERE id >= $first + 17000 AND id < $first + 19000"
cat >>"$T/pg/postgresql.conf" <<'EOF2'
auto_explain.log_analyze = on
auto_explain.log_timing = off
EOF2
psql_q "SELECT pg_reload_conf()" >/dev/null
log_from=$(wc -l <"$T/pg.log")
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS"
behind_failed_only() { # the failed rows and the ones behind them are the only unsent rows
    [ "$(unsent_rows)" = 3000 ]
}
wait_for "every row sent but the 2,000 failed ones and the 1,000 behind them" 120 behind_failed_only
relay_stop
check_eq "relay exits 0" 0 $?
check_eq "the rows behind the failed ones wait (none sent)" 0 \
    "$(psql_q "SELECT count(*) FROM outbox WHERE id >= $first + 19000 AND sent_at IS NOT NULL")"
plans_of 'SELECT w\.seq, CASE WHEN w\.too_big' "$((log_from + 1))" >"$T/held-plans.txt"
claims=$(grep -c 'Query Text: SELECT w.seq, CASE WHEN w.too_big' "$T/held-plans.txt")
check "claims had their plan logged, with row counts ($claims)" test "$claims" -ge 10
check "the claims' plans counted their rows" grep -q 'actual rows=800 ' "$T/held-plans.txt"
# A join filter that compares rows with the held-back aggregates pair by pair removes up to
# (candidate rows x held-back aggregates) a claim; a look-up by aggregate removes none by join.
removed=$(grep -o 'Rows Removed by Join Filter: [0-9]*' "$T/held-plans.txt" |
    awk '{ if ($NF > m) m = $NF } END { print m + 0 }')
check "no claim compares rows with held-back aggregates pair by pair (at most $removed removed by a join filter)" \
    test "$removed" -lt 1000
check "no claim joins its rows with the held-back aggregates in a nested loop" \
    lacks_re "$T/held-plans.txt" 'Nested Loop'
