#!/bin/bash
# Proves a failed event holds back the later events of its own aggregate when the aggregate id
# column has a nondeterministic collation (an adopted table may declare one: case-insensitive,
# or equal up to Unicode normalization). The claim's held-back aggregates are grouped before
# they are looked up by exact key (the jsonb map of statements.c SQL_BLOCKED): grouped under the
# column's collation, 'A' and 'a' became one group named by one of them, and the other's rows
# found nothing held back, so the later event of 'a' was published while the first waited for
# its retry: an order break for the Kafka key 'a'. Grouped by bytes, each id has its own entry.
# A Debezium-layout table whose aggregateid is case-insensitive holds, for type 'n': a 2 MB event
# of 'A', then a 2 MB event of 'a' (both over message.max.bytes: rejected, retried after
# --retry-backoff), then a small event of 'a'. After the rejections, a row of another aggregate
# inserted later is delivered (so later claims ran), while the small event of 'a' stays unsent and
# unpublished.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1

psql_q "CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)" ||
    fail "create a case-insensitive collation (ICU)"
psql_q "CREATE TABLE outbox (
            id uuid NOT NULL PRIMARY KEY DEFAULT gen_random_uuid(),
            aggregatetype varchar(255) NOT NULL,
            aggregateid varchar(255) COLLATE ci NOT NULL,
            type varchar(255) NOT NULL,
            payload jsonb)" || fail "create the Debezium table"
relay_migrate --layout debezium 2>"$T/migrate.log" || fail "migrate adopts the table"
insert() { # insert AGGREGATE_ID SEQ [BLOB_BYTES]
    psql_q "INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
            VALUES ('n', '$1', 'changed',
                    jsonb_build_object('seq', $2, 'blob', repeat('x', ${3:-0})))"
}
insert A 1 $((2 * 1024 * 1024))
insert a 2 $((2 * 1024 * 1024))
insert a 3
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --layout debezium \
    --retry-backoff 60000 --kafka reconnect.backoff.max.ms=500
rejected() {
    [ "$(psql_q "SELECT count(*) FROM outbox WHERE payload->>'seq' IN ('1', '2')
                 AND rejections >= 1")" = 2 ]
}
wait_for "the two 2 MB events (ids 'A' and 'a') are rejected" 30 rejected
insert other 4
other_sent() {
    [ "$(psql_q "SELECT count(*) FROM outbox WHERE aggregateid = 'other'
                 AND sent_at IS NOT NULL")" = 1 ]
}
wait_for "a later row of another aggregate is delivered (claims go on)" 30 other_sent
# The claim that took 'other' (4) found the later event of 'a' (3) first: unless the failed
# event of 'a' (2) holds it back, it was in that batch, ahead of 'other'.
check_eq "the later event of 'a' stays unsent" 0 \
    "$(psql_q "SELECT count(*) FROM outbox WHERE payload->>'seq' = '3' AND sent_at IS NOT NULL")"
# Exact: the mark of 'other' came after Kafka acknowledged its batch, and any batch before it.
consume --topic outbox.event.n --to-end --timeout-ms 30000 >"$T/n.json"
check_eq "and it was not published" 0 \
    "$(jq -r 'select(.key != "other") | .headers.id' "$T/n.json" | wc -l)"
relay_stop
check_eq "the relay exits 0" 0 "$?"
