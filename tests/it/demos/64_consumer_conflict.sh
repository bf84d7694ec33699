#!/bin/bash
# Proves that consumer-demo tells a redelivery from an event id reused for another payload (a
# producer's bug), against the mock broker, a real PostgreSQL and Debian's redis-server:
#  1. one id with payload A, then B, then A again (one partition, in that order): A is applied
#     once, the second A counted a duplicate, B a conflict (conflicts=1, one warn line with the
#     event id, partition, offset and both digests' first 8 hex characters); the shipment and
#     processed_events keep A; a third payload C for the id is counted (conflicts=2) but not
#     warned about again;
#  2. the conflicting message's offset is committed: a restarted member of the group does not
#     get it again;
#  3. a processed_events row without a digest (written before the column existed) is unknown,
#     not a conflict: another payload under its id counts as a duplicate;
#  4. with Redis, which holds the applied payload's digest: a redelivery of A is skipped there
#     (redis_hits), B is not (it goes to PostgreSQL and is a conflict); an entry of the older
#     form ("1") is no Redis hit, and is rewritten with the digest;
#  5. a malformed message with a NUL byte in a header value is parked (the value kept as hex),
#     and the valid event behind it is applied;
#  6. a message with two different id headers, or an id header without a value, is parked with
#     that reason; the same id twice is one id.
# The consumer before payload digests counted B as a duplicate and applied only A, silently.
source "$(dirname "$0")/../../lib.sh"
source "$(dirname "$0")/../../demo_lib.sh"
demo_setup
pg_start
broker_start 1
"$CONSUMER_BIN" migrate --database-url "$DATABASE_URL" 2>"$T/consumer.migrate.log" ||
    fail "consumer-demo migrate"

TOPIC=orders.conflict
uuid() { cat /proc/sys/kernel/random/uuid; }
digest() { printf '%s' "$1" | sha256sum | cut -c1-64; }
# payload ORDER AMOUNT: an OrderCreated payload, as the value's exact bytes.
payload() {
    printf '{"id":"%s","customer_id":"c-%s","amount_cents":%s,"currency":"EUR"}' "$1" "$1" "$2"
}
# msg ID PAYLOAD: one message as a bin/produce line, keyed by the payload's order (so all
# messages of one order land in one partition, in the order they are produced).
msg() {
    jq -cn --arg id "$1" --arg v "$2" \
        '{key: ($v | fromjson | .id), value: $v,
          headers: [["id", $id], ["event_type", "OrderCreated"], ["aggregate_type", "order"]]}'
}
produce() {
    "$BIN/produce" --brokers "$BROKERS" --topic "$1" >/dev/null 2>>"$T/produce.log"
}
# counts: the counters of the current consumer's last progress (or final) line.
counts() {
    grep -E 'msg="consumer (progress|stopped)"' "$CONSUMER_LOG" | tail -n 1 |
        grep -o 'applied=.*conflicts=[0-9]*'
}
counts_are() {
    [ "$(counts)" = "$1" ]
}
conflict_warnings() {
    grep -c 'level=warn msg="conflicting event skipped"' "$CONSUMER_LOG"
}

# --- 1. A, B, A under one id ------------------------------------------------------------------
ID=$(uuid)
A=$(payload o-1 100)
B=$(payload o-1 999)
C=$(payload o-1 555)
{
    msg "$ID" "$A"
    msg "$ID" "$B"
    msg "$ID" "$A"
} | produce "$TOPIC" || fail "produce A, B, A"
consumer_start --topic "$TOPIC" --group shipping
wait_for "1: A applied once, A again a duplicate, B a conflict" 30 \
    counts_are "applied=1 duplicates=1 ignored=0 parked=0 stale=0 redis_hits=0 conflicts=1"
check_eq "1: the shipment holds A, the first payload" "o-1 c-o-1 100" \
    "$(psql_q "SELECT order_id || ' ' || customer_id || ' ' || amount_cents FROM shipments")"
check_eq "1: processed_events keeps A's digest" "$(digest "$A")" \
    "$(psql_q "SELECT encode(payload_sha256, 'hex') FROM processed_events
               WHERE event_id = '$ID'")"
read -r PART OFF <<<"$(psql_q "SELECT \"partition\" || ' ' || \"offset\" FROM processed_events
                               WHERE event_id = '$ID'")"
check "1: the conflict is logged at warn: id, partition, offset, both digests" grep -qF \
    "level=warn msg=\"conflicting event skipped\" event_id=$ID partition=$PART offset=$((OFF + 1)) applied_sha256=$(digest "$A" | cut -c1-8) message_sha256=$(digest "$B" | cut -c1-8)" \
    "$CONSUMER_LOG"

msg "$ID" "$C" | produce "$TOPIC" || fail "produce C"
wait_for "1: a third payload C under the id is a conflict too" 30 \
    counts_are "applied=1 duplicates=1 ignored=0 parked=0 stale=0 redis_hits=0 conflicts=2"
check_eq "1: ...logged at warn once per event id, not once per message" 1 "$(conflict_warnings)"
check_eq "1: still A in the shipment" 100 \
    "$(psql_q "SELECT amount_cents FROM shipments WHERE order_id = 'o-1'")"

# --- 2. the conflicting message's offset is committed ----------------------------------------
consumer_stop
check_eq "2: SIGTERM: consumer-demo exits 0" 0 $?
check "2: the final line has the conflicts" grep -q \
    'msg="consumer stopped" applied=1 duplicates=1 .* conflicts=2' "$CONSUMER_LOG"
consumer_start --topic "$TOPIC" --group shipping
# A new event behind C in its partition (the same order at the same version: stale): once it
# is dealt with, C, had its offset not been committed, would have come again first.
msg "$(uuid)" "$(payload o-1 100)" | produce "$TOPIC" || fail "produce an event behind C"
wait_for "2: the restarted member gets the new event, not C again" 30 \
    counts_are "applied=0 duplicates=0 ignored=0 parked=0 stale=1 redis_hits=0 conflicts=0"

# --- 3. a row without a digest is unknown, not a conflict ------------------------------------
OLD=$(uuid)
psql_q "INSERT INTO processed_events (event_id, topic, \"partition\", \"offset\")
        VALUES ('$OLD', '$TOPIC', 0, 0)" || fail "insert a row without a digest"
msg "$OLD" "$(payload o-old 1)" | produce "$TOPIC" || fail "produce under the old id"
wait_for "3: another payload under an id recorded without a digest: a duplicate" 30 \
    counts_are "applied=0 duplicates=1 ignored=0 parked=0 stale=1 redis_hits=0 conflicts=0"
check_eq "3: not applied" 0 "$(psql_q "SELECT count(*) FROM shipments WHERE order_id = 'o-old'")"
check_eq "3: no conflict warned about" 0 "$(conflict_warnings)"
consumer_stop

# --- 4. Redis holds the digest and never hides a conflict -------------------------------------
redis_start
RID=$(uuid)
RA=$(payload o-r 300)
RB=$(payload o-r 301)
{
    msg "$RID" "$RA"
    msg "$RID" "$RA"
    msg "$RID" "$RB"
} | produce orders.conflict.redis || fail "produce A, A, B for Redis"
consumer_start --topic orders.conflict.redis --group shipping --redis-url "$REDIS_URL" \
    --redis-timeout-ms 500
wait_for "4: A applied, A again skipped in Redis, B still a conflict" 30 \
    counts_are "applied=1 duplicates=1 ignored=0 parked=0 stale=0 redis_hits=1 conflicts=1"
check_eq "4: the shipment holds A" 300 \
    "$(psql_q "SELECT amount_cents FROM shipments WHERE order_id = 'o-r'")"
KEY=$(redis_q --scan --pattern "consumer-demo:done:*:shipping:$RID")
check_eq "4: Redis holds A's digest for the id" "$(digest "$RA")" "$(redis_q GET "$KEY")"
check "4: the conflict is logged at warn" grep -qF \
    "msg=\"conflicting event skipped\" event_id=$RID" "$CONSUMER_LOG"
redis_q SET "$KEY" 1 >/dev/null
msg "$RID" "$RA" | produce orders.conflict.redis || fail "produce A once more"
wait_for "4: an entry \"1\" (before digests) is no Redis hit: PostgreSQL finds the duplicate" 30 \
    counts_are "applied=1 duplicates=2 ignored=0 parked=0 stale=0 redis_hits=1 conflicts=1"
wait_for "4: ...and the entry holds the digest again" 10 \
    test "$(redis_q GET "$KEY")" = "$(digest "$RA")"
consumer_stop
check_eq "4: SIGTERM: consumer-demo exits 0" 0 $?

# --- 5. a malformed message with a NUL byte in a header value is parked ----------------------------
# jsonb refuses \u0000: before the fix the park was refused (22P05) and retried for ever, and the
# valid event behind it in the same partition was never applied.
{
    jq -cn '{key: "o-nul", value: "{}", headers: [["event_type", "OrderCreated"], ["trace", "a\u0000b"]]}'
    msg "$(uuid)" "$(payload o-nul 500)"
} | produce orders.conflict.nul || fail "produce a NUL header, then a valid event"
consumer_start --topic orders.conflict.nul --group shipping
wait_for "5: the message is parked and the valid event after it applied" 30 \
    counts_are "applied=1 duplicates=0 ignored=0 parked=1 stale=0 redis_hits=0 conflicts=0"
check_eq "5: the parked row keeps the header value as bytes in hex" 'no id header|trace|\x610062' \
    "$(psql_q "SELECT reason || '|' || (headers->1->>0) || '|' || (headers->1->>1)
               FROM parked_messages WHERE topic = 'orders.conflict.nul'")"
check_eq "5: the shipment exists" 500 \
    "$(psql_q "SELECT amount_cents FROM shipments WHERE order_id = 'o-nul'")"
consumer_stop
check_eq "5: SIGTERM: consumer-demo exits 0" 0 $?

# --- 6. two different id headers, an id header without a value: parked ---------------------------
# Before the fix the last id header counted and the first was dropped silently (the message was
# applied as the event the last one names), and an id header without a value was "no id header".
{
    jq -cn --arg a "$(uuid)" --arg b "$(uuid)" --arg v "$(payload o-two 600)" \
        '{key: "o-two", value: $v,
          headers: [["id", $a], ["event_type", "OrderCreated"], ["id", $b]]}'
    jq -cn --arg v "$(payload o-two 601)" \
        '{key: "o-two", value: $v, headers: [["id", null], ["event_type", "OrderCreated"]]}'
    same=$(uuid)
    jq -cn --arg a "$same" --arg v "$(payload o-two 602)" \
        '{key: "o-two", value: $v, headers: [["id", $a], ["event_type", "OrderCreated"], ["id", $a]]}'
} | produce orders.conflict.ids || fail "produce messages with unclear id headers"
consumer_start --topic orders.conflict.ids --group shipping
wait_for "6: two parked, the one with the same id twice applied" 30 \
    counts_are "applied=1 duplicates=0 ignored=0 parked=2 stale=0 redis_hits=0 conflicts=0"
check_eq "6: the reasons" "id header without a value|id headers with different values" \
    "$(psql_q "SELECT string_agg(reason, '|' ORDER BY reason) FROM parked_messages
               WHERE topic = 'orders.conflict.ids'")"
check_eq "6: the shipment is the one with one id (sent twice)" 602 \
    "$(psql_q "SELECT amount_cents FROM shipments WHERE order_id = 'o-two'")"
consumer_stop
check_eq "6: SIGTERM: consumer-demo exits 0" 0 $?
