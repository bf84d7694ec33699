-- Lanes, per-row retries and dead-lettering.
--
-- Every aggregate hashes into one of 64 lanes. Each lane is owned by exactly one relay at a time
-- (a session-level advisory lock), so two relays never hold events of the same aggregate at once
-- and each aggregate's events go out in id order however many relays run. hashtextextended is
-- the hash PostgreSQL's hash partitioning relies on, so it is stable across versions. The relay
-- has the lane count (64) built in: change both or neither.
CREATE OR REPLACE FUNCTION outbox_lane(aggregate_type text, aggregate_id text) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (hashtextextended(aggregate_type || '/' || aggregate_id, 0) & 63)::smallint
$$;

ALTER TABLE outbox
    ADD COLUMN IF NOT EXISTS lane smallint
        GENERATED ALWAYS AS (outbox_lane(aggregate_type, aggregate_id)) STORED,
    -- A failed event is not retried before this time (capped exponential backoff with jitter).
    ADD COLUMN IF NOT EXISTS next_attempt_at timestamptz,
    -- Failures that will not go away by retrying (too large, illegal topic, rejected by the
    -- broker); max-attempts of them dead-letter the event. `attempts` counts every failure.
    ADD COLUMN IF NOT EXISTS rejections integer NOT NULL DEFAULT 0,
    -- Set when the event is dead-lettered: it stays in the table, unsent, until requeued.
    ADD COLUMN IF NOT EXISTS dead_at timestamptz,
    -- The dead-letter topic it was published to, when one is configured.
    ADD COLUMN IF NOT EXISTS dead_letter_topic text;

-- Failed, waiting and dead events: few, and what the claim checks to hold an aggregate back.
CREATE INDEX IF NOT EXISTS outbox_retry_idx ON outbox (aggregate_type, aggregate_id, id)
    WHERE sent_at IS NULL AND attempts > 0;
