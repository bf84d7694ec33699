-- producer-demo's own tables (the outbox table is the relay's: `outbox-relay migrate`).
-- Applied by `producer-demo migrate` and at start-up of `serve` and `load`, in one transaction
-- under an advisory lock; every statement is idempotent, so re-running it changes nothing.

-- The business table: one row per order.
CREATE TABLE IF NOT EXISTS orders (
    id           uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    customer_id  text        NOT NULL,
    amount_cents bigint      NOT NULL CHECK (amount_cents > 0),
    currency     text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    status       text        NOT NULL DEFAULT 'created',
    version      integer     NOT NULL DEFAULT 1,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);

-- Idempotency-Key records. A key is scoped to one endpoint; request_hash is the SHA-256 of the
-- method, path and body that first used it. The response columns are NULL only inside the
-- transaction that claims the key: it inserts the record, writes the order and its outbox row,
-- stores the response and commits, all at once.
CREATE TABLE IF NOT EXISTS idempotency_keys (
    endpoint          text        NOT NULL,
    key               text        NOT NULL,
    request_hash      bytea       NOT NULL,
    response_status   integer,
    response_body     text,
    response_location text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    expires_at        timestamptz NOT NULL,
    PRIMARY KEY (endpoint, key),
    CONSTRAINT idempotency_keys_key_chars CHECK (key ~ '^[!-~]{1,255}$')
);

-- The ETag of the stored response (PATCH and POST answers name the order's version), added after
-- the table first shipped, hence a separate, idempotent ALTER.
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS response_etag text;

-- The cleanup deletes expired records oldest first, in bounded batches.
CREATE INDEX IF NOT EXISTS idempotency_keys_expires_at_idx ON idempotency_keys (expires_at);
