-- consumer-demo's tables: a shipping service downstream of the order service.
-- Applied by `consumer-demo migrate` and at start-up, in one transaction under an advisory lock;
-- every statement is idempotent, so re-running it changes nothing.

-- One row per event applied; written in the same transaction as the event's effect, so "the row
-- exists" means "the effect is committed". A redelivered event conflicts on the primary key and
-- is skipped.
CREATE TABLE IF NOT EXISTS processed_events (
    event_id     uuid        PRIMARY KEY,
    topic        text        NOT NULL,
    "partition"  integer     NOT NULL,
    "offset"     bigint      NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now()
);

-- Seed 003's TTL: a processed event id is kept until expires_at (now() + --dedupe-ttl at insert)
-- and then swept by the consumer in bounded batches, so the table stays bounded by the event rate
-- times the TTL. Rows from before the column existed get the default once, at the ALTER.
ALTER TABLE processed_events
    ADD COLUMN IF NOT EXISTS expires_at timestamptz NOT NULL DEFAULT now() + interval '7 days';
CREATE INDEX IF NOT EXISTS processed_events_expires_at_idx ON processed_events (expires_at);

-- SHA-256 of the applied copy's raw Kafka value: a later message with the same event id and
-- another digest is a conflict (a producer reused the id for other content), counted and logged,
-- never applied; the first copy stays the truth. Rows from before the column existed are NULL:
-- unknown, so a redelivery of theirs counts as a duplicate whatever it carries.
ALTER TABLE processed_events ADD COLUMN IF NOT EXISTS payload_sha256 bytea;

-- The effect of OrderCreated: one shipment per order (the primary key makes the effect itself
-- idempotent too, should an order ever be announced by two different events).
CREATE TABLE IF NOT EXISTS shipments (
    order_id     text        PRIMARY KEY,
    event_id     uuid        NOT NULL,
    customer_id  text        NOT NULL,
    amount_cents bigint      NOT NULL,
    currency     text        NOT NULL,
    status       text        NOT NULL DEFAULT 'pending',
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- OrderUpdated (versioned updates): a shipment follows its order's state, and only forward.
-- order_version is the version of the order state the row holds; an event applies only when it
-- carries a higher one, so a stale or repeated update changes nothing. Added after the table
-- first shipped, hence the idempotent ALTERs.
ALTER TABLE shipments ADD COLUMN IF NOT EXISTS order_version integer NOT NULL DEFAULT 1;
ALTER TABLE shipments ADD COLUMN IF NOT EXISTS order_status text NOT NULL DEFAULT 'created';
ALTER TABLE shipments ADD COLUMN IF NOT EXISTS last_event_id uuid;
ALTER TABLE shipments ADD COLUMN IF NOT EXISTS updated_at timestamptz NOT NULL DEFAULT now();

-- Messages that cannot be applied (no id header, malformed payload), kept for a human to look
-- at instead of blocking their partition. One row per Kafka position, however often it is
-- redelivered.
CREATE TABLE IF NOT EXISTS parked_messages (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic       text        NOT NULL,
    "partition" integer     NOT NULL,
    "offset"    bigint      NOT NULL,
    key         bytea,
    headers     jsonb       NOT NULL,
    payload     bytea,
    reason      text        NOT NULL,
    parked_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (topic, "partition", "offset")
);
