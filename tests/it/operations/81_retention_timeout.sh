#!/bin/bash
# Proves the relay's upkeep session (retention, the backlog gauges) bounds its statements at
# 30 s without loosening a stricter statement_timeout of the connection (the URL's options, as
# for a role or a database): the bound only shortens a longer one, or none, as the commands'.
#  1. with statement_timeout 5s in the URL, retention's DELETE runs under 5 s (it ran under the
#     30 s the session SET over it);
#  2. without one, under 30 s;
#  3. a backlog count that fails for good (the outbox locked: it times out at the URL's 1 s, and
#     is then paced to ten times that) is logged at warn level once, not again after the quick
#     looks (lane squatters, vacuum horizon) that work between two counts, and "upkeep queries
#     work again" (task=backlog) once the count answers.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"

# The statement_timeout in force for each row retention deletes, as a trigger records it.
psql_q "CREATE TABLE seen_timeout (setting text);
        CREATE FUNCTION note_timeout() RETURNS trigger LANGUAGE plpgsql AS \$\$ BEGIN
            INSERT INTO seen_timeout VALUES (pg_catalog.current_setting('statement_timeout'));
            RETURN OLD; END \$\$;
        CREATE TRIGGER note_timeout BEFORE DELETE ON outbox
            FOR EACH ROW EXECUTE FUNCTION note_timeout()"
seen() { psql_q "SELECT string_agg(DISTINCT setting, ',') FROM seen_timeout"; }
old_rows() {
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
            SELECT 'old', 'o-' || g, 'changed', '{}', now() - interval '1 hour'
            FROM generate_series(1, 10) g"
}
none_left() { [ "$(psql_q "SELECT count(*) FROM outbox")" = 0 ]; }

# --- 1. ---
old_rows
relay_start --database-url "$DATABASE_URL?options=-c%20statement_timeout%3D5s" \
    --brokers "$BROKERS" --retention 3s
wait_for "1: retention deletes the old rows" 30 none_left
check_eq "1: ... under the URL's 5 s" 5s "$(seen)"
relay_stop

# --- 2. ---
psql_q "TRUNCATE seen_timeout"
old_rows
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --retention 3s
wait_for "2: retention deletes the old rows" 30 none_left
check_eq "2: ... under 30 s" 30s "$(seen)"
relay_stop

# --- 3. ---
# The count and the quick looks were one task: the looks that worked between two counts said
# "upkeep queries work again" (task=backlog), and the next failed count was new again, a warn
# line and an info line every count instead of one warn line.
relay_start --database-url "$DATABASE_URL?options=-c%20statement_timeout%3D1s" \
    --brokers "$BROKERS" --metrics-listen 127.0.0.1:0 --log-level debug
metrics_wait
wait_for "3: the backlog gauges refresh" 30 metric_at_least outbox_backlog_refresh_timestamp_seconds 1
coproc LOCKER { psql -XAtq -v ON_ERROR_STOP=1 -d "$DATABASE_URL" 2>&1; }
locker_pid=$LOCKER_PID
_t_track "$locker_pid"
echo "BEGIN; LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE; SELECT 'locked';" >&"${LOCKER[1]}"
read -r -t 30 locked <&"${LOCKER[0]}" || fail "3: a session locks the outbox"
[ "$locked" = locked ] || fail "3: a session locks the outbox: $locked"
count_failures() { grep -c 'msg="upkeep query failed.*task=backlog .*statement timeout' "$RELAY_LOG"; }
count_failures_over() { [ "$(count_failures)" -ge "$1" ]; }
wait_for "3: three counts time out (the looks run between them)" 90 count_failures_over 3
check_eq "3: the failing count is logged at warn level once, its repeats at debug level" 1 \
    "$(grep -c 'level=warn msg="upkeep query failed.*task=backlog' "$RELAY_LOG")"
check_eq "3: and no line says the count works again while it fails" 0 \
    "$(sed -n '/msg="upkeep query failed.*task=backlog/,$p' "$RELAY_LOG" | grep -c 'work again')"
echo "COMMIT; \\q" >&"${LOCKER[1]}"
wait "$locker_pid" 2>/dev/null
work_again() { grep -q 'msg="upkeep queries work again" task=backlog' "$RELAY_LOG"; }
wait_for "3: the lock gone, the count works again (task=backlog)" 60 work_again
relay_stop

