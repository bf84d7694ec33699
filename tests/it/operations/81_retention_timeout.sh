#!/bin/bash
# Proves the relay's upkeep session (retention, the backlog gauges) bounds its statements at
# 30 s without loosening a stricter statement_timeout of the connection (the URL's options, as
# for a role or a database): the bound only shortens a longer one, or none, as the commands'.
#  1. with statement_timeout 5s in the URL, retention's DELETE runs under 5 s (it ran under the
#     30 s the session SET over it);
#  2. without one, under 30 s.
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
