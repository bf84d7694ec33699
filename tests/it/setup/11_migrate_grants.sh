#!/bin/bash
# Proves that `migrate` cannot silently skip the grants of the least-privileged setup
# (docs/security.md#secure-by-default, "Least privilege"):
#  1. run as a database owner without CREATEROLE on a cluster without the roles, it prints the
#     server's WARNING (not only the server log), exits non-zero, and names the missing roles and
#     the statements that create them;
#  2. once an administrator created the roles, a second `migrate` (nothing left to apply) grants
#     everything, 0008's sequence grant included, and exits 0; a third run is quiet and exits 0;
#     a DELETE the operator revoked is not given back;
#  3. a relay logging in as a member of outbox_relay delivers with the claim floor on: no "claims
#     read the unsent index from its start" warning;
#  4. an owner who does not own the table (the grants cannot be given): non-zero, the GRANT named,
#     and its --dry-run says so first (exit 1; the table's owner's lists it as pending, exit 0);
#     in 1, the --dry-run of a role that may not create the roles says so too (exit 1); a role
#     that does not own the sequence but holds SELECT on it WITH GRANT OPTION may give it (its
#     --dry-run lists it, exit 0, and its run gives it);
#  5. the relay's functions in their own schema (--schema) and the table in another: outbox_relay
#     gets USAGE on both (without the functions' schema its wakeup calls find no function);
#  6. the GRANTs `check` gives, for a relay whose table is in its --schema, run as written in
#     psql (whose search_path is not pinned), and then check passes;
#  7. a server that refuses client_connection_check_interval (here: pg_settings not readable by
#     the owner): a warning, and migrate (and its --dry-run) goes on, exit 0.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1

psql_q "CREATE ROLE app_owner LOGIN" -d postgres && psql_q "CREATE DATABASE owned OWNER app_owner" \
    -d postgres || fail "create app_owner and its database"
OWNER_URL=postgresql://app_owner@127.0.0.1:$PGPORT/owned
as_owner() { # as_owner LOG: migrate as app_owner; its exit status
    "$RELAY_BIN" migrate --database-url "$OWNER_URL" >"$1" 2>&1
}

# --- 1. no roles, no CREATEROLE ---
as_owner "$T/m1.log"
rc=$?
check "1: migrate without the roles exits non-zero" test "$rc" -ne 0
check "1: the server's warning is printed" grep -q \
    'level=warn msg="server notice" severity=WARNING step="0006_relay_role.sql" message="role outbox_relay is missing' \
    "$T/m1.log"
check "1: one error line names both roles and how to create them" grep -q \
    'roles outbox_relay, outbox_producer are missing and app_owner may not create them.*CREATE ROLE outbox_relay NOLOGIN; CREATE ROLE outbox_producer NOLOGIN;.*outbox-relay migrate` again' \
    "$T/m1.log"
check "1: it does not claim to be up to date" lacks "$T/m1.log" "migrations up to date"
# The dry run listed the roles as ones a run "would create", exit 0, for a role that may not
# create them: the run then failed (above). It says so now, exit 1.
"$RELAY_BIN" migrate --dry-run --database-url "$OWNER_URL" >"$T/m1dry.log" 2>&1
check_eq "1: then --dry-run says the run would fail (exit 1)" 1 $?
check "1: ...naming each role this one may not create" grep -q \
    'level=error msg="role missing, and this role may not create it.*role=outbox_producer' "$T/m1dry.log"
check_eq "1: the migrations themselves are applied" "$(ls "$ROOT"/migrations/*.sql | wc -l)" \
    "$(psql_q "SELECT count(*) FROM schema_migrations" -d owned)"

# --- 2. the administrator creates the roles; migrate again grants ---
psql_q "CREATE ROLE outbox_relay NOLOGIN; CREATE ROLE outbox_producer NOLOGIN;
        CREATE ROLE relay_login LOGIN IN ROLE outbox_relay" -d postgres || fail "create the roles"
as_owner "$T/m2.log"
check_eq "2: the second migrate exits 0" 0 $?
check_eq "2: outbox_relay may read the sequence, read, mark and delete; the producer may insert (its columns only: 16_writer_columns)" \
    "t|t|t|t|t|t" \
    "$(psql_q "SELECT has_sequence_privilege('outbox_relay', 'outbox_id_seq', 'SELECT'),
                      has_table_privilege('outbox_relay', 'outbox', 'SELECT'),
                      has_column_privilege('outbox_relay', 'outbox', 'sent_at', 'UPDATE'),
                      has_table_privilege('outbox_relay', 'outbox', 'DELETE'),
                      has_function_privilege('outbox_relay', 'outbox_relay_sleep()', 'EXECUTE'),
                      has_column_privilege('outbox_producer', 'outbox', 'payload', 'INSERT')
                      AND NOT has_column_privilege('outbox_producer', 'outbox', 'attempts',
                                                   'INSERT')" -d owned)"
check "2: it says it is up to date" grep -q 'msg="migrations up to date" applied=0' "$T/m2.log"
as_owner "$T/m3.log"
check_eq "2: a third migrate exits 0" 0 $?
check "2: ... with no server notice" lacks "$T/m3.log" "server notice"
psql_q "REVOKE DELETE ON outbox FROM outbox_relay" -d owned || fail "revoke DELETE"
as_owner "$T/m3b.log"
check_eq "2: a DELETE the operator revoked stays revoked (granted only once)" f \
    "$(psql_q "SELECT has_table_privilege('outbox_relay', 'outbox', 'DELETE')" -d owned)"

# --- 3. the relay as a member of outbox_relay: the claim floor is on ---
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'order', 'o-' || (g % 10), 'changed', '{}' FROM generate_series(1, 50) g" -d owned ||
    fail "insert"
relay_start --database-url "postgresql://relay_login@127.0.0.1:$PGPORT/owned" --brokers "$BROKERS"
all_sent() { [ "$(psql_q "SELECT count(*) FROM outbox WHERE sent_at IS NULL" -d owned)" = 0 ]; }
wait_for "3: the relay delivers the 50 events" 30 all_sent
relay_stop
check "3: no claim-floor warning in the relay's log" lacks "$RELAY_LOG" \
    "claims read the unsent index from its start"
check "3: no permission error" lacks "$RELAY_LOG" "permission denied"

# --- 4. the grants cannot be given: named, non-zero ---
psql_q "CREATE ROLE other_owner LOGIN; GRANT CREATE ON DATABASE owned TO other_owner;
        GRANT ALL ON SCHEMA public TO other_owner; GRANT SELECT ON schema_migrations TO other_owner;
        REVOKE SELECT ON SEQUENCE outbox_id_seq FROM outbox_relay" -d owned || fail "other owner"
"$RELAY_BIN" migrate --database-url "postgresql://other_owner@127.0.0.1:$PGPORT/owned" \
    >"$T/m4.log" 2>&1
rc=$?
check "4: a migrate that cannot grant exits non-zero" test "$rc" -ne 0
check "4: it names the GRANT to run" grep -q \
    'grant="GRANT SELECT ON SEQUENCE public.outbox_id_seq TO outbox_relay"' "$T/m4.log"
# The dry run listed that GRANT as one a run would give, exit 0; the run failed on it. It says
# so first now (exit 1), and as the owner it stays a pending grant (exit 0).
"$RELAY_BIN" migrate --dry-run --database-url "postgresql://other_owner@127.0.0.1:$PGPORT/owned" \
    >"$T/m4dry.log" 2>&1
check_eq "4: its --dry-run says the run would fail (exit 1)" 1 $?
check "4: ...naming the GRANT this role may not give" grep -q \
    'level=error msg="grant pending, and this role may not give it.*grant="GRANT SELECT ON SEQUENCE public.outbox_id_seq TO outbox_relay"' \
    "$T/m4dry.log"
"$RELAY_BIN" migrate --dry-run --database-url "$OWNER_URL" >"$T/m4owner.log" 2>&1
check_eq "4: the owner's --dry-run exits 0" 0 $?
check "4: ...listing that GRANT as one its run gives" grep -q \
    'msg="grant pending (dry run: not given)".*grant="GRANT SELECT ON SEQUENCE public.outbox_id_seq TO outbox_relay"' \
    "$T/m4owner.log"
# A role that does not own the sequence but holds SELECT on it WITH GRANT OPTION may give it on
# (PostgreSQL's GRANT lets it): its dry run said it may not (exit 1), and its run then gave it.
psql_q "GRANT SELECT ON SEQUENCE outbox_id_seq TO other_owner WITH GRANT OPTION" -d owned ||
    fail "grant option to other_owner"
"$RELAY_BIN" migrate --dry-run --database-url "postgresql://other_owner@127.0.0.1:$PGPORT/owned" \
    >"$T/m4option-dry.log" 2>&1
check_eq "4: holding it WITH GRANT OPTION, its --dry-run exits 0" 0 $?
check "4: ...listing that GRANT as one its run gives" grep -q \
    'msg="grant pending (dry run: not given)".*grant="GRANT SELECT ON SEQUENCE public.outbox_id_seq TO outbox_relay"' \
    "$T/m4option-dry.log"
"$RELAY_BIN" migrate --database-url "postgresql://other_owner@127.0.0.1:$PGPORT/owned" \
    >"$T/m4option.log" 2>&1
check_eq "4: ...and its run gives it (exit 0)" 0 $?
check_eq "4: ...outbox_relay may read the sequence" t \
    "$(psql_q "SELECT has_sequence_privilege('outbox_relay', 'outbox_id_seq', 'SELECT')" -d owned)"

# --- 5. the relay's functions in a schema of their own, the table in another ---
psql_q "CREATE DATABASE split" -d postgres || fail "create split"
psql_q "CREATE SCHEMA fns; CREATE SCHEMA app;
        CREATE TABLE app.events (event_id uuid NOT NULL DEFAULT gen_random_uuid(),
            aggregate_type text NOT NULL, aggregate_id text NOT NULL, event_type text NOT NULL,
            payload jsonb)" -d split || fail "create the schemas and the table"
"$RELAY_BIN" migrate --database-url "postgresql://postgres@127.0.0.1:$PGPORT/split" --schema fns \
    --table app.events >"$T/m5.log" 2>&1
check_eq "5: migrate --schema fns --table app.events exits 0" 0 $?
check_eq "5: outbox_relay may use both schemas (the table's, the functions')" "t|t" \
    "$(psql_q "SELECT has_schema_privilege('outbox_relay', 'app', 'USAGE'),
                      has_schema_privilege('outbox_relay', 'fns', 'USAGE')" -d split)"

# --- 6. check's GRANTs run as written, for a relay whose table is in its --schema ---
# check's session has search_path pinned to --schema, psql's has not: the statements must name the
# schema. Before, they named the table, the sequence and outbox_lane unqualified (regclass's text,
# a constant), and psql answered "relation outbox does not exist".
psql_q "CREATE DATABASE inapp" -d postgres && psql_q "CREATE SCHEMA app" -d inapp ||
    fail "create inapp and its schema"
"$RELAY_BIN" migrate --database-url "postgresql://postgres@127.0.0.1:$PGPORT/inapp" --schema app \
    >"$T/m6.log" 2>&1
check_eq "6: migrate --schema app exits 0" 0 $?
psql_q "CREATE ROLE app_relay_login LOGIN IN ROLE outbox_relay;
        REVOKE SELECT ON app.outbox FROM outbox_relay;
        REVOKE SELECT, USAGE ON SEQUENCE app.outbox_id_seq FROM outbox_relay;
        REVOKE EXECUTE ON FUNCTION app.outbox_lane(text, text) FROM PUBLIC, outbox_relay" -d inapp ||
    fail "6: revoke"
check_app() { # check_app OUT: `check --schema app` as app_relay_login; its exit status
    timeout 60 "$RELAY_BIN" check --database-url "postgresql://app_relay_login@127.0.0.1:$PGPORT/inapp" \
        --schema app --brokers "$BROKERS" >"$1" 2>&1
}
check_app "$T/c6.out"
check_eq "6: check, three privileges revoked: exit 1" 1 $?
sed -n 's/^FAIL  [a-z ]*: .*as \(the\|its\) owner, \(GRANT .* TO outbox_relay\) (.*$/\2/p' \
    "$T/c6.out" >"$T/c6.sql"
check_eq "6: ... three GRANTs given" 3 "$(wc -l <"$T/c6.sql")"
run_grants() {
    local g
    while IFS= read -r g; do
        psql_q "$g" -d inapp || return 1
    done <"$T/c6.sql"
}
check "6: ... each runs as written in psql (its own search_path)" run_grants
check_app "$T/c6b.out"
check_eq "6: ... and then check exits 0" 0 $?

# --- 7. a server that will not set client_connection_check_interval ---
# migrate sets it for its session (an interrupted migrate's statement then ends on the server),
# and failed at setup, exit 1, when the server refused: Windows, PostgreSQL 14 on macOS or FreeBSD
# (it must be 0 on those platforms), or, as here, a pg_settings the role may not read. Now a
# warning says what is lost and migrate goes on.
psql_q "CREATE DATABASE hardened OWNER app_owner" -d postgres &&
    psql_q "REVOKE SELECT ON pg_catalog.pg_settings FROM PUBLIC" -d hardened ||
    fail "7: create hardened without pg_settings for PUBLIC"
"$RELAY_BIN" migrate --database-url "postgresql://app_owner@127.0.0.1:$PGPORT/hardened" \
    >"$T/m7.log" 2>&1
check_eq "7: pg_settings not readable: migrate exits 0" 0 $?
check "7: ... with one warning naming what is not set and why" grep -q \
    'level=warn msg="client_connection_check_interval not set: .*" error=.*permission denied' \
    "$T/m7.log"
check_eq "7: ... and the migrations applied" "$(ls "$ROOT"/migrations/*.sql | wc -l)" \
    "$(psql_q "SELECT count(*) FROM schema_migrations" -d hardened)"
"$RELAY_BIN" migrate --dry-run --database-url "postgresql://app_owner@127.0.0.1:$PGPORT/hardened" \
    >"$T/m7d.log" 2>&1
check_eq "7: ... and --dry-run there exits 0" 0 $?
