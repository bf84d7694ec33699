-- The wakeup trigger fires in every session, also one with session_replication_role = replica.
-- A trigger enabled the ordinary way (ENABLE, the default) does not fire there, and such
-- sessions write outbox rows in production: logical replication's apply workers (an outbox fed
-- by a subscription, the relay running on the subscriber), pglogical, loaders that set the role
-- to skip foreign-key checks. Their insert then neither took the wakeup lock shared nor notified:
-- a relay could fall asleep as the guard while such a transaction was open, and its rows, and
-- any committed while the relay slept, waited for the --poll-interval timer (1 s by default,
-- longer where it was raised) however soon they committed. ENABLE ALWAYS makes the trigger, and
-- its WHEN, run there as anywhere. (A trigger disabled by hand, or by a restore's
-- --disable-triggers, still fires nowhere: the poll timer alone then finds the rows.)
-- outbox_wakeup_install, as 0009 defines it now, enables it so, for the tables migrate installs
-- the trigger on from now on; here it is defined again for databases where 0009 ran before, and
-- each table that has the trigger gets it again.
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
