#!/bin/bash
# Proves that no SQL of the relay or of its migrations can be captured by look-alike functions and
# operators (docs/security.md, its search_path item). PostgreSQL prefers an exact argument-type
# match anywhere on the search_path over a built-in that needs a cast, so with pg_catalog first a
# built-in is safe only where its argument types match exactly. An untrusted role, `neighbour`,
# with CREATE on `public` (the relay's schema), plants before anything is migrated:
#  - for every built-in function the relay's SQL and its migrations name, one look-alike per
#    signature and argument position with integer, bigint, smallint, numeric, float, text,
#    varchar, name, boolean, jsonb, oid, regclass, time, interval (and "unknown" where PostgreSQL
#    lets it be declared) in place of the built-in's type, and each with all arguments so;
#  - look-alike aggregates (count, min, max, sum, array_agg) over those types;
#  - every operator the SQL uses, for every pair of those types that has no exact built-in;
#  - a type named text (a domain whose CHECK records its use), which a cast to text would find
#    on a search_path that lists the schema before pg_catalog (a writer's may).
# Each look-alike is SECURITY INVOKER (it runs as whoever calls it) and records its call three
# ways: a sequence (not rolled back with the caller's transaction), a row in a table of the
# neighbour (when the caller commits) and a WARNING in the server log. Then, with the look-alikes
# in place: `migrate` (all migrations, then again), `migrate --table` adopting another table (it
# installs the same functions, on every run), producer inserts as a member of
# outbox_producer with the default search_path and with the schema first (the triggers and the
# lane's function run in the producer's session), the relay delivering, failing and dead-lettering an event, sleeping (the
# wakeup lock) and being woken, --retention deleting sent rows, the upkeep's looks with
# --metrics-listen (lane-group squatters, with a session of the neighbour holding a mark lock no
# relay would; the vacuum horizon, with a snapshot of the neighbour's held open; the backlog and
# retention's oldest sent row: each gauge served with what those rows give, no upkeep query
# failed; before, no test ran them here: tests/mutants/48), `verify`, `replay` (a dry run,
# then two batches), `status`, `dead`, `requeue`, `purge-dead` and `check`. No look-alike may
# have been called.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1

# The built-ins named by relay/**/*.c, lib/db.c and migrations/*.sql (a superset is harmless).
FUNCS="set_config current_setting to_regclass to_regrole to_regprocedure has_table_privilege
has_column_privilege has_schema_privilege has_function_privilege has_sequence_privilege
pg_has_role unnest clock_timestamp now current_database pg_notify pg_get_serial_sequence
pg_backend_pid pg_advisory_unlock pg_advisory_lock pg_try_advisory_lock
pg_try_advisory_xact_lock_shared pg_advisory_xact_lock_shared pg_advisory_xact_lock to_char
octet_length make_interval hashtextextended hashtext age pg_typeof host quote_ident random
pg_sequence_last_value pg_column_size jsonb_typeof jsonb_build_object jsonb_object_agg inet_server_addr
generate_series gen_random_uuid format string_agg date_part extract timezone pg_current_snapshot
pg_snapshot_xmax pg_control_system pg_is_in_recovery pg_walfile_name pg_current_wal_lsn"
AGGS="count min max sum array_agg"
OPS="+ - * / ^ & | % = <> < > <= >= || ~~ ~ #>> ->>"

# The schema as an existing installation has it: migrated before any look-alike existed (0001-0008
# predate the hardening and, once applied, never run again; docs/security.md: the schema must be
# writable by trusted roles only whenever migrate applies 0001-0008). 0009 is forgotten, so that
# the migrate below applies it with the look-alikes in place, as an upgrade would.
relay_migrate >"$T/migrate0.log" 2>&1 || { cat "$T/migrate0.log"; fail "migrate"; }
psql_q "DELETE FROM schema_migrations WHERE version >= '0009'" || fail "forget 0009"
psql_q "CREATE ROLE neighbour LOGIN; GRANT CREATE ON SCHEMA public TO neighbour" ||
    fail "create the untrusted role"
# The test's own queries see pg_catalog only (tables named with their schema): the look-alikes
# must not catch them.
psql_safe() { PGOPTIONS="-c search_path=pg_catalog,pg_temp" psql_q "$@"; }
as_neighbour() { psql -XAtq -v ON_ERROR_STOP=1 -U neighbour "$@"; }

as_neighbour -v funcs="$FUNCS" -v aggs="$AGGS" -v ops="$OPS" >"$T/plant.log" 2>&1 <<'SQL' ||
CREATE SEQUENCE public.shadow_hits;
CREATE TABLE public.shadow_calls (sig text, caller name DEFAULT current_user);
GRANT USAGE ON SEQUENCE public.shadow_hits TO PUBLIC;
GRANT INSERT ON public.shadow_calls TO PUBLIC;
-- What every look-alike does: false, after recording the call.
CREATE FUNCTION public.shadow_hit(sig text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_catalog.nextval('public.shadow_hits'::pg_catalog.regclass);
    INSERT INTO public.shadow_calls (sig) VALUES (sig);
    RAISE WARNING 'shadow called: %', sig USING DETAIL = pg_catalog.current_query();
    RETURN false;
END
$$;
CREATE TABLE public.shadow_planted (kind text, sig text);
CREATE TABLE public.shadow_refused (sig text, error text);
SELECT set_config('shadow.funcs', :'funcs', false), set_config('shadow.aggs', :'aggs', false),
       set_config('shadow.ops', :'ops', false);
-- The plants would capture this block's own format() calls: it sees pg_catalog only.
SET search_path = pg_catalog, pg_temp;
DO $plant$
DECLARE
    alts text[] := ARRAY['integer', 'bigint', 'smallint', 'numeric', 'double precision', 'real',
                         'text', 'character varying', 'name', 'boolean', 'jsonb', 'oid',
                         'regclass', 'timestamp with time zone', 'timestamp without time zone',
                         'interval', 'unknown'];
    poly_elem text[] := ARRAY['anyelement', 'anycompatible', 'anynonarray', '"any"', 'anyenum'];
    poly_arr text[] := ARRAY['anyarray', 'anycompatiblearray'];
    fn text; p record; args text[]; variant text[]; ret text; alt text; i int; pos int;
    n int := 0; psig text; body text; argv text[];
BEGIN
    FOREACH fn IN ARRAY regexp_split_to_array(trim(current_setting('shadow.funcs')), '\s+') LOOP
        FOR p IN SELECT ARRAY(SELECT format_type(t, NULL) FROM unnest(proargtypes) t) AS a,
                        format_type(prorettype, NULL) AS r, proretset
                 FROM pg_proc WHERE proname = fn AND pronamespace = 'pg_catalog'::regnamespace
                 AND prokind = 'f' AND pronargs > 0 LOOP
            CONTINUE WHEN p.r IN ('record', 'internal', 'trigger', 'event_trigger');
            FOREACH alt IN ARRAY alts LOOP
                -- pos 0: every argument replaced; pos i: only the i-th.
                FOR pos IN 0 .. cardinality(p.a) LOOP
                    variant := p.a;
                    ret := p.r;
                    FOR i IN 1 .. cardinality(p.a) LOOP
                        IF p.a[i] = ANY (poly_elem) OR p.a[i] = ANY (poly_arr) OR pos IN (0, i) THEN
                            variant[i] := CASE WHEN p.a[i] = ANY (poly_arr) THEN alt || '[]'
                                               ELSE alt END;
                        END IF;
                    END LOOP;
                    IF ret = ANY (poly_elem) THEN ret := alt; END IF;
                    IF ret = ANY (poly_arr) THEN ret := alt || '[]'; END IF;
                    CONTINUE WHEN ret = 'unknown' OR ret LIKE 'unknown%' OR variant = p.a;
                    psig := format('%s(%s)', fn, array_to_string(variant, ', '));
                    CONTINUE WHEN EXISTS (SELECT 1 FROM public.shadow_planted s WHERE s.sig = psig);
                    body := CASE WHEN ret = 'void' THEN format('SELECT public.shadow_hit(%L)', psig)
                                 WHEN p.proretset THEN
                                     format('SELECT NULL::%s WHERE public.shadow_hit(%L)', ret, psig)
                                 ELSE format('SELECT CASE WHEN public.shadow_hit(%L) THEN NULL::%s END',
                                             psig, ret) END;
                    BEGIN
                        EXECUTE format('CREATE FUNCTION public.%I(%s) RETURNS %s%s LANGUAGE sql AS %L',
                                       fn, array_to_string(variant, ', '),
                                       CASE WHEN p.proretset THEN 'SETOF ' ELSE '' END, ret, body);
                        INSERT INTO public.shadow_planted VALUES ('function', psig);
                    EXCEPTION WHEN OTHERS THEN
                        NULL; -- a type PostgreSQL refuses here (unknown), or a duplicate
                    END;
                END LOOP;
            END LOOP;
        END LOOP;
    END LOOP;
    FOREACH fn IN ARRAY regexp_split_to_array(trim(current_setting('shadow.aggs')), '\s+') LOOP
        FOREACH alt IN ARRAY alts LOOP
            CONTINUE WHEN alt = 'unknown';
            ret := CASE fn WHEN 'count' THEN 'bigint' WHEN 'sum' THEN 'numeric'
                           WHEN 'array_agg' THEN alt || '[]' ELSE alt END;
            psig := format('%s(%s)', fn, alt);
            n := n + 1;
            BEGIN
                EXECUTE format('CREATE FUNCTION public.shadow_sf_%s(%s, %s) RETURNS %s LANGUAGE sql'
                               ' AS %L', n, ret, alt, ret,
                               format('SELECT CASE WHEN public.shadow_hit(%L) THEN $1 END', psig));
                EXECUTE format('CREATE AGGREGATE public.%I(%s) (SFUNC = public.shadow_sf_%s, STYPE = %s)',
                               fn, alt, n, ret);
                INSERT INTO public.shadow_planted VALUES ('aggregate', psig);
            EXCEPTION WHEN OTHERS THEN
                INSERT INTO public.shadow_refused VALUES (psig, SQLERRM);
            END;
        END LOOP;
    END LOOP;
    FOREACH fn IN ARRAY regexp_split_to_array(trim(current_setting('shadow.ops')), '\s+') LOOP
        FOREACH alt IN ARRAY alts LOOP
            FOREACH body IN ARRAY alts LOOP
                CONTINUE WHEN alt = 'unknown' OR body = 'unknown';
                CONTINUE WHEN EXISTS (SELECT 1 FROM pg_operator WHERE oprname = fn
                                      AND oprleft = alt::regtype AND oprright = body::regtype
                                      AND oprnamespace = 'pg_catalog'::regnamespace);
                psig := format('%s %s %s', alt, fn, body);
                n := n + 1;
                BEGIN
                    EXECUTE format('CREATE FUNCTION public.shadow_op_%s(%s, %s) RETURNS boolean'
                                   ' LANGUAGE sql AS %L', n, alt, body,
                                   format('SELECT public.shadow_hit(%L)', psig));
                    EXECUTE format('CREATE OPERATOR public.%s (LEFTARG = %s, RIGHTARG = %s,'
                                   ' FUNCTION = public.shadow_op_%s)', fn, alt, body, n);
                    INSERT INTO public.shadow_planted VALUES ('operator', psig);
                EXCEPTION WHEN OTHERS THEN
                    INSERT INTO public.shadow_refused VALUES (psig, SQLERRM);
                END;
            END LOOP;
        END LOOP;
    END LOOP;
END
$plant$;
-- A look-alike type: text is a type name the search_path resolves (bigint and smallint are
-- keywords), and a domain over text runs its CHECK wherever a value is cast to it.
CREATE DOMAIN public.text AS pg_catalog.text CHECK (public.shadow_hit('type text') IS NOT NULL);
INSERT INTO public.shadow_planted VALUES ('type', 'text');
SQL
    { cat "$T/plant.log"; fail "plant the look-alikes"; }
planted() { psql_safe "SELECT count(*) FROM public.shadow_planted WHERE kind = '$1'"; }
psql_safe "SELECT sig, error FROM public.shadow_refused" >"$T/refused.txt"
check "look-alike functions planted" [ "$(planted function)" -gt 1000 ]
check "look-alike aggregates planted" [ "$(planted aggregate)" -gt 50 ]
check "look-alike operators planted" [ "$(planted operator)" -gt 1000 ]
# The ones the review reproduced are among them.
for sig in "pg_try_advisory_lock(integer)" "hashtextextended(text, integer)" \
    "pg_try_advisory_xact_lock_shared(integer)"; do
    check_eq "planted: $sig" 1 "$(psql_safe "SELECT count(*) FROM public.shadow_planted WHERE sig = '$sig'")"
done
for sig in "numeric * integer" "bigint & integer" "integer ^ integer" "double precision / integer"; do
    check_eq "planted: $sig" 1 "$(psql_safe "SELECT count(*) FROM public.shadow_planted WHERE sig = '$sig'")"
done
# Proves the recording works: a call that matches a look-alike exactly is recorded.
psql_q "SELECT 2::numeric * 3" >/dev/null
check_eq "a look-alike records its call" "numeric * integer" \
    "$(psql_safe "SELECT string_agg(sig, ',') FROM public.shadow_calls")"
psql_safe "TRUNCATE public.shadow_calls; SELECT setval('public.shadow_hits', 1, false)" >/dev/null
PG_LOG_START=$(wc -c <"$T/pg.log")

# --- the relay's SQL, with the look-alikes in place ---
check "migrate, with the look-alikes in place" relay_migrate >"$T/migrate1.log" 2>&1
# Adopting a table runs, every time, the SQL that installs the relay's functions and triggers on it.
psql_safe "CREATE TABLE public.adopted (event_id uuid NOT NULL DEFAULT pg_catalog.gen_random_uuid(),
           aggregate_type text NOT NULL, aggregate_id text NOT NULL, event_type text NOT NULL,
           payload jsonb)" || fail "create the table to adopt"
relay_migrate --table adopted >"$T/adopt.log" 2>&1
check_eq "migrate --table (adopt), with the look-alikes in place, exits 0" 0 $?
# Once adopted, a run checks what is in place (and skips the DDL), with its own statements.
relay_migrate --table adopted >"$T/adopt2.log" 2>&1
check_eq "migrate --table again (in place), with the look-alikes in place, exits 0" 0 $?
psql_safe "CREATE ROLE producer_login LOGIN IN ROLE outbox_producer" || fail "create producer_login"
psql_some() { [ -n "$(psql_safe "$1")" ]; }
psql_none() { [ -z "$(psql_safe "$1")" ]; }
guard_held_safe() { PGOPTIONS="-c search_path=pg_catalog,pg_temp" guard_held; }
no_unsent_rows_but() { psql_none "SELECT 1 FROM public.outbox WHERE sent_at IS NULL AND $1"; }
as_producer() { psql -XAtq -v ON_ERROR_STOP=1 -U producer_login -c "$1"; }
insert() { # insert FROM TO: as the producer, default search_path ("$user", public)
    # The producer's own SQL names its built-ins exactly: only what runs inside its INSERT
    # because of the outbox (the lane's function, the triggers) is under test here.
    as_producer "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
                 SELECT 'order', 'o-' OPERATOR(pg_catalog.||) (g % 20)::text, 'changed',
                        pg_catalog.jsonb_build_object('seq'::text, g), '{\"h\": \"v\"}'
                 FROM generate_series($1, $2) AS g ORDER BY g"
}
check "the producer inserts" insert 1 200
# A writer whose own search_path puts the schema first misleads its own statements, but not the
# lane function inside its INSERT (it names every type, function and operator in pg_catalog).
check "a producer with the schema before pg_catalog inserts" as_producer \
    "SET search_path = public, pg_catalog;
     INSERT INTO outbox (aggregate_type, aggregate_id, event_type) VALUES ('order', 'p-1', 'changed')"
as_producer "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
             VALUES ('bad topic!', 'p-1', 'changed', '{}')" || not_ok "insert the poison event"
check_eq "the lanes are the built-in hash's (not all 0)" t \
    "$(psql_safe "SELECT count(DISTINCT lane) > 1 FROM public.outbox")"
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --retention 3s \
    --metrics-listen 127.0.0.1:0 --max-attempts 2 --retry-backoff 100 --retry-backoff-max 200 \
    --dead-letter-topic outbox.dead --poll-interval 60000
metrics_wait
wait_for "the relay delivers" 30 no_unsent_rows_but "aggregate_type = 'order'"
# The poison event's second attempt waits for the relay's next claim: the next poll (60 s away:
# the wakeup below must be the trigger's doing) or a wakeup. Once its first attempt failed and
# the relay sleeps, a row the producer inserts wakes it (the test used to wait for the poll).
failed_once() {
    psql_some "SELECT 1 FROM public.outbox WHERE aggregate_type = 'bad topic!' AND attempts > 0"
}
_poll 30 failed_once && _poll 30 guard_held_safe &&
    as_producer "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
                 VALUES ('order', 'wake-1', 'changed', '{}')"
wait_for "the poison event fails and is dead-lettered" 90 \
    psql_some "SELECT 1 FROM public.outbox WHERE dead_at IS NOT NULL AND dead_letter_topic IS NOT NULL"
wait_for "the relay sleeps, guarding the wakeup lock" 30 guard_held_safe
check "the producer inserts while it sleeps" insert 201 300
wait_for "the wakeup trigger wakes it: all delivered" 30 no_unsent_rows_but "aggregate_type = 'order'"
wait_for "--retention deletes sent rows" 30 psql_none "SELECT 1 FROM public.outbox WHERE sent_at IS NOT NULL"
# The upkeep's looks (--metrics-listen) with rows to read: a session that is not a relay holds a
# mark lock no relay would (the lane-group squatters' look), the neighbour holds a snapshot open
# while transactions go on (the vacuum horizon's), a sent row is kept (retention's oldest), and
# the backlog counts the dead-lettered and the unsent. Each gauge must be served with the value
# those rows give, and no upkeep query may fail.
as_neighbour -c "SELECT pg_catalog.pg_backend_pid()" \
    -c "SELECT pg_catalog.pg_advisory_lock($AWAY_NS, 2000)" \
    -c "BEGIN ISOLATION LEVEL REPEATABLE READ" -c "SELECT pg_catalog.txid_current()" \
    -c "SELECT pg_catalog.pg_sleep(60)" >"$T/neighbour-locks.out" 2>&1 &
NEIGHBOUR=$!
_t_track "$NEIGHBOUR"
neighbour_holds() { [ "$(wc -l <"$T/neighbour-locks.out")" -ge 3 ]; }
_poll 10 neighbour_holds || fail "the neighbour holds a mark lock and a snapshot"
# Sent at infinity: retention never deletes it, and its age is read (overdue: none).
psql_safe "INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, sent_at)
           VALUES ('kept', 'k-1', 'changed', 'infinity')" || not_ok "keep a sent row"
as_producer "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
             VALUES ('order', 'up-1', 'changed', '{}')" || not_ok "insert after the snapshot"
wait_for "upkeep: the squatters' look names the neighbour" 30 metric_is outbox_lane_squatters 1
check "upkeep: ... in the log" grep -q "not a relay holds the lane group's locks.*what=stray-marks" \
    "$RELAY_LOG"
wait_for "upkeep: the horizon's look sees the snapshot" 30 \
    metric_at_least outbox_vacuum_horizon_age_xids 1
check "upkeep: retention's lag is served" metric_is outbox_retention_overdue_seconds 0
check "upkeep: the backlog is counted" metric_at_least outbox_backlog_refresh_timestamp_seconds 1
wait_for "upkeep: ... the dead-lettered" 30 metric_is outbox_dead_letter_rows 1
check_eq "upkeep: no upkeep query failed" "" \
    "$(grep 'upkeep query failed' "$RELAY_LOG" | head -n 3)"
kill "$NEIGHBOUR" 2>/dev/null
wait "$NEIGHBOUR" 2>/dev/null
psql_safe "DELETE FROM public.outbox WHERE aggregate_type = 'kept'" || not_ok "delete the kept row"
relay_stop || not_ok "the relay exits 0"
cmd() { # cmd NAME ARGS...: a command of the relay against the test database
    local name=$1
    shift
    timeout 60 "$RELAY_BIN" "$@" >"$T/$name.out" 2>&1
}
cmd verify verify --database-url "$DATABASE_URL" --brokers "$BROKERS" --since 1h --from-beginning
check "verify ran (exit 0, 1 or 2: the verdict is not the point)" [ $? -le 2 ]
# replay runs as the table's owner: a look-alike it called would run with the owner's rights. Three
# sent rows (retention has deleted the relay's), replayed in two batches after a dry run.
psql_safe "INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
           SELECT 'order', 'r-' || g, 'changed', '{}', pg_catalog.now()
           FROM pg_catalog.generate_series(1, 3) AS g" || not_ok "insert rows to replay"
check "replay --dry-run exits 0" cmd replay-dry replay --database-url "$DATABASE_URL" \
    --aggregate-type order --dry-run
check "replay exits 0" cmd replay replay --database-url "$DATABASE_URL" --aggregate-type order \
    --batch-rows 2
check_eq "... and replayed the 3" 3 "$(psql_safe "SELECT pg_catalog.count(*) FROM public.outbox
                                              WHERE aggregate_id LIKE 'r-%' AND sent_at IS NULL")"
check "status exits 0" cmd status status --database-url "$DATABASE_URL"
check "dead exits 0" cmd dead dead --database-url "$DATABASE_URL"
check "requeue exits 0" cmd requeue requeue --all --database-url "$DATABASE_URL"
psql_safe "UPDATE public.outbox SET dead_at = now() WHERE aggregate_type = 'bad topic!'"
check "purge-dead exits 0" cmd purge purge-dead --all --database-url "$DATABASE_URL"
cmd check check --database-url "$DATABASE_URL" --brokers "$BROKERS"
check "check ran" [ $? -le 2 ]
check "migrate again exits 0" cmd migrate2 migrate --database-url "$DATABASE_URL"

# --- none was called ---
check_eq "no look-alike was called (sequence)" f \
    "$(psql_safe "SELECT is_called FROM public.shadow_hits")"
check_eq "no look-alike was called (log table)" "" \
    "$(psql_safe "SELECT string_agg(DISTINCT sig || ' by ' || caller, '; ') FROM public.shadow_calls")"
check_eq "no look-alike was called (server log)" "" \
    "$(tail -c +"$((PG_LOG_START + 1))" "$T/pg.log" | grep -o 'shadow called: .*' | sort | uniq -c)"
