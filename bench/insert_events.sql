-- One producer transaction of :events outbox events (pgbench -D events=N), for the latency rows
-- whose event rate this machine cannot reach one transaction per event (bench.sh's RATExN).
-- Each row is shaped like insert_event.sql's: its own random aggregate, ~200 bytes of payload,
-- committed_us taken while the INSERT runs, just before the commit.
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
SELECT 'order', 'order-' || lpad(a::text, 4, '0'), 'order.paid',
       jsonb_build_object(
           'committed_us', (extract(epoch FROM clock_timestamp()) * 1000000)::bigint,
           'order_id', 'order-' || lpad(a::text, 4, '0'),
           'status', 'paid',
           'customer_id', 'cust-' || lpad(a::text, 5, '0'),
           'amount_cents', 4200,
           'currency', 'EUR',
           'items', '[{"sku": "SKU-01234", "qty": 2, "price_cents": 2100}]'::jsonb,
           'note', md5(random()::text)),
       jsonb_build_object('traceparent',
           '00-' || md5(random()::text) || '-' || left(md5(random()::text), 16) || '-01')
FROM (SELECT floor(random() * 1000)::int AS a FROM generate_series(1, :events)) AS g;
