-- The claim floor (relay/engine/floor.h; README, "Dead rows and old snapshots"). A session's
-- claims start after the rows it has sent; failed events below that point come from the index on
-- failed rows (attempts > 0). What it needs of the table, set up by outbox_floor_install() for
-- the relay's own table here and by `migrate` for a table it adopts (which runs this file's
-- functions, as it does 0007's):
--
-- 1. The relay reads the last value the order column's sequence handed out
--    (pg_sequence_last_value), which needs SELECT on the sequence: granted to outbox_relay (0006)
--    when that role exists. Without it the relay says so once and claims from the start of the
--    unsent index, as before.
-- 2. An event that waits (next_attempt_at) or is dead (dead_at) has failed at least once: the
--    relay sets those columns only together with attempts. A row inserted already waiting or
--    dead, with attempts 0, would be in neither index the claims read once the floor has passed
--    it: a CHECK refuses it. NOT VALID: rows already in the table are not checked (the relay never
--    wrote such a row), new and updated rows are.
-- 3. A row made unsent again by hand would lie below the floor with attempts 0: an UPDATE that
--    clears sent_at (a replay), that sets attempts back to 0, or that moves an unsent row to
--    another aggregate (and with it to another lane, whose session's floor may have passed it).
--    A trigger counts such a row as tried once (attempts 1), which puts it in the index on failed
--    rows: claims find it below the floor, in order, and the floor does not pass it until it is
--    sent. Its WHEN condition is all the relay's own updates cost (they never match).
CREATE OR REPLACE FUNCTION outbox_floor_counted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.attempts := 1;
    RETURN NEW;
END
$$;

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
                   ' WHEN (NEW.sent_at IS NULL AND NEW.attempts = 0 AND (OLD.sent_at IS NOT NULL'
                   ' OR OLD.attempts > 0 OR OLD.%I IS DISTINCT FROM NEW.%I'
                   ' OR OLD.%I IS DISTINCT FROM NEW.%I))'
                   ' EXECUTE FUNCTION outbox_floor_counted()',
                   t, aggregate_type, aggregate_type, aggregate_id, aggregate_id);
END
$$;

-- The relay's own table; a foreign table named outbox (one `migrate` adopts) has other columns.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('outbox')
               AND attname = 'aggregate_type' AND NOT attisdropped) THEN
        PERFORM outbox_floor_install('outbox', 'id', 'aggregate_type', 'aggregate_id');
    END IF;
END
$$;
