#!/bin/bash
# Proves the Redis fast path (--redis-url) is a shortcut, never the source of truth, with the
# sanitizer builds and Debian's redis-server:
#  1. producer-demo: a completed key's response is cached with a TTL no longer than the key's
#     remaining lifetime; a retry is answered from Redis (same status, body, Location, ETag,
#     Idempotency-Replayed) — even with PostgreSQL stopped — and a retry with another body still
#     gets 422 there; a cache entry that is not ours is ignored (PostgreSQL answers, correctly);
#     an in-progress guard answers 409 + Retry-After, and the key works once it is gone;
#  2. Redis SIGSTOPped (slow: every call hits the timeout), SIGKILLed and restarted empty, and
#     FLUSHALLed, while 96 requests (each sent twice) and their events flow through the relay
#     to consumer-demo (also on Redis): every request answered 201 and its retry with the same
#     order, exactly one order, outbox row, shipment and processed event per request;
#  3. each change of Redis state is logged once (one "redis down" and one "redis up again" per
#     outage, however many requests ran meanwhile) and counted (/healthz, the totals line).
source "$(dirname "$0")/../../lib.sh"
source "$(dirname "$0")/../../demo_lib.sh"
demo_setup
pg_start
broker_start 1
redis_start
relay_migrate 2>"$T/migrate.log" || fail "outbox-relay migrate"
KEY_TTL=600
# A generous call timeout: a loaded test machine must not turn a slow answer into an outage the
# checks below do not expect (the stopped Redis still costs one timeout per probe, once a second).
producer_start --redis-url "$REDIS_URL" --redis-guard-ms 3000 --key-ttl $KEY_TTL \
    --redis-timeout-ms 500
# Keys are scoped by the database's identity (lib/db.h db_identity).
NS=$(psql_q "SELECT d.oid || '.' || d.datname || coalesce('@' ||
             (SELECT system_identifier::text FROM pg_control_system()), '')
             FROM pg_database d WHERE d.datname = current_database()")
CACHE="producer-demo:idem:$NS:POST /orders|"
GUARD="producer-demo:busy:$NS:POST /orders|"
ORDER='{"customer_id": "c-1", "amount_cents": 4200, "currency": "EUR"}'

# --- 1. the fast path -------------------------------------------------------------------------------
post_order k-1 "$ORDER"
check_eq "1: new key: 201, not from Redis" "201 " "$STATUS $(hdr Idempotency-Replayed)"
cp "$T/body" "$T/k1.body"
LOC=$(hdr Location)
check_eq "1: the response is cached after the commit" 1 "$(redis_q EXISTS "${CACHE}k-1")"
# PostgreSQL's remaining lifetime first: Redis's, read later, must be no longer.
pg_left=$(psql_q "SELECT ceil(extract(epoch FROM expires_at - now()) * 1000)::bigint
                  FROM idempotency_keys WHERE key = 'k-1'")
pttl=$(redis_q PTTL "${CACHE}k-1")
check "1: its TTL ($pttl ms) is positive and no longer than the key's lifetime" \
    test "$pttl" -gt 0 -a "$pttl" -le $((KEY_TTL * 1000))
check "1: and no longer than the record has left in PostgreSQL ($pg_left ms)" \
    test "$pttl" -le "$pg_left"

pg_stop
post_order k-1 "$ORDER"
check_eq "1: retry with PostgreSQL stopped: 201 replayed from Redis" '201 true "1"' \
    "$STATUS $(hdr Idempotency-Replayed) $(hdr ETag)"
check "1: byte-identical body" cmp -s "$T/k1.body" "$T/body"
check_eq "1: same Location" "$LOC" "$(hdr Location)"
post_order k-1 '{"customer_id": "c-1", "amount_cents": 1, "currency": "EUR"}'
check_eq "1: the key with another body: 422, fingerprint checked in Redis" 422 "$STATUS"
post_order k-2 "$ORDER"
check_eq "1: a new key with PostgreSQL stopped: 503 (Redis never decides alone)" 503 "$STATUS"
pg_start
check "1: the Redis answers were logged as such" \
    grep -q 'status=201 replayed=true redis=hit' "$PRODUCER_LOG"

redis_q SET "${CACHE}k-1" 'not json' >/dev/null
post_order k-1 "$ORDER"
check_eq "1: a foreign cache entry is ignored: PostgreSQL replays" "201 true" \
    "$STATUS $(hdr Idempotency-Replayed)"
check "1: with the same body" cmp -s "$T/k1.body" "$T/body"
redis_q SET "${CACHE}k-3" \
    '{"fp":"0000000000000000000000000000000000000000000000000000000000000000","status":201,"body":"{}"}' \
    >/dev/null
post_order k-3 "$ORDER"
check_eq "1: a cache entry with another fingerprint: 422 (never another request's answer)" 422 \
    "$STATUS"
redis_q DEL "${CACHE}k-3" >/dev/null
post_order k-3 "$ORDER"
check_eq "1: once it is gone the key works" 201 "$STATUS"

redis_q SET "${GUARD}k-4" someone PX 60000 >/dev/null
post_order k-4 "$ORDER"
check_eq "1: a key guarded as in progress: 409 + Retry-After, nothing written" "409 1 0" \
    "$STATUS $(hdr Retry-After) $(psql_q "SELECT count(*) FROM idempotency_keys WHERE key = 'k-4'")"
redis_q DEL "${GUARD}k-4" >/dev/null
post_order k-4 "$ORDER"
check_eq "1: after the guard is gone: 201" 201 "$STATUS"
check_eq "1: a completed request leaves no guard behind" 0 "$(redis_keys 'producer-demo:busy:*')"

# --- 2. Redis slow, dead, restarted empty and flushed while everything flows -----------------------------
"$CONSUMER_BIN" migrate --database-url "$DATABASE_URL" 2>>"$T/migrate.log" ||
    fail "consumer-demo migrate"
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS"
consumer_start --topic outbox.event.order --group shipping --redis-url "$REDIS_URL" \
    --redis-timeout-ms 500
PRODUCER=$PRODUCER_LOG

# send I: request I and its retry; records "STATUS1 STATUS2 ID1 ID2" in $T/r.I.
send() {
    local i=$1 a b
    local body="{\"customer_id\": \"flow\", \"amount_cents\": $((1000 + i)), \"currency\": \"EUR\"}"
    a=$(curl -sS -m 20 -w ' %{http_code}' -X POST "$API/orders" -H "Idempotency-Key: f-$i" \
        -d "$body")
    b=$(curl -sS -m 20 -w ' %{http_code}' -X POST "$API/orders" -H "Idempotency-Key: f-$i" \
        -d "$body")
    echo "${a##* } ${b##* } $(jq -r .id <<<"${a% *}" 2>/dev/null) $(jq -r .id <<<"${b% *}" \
        2>/dev/null)" >"$T/r.$i"
}

# batch FROM TO: requests FROM..TO, 16 at a time.
batch() {
    local i
    for i in $(seq "$1" "$2"); do
        send "$i" &
        [ $((i % 16)) = 0 ] && wait_sends
    done
    wait_sends
}
wait_sends() {
    local p
    for p in $(jobs -pr); do
        case " ${_T_PIDS[*]} " in *" $p "*) ;; *) wait "$p" ;; esac
    done
}

echo "# flow starts at ${SECONDS}s"
batch 1 16
kill -STOP "$REDIS_PID"
batch 17 32 # Redis accepts connections but never answers: each call ends at the timeout
kill -CONT "$REDIS_PID"
batch 33 48
redis_kill
batch 49 64 # Redis gone: connection refused
redis_start
batch 65 80 # a new, empty Redis
redis_q FLUSHALL >/dev/null
batch 81 96
echo "# flow sent at ${SECONDS}s"

bad=$(for i in $(seq 1 96); do
    read -r s1 s2 id1 id2 <"$T/r.$i"
    [ "$s1 $s2" = "201 201" ] && [ -n "$id1" ] && [ "$id1" = "$id2" ] || echo "f-$i: $(cat "$T/r.$i")"
done)
check_eq "2: every request 201, its retry 201 with the same order" "" "$bad"
check_eq "2: exactly one order per request" "96 96" \
    "$(psql_q "SELECT count(*) || ' ' || count(DISTINCT amount_cents) FROM orders
               WHERE customer_id = 'flow'")"
check_eq "2: exactly one outbox row per order" 96 \
    "$(psql_q "SELECT count(*) FROM outbox x JOIN orders o ON o.id::text = x.aggregate_id
               WHERE o.customer_id = 'flow'")"
wait_for "2: every event sent" 60 no_unsent_rows
all=$(psql_q "SELECT count(*) FROM orders")
wait_for "2: one shipment per order, none lost" 60 sql_is "SELECT count(*) FROM shipments" "$all"
echo "# flow consumed at ${SECONDS}s"
check_eq "2: one processed event per outbox row, none applied twice" \
    "$(psql_q "SELECT count(*) FROM outbox")" \
    "$(psql_q "SELECT count(*) FROM processed_events")"
check_eq "2: every shipment matches its order" "$all" \
    "$(psql_q "SELECT count(*) FROM shipments s JOIN orders o ON o.id::text = s.order_id
               WHERE s.amount_cents = o.amount_cents")"

# --- 3. one log line per change of state, and the counters --------------------------------------------
# After a failure the producer leaves Redis alone for a second (RCACHE_RETRY_MS) and tries it again
# only on a request: the flow above may end inside that second (seen once in a full run). Replays
# of a finished request (no new order) until it reports Redis up again.
redis_found_again() {
    send 96 && http GET /healthz && [ "$(jq -r .redis.up "$T/body")" = true ]
}
wait_for "3: the producer finds Redis again on a later request" 10 redis_found_again
http GET /healthz
outages=$(jq -r .redis.outages "$T/body")
check_eq "3: /healthz stays 200 with Redis up again" "200 true" "$STATUS $(jq -r .redis.up "$T/body")"
# At least one outage: the stop and the kill are two only when a call got through in between
# (the batch after SIGCONT may fall in the 1 s back-off after the stop, and then the producer
# sees one long outage): seen once in a full run.
check "3: it counted the outages (stopped, killed; $outages)" test "$outages" -ge 1
check_eq "3: producer: one 'redis down' line per outage, however many requests ran" "$outages" \
    "$(grep -c 'msg="redis down' "$PRODUCER")"
check_eq "3: producer: one 'redis up again' line per recovery" "$outages" \
    "$(grep -c 'msg="redis up again"' "$PRODUCER")"
# The consumer meets an outage only if an event reached it while Redis was away (it calls Redis
# per event): its lines must pair up, whether it met one or not.
check "3: consumer: one 'redis down' line per 'redis up again', no repeats" \
    test "$(grep -c 'msg="redis down' "$CONSUMER_LOG")" = \
    "$(grep -c 'msg="redis up again"' "$CONSUMER_LOG")"
check "3: /healthz counts cache hits" test "$(jq -r .redis.hits "$T/body")" -gt 0
# A Redis call is bounded: the requests sent while Redis was stopped took at most the timeout
# more, not "forever"; they all completed above (curl -m 20), which is what is checked here.
producer_stop
check "3: the producer's totals line counts failures" \
    grep -qE 'msg="redis totals".* failures=[1-9]' "$PRODUCER"
consumer_stop
check "3: the consumer logged its totals" grep -q 'msg="redis totals"' "$CONSUMER_LOG"
check "no sanitizer report in the demo logs" \
    bash -c "! grep -l 'ERROR: AddressSanitizer\|ERROR: LeakSanitizer\|runtime error:' \
        '$T'/producer.*.log '$T'/consumer.*.log"
