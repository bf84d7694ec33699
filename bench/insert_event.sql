-- One producer transaction: a single outbox event in its own (autocommit) transaction, for
-- pgbench -M prepared (-R RATE for the latency runs, -T for the producer-cost runs). The payload
-- is shaped like bench_seed's (~200 bytes) and carries committed_us, clock_timestamp() in
-- microseconds taken while the INSERT runs, just before its commit; the consumer stamps the
-- message on receipt with the same clock (same machine).
\set aggr random(0, 999)
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
VALUES ('order', 'order-' || lpad((:aggr)::text, 4, '0'), 'order.paid',
        jsonb_build_object(
            'committed_us', (extract(epoch FROM clock_timestamp()) * 1000000)::bigint,
            'order_id', 'order-' || lpad((:aggr)::text, 4, '0'),
            'status', 'paid',
            'customer_id', 'cust-' || lpad((:aggr)::text, 5, '0'),
            'amount_cents', 4200,
            'currency', 'EUR',
            'items', '[{"sku": "SKU-01234", "qty": 2, "price_cents": 2100}]'::jsonb,
            'note', md5(random()::text)),
        jsonb_build_object('traceparent',
            '00-' || md5(random()::text) || '-' || left(md5(random()::text), 16) || '-01'));
