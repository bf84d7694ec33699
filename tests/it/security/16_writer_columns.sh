#!/bin/bash
# Proves that writers (members of outbox_producer) may INSERT only the columns of the integration
# contract (migrations/0009_hardening.sql, relay/cmd/grants.c; docs/security.md):
#  1. the documented INSERT (aggregate_type, aggregate_id, event_type, payload, headers) works;
#  2. setting attempts, next_attempt_at, dead_at, sent_at, rejections, last_error,
#     dead_letter_topic, event_id, created_at or the id (OVERRIDING SYSTEM VALUE) is refused,
#     each with a privilege error, and no such row is left;
#  3. a table-wide INSERT granted by hand is taken back by the next `migrate` (its grants step),
#     and outbox_wakeup_state, unused since 0007, is no longer granted to either role.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
relay_migrate >"$T/migrate.log" 2>&1 || { cat "$T/migrate.log"; fail "migrate"; }
psql_q "CREATE ROLE writer LOGIN IN ROLE outbox_producer" || fail "create the writer"

# as_writer SQL: runs SQL as the writer; output (and errors) in $T/writer.out.
as_writer() { psql -XAtq -v ON_ERROR_STOP=1 -U writer -c "$1" >"$T/writer.out" 2>&1; }
# refused SQL: the statement fails for the writer with a privilege error.
refused() {
    as_writer "$1" && return 1
    grep -q 'permission denied' "$T/writer.out"
}
rows() { psql_q "SELECT count(*) FROM outbox"; }

# --- 1. the documented INSERT ---
check "1: the writer does the documented INSERT" \
    as_writer "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
               VALUES ('order', 'o-1', 'OrderCreated', '{\"id\": \"o-1\"}', '{\"h\": \"v\"}')"
check "1: ... and without headers" \
    as_writer "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
               VALUES ('order', 'o-2', 'OrderCreated', '{}')"
check_eq "1: two rows" 2 "$(rows)"

# --- 2. the relay's columns, the database's columns, the id ---
base="INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload"
for col_val in "attempts|1" "next_attempt_at|'infinity'" "dead_at|now()" "sent_at|now()" \
    "rejections|1" "last_error|'x'" "dead_letter_topic|'t'" \
    "event_id|gen_random_uuid()" "created_at|now()"; do
    col=${col_val%%|*} val=${col_val#*|}
    check "2: the writer may not set $col" \
        refused "$base, $col) VALUES ('order', 'o-42', 'changed', '{}', $val)"
done
check "2: the writer may not set the id (OVERRIDING SYSTEM VALUE)" \
    refused "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
             OVERRIDING SYSTEM VALUE VALUES (-1, 'order', 'o-42', 'changed', '{}')"
check "2: the review's row (id -1, attempts 1, next_attempt_at infinity) is refused" \
    refused "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, attempts,
                                 next_attempt_at)
             OVERRIDING SYSTEM VALUE VALUES (-1, 'order', 'o-42', 'changed', '{}', 1, 'infinity')"
check_eq "2: no refused row was left" 2 "$(rows)"

# --- 3. migrate re-applies the rule; outbox_wakeup_state ---
psql_q "GRANT INSERT ON outbox TO outbox_producer" || fail "grant table-wide INSERT by hand"
check "3: (the hand-made grant lets the writer set attempts)" \
    as_writer "$base, attempts) VALUES ('order', 'o-3', 'changed', '{}', 1)"
check "3: migrate exits 0" relay_migrate >"$T/migrate2.log" 2>&1
check "3: after migrate the writer may not set attempts again" \
    refused "$base, attempts) VALUES ('order', 'o-4', 'changed', '{}', 1)"
check "3: ... and still does the documented INSERT" \
    as_writer "$base) VALUES ('order', 'o-5', 'changed', '{}')"
check_eq "3: outbox_producer holds no table-wide INSERT" f \
    "$(psql_q "SELECT has_table_privilege('outbox_producer', 'outbox', 'INSERT')")"
check_eq "3: neither role has any grant on outbox_wakeup_state" "false false" \
    "$(psql_q "SELECT string_agg(has_table_privilege(r, 'outbox_wakeup_state',
                                   'SELECT, INSERT, UPDATE, DELETE')::text, ' ' ORDER BY r)
               FROM unnest(ARRAY['outbox_producer', 'outbox_relay']) AS r")"
