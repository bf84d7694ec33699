-- The benchmark's rows, generated once per run into bench_seed (psql -v rows=N): every drain
-- copies the first N of them into a freshly truncated outbox, so every measurement of a size
-- works on the same rows (same ids, event ids, keys and payloads). Deterministic: no random().
--   * 1,000 aggregates ('order-0000' .. 'order-0999'), round robin in id order, so a batch of
--     1,000 rows holds one event of each aggregate;
--   * a ~200-byte JSON payload and a W3C traceparent header, like a real order event.
SET client_min_messages = warning;
DROP TABLE IF EXISTS bench_seed;
CREATE TABLE bench_seed AS
SELECT g AS n,
       md5('event-' || g)::uuid AS event_id,
       'order'::text AS aggregate_type,
       'order-' || lpad((g % 1000)::text, 4, '0') AS aggregate_id,
       (ARRAY['order.created', 'order.paid', 'order.packed', 'order.shipped',
              'order.delivered'])[1 + g % 5] AS event_type,
       jsonb_build_object(
           'order_id', 'order-' || lpad((g % 1000)::text, 4, '0'),
           'seq', g / 1000,
           'status', (ARRAY['created', 'paid', 'packed', 'shipped', 'delivered'])[1 + g % 5],
           'customer_id', 'cust-' || lpad(((g * 7919) % 100000)::text, 5, '0'),
           'amount_cents', (g * 37) % 100000,
           'currency', 'EUR',
           'items', jsonb_build_array(jsonb_build_object(
               'sku', 'SKU-' || lpad((g % 5000)::text, 5, '0'),
               'qty', 1 + g % 3,
               'price_cents', (g * 13) % 10000)),
           'note', md5('note-' || g)) AS payload,
       jsonb_build_object('traceparent',
           '00-' || md5('trace-' || g) || '-' || left(md5('span-' || g), 16) || '-01') AS headers
FROM generate_series(1::bigint, :rows) AS g;
ALTER TABLE bench_seed ADD PRIMARY KEY (n);
ANALYZE bench_seed;
