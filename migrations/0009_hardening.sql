-- Hardening against roles that may create objects in the relay's schema (issue 46; README,
-- "Security"), and writers limited to their own columns.
--
-- 1. Look-alikes. PostgreSQL prefers a function or operator whose argument types match exactly,
--    anywhere on the search_path, over a built-in that needs a cast, even with pg_catalog first.
--    0003-0008 called several built-ins that need one (pg_try_advisory_lock(1331849732) takes a
--    bigint, hashtextextended(..., 0) a bigint seed, bigint & 63), and their functions ran with
--    the caller's search_path: a writer's INSERT, the relay, the owner's migrate. A role with
--    CREATE on the schema could plant public.&(bigint, integer) and have it run as each of them.
--    Here every function body names its built-ins and operators in pg_catalog and gives every
--    literal its exact type, and each function but outbox_lane runs with a search_path of its own
--    (pg_catalog, its schema, pg_temp), whatever the caller's. outbox_lane keeps none: a function
--    with SET is never inlined, and this one runs on every insert (the generated lane column);
--    its body depends on no search_path at all. The wakeup trigger's WHEN, resolved when the
--    trigger is created, is re-created from the hardened outbox_wakeup_install.
-- 2. Writers (outbox_producer) may INSERT only the columns of the integration contract:
--    aggregate_type, aggregate_id, event_type, payload, headers. Until now they could set
--    attempts, next_attempt_at, dead_at, sent_at, ... and the id itself (OVERRIDING SYSTEM VALUE):
--    a row of their own could hold another application's aggregate back for ever, and an id set
--    ahead of the sequence breaks later inserts. event_id and created_at stay the database's
--    (gen_random_uuid(), now()): an event id a writer picks could repeat another application's,
--    which consumers would drop as a duplicate. `migrate` re-applies the same rule on every run
--    (relay/cmd/grants.c), also to an adopted table.
-- 3. outbox_wakeup_state, unread since 0007: its grants go, PUBLIC's SELECT of 0004 too (the
--    table stays, see 0007; a relay from before 0007 now fails its batches: upgrade it first).

CREATE OR REPLACE FUNCTION outbox_lane(aggregate_type text, aggregate_id text) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (pg_catalog.hashtextextended(aggregate_type OPERATOR(pg_catalog.||) '/'::text
                                        OPERATOR(pg_catalog.||) aggregate_id, 0::bigint)
            OPERATOR(pg_catalog.&) 63::bigint)::smallint
$$;

CREATE OR REPLACE FUNCTION outbox_wakeup() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_catalog.pg_notify('outbox_relay'::text, ''::text);
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION outbox_wakeup_install(tbl regclass) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE pg_catalog.format('DROP TRIGGER IF EXISTS outbox_wakeup ON %s', tbl);
    EXECUTE pg_catalog.format('CREATE TRIGGER outbox_wakeup AFTER INSERT ON %s FOR EACH STATEMENT'
                              ' WHEN (NOT pg_catalog.pg_try_advisory_xact_lock_shared(1331849732::bigint))'
                              ' EXECUTE FUNCTION %s()', tbl,
                              'outbox_wakeup()'::pg_catalog.regprocedure::pg_catalog.regproc);
    -- ALWAYS: also in sessions with session_replication_role = replica (0011_triggers_always.sql).
    EXECUTE pg_catalog.format('ALTER TABLE %s ENABLE ALWAYS TRIGGER outbox_wakeup', tbl);
    -- Its row-level twin for apply workers, which fire row triggers only (0012_wakeup_replica_rows.sql),
    -- queueing one notification a transaction (0013_wakeup_replica_once.sql).
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_trigger WHERE tgrelid OPERATOR(pg_catalog.=) tbl::oid
               AND tgname OPERATOR(pg_catalog.=) 'outbox_wakeup_replica'::name) THEN
        EXECUTE pg_catalog.format('DROP TRIGGER outbox_wakeup_replica ON %s', tbl);
    END IF;
    EXECUTE pg_catalog.format('CREATE TRIGGER outbox_wakeup_replica AFTER INSERT ON %s FOR EACH ROW'
                              ' WHEN (CASE WHEN pg_catalog.pg_try_advisory_xact_lock_shared(1331849732::bigint)'
                              ' THEN false WHEN pg_catalog.current_setting(''outbox_relay.wakeup_queued''::text,'
                              ' true) OPERATOR(pg_catalog.=) ''on''::text THEN false'
                              ' ELSE pg_catalog.set_config(''outbox_relay.wakeup_queued''::text, ''on''::text,'
                              ' true) OPERATOR(pg_catalog.=) ''on''::text END)'
                              ' EXECUTE FUNCTION %s()', tbl,
                              'outbox_wakeup()'::pg_catalog.regprocedure::pg_catalog.regproc);
    EXECUTE pg_catalog.format('ALTER TABLE %s ENABLE REPLICA TRIGGER outbox_wakeup_replica', tbl);
END
$$;

CREATE OR REPLACE FUNCTION outbox_relay_sleep() RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    IF pg_catalog.pg_try_advisory_lock(1331849732::bigint) THEN
        RETURN 'guard';
    END IF;
    IF pg_catalog.pg_try_advisory_xact_lock_shared(1331849732::bigint) THEN
        RETURN 'busy';
    END IF;
    RETURN 'follow';
END
$$;

CREATE OR REPLACE FUNCTION outbox_relay_wake() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_catalog.pg_advisory_unlock(1331849732::bigint);
    PERFORM pg_catalog.pg_notify('outbox_relay'::text, 'guard left'::text);
END
$$;

CREATE OR REPLACE FUNCTION outbox_floor_counted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.attempts := 1;
    RETURN NEW;
END
$$;

-- As in 0008; the aggregate columns are compared as text, whose = is exact (an adopted table's
-- varchar would otherwise reach texteq through a cast, and a look-alike =(varchar, varchar)).
--
-- Replay (`outbox-relay replay`, relay/cmd/replay.h): a sent event put back in line is given a
-- new order value from the sequence ({seq} = DEFAULT), in the same UPDATE that clears sent_at.
-- Its new value is drawn, as an INSERT's is, while the replaying transaction holds
-- RowExclusiveLock on the table, so the claim floor (relay/engine/floor.h) cannot pass it before
-- it commits: to the claims it is a fresh row, read from the unsent index above every floor at
-- the rate of new events, with attempts 0. So the trigger (0008: a row made unsent again counts
-- as tried once, attempts 1, and the claims find it below the floor on the index of failed rows)
-- leaves alone a row whose order value changed in the same UPDATE; it stays the safety net for
-- rows made unsent by hand with their old order value. Safe because the floor is on only for an
-- identity column GENERATED ALWAYS (diagnose.h's SQL_FLOOR_CHECK): an UPDATE may set such a
-- column only to DEFAULT, a value the sequence hands out now, never a lower one chosen by hand.
CREATE OR REPLACE FUNCTION outbox_floor_install(t regclass, seq name, aggregate_type name,
                                                aggregate_id name)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    sequence text := pg_catalog.pg_get_serial_sequence(t::text, seq::text);
BEGIN
    IF sequence IS NOT NULL AND pg_catalog.to_regrole('outbox_relay'::text) IS NOT NULL THEN
        EXECUTE pg_catalog.format('GRANT SELECT ON SEQUENCE %s TO outbox_relay', sequence);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint
                   WHERE conrelid OPERATOR(pg_catalog.=) t::oid
                   AND conname OPERATOR(pg_catalog.=) 'outbox_waits_after_failure'::name) THEN
        EXECUTE pg_catalog.format('ALTER TABLE %s ADD CONSTRAINT outbox_waits_after_failure'
                                  ' CHECK (attempts > 0 OR (next_attempt_at IS NULL AND dead_at IS NULL))'
                                  ' NOT VALID', t);
    END IF;
    EXECUTE pg_catalog.format('DROP TRIGGER IF EXISTS outbox_floor_visible ON %s', t);
    EXECUTE pg_catalog.format('CREATE TRIGGER outbox_floor_visible BEFORE UPDATE ON %s FOR EACH ROW'
                              ' WHEN (NEW.sent_at IS NULL AND NEW.attempts = 0'
                              ' AND OLD.%I IS NOT DISTINCT FROM NEW.%I AND (OLD.sent_at IS NOT NULL'
                              ' OR OLD.attempts > 0 OR OLD.%I::text IS DISTINCT FROM NEW.%I::text'
                              ' OR OLD.%I::text IS DISTINCT FROM NEW.%I::text))'
                              ' EXECUTE FUNCTION %s()',
                              t, seq, seq, aggregate_type, aggregate_type, aggregate_id, aggregate_id,
                              'outbox_floor_counted()'::pg_catalog.regprocedure::pg_catalog.regproc);
    -- ALWAYS: also in sessions with session_replication_role = replica (0011_triggers_always.sql).
    EXECUTE pg_catalog.format('ALTER TABLE %s ENABLE ALWAYS TRIGGER outbox_floor_visible', t);
END
$$;

-- Each function above but outbox_lane gets the search_path pg_catalog, its own schema, pg_temp
-- (its schema: where the outbox's functions are, which migrate or psql created here).
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOREACH f IN ARRAY ARRAY['outbox_wakeup()', 'outbox_wakeup_install(regclass)',
                             'outbox_relay_sleep()', 'outbox_relay_wake()',
                             'outbox_floor_counted()',
                             'outbox_floor_install(regclass, name, name, name)']::regprocedure[] LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', f,
                                  (SELECT n.nspname FROM pg_catalog.pg_proc p
                                   JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
                                   WHERE p.oid OPERATOR(pg_catalog.=) f::oid));
    END LOOP;
END
$$;

-- The triggers again, their WHEN conditions resolved by the functions above.
SELECT outbox_wakeup_install(tgrelid::regclass) FROM pg_catalog.pg_trigger
WHERE tgname OPERATOR(pg_catalog.=) 'outbox_wakeup'::name
AND tgfoid OPERATOR(pg_catalog.=) 'outbox_wakeup()'::regprocedure::oid;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_attribute WHERE attrelid OPERATOR(pg_catalog.=)
               pg_catalog.to_regclass('outbox'::text)::oid
               AND attname OPERATOR(pg_catalog.=) 'aggregate_type'::name AND NOT attisdropped) THEN
        PERFORM outbox_floor_install('outbox'::regclass, 'id'::name, 'aggregate_type'::name,
                                     'aggregate_id'::name);
    END IF;
END
$$;

-- 2 and 3. REVOKE INSERT ON a table also takes its column privileges: the GRANT follows it.
DO $$
BEGIN
    IF pg_catalog.to_regrole('outbox_producer'::text) IS NOT NULL THEN
        -- The relay's own table only (an adopted table named outbox has other columns: migrate's
        -- grants step gives its writers theirs).
        IF (SELECT pg_catalog.count(*) FROM pg_catalog.pg_attribute
            WHERE attrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('outbox'::text)::oid
            AND attname OPERATOR(pg_catalog.=) ANY (ARRAY['aggregate_type', 'aggregate_id',
                'event_type', 'payload', 'headers', 'attempts']::name[])
            AND NOT attisdropped) OPERATOR(pg_catalog.=) 6::bigint THEN
            REVOKE INSERT ON outbox FROM outbox_producer;
            GRANT INSERT (aggregate_type, aggregate_id, event_type, payload, headers)
                ON outbox TO outbox_producer;
        END IF;
        IF pg_catalog.to_regclass('outbox_wakeup_state'::text) IS NOT NULL THEN
            REVOKE ALL ON outbox_wakeup_state FROM outbox_producer;
        END IF;
    END IF;
    IF pg_catalog.to_regrole('outbox_relay'::text) IS NOT NULL
       AND pg_catalog.to_regclass('outbox_wakeup_state'::text) IS NOT NULL THEN
        REVOKE ALL ON outbox_wakeup_state FROM outbox_relay;
    END IF;
    -- 0004 let every role read it (its producers' trigger did, with their privileges).
    IF pg_catalog.to_regclass('outbox_wakeup_state'::text) IS NOT NULL THEN
        REVOKE ALL ON outbox_wakeup_state FROM PUBLIC;
    END IF;
END
$$;
