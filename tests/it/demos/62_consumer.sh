#!/bin/bash
# Proves consumer-demo against the mock broker and a real PostgreSQL: 50 OrderCreated events,
# each delivered twice with the same id header, plus malformed messages (no id header, a payload
# that is not JSON, an id that is not a UUID) give exactly 50 shipments and 50 processed events;
# the malformed ones are parked and the consumer keeps running and keeps consuming their
# partition. Offsets are committed only after the database commit: a restarted member resumes
# where it stopped (no redelivery), a SIGKILLed one has its uncommitted messages redelivered and
# the dedupe absorbs them, a new group re-reads everything and changes nothing. PostgreSQL going
# away is waited out without losing a message, and a member stopped while it waits has not
# committed the waiting message's offset (the next member applies it). SIGTERM while the broker is
# silent ends the member within 9 s (under docker's 10 s). Bad command lines exit 2 with one line.
source "$(dirname "$0")/../../lib.sh"
source "$(dirname "$0")/../../demo_lib.sh"
demo_setup
pg_start
broker_start 1
TOPIC=orders.test
PARTITIONS=4 # the mock broker's partitions for an auto-created topic
"$CONSUMER_BIN" migrate --database-url "$DATABASE_URL" 2>"$T/consumer.migrate.log" ||
    fail "consumer-demo migrate"

# order_msg N [PARTITION]: one OrderCreated message for order o-N as a bin/produce line; the event
# id is fixed per N (ids.N), so producing it again is a redelivery of the same event.
order_msg() {
    local n=$1 part=${2:-}
    [ -f "$T/ids.$n" ] || cat /proc/sys/kernel/random/uuid >"$T/ids.$n"
    jq -cn --arg n "$n" --arg id "$(cat "$T/ids.$n")" --arg p "$part" '{
        key: ("o-" + $n),
        value: ({id: ("o-" + $n), customer_id: ("c-" + $n), amount_cents: (($n | tonumber) * 100),
                 currency: "EUR"} | tojson),
        headers: [["id", $id], ["event_type", "OrderCreated"], ["aggregate_type", "order"]]}
        + (if $p == "" then {} else {partition: ($p | tonumber)} end)'
}

produce() {
    "$BIN/produce" --brokers "$BROKERS" --topic "$TOPIC" >/dev/null 2>>"$T/produce.log"
}

shipments() {
    psql_q "SELECT count(*) FROM shipments"
}

shipments_over() {
    [ "$(shipments)" -gt "$1" ]
}

# last_counts: the counters of the current consumer's last progress (or final) line.
last_counts() {
    grep -E 'msg="consumer (progress|stopped)"' "$CONSUMER_LOG" | tail -n 1 |
        grep -o 'applied=[0-9]* duplicates=[0-9]* ignored=[0-9]* parked=[0-9]*'
}

counts_are() {
    [ "$(last_counts)" = "$1" ]
}

consumer_start --topic "$TOPIC" --group shipping

# --- 50 events, each twice, plus malformed and foreign messages --------------------------------------
{
    for n in $(seq 1 50); do order_msg "$n"; done
    for n in $(seq 1 50); do order_msg "$n"; done
    # Same key "bad": these land in one partition, followed later by a valid event.
    jq -cn '{key: "bad", value: ({id: "o-x", customer_id: "c", amount_cents: 1, currency: "EUR"}
                                 | tojson), headers: [["event_type", "OrderCreated"]]}'
    jq -cn --arg id "$(cat /proc/sys/kernel/random/uuid)" \
        '{key: "bad", value: "garbage{", headers: [["id", $id], ["event_type", "OrderCreated"]]}'
    jq -cn '{key: "bad", value: "{}", headers: [["id", "not-a-uuid"], ["event_type", "OrderCreated"]]}'
    jq -cn --arg id "$(cat /proc/sys/kernel/random/uuid)" \
        '{key: "bad", value: "{}", headers: [["id", $id], ["event_type", "OrderShipped"]]}'
} | produce || fail "produce the first batch"

wait_for "50 shipments" 60 sql_is "SELECT count(*) FROM shipments" 50
wait_for "the consumer has seen every message" 30 \
    counts_are "applied=50 duplicates=50 ignored=1 parked=3"
check_eq "exactly 50 shipments" 50 "$(shipments)"
check_eq "exactly 50 processed events" 50 "$(psql_q "SELECT count(*) FROM processed_events")"
check_eq "one shipment per order, from its event" 50 \
    "$(psql_q "SELECT count(*) FROM shipments s JOIN processed_events p USING (event_id)
               WHERE s.order_id = 'o-' || (s.amount_cents / 100)")"
check_eq "three malformed messages parked, with their reasons" "1 1 1 3" \
    "$(psql_q "SELECT count(*) FILTER (WHERE reason = 'no id header') || ' ' ||
                      count(*) FILTER (WHERE reason LIKE 'payload is not JSON%') || ' ' ||
                      count(*) FILTER (WHERE reason LIKE 'id header is not a UUID%') || ' ' ||
                      count(*) FROM parked_messages")"
check_eq "a parked message keeps its bytes and headers" "garbage{|event_type" \
    "$(psql_q "SELECT convert_from(payload, 'UTF8') || '|' || (headers->1->>0)
               FROM parked_messages WHERE reason LIKE 'payload%'")"
check "the consumer is still running" consumer_running
check "each parked message is logged" test \
    "$(grep -c 'msg="message parked"' "$CONSUMER_LOG")" = 3

order_msg 51 | jq -c '.key = "bad"' | produce || fail "produce o-51"
wait_for "a valid event after the malformed ones, same partition, is applied" 30 \
    sql_is "SELECT count(*) FROM shipments WHERE order_id = 'o-51'" 1

# --- restart: offsets were committed after each database commit ---------------------------------------
consumer_stop
check_eq "SIGTERM: consumer-demo exits 0" 0 $?
check "the final line has the totals" grep -q \
    'msg="consumer stopped" applied=51 duplicates=50 ignored=1 parked=3' "$CONSUMER_LOG"
consumer_start --topic "$TOPIC" --group shipping
# One new event per partition: Kafka delivers a partition in order, so by the time these are
# applied, anything redelivered from before would have been seen (as a duplicate).
for p in $(seq 0 $((PARTITIONS - 1))); do order_msg $((60 + p)) "$p"; done | produce
wait_for "the restarted member applies the new events" 30 \
    sql_is "SELECT count(*) FROM shipments" 55
wait_for "...and redelivered nothing from before" 10 \
    counts_are "applied=4 duplicates=0 ignored=0 parked=0"

# --- crash: SIGKILL mid-stream, then restart ------------------------------------------------------------
# This member never auto-commits on its own (1 h interval), so whatever it applied before the
# SIGKILL is certainly redelivered to the next member.
consumer_stop
consumer_start --topic "$TOPIC" --group shipping --kafka auto.commit.interval.ms=3600000
for n in $(seq 100 139); do order_msg "$n" $((n % PARTITIONS)); done | produce
_poll 30 shipments_over 55 || fail "the member applies some of the 40 new events"
kill -KILL "$CONSUMER_PID"
wait "$CONSUMER_PID" 2>/dev/null
before_restart=$(shipments)
consumer_start --topic "$TOPIC" --group shipping
wait_for "after a SIGKILL and a restart, every event is applied" 60 \
    sql_is "SELECT count(*) FROM shipments" 95
wait_for "the events applied before the crash come again and are skipped as duplicates" 30 \
    counts_are "applied=$((95 - before_restart)) duplicates=$((before_restart - 55)) ignored=0 parked=0"
check_eq "...exactly once: 95 shipments, 95 processed events" "95 95" \
    "$(psql_q "SELECT (SELECT count(*) FROM shipments) || ' ' ||
                      (SELECT count(*) FROM processed_events)")"

# --- a new group re-reads the whole topic: all duplicates ---------------------------------------------
consumer_stop
consumer_start --topic "$TOPIC" --group audit
wait_for "a new group re-reads all 145 OrderCreated messages as duplicates" 60 \
    counts_are "applied=0 duplicates=145 ignored=1 parked=3"
check_eq "still 95 shipments" 95 "$(shipments)"
check_eq "still 3 parked messages (one per Kafka position)" 3 \
    "$(psql_q "SELECT count(*) FROM parked_messages")"

# --- PostgreSQL goes away while events arrive ---------------------------------------------------------
pg_stop
for n in $(seq 200 204); do order_msg "$n"; done | produce
# The consumer meets the outage (an event to apply, no server) before PostgreSQL comes back.
wait_for "the outage is logged" 30 grep -Eq 'msg="postgres (connection lost|unreachable)"' \
    "$CONSUMER_LOG"
check "the consumer waits PostgreSQL out (still running)" consumer_running
pg_start
wait_for "once PostgreSQL is back, the 5 events are applied" 60 \
    sql_is "SELECT count(*) FROM shipments" 100
check "the recovery is logged" grep -q 'msg="postgres reconnected"' "$CONSUMER_LOG"

# --- stopped while an event waits for PostgreSQL: its offset is not committed -------------------------
# The member takes the event, finds PostgreSQL gone (it logs that) and waits inside the apply;
# SIGTERM ends the wait before the database commit, so the offset must not be committed: the
# next member gets the event again and applies it. Committing before the transaction loses it.
lost_lines() { grep -cE 'msg="postgres (connection lost|unreachable)"' "$CONSUMER_LOG"; }
lost_over() { [ "$(lost_lines)" -gt "$1" ]; }
mark=$(lost_lines)
pg_stop
order_msg 300 | produce
wait_for "the member holds the event and waits for PostgreSQL" 30 lost_over "$mark"
consumer_stop
check_eq "SIGTERM while waiting for PostgreSQL: consumer-demo exits 0" 0 $?
pg_start
consumer_start --topic "$TOPIC" --group audit
wait_for "the next member gets the uncommitted event again and applies it" 30 \
    sql_is "SELECT count(*) FROM shipments WHERE order_id = 'o-300'" 1
consumer_stop
check_eq "SIGTERM: consumer-demo exits 0" 0 $?

# --- parking refused for the message's own data: a defined outcome, the partition goes on -------------
# An operator's CHECK constraint on parked_messages refuses a message's row (23514). A: the whole
# row is refused, its position alone is taken (reason 'not parked whole: SQLSTATE 23514'). B:
# every row is refused: the message (a malformed one, and an event the database rejected five
# times) is skipped, logged at error with its position and counted as unparked. Either way the
# valid event behind them in the same partition is applied. Before the fix a refused park was
# retried without limit and held its partition: o-501 was never applied.
psql_q "ALTER TABLE parked_messages ADD CONSTRAINT short_payload
            CHECK (payload IS NULL OR octet_length(payload) < 10) NOT VALID" >/dev/null
consumer_start --topic "$TOPIC" --group audit
{
    jq -cn '{key: "refused", value: "a payload far longer than ten bytes",
             headers: [["event_type", "OrderCreated"]]}'
    order_msg 501 | jq -c '.key = "refused"'
} | produce || fail "produce part A"
wait_for "A: the event behind a message whose park is refused whole is applied" 30 \
    sql_is "SELECT count(*) FROM shipments WHERE order_id = 'o-501'" 1
check_eq "A: the refused message is parked by its position only, the refusal named" \
    "1 true true" "$(psql_q "SELECT count(*) || ' ' || bool_and(payload IS NULL AND key IS NULL)
                          || ' ' || bool_and(headers = '[]')
                        FROM parked_messages WHERE reason = 'not parked whole: SQLSTATE 23514'")"
check "A: the refusal is logged at error" grep -q \
    'level=error msg="cannot park a message whole, parking its position only"' "$CONSUMER_LOG"
psql_q "ALTER TABLE parked_messages ADD CONSTRAINT refuse_all CHECK (false) NOT VALID" >/dev/null
psql_q "ALTER TABLE shipments ADD CONSTRAINT no_xxx CHECK (currency <> 'XXX') NOT VALID" >/dev/null
parked_before=$(psql_q "SELECT count(*) FROM parked_messages")
{
    jq -cn '{key: "refused", value: "{}", headers: [["event_type", "OrderCreated"]]}'
    order_msg 502 | jq -c '.key = "refused" | .value |= (fromjson | .currency = "XXX" | tojson)'
    order_msg 503 | jq -c '.key = "refused"'
} | produce || fail "produce part B"
wait_for "B: the event behind two messages that nothing can park is applied" 60 \
    sql_is "SELECT count(*) FROM shipments WHERE order_id = 'o-503'" 1
check_eq "B: neither is in parked_messages" "$parked_before" \
    "$(psql_q "SELECT count(*) FROM parked_messages")"
check_eq "B: o-502, refused five times, is not applied" 0 \
    "$(psql_q "SELECT count(*) FROM shipments WHERE order_id = 'o-502'")"
check_eq "B: both are logged at error with their position" 2 \
    "$(grep -cE 'level=error msg="message skipped, parking refused" topic=orders.test partition=[0-9]+ offset=[0-9]+' "$CONSUMER_LOG")"
consumer_stop
check_eq "SIGTERM: consumer-demo exits 0" 0 $?
check "B: the final line counts them as unparked" grep -Eq \
    'msg="consumer stopped" .* parked=1 .* unparked=2$' "$CONSUMER_LOG"
psql_q "ALTER TABLE parked_messages DROP CONSTRAINT short_payload, DROP CONSTRAINT refuse_all" \
    >/dev/null
psql_q "ALTER TABLE shipments DROP CONSTRAINT no_xxx" >/dev/null

# --- SIGTERM while Kafka is silent ---------------------------------------------------------------
# A container manager sends SIGTERM and SIGKILLs 10 s later (docker's default). With the broker
# answering nothing (a 60 s round trip: as a host gone without a FIN), closing the member used
# to wait for the coordinator for 30 s; it must give up in time and exit 0. Last in this test:
# the broker stays slow.
consumer_start --topic "$TOPIC" --group silent
order_msg 400 | produce
wait_for "the member applies an event before Kafka goes silent" 30 \
    sql_is "SELECT count(*) FROM shipments WHERE order_id = 'o-400'" 1
broker_cmd "rtt all 60000"
sleep 2 # the member's next requests are in flight and unanswered
kill -TERM "$CONSUMER_PID"
if _poll 9 _t_dead "$CONSUMER_PID"; then
    ok "SIGTERM with Kafka silent: consumer-demo exits within 9 s"
    wait "$CONSUMER_PID"
    check_eq "SIGTERM with Kafka silent: exit status 0" 0 $?
else
    not_ok "SIGTERM with Kafka silent: consumer-demo exits within 9 s" "still running"
    consumer_stop
fi
check "it says it left without committing" grep -q 'consumer close timed out' "$CONSUMER_LOG"

# --- bad command lines ---------------------------------------------------------------------------------
usage() {
    local desc=$1 err rc
    shift
    err=$(env -u KAFKA_BROKERS "$CONSUMER_BIN" "$@" 2>&1 >/dev/null)
    rc=$?
    check_eq "$desc: exit 2 with one line" "2 1" "$rc $(printf '%s\n' "$err" | wc -l)"
}
usage "no --brokers" --database-url "$DATABASE_URL"
usage "an illegal topic" --database-url "$DATABASE_URL" --brokers "$BROKERS" --topic 'bad topic!'
usage "a property that would break at-least-once" --database-url "$DATABASE_URL" \
    --brokers "$BROKERS" --kafka enable.auto.offset.store=true
usage "an unknown librdkafka property" --database-url "$DATABASE_URL" --brokers "$BROKERS" \
    --kafka no.such.property=1
usage "--kafka without '='" --database-url "$DATABASE_URL" --brokers "$BROKERS" --kafka linger.ms
usage "--stats-interval 0" --database-url "$DATABASE_URL" --brokers "$BROKERS" --stats-interval 0
usage "unknown command" migrat --database-url "$DATABASE_URL"
