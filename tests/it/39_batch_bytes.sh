#!/bin/bash
# Proves a claim holds at most --batch-bytes of payload whatever the rows' sizes (issue 16), and
# that a payload over the producer's message.max.bytes is failed without being loaded:
#  - 30 rows of ~150 KB over 5 aggregates, one of ~700 KB (over the budget of 500,000 bytes: it
#    goes alone) and one of ~2 MB in an aggregate of its own (over message.max.bytes, 1,000,000 by
#    default);
#  - every batch the relay claimed (its debug line "claimed batch ... bytes=N") holds at most
#    500,000 payload bytes, or a single row; the 2 MB payload never counts (it is not loaded);
#  - every row but the 2 MB one is delivered, first copies in order; that one is rejected with
#    last_error "payload too large: N bytes ...", N its real size.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../lib.sh"
t_setup
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"

BUDGET=500000
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'big', CASE g WHEN 20 THEN 'huge' ELSE 'big-' || (g % 5) END, 'changed',
               jsonb_build_object('seq', g, 'blob', repeat('x', CASE g WHEN 10 THEN 700000
                                                                      WHEN 20 THEN 2100000
                                                                      ELSE 150000 END))
        FROM generate_series(1, 32) AS g ORDER BY g"
HUGE=$(psql_q "SELECT id FROM outbox WHERE payload->>'seq' = '20'")
HUGE_BYTES=$(psql_q "SELECT octet_length(payload::text) FROM outbox WHERE id = $HUGE")
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --batch-bytes "$BUDGET" \
    --retry-backoff 60000 --log-level debug --kafka reconnect.backoff.max.ms=500
others_sent() {
    [ "$(psql_q "SELECT count(*) FROM outbox WHERE id <> $HUGE AND sent_at IS NULL")" = 0 ]
}
wait_for "every row but the 2 MB one is delivered" 60 others_sent
grep 'msg="claimed batch"' "$RELAY_LOG" | sed -E 's/.* rows=([0-9]+) .* bytes=([0-9]+) .*/\1 \2/' \
    >"$T/batches.txt"
echo "# batches (rows bytes): $(sort -n "$T/batches.txt" | uniq -c | tr -s ' ' | tr '\n' ';')"
check "batches were claimed" test -s "$T/batches.txt"
check_eq "no batch of several rows holds more than $BUDGET payload bytes" "" \
    "$(awk -v b="$BUDGET" '$1 > 1 && $2 > b' "$T/batches.txt")"
check "the ~700 KB row went alone" grep -qE '^1 7[0-9]{5}$' "$T/batches.txt"
check_eq "no batch held the 2 MB payload" "" "$(awk '$2 >= 2000000' "$T/batches.txt")"
check_eq "the 2 MB row is rejected with its real size" \
    "1|payload too large: $HUGE_BYTES bytes, over the producer's message.max.bytes (not sent)" \
    "$(psql_q "SELECT rejections, last_error FROM outbox WHERE id = $HUGE")"
consume --topic outbox.event.big --idle-ms 2000 --timeout-ms 30000 >"$T/big.json"
check "every row but the 2 MB one is in Kafka, and not that one" \
    diff <(jq -r .headers.id "$T/big.json" | sort -u) \
    <(psql_q "SELECT event_id FROM outbox WHERE id <> $HUGE" | sort)
check "first copies in order per aggregate" first_copies_in_order "$T/big.json"
relay_stop
check_eq "the relay exits 0" 0 "$?"
