-- The claim floor (relay/engine/floor.h; README, "Dead rows and old snapshots"). A session's
-- claims start after the rows it has sent; failed events below that point come from the index on
-- failed rows (attempts > 0). Two things it relies on:
--
-- 1. The relay reads the last value the id's sequence handed out (pg_sequence_last_value), which
--    needs SELECT on the sequence: granted to outbox_relay (0006) when that role exists. Without
--    it the relay says so once and claims from the start of the unsent index, as before.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'outbox_relay') THEN
        EXECUTE format('GRANT SELECT ON SEQUENCE %s TO outbox_relay',
                       pg_get_serial_sequence('outbox', 'id'));
    END IF;
END
$$;

-- 2. An event that waits (next_attempt_at) or is dead (dead_at) has failed at least once: the
--    relay sets those columns only together with attempts. A row inserted already waiting or
--    dead, with attempts 0, would be in neither index the claims read once the floor has passed
--    it. NOT VALID: rows already in the table are not checked (the relay never wrote such a row),
--    new and updated rows are.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                   WHERE conrelid = 'outbox'::regclass AND conname = 'outbox_waits_after_failure') THEN
        ALTER TABLE outbox ADD CONSTRAINT outbox_waits_after_failure
            CHECK (attempts > 0 OR (next_attempt_at IS NULL AND dead_at IS NULL)) NOT VALID;
    END IF;
END
$$;
