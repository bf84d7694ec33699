-- The relay's triggers fire in every session, also one with session_replication_role = replica.
-- A trigger enabled the ordinary way (ENABLE, the default) does not fire there, and such sessions
-- write outbox rows in production: logical replication's apply workers (an outbox fed by a
-- subscription, the relay running on the subscriber), pglogical, loaders that set the role to
-- skip foreign-key checks. ENABLE ALWAYS makes each trigger, and its WHEN, run there as anywhere.
-- (A trigger disabled by hand, or by a restore's --disable-triggers, still fires nowhere.)
--
-- 1. The wakeup trigger (0007). Such an insert neither took the wakeup lock shared nor notified:
--    a relay could fall asleep as the guard while such a transaction was open, and its rows, and
--    any committed while the relay slept, waited for the --poll-interval timer (1 s by default,
--    longer where it was raised) however soon they committed.
-- 2. The claim floor's trigger (0008, 0009: outbox_floor_visible). A row such a session made
--    unsent again (sent_at cleared, attempts set back to 0, moved to another aggregate) kept
--    attempts 0: below the floor it was on neither index the claims read, so the next events of
--    its aggregate, above the floor, were published before it, and it waited until the floor
--    started again from 0 (a reconnect, lanes gained).
-- outbox_wakeup_install and outbox_floor_install, as 0009 defines them now, enable their triggers
-- so, for the tables migrate installs them on from now on (an adopted table runs 0009 again);
-- here they are defined again for databases where 0009 ran before, and each table that has a
-- trigger gets it enabled ALWAYS (the floor's in place: its columns are the table's to know).
CREATE OR REPLACE FUNCTION outbox_wakeup_install(tbl regclass) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE pg_catalog.format('DROP TRIGGER IF EXISTS outbox_wakeup ON %s', tbl);
    EXECUTE pg_catalog.format('CREATE TRIGGER outbox_wakeup AFTER INSERT ON %s FOR EACH STATEMENT'
                              ' WHEN (NOT pg_catalog.pg_try_advisory_xact_lock_shared(1331849732::bigint))'
                              ' EXECUTE FUNCTION %s()', tbl,
                              'outbox_wakeup()'::pg_catalog.regprocedure::pg_catalog.regproc);
    EXECUTE pg_catalog.format('ALTER TABLE %s ENABLE ALWAYS TRIGGER outbox_wakeup', tbl);
END
$$;

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
    -- ALWAYS: also in sessions with session_replication_role = replica (2, above).
    EXECUTE pg_catalog.format('ALTER TABLE %s ENABLE ALWAYS TRIGGER outbox_floor_visible', t);
END
$$;

-- CREATE OR REPLACE resets a function's settings: their search_path again, as 0009 sets it.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOREACH f IN ARRAY ARRAY['outbox_wakeup_install(regclass)',
                             'outbox_floor_install(regclass, name, name, name)']::regprocedure[] LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', f,
                                  (SELECT n.nspname FROM pg_catalog.pg_proc p
                                   JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
                                   WHERE p.oid OPERATOR(pg_catalog.=) f::oid));
    END LOOP;
END
$$;

SELECT outbox_wakeup_install(tgrelid::regclass) FROM pg_catalog.pg_trigger
WHERE tgname OPERATOR(pg_catalog.=) 'outbox_wakeup'::name
AND tgfoid OPERATOR(pg_catalog.=) 'outbox_wakeup()'::regprocedure::oid;
DO $$
DECLARE
    t regclass;
BEGIN
    FOR t IN SELECT tgrelid::regclass FROM pg_catalog.pg_trigger
             WHERE tgname OPERATOR(pg_catalog.=) 'outbox_floor_visible'::name
             AND tgfoid OPERATOR(pg_catalog.=) 'outbox_floor_counted()'::regprocedure::oid LOOP
        EXECUTE pg_catalog.format('ALTER TABLE %s ENABLE ALWAYS TRIGGER outbox_floor_visible', t);
    END LOOP;
END
$$;
