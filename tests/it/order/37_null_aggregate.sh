#!/bin/bash
# Proves a failed event holds back the later events of its aggregate when the aggregate id is NULL
# (an adopted table may allow it). Lanes hash NULL as '', but the claim's held-back check compared
# `b.agg_id = o.agg_id`, never true for NULL, so on main the later events of a NULL-keyed aggregate
# were claimed and published while its first event waited for its retry: an order break.
# A Debezium-layout table whose aggregateid allows NULL holds, for aggregate ('n', NULL): a 2 MB
# event (over message.max.bytes: rejected, retried after --retry-backoff) and then two small ones.
# After the rejection, rows of another aggregate inserted later are delivered (so later claims ran),
# while the two small events stay unsent and unpublished.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1

psql_q "CREATE TABLE outbox (
            id uuid NOT NULL PRIMARY KEY DEFAULT gen_random_uuid(),
            aggregatetype varchar(255) NOT NULL,
            aggregateid varchar(255),
            type varchar(255) NOT NULL,
            payload jsonb)" || fail "create the Debezium table"
relay_migrate --layout debezium 2>"$T/migrate.log" || fail "migrate adopts the table"
insert() { # insert AGGREGATE_ID_SQL SEQ [BLOB_BYTES]
    psql_q "INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
            VALUES ('n', $1, 'changed',
                    jsonb_build_object('seq', $2, 'blob', repeat('x', ${3:-0})))"
}
insert NULL 1 $((2 * 1024 * 1024))
insert NULL 2
insert NULL 3
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --layout debezium \
    --retry-backoff 60000 --kafka reconnect.backoff.max.ms=500
rejected() {
    [ "$(psql_q "SELECT rejections FROM outbox WHERE payload->>'seq' = '1'")" -ge 1 ]
}
wait_for "the 2 MB event of the NULL aggregate is rejected" 30 rejected
insert "'other'" 4
other_sent() {
    [ "$(psql_q "SELECT count(*) FROM outbox WHERE aggregateid = 'other'
                 AND sent_at IS NOT NULL")" = 1 ]
}
wait_for "a later row of another aggregate is delivered (claims go on)" 30 other_sent
# The claim that took 'other' (seq 4) found the NULL aggregate's later events (seq 2, 3) first:
# unless they are held back, they were in that batch, ahead of it.
check_eq "the later events of the NULL aggregate stay unsent" 0 \
    "$(psql_q "SELECT count(*) FROM outbox WHERE aggregateid IS NULL AND sent_at IS NOT NULL")"
# Exact: the mark of 'other' came after Kafka acknowledged its batch, and any batch before it, so
# a later event of the NULL aggregate published with or before it lies below the end offsets.
consume --topic outbox.event.n --to-end --timeout-ms 30000 >"$T/n.json"
check_eq "and none of them was published" 0 \
    "$(jq -r 'select(.key != "other") | .headers.id' "$T/n.json" | wc -l)"
relay_stop
check_eq "the relay exits 0" 0 "$?"
