-- The wakeup's row-level twin (0012) queues one notification a transaction, not one a row.
-- Its WHEN ran for each row and, while a relay slept, queued the trigger's event for each: an
-- after-trigger event is kept in the inserting backend's memory until its statement ends, so
-- the initial sync of a subscription (its COPY fires row triggers, in one statement) or a
-- loader's bulk INSERT held one per row and then ran outbox_wakeup() and pg_notify once per
-- row, all folded into one notification at commit. Measured before, a replica session's COPY of
-- 1,000,000 rows while a relay slept, 2 interleaved rounds: the backend's peak memory 166 MB
-- with the twin, 124 MB with it disabled (about 43 bytes a row, so gigabytes for an outbox of
-- tens of millions of rows, as a major-version upgrade by logical replication syncs).
-- Now the WHEN, past the wakeup lock, notes in a setting local to the transaction
-- (outbox_relay.wakeup_queued, set_config(..., true)) that it queued the event, and the rows
-- after it queue none. The setting goes back at commit, at rollback and at a rollback to a
-- savepoint, as a queued notification goes, so the next transaction notifies again. CASE fixes
-- the order: the lock is tried first, as before (taken shared, no notification needed).
-- outbox_wakeup_install, as 0009 defines it now, installs it so; here it is defined again for
-- databases where 0009 ran before, and each table that has the wakeup trigger gets both again.
CREATE OR REPLACE FUNCTION outbox_wakeup_install(tbl regclass) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE pg_catalog.format('DROP TRIGGER IF EXISTS outbox_wakeup ON %s', tbl);
    EXECUTE pg_catalog.format('CREATE TRIGGER outbox_wakeup AFTER INSERT ON %s FOR EACH STATEMENT'
                              ' WHEN (NOT pg_catalog.pg_try_advisory_xact_lock_shared(1331849732::bigint))'
                              ' EXECUTE FUNCTION %s()', tbl,
                              'outbox_wakeup()'::pg_catalog.regprocedure::pg_catalog.regproc);
    EXECUTE pg_catalog.format('ALTER TABLE %s ENABLE ALWAYS TRIGGER outbox_wakeup', tbl);
    -- Looked up first: DROP TRIGGER IF EXISTS would say "does not exist, skipping" for each
    -- table on its first install, which migrate passes on as a server notice.
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

-- CREATE OR REPLACE resets the function's settings: its search_path again, as 0009 sets it.
DO $$
BEGIN
    EXECUTE pg_catalog.format('ALTER FUNCTION outbox_wakeup_install(regclass)'
                              ' SET search_path = pg_catalog, %I, pg_temp',
                              (SELECT n.nspname FROM pg_catalog.pg_proc p
                               JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
                               WHERE p.oid OPERATOR(pg_catalog.=) 'outbox_wakeup_install(regclass)'::regprocedure::oid));
END
$$;

SELECT outbox_wakeup_install(tgrelid::regclass) FROM pg_catalog.pg_trigger
WHERE tgname OPERATOR(pg_catalog.=) 'outbox_wakeup'::name
AND tgfoid OPERATOR(pg_catalog.=) 'outbox_wakeup()'::regprocedure::oid;
