-- The PostgreSQL-only bound with DELETE instead of UPDATE (no new row versions, no index
-- entries for them): claim 1,000 unsent rows in id order and delete them, returning the columns
-- the relay needs. No Kafka. pgbench -n -M prepared -c 1 -t N/1000.
WITH c AS (
    SELECT id FROM outbox WHERE sent_at IS NULL ORDER BY id LIMIT 1000 FOR UPDATE SKIP LOCKED)
DELETE FROM outbox AS o USING c WHERE o.id = c.id
RETURNING o.id, o.event_id, o.aggregate_type, o.aggregate_id, o.event_type, o.payload::text,
          o.headers::text;
