-- Replay (`outbox-relay replay`, relay/cmd/replay.h): a sent event put back in line is given a
-- new order value from the sequence ({seq} = DEFAULT), in the same UPDATE that clears sent_at.
-- Its new value is drawn, as an INSERT's is, while the replaying transaction holds
-- RowExclusiveLock on the table, so the claim floor (relay/engine/floor.h) cannot pass it before
-- it commits: to the claims it is a fresh row, read from the unsent index above every floor at
-- the rate of new events, with attempts 0.
--
-- 0008's trigger counts a row made unsent again as tried once (attempts 1), so the claims find it
-- below the floor on the index of failed rows. It stays the safety net for rows made unsent by
-- hand with their old order value; a row whose order value changed in the same UPDATE is left
-- alone. Safe because the floor is on only for an identity column GENERATED ALWAYS (diagnose.h's
-- SQL_FLOOR_CHECK): an UPDATE may set such a column only to DEFAULT, a value the sequence hands
-- out now, never a lower one chosen by hand.
CREATE OR REPLACE FUNCTION outbox_floor_install(t regclass, seq name, aggregate_type name,
                                                aggregate_id name)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    sequence text := pg_get_serial_sequence(t::text, seq);
BEGIN
    IF sequence IS NOT NULL AND to_regrole('outbox_relay') IS NOT NULL THEN
        EXECUTE format('GRANT SELECT ON SEQUENCE %s TO outbox_relay', sequence);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                   WHERE conrelid = t AND conname = 'outbox_waits_after_failure') THEN
        EXECUTE format('ALTER TABLE %s ADD CONSTRAINT outbox_waits_after_failure CHECK (attempts > 0'
                       ' OR (next_attempt_at IS NULL AND dead_at IS NULL)) NOT VALID', t);
    END IF;
    EXECUTE format('DROP TRIGGER IF EXISTS outbox_floor_visible ON %s', t);
    EXECUTE format('CREATE TRIGGER outbox_floor_visible BEFORE UPDATE ON %s FOR EACH ROW'
                   ' WHEN (NEW.sent_at IS NULL AND NEW.attempts = 0'
                   ' AND OLD.%I IS NOT DISTINCT FROM NEW.%I AND (OLD.sent_at IS NOT NULL'
                   ' OR OLD.attempts > 0 OR OLD.%I IS DISTINCT FROM NEW.%I'
                   ' OR OLD.%I IS DISTINCT FROM NEW.%I))'
                   ' EXECUTE FUNCTION outbox_floor_counted()',
                   t, seq, seq, aggregate_type, aggregate_type, aggregate_id, aggregate_id);
END
$$;

-- The relay's own table, as in 0008; a table `migrate` adopts gets the new trigger from migrate,
-- which calls outbox_floor_install after the migrations.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('outbox')
               AND attname = 'aggregate_type' AND NOT attisdropped) THEN
        PERFORM outbox_floor_install('outbox', 'id', 'aggregate_type', 'aggregate_id');
    END IF;
END
$$;
