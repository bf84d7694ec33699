-- The PostgreSQL-only bound: claim 1,000 unsent rows in id order, as the relay does (same partial
-- index, SKIP LOCKED), and mark them sent in the same statement, returning the columns the relay
-- needs. No Kafka. Run back to back from one client: pgbench -n -M prepared -c 1 -t N/1000.
WITH c AS (
    SELECT id FROM outbox WHERE sent_at IS NULL ORDER BY id LIMIT 1000 FOR UPDATE SKIP LOCKED)
UPDATE outbox AS o SET sent_at = now() FROM c WHERE o.id = c.id
RETURNING o.id, o.event_id, o.aggregate_type, o.aggregate_id, o.event_type, o.payload::text,
          o.headers::text;
