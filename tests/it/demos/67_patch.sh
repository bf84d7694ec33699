#!/bin/bash
# Proves versioned updates (optimistic locking) end to end, with the sanitizer builds:
#  1. every order response carries ETag: "<version>"; PATCH /orders/{id} without If-Match gets
#     428, with a malformed one 400 (a weak one 412), on an unknown order 404, with a bad body 400/422 — none of
#     them writes anything;
#  2. a matching If-Match updates the order, bumps its version and writes an OrderUpdated outbox
#     event whose payload is the new order (with the version), in one transaction; the same
#     If-Match again gets 412 with the current ETag and writes nothing; a status that goes back,
#     or any change of a cancelled order, gets 409;
#  3. with an Idempotency-Key a retried PATCH replays (200, Idempotency-Replayed, same body and
#     ETag), it does not answer 412, also when the retry writes the id in upper case; the key
#     with another If-Match is another request (422);
#  4. 20 concurrent PATCHes with the same If-Match: exactly one 200, 19 x 412, one new version;
#  5. consumer-demo (fed by outbox-relay, per-aggregate order) ends with every shipment at its
#     order's final version and state, counting no stale event: ordering never skips a real
#     update; an old version sent again under a new event id is counted stale and changes
#     nothing; a redelivered event is a duplicate;
#  6. If-Match * matches any version, a list (one header or several lines) matches when one of
#     its strong tags is the current version, a weak tag never does (412); * and a tag under one
#     Idempotency-Key are different requests (422).
source "$(dirname "$0")/../../lib.sh"
source "$(dirname "$0")/../../demo_lib.sh"
demo_setup
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "outbox-relay migrate"
producer_start
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS"
consumer_start --topic outbox.event.order --group shipping

ORDER='{"customer_id": "c-1", "amount_cents": 1000, "currency": "EUR"}'

# patch ID IF-MATCH BODY [CURL ARGS...]: PATCH /orders/ID (IF-MATCH empty: no header).
patch() {
    local id=$1 match=$2 body=$3
    shift 3
    if [ -n "$match" ]; then
        http PATCH "/orders/$id" -H "If-Match: $match" -H 'Content-Type: application/json' \
            -d "$body" "$@"
    else
        http PATCH "/orders/$id" -H 'Content-Type: application/json' -d "$body" "$@"
    fi
}

# --- 1. ETag and refusals -------------------------------------------------------------------------
post_order k-1 "$ORDER"
check_eq "1: POST 201 with ETag \"1\"" '201 "1"' "$STATUS $(hdr ETag)"
ID=$(jq -r .id "$T/body")
check_eq "1: the body shows version 1" 1 "$(jq -r .version "$T/body")"
http GET "/orders/$ID"
check_eq "1: GET 200 with ETag \"1\"" '200 "1"' "$STATUS $(hdr ETag)"
post_order k-1 "$ORDER"
check_eq "1: a replayed POST carries the same ETag" '201 "1" true' \
    "$STATUS $(hdr ETag) $(hdr Idempotency-Replayed)"

patch "$ID" "" '{"amount_cents": 2000}'
check_eq "1: no If-Match: 428" 428 "$STATUS"
patch "$ID" '"1' '{"amount_cents": 2000}'
check_eq "1: an unterminated ETag in If-Match: 400" 400 "$STATUS"
patch "$ID" '"1" "2"' '{"amount_cents": 2000}'
check_eq "1: two ETags without a comma: 400" 400 "$STATUS"
patch "$ID" '*, "1"' '{"amount_cents": 2000}'
check_eq "1: * inside a list: 400" 400 "$STATUS"
http PATCH "/orders/$ID" -H 'If-Match: *' -H 'If-Match: "1"' -d '{"amount_cents": 2000}'
check_eq "1: * and a tag on two If-Match lines (one list): 400" 400 "$STATUS"
patch "$ID" 'W/"1"' '{"amount_cents": 2000}'
check_eq "1: a weak ETag never matches (strong comparison): 412 with the current ETag" \
    '412 "1"' "$STATUS $(hdr ETag)"
check "1: the 412 says why" grep -q 'weak tag' "$T/body"
patch 00000000-0000-4000-8000-000000000000 '"1"' '{"amount_cents": 2000}'
check_eq "1: unknown order: 404" 404 "$STATUS"
patch not-an-id '"1"' '{"amount_cents": 2000}'
check_eq "1: not an order id: 404" 404 "$STATUS"
patch "$ID" '"1"' '{}'
check_eq "1: nothing to change: 422" 422 "$STATUS"
patch "$ID" '"1"' '{"currency": "USD"}'
check_eq "1: a field that cannot change: 422" 422 "$STATUS"
patch "$ID" '"1"' '{"amount_cents": -5}'
check_eq "1: an invalid amount: 422" 422 "$STATUS"
patch "$ID" '"1"' '{"amount_cents": '
check_eq "1: not JSON: 400" 400 "$STATUS"
check_eq "1: none of these wrote anything (orders outbox keys)" "1 1 1" "$(counts)"

# --- 2. a matching If-Match, then a stale one -------------------------------------------------------
patch "$ID" '"1"' '{"amount_cents": 2000}'
check_eq "2: matching If-Match: 200 with ETag \"2\"" '200 "2"' "$STATUS $(hdr ETag)"
check_eq "2: the body is the new order" "2000 created 2" \
    "$(jq -r '[.amount_cents, .status, .version] | join(" ")' "$T/body")"
check_eq "2: one OrderUpdated outbox row, payload = the response body" "OrderUpdated|$ID|t" \
    "$(psql_q "SELECT event_type, aggregate_id, payload = '$(cat "$T/body")'::jsonb FROM outbox
               WHERE id = (SELECT max(id) FROM outbox)")"
check_eq "2: the order row has version 2" "2000|2" \
    "$(psql_q "SELECT amount_cents, version FROM orders WHERE id = '$ID'")"
patch "$ID" '"1"' '{"amount_cents": 3000}'
check_eq "2: the same If-Match again: 412 with the current ETag" '412 "2"' "$STATUS $(hdr ETag)"
check_eq "2: 412 is a problem document" "application/problem+json" "$(hdr Content-Type)"
check_eq "2: the 412 wrote nothing" "1 2 1" "$(counts)"

# --- 3. Idempotency-Key on PATCH ------------------------------------------------------------------
patch "$ID" '"2"' '{"status": "confirmed"}' -H 'Idempotency-Key: p-1'
check_eq "3: PATCH with a key: 200, ETag \"3\"" '200 "3"' "$STATUS $(hdr ETag)"
cp "$T/body" "$T/p1.body"
patch "$ID" '"2"' '{"status": "confirmed"}' -H 'Idempotency-Key: p-1'
check_eq "3: the retry replays (not 412)" '200 "3" true' \
    "$STATUS $(hdr ETag) $(hdr Idempotency-Replayed)"
check "3: the replay is byte-identical" cmp -s "$T/p1.body" "$T/body"
check_eq "3: the retry wrote nothing" "1 3 2" "$(counts)"
UPPER_ID=$(printf '%s' "$ID" | tr 'a-f' 'A-F')
patch "$UPPER_ID" '"2"' '{"status": "confirmed"}' -H 'Idempotency-Key: p-1'
check_eq "3: a retry naming the id in upper case is the same request: it replays" '200 true' \
    "$STATUS $(hdr Idempotency-Replayed)"
patch "$ID" '"3"' '{"status": "confirmed"}' -H 'Idempotency-Key: p-1'
check_eq "3: the key with another If-Match is another request: 422" 422 "$STATUS"
patch "$ID" '"3"' '{"status": "created"}'
check_eq "3: a status cannot go back: 409 with the current ETag" '409 "3"' "$STATUS $(hdr ETag)"

# --- 4. 20 concurrent PATCHes with one If-Match ------------------------------------------------------
racers=()
for i in $(seq 1 20); do
    curl -sS -m 30 -o /dev/null -w '%{http_code}\n' -X PATCH "$API/orders/$ID" \
        -H 'If-Match: "3"' -d "{\"amount_cents\": $((5000 + i))}" >"$T/race.$i" &
    racers+=($!)
done
wait "${racers[@]}"
check_eq "4: exactly one 200" 1 "$(cat "$T"/race.* | grep -c '^200$')"
check_eq "4: the other 19 got 412" 19 "$(cat "$T"/race.* | grep -c '^412$')"
check_eq "4: one new version" 4 "$(psql_q "SELECT version FROM orders WHERE id = '$ID'")"
check_eq "4: one more OrderUpdated row (4 events for the order)" 4 \
    "$(psql_q "SELECT count(*) FROM outbox WHERE aggregate_id = '$ID'")"
WINNER=$(psql_q "SELECT amount_cents FROM orders WHERE id = '$ID'")
patch "$ID" '"4"' '{"status": "cancelled"}'
check_eq "4: cancel: 200, ETag \"5\"" '200 "5"' "$STATUS $(hdr ETag)"
patch "$ID" '"5"' '{"amount_cents": 1}'
check_eq "4: a cancelled order cannot change: 409" 409 "$STATUS"

# --- 5. the consumer follows every order to its final version -----------------------------------------
# Five more orders with four updates each, interleaved: per-aggregate order keeps each order's
# events in version order, so none is stale.
for n in 2 3 4 5 6; do
    post_order "k-$n" "{\"customer_id\": \"c-$n\", \"amount_cents\": 100, \"currency\": \"EUR\"}"
    jq -r .id "$T/body" >"$T/id.$n"
done
for v in 1 2 3 4; do
    for n in 2 3 4 5 6; do
        patch "$(cat "$T/id.$n")" "\"$v\"" "{\"amount_cents\": $((100 * n + v))}"
        [ "$STATUS" = 200 ] || not_ok "5: update $v of order $n" "status $STATUS"
    done
done
wait_for "5: every event sent" 60 no_unsent_rows
wait_for "5: six shipments, each at its order's version, amount and state" 60 sql_is \
    "SELECT count(*) FROM shipments s JOIN orders o ON o.id::text = s.order_id
     WHERE s.order_version = o.version AND s.amount_cents = o.amount_cents
       AND s.order_status = o.status" 6
check_eq "5: the raced order's shipment: version 5, the winner's amount, cancelled" \
    "5|$WINNER|cancelled|cancelled" \
    "$(psql_q "SELECT order_version, amount_cents, order_status, status FROM shipments
               WHERE order_id = '$ID'")"
check_eq "5: every event recorded once" \
    "$(psql_q "SELECT count(*) FROM outbox")" "$(psql_q "SELECT count(*) FROM processed_events")"
stale_is() {
    grep -E 'msg="consumer progress"' "$CONSUMER_LOG" | tail -n 1 | grep -q " stale=$1 "
}
applied_all() {
    grep -E 'msg="consumer progress"' "$CONSUMER_LOG" | tail -n 1 |
        grep -q "applied=$(psql_q "SELECT count(*) FROM outbox") "
}
wait_for "5: the consumer applied every event, none stale (relay order never skips a real update)" \
    20 applied_all
check "5: stale=0" stale_is 0

# An old state (version 3) of the raced order under a new event id, as a misordered producer
# would send it, and a redelivery of its last event.
old=$(psql_q "SELECT payload FROM outbox WHERE aggregate_id = '$ID' AND payload->>'version' = '3'")
last_id=$(psql_q "SELECT event_id FROM outbox WHERE aggregate_id = '$ID' ORDER BY id DESC LIMIT 1")
last=$(psql_q "SELECT payload FROM outbox WHERE aggregate_id = '$ID' AND payload->>'version' = '5'")
{
    jq -cn --arg k "$ID" --arg v "$old" --arg id "$(cat /proc/sys/kernel/random/uuid)" \
        '{key: $k, value: $v, headers: [["id", $id], ["event_type", "OrderUpdated"]]}'
    jq -cn --arg k "$ID" --arg v "$last" --arg id "$last_id" \
        '{key: $k, value: $v, headers: [["id", $id], ["event_type", "OrderUpdated"]]}'
} | "$BIN/produce" --brokers "$BROKERS" --topic outbox.event.order >/dev/null 2>"$T/produce.log" ||
    fail "produce the stale and the repeated event"
wait_for "5: the old version is counted stale" 30 stale_is 1
check_eq "5: and changed nothing" "5|$WINNER|cancelled" \
    "$(psql_q "SELECT order_version, amount_cents, order_status FROM shipments
               WHERE order_id = '$ID'")"
dup_seen() {
    grep -E 'msg="consumer progress"' "$CONSUMER_LOG" | tail -n 1 | grep -qE ' duplicates=[1-9]'
}
wait_for "5: the redelivered event was counted a duplicate" 30 dup_seen
# --- 6. If-Match * and lists (RFC 9110 section 13.1.1) ----------------------------------------------
post_order k-7 "$ORDER"
ID7=$(jq -r .id "$T/body")
patch "$ID7" '"7", "1"' '{"amount_cents": 1001}'
check_eq "6: a list holding the current version: 200, ETag \"2\"" '200 "2"' "$STATUS $(hdr ETag)"
http PATCH "/orders/$ID7" -H 'If-Match: "9"' -H 'If-Match: "2"' -d '{"amount_cents": 1002}'
check_eq "6: two If-Match lines are one list: 200, ETag \"3\"" '200 "3"' "$STATUS $(hdr ETag)"
patch "$ID7" '*' '{"amount_cents": 1003}' -H 'Idempotency-Key: p-7'
check_eq "6: If-Match * matches any version: 200, ETag \"4\"" '200 "4"' "$STATUS $(hdr ETag)"
patch "$ID7" ' * ' '{"amount_cents": 1003}' -H 'Idempotency-Key: p-7'
check_eq "6: its retry replays" '200 "4" true' "$STATUS $(hdr ETag) $(hdr Idempotency-Replayed)"
patch "$ID7" '"4"' '{"amount_cents": 1003}' -H 'Idempotency-Key: p-7'
check_eq "6: the key with a tag instead of * is another request: 422" 422 "$STATUS"
patch "$ID7" '"1", W/"4", "3"' '{"amount_cents": 1004}'
check_eq "6: a list naming no current version: 412 with the current ETag" '412 "4"' \
    "$STATUS $(hdr ETag)"
patch 00000000-0000-4000-8000-000000000000 '*' '{"amount_cents": 2000}'
check_eq "6: * on an unknown order: 404" 404 "$STATUS"
check_eq "6: the order is at version 4 with the * request's amount" "4|1003" \
    "$(psql_q "SELECT version, amount_cents FROM orders WHERE id = '$ID7'")"
check_eq "6: three OrderUpdated rows for it" 3 \
    "$(psql_q "SELECT count(*) FROM outbox WHERE aggregate_id = '$ID7' AND event_type = 'OrderUpdated'")"

check "no sanitizer report in the demo logs" \
    bash -c "! grep -l 'ERROR: AddressSanitizer\|ERROR: LeakSanitizer\|runtime error:' \
        '$T'/producer.*.log '$T'/consumer.*.log"
