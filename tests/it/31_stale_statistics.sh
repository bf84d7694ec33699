#!/bin/bash
# Proves the claim walks the unsent index in id order even when the table's statistics say almost
# nothing is unsent (a backlog that arrived since autovacuum last analyzed the table). With such
# statistics PostgreSQL's cheapest-looking plan was a bitmap scan of every unsent row plus a sort,
# so each claim read the whole backlog. auto_explain logs the plan of every claim; none may scan
# the table by bitmap or sort its rows, and every claim must use the unsent index.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../lib.sh"
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
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --batch-size 1000
wait_for "every row gets sent_at" 120 no_unsent_rows
relay_stop
check_eq "relay exits 0" 0 $?

# The plans of the claim (the statement with the held-back aggregates), one block per claim.
awk '/Query Text: SELECT w.seq, w.event_id/ { on = 1; n++ } on && /^20[0-9][0-9]-/ && !/Query Text/ { on = 0 }
     on { print n ": " $0 }' "$T/pg.log" >"$T/claim-plans.txt"
claims=$(grep -c 'Query Text: SELECT w.seq, w.event_id' "$T/claim-plans.txt")
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
