-- The outbox table: applications INSERT aggregate_type, aggregate_id, event_type, payload and
-- optionally headers, in the same transaction as their business change. Everything else has a
-- default. The relay claims unsent rows in id order and sets sent_at once Kafka acknowledged them.
CREATE TABLE IF NOT EXISTS outbox (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id       uuid        NOT NULL DEFAULT gen_random_uuid(),
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    event_type     text        NOT NULL,
    payload        jsonb,
    headers        jsonb,
    created_at     timestamptz NOT NULL DEFAULT now(),
    sent_at        timestamptz,
    attempts       integer     NOT NULL DEFAULT 0,
    last_error     text,
    CONSTRAINT outbox_event_id_key UNIQUE (event_id),
    CONSTRAINT outbox_headers_is_object CHECK (headers IS NULL OR jsonb_typeof(headers) = 'object')
);

-- The claim query walks unsent rows in id order; a partial index keeps it small however many
-- sent rows the table holds.
CREATE INDEX IF NOT EXISTS outbox_unsent_idx ON outbox (id) WHERE sent_at IS NULL;
