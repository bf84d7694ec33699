#!/bin/bash
# Proves that an aggregate whose id is empty ('' in a NOT NULL column, or NULL in an adopted table,
# both published with an empty key) stays in one partition, and so in order: librdkafka's default
# partitioner, consistent_random, places each message with an empty key in a partition at
# random, which spread such an aggregate's 40 events over all 4 partitions of the topic (relay/io/
# kafka.c sets partitioner=consistent, the same CRC32 of the key for every non-empty key).
# A second aggregate with a real id checks that partitioning of other keys is unchanged.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"

psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'e', a, 'changed', jsonb_build_object('seq', i)
        FROM generate_series(1, 40) AS i, (VALUES (''), ('order-7')) AS v(a)
        ORDER BY i, a" || fail "insert the events"
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --batch-size 10
all_sent() { [ "$(psql_q "SELECT count(*) FROM outbox WHERE sent_at IS NULL")" = 0 ]; }
wait_for "every event is delivered" 30 all_sent
relay_stop
consume --topic outbox.event.e --count 80 --timeout-ms 10000 >"$T/e.json"
check_eq "all 80 events are read back" 80 "$(jq -r '.headers.id' "$T/e.json" | sort -u | wc -l)"
check_eq "the empty aggregate id's 40 events are all in one partition" 1 \
    "$(jq -r 'select(.key == "") | .partition' "$T/e.json" | sort -u | wc -l)"
# CRC32("order-7") % 4 = 2 (python3 -c "import zlib; print(zlib.crc32(b'order-7') % 4)"): what
# consistent_random gave it too, so no aggregate with an id moves when the partitioner changes.
check_eq "order-7's 40 events are all in partition 2, CRC32 of the key as before" 2 \
    "$(jq -r 'select(.key == "order-7") | .partition' "$T/e.json" | sort -u | tr '\n' ' ' |
        sed 's/ $//')"
check "and the first copies of each aggregate are in order" first_copies_in_order "$T/e.json"
