#!/bin/bash
# Proves the relay and migrate use their own objects when a hostile schema comes earlier on the
# search_path (the CVE-2018-1058 pattern; docs/security.md). After a normal migrate, a schema
# `evil` gets a table `outbox` (same columns, one decoy row), a `schema_migrations`, and
# functions of the relay's names (outbox_relay_sleep, outbox_relay_wake, outbox_lane,
# outbox_wakeup_install) that record every call; then ALTER DATABASE and ALTER ROLE put `evil`
# first on everyone's search_path. Then:
#  1. migrate (again) touches nothing in evil: no call recorded, evil.schema_migrations empty;
#  2. the relay sends every row of public.outbox (also after going to sleep and being woken),
#     never the decoy: the decoy row stays unsent and no evil function is ever called;
#  3. `status` reports public.outbox's counts;
#  4. --schema with a name that is not a plain identifier exits 2 with one line.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"

psql_q "CREATE SCHEMA evil;
        CREATE TABLE evil.calls (fn text, at timestamptz DEFAULT clock_timestamp());
        CREATE TABLE evil.outbox (LIKE public.outbox INCLUDING DEFAULTS);
        INSERT INTO evil.outbox (id, aggregate_type, aggregate_id, event_type, payload)
            VALUES (1, 'decoy', 'decoy-1', 'stolen', '{\"decoy\": true}');
        CREATE TABLE evil.schema_migrations (version text PRIMARY KEY,
                                             applied_at timestamptz DEFAULT now());
        CREATE FUNCTION evil.outbox_relay_sleep() RETURNS text LANGUAGE sql AS
            \$\$ INSERT INTO evil.calls (fn) VALUES ('sleep'); SELECT 'busy'::text \$\$;
        CREATE FUNCTION evil.outbox_relay_wake() RETURNS void LANGUAGE sql AS
            \$\$ INSERT INTO evil.calls (fn) VALUES ('wake') \$\$;
        CREATE FUNCTION evil.outbox_lane(text, text) RETURNS smallint LANGUAGE sql AS
            \$\$ INSERT INTO evil.calls (fn) VALUES ('lane'); SELECT 0::smallint \$\$;
        CREATE FUNCTION evil.outbox_wakeup_install(regclass) RETURNS void LANGUAGE sql AS
            \$\$ INSERT INTO evil.calls (fn) VALUES ('install') \$\$;
        GRANT USAGE ON SCHEMA evil TO PUBLIC;
        GRANT ALL ON ALL TABLES IN SCHEMA evil TO PUBLIC;
        ALTER DATABASE outbox SET search_path = evil, public;
        ALTER ROLE postgres SET search_path = evil, public;" || fail "create the hostile schema"
check_eq "0: a plain session now resolves outbox to evil's" decoy \
    "$(psql_q "SELECT aggregate_type FROM outbox")"

# --- 1. migrate ---
relay_migrate >"$T/migrate2.log" 2>&1
check_eq "1: migrate succeeds with evil first on the path" 0 $?
check_eq "1: migrate called no evil function" 0 "$(psql_q "SELECT count(*) FROM evil.calls")"
check_eq "1: evil.schema_migrations untouched" 0 \
    "$(psql_q "SELECT count(*) FROM evil.schema_migrations")"

# --- 2. relaying ---
psql_q "INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'good', 'g-' || (g % 7), 'changed', jsonb_build_object('seq', g)
        FROM generate_series(1, 200) AS g ORDER BY g"
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --sleep-after 10 \
    --kafka reconnect.backoff.max.ms=500
public_sent() {
    [ "$(psql_q "SELECT count(*) FROM public.outbox WHERE sent_at IS NULL")" = 0 ]
}
wait_for "2: every row of public.outbox sent" 60 public_sent
# Let the sessions run out of work, go to sleep (outbox_relay_sleep) and be woken by new rows.
wait_for "2: the relay goes to sleep once public.outbox is sent" 15 guard_held
psql_q "INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'good', 'g-' || (g % 7), 'changed', jsonb_build_object('seq', g)
        FROM generate_series(201, 250) AS g ORDER BY g"
wait_for "2: rows inserted while the relay slept are sent too" 30 public_sent
check_eq "2: the decoy row in evil.outbox stays unsent" t \
    "$(psql_q "SELECT sent_at IS NULL FROM evil.outbox WHERE id = 1")"
check_eq "2: no evil function was ever called" "" \
    "$(psql_q "SELECT string_agg(DISTINCT fn, ',') FROM evil.calls")"
wait_for "2: the relay went to sleep through its own function (a guard holds the wakeup lock)" \
    15 guard_held
# Asleep, the relay has no batch in flight: whatever it published is acknowledged, below the end
# offsets (a topic nothing was ever produced to does not exist: --to-end reads it as empty).
consume --topic outbox.event.decoy --to-end --timeout-ms 20000 >"$T/decoy.json"
check_eq "2: nothing reached the decoy's topic" 0 "$(wc -l <"$T/decoy.json")"
relay_stop
check_eq "2: the relay exits 0" 0 $?

# --- 3. status ---
"$RELAY_BIN" status --database-url "$DATABASE_URL" --json >"$T/status.json" 2>"$T/status.err"
check_eq "3: status exits 0" 0 $?
check "3: status counts public.outbox (0 unsent), not the decoy" \
    test "$(jq -r '.backlog' "$T/status.json")" = 0

# --- 4. --schema validation ---
"$RELAY_BIN" migrate --database-url "$DATABASE_URL" --schema 'evil,public' >"$T/out" 2>"$T/err"
check_eq "4: --schema 'evil,public' exits 2" 2 $?
check_eq "4: with one line" 1 "$(wc -l <"$T/err")"
