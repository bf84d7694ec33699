#!/bin/bash
# Proves transient Kafka failures are retried without loss, reordering, hot loops or log floods:
#  1. all brokers down for 6 s, longer than --delivery-timeout 2000, with --max-attempts 1: the
#     rows claimed meanwhile get attempts > 0 and a last_error while nothing is marked sent, and
#     none is counted as a rejection or dead-lettered (a delivery timeout is transient, however
#     low --max-attempts is: docs/guarantees.md#failure-modes); once the brokers are back
#     every row is delivered, first copies in order per aggregate; the outage costs at most a
#     few warn lines (`kafka unreachable`, `events not delivered`, delivery timeouts), not one per
#     retry, and the relay logs that Kafka is reachable again;
#  2. injected produce errors NOT_LEADER_FOR_PARTITION (6) and REQUEST_TIMED_OUT (7) on 5
#     requests each, one request in flight per connection: the relay's producer hits them (its
#     librdkafka debug log shows the error) and retries; every row delivered, in order, with no
#     duplicate;
#  3. a broker rejection, MESSAGE_TOO_LARGE (10) on 5 produce requests: the rows of a refused
#     request of several messages count nothing and go again alone (the warning that names
#     batch.size is logged); a row refused alone is recorded as rejected (the broker's too-large
#     error in last_error); the producer is reset rather than letting later messages past the
#     gap, no `order broken`, and every row is delivered in order (after the per-row backoff for
#     a rejected one: the rejection was not permanent after all);
#  4. 300 ms of added round-trip time on every broker: everything still delivered, in order;
#  5. the errors of 2 with the default in-flight setting (the idempotent producer's five requests
#     per connection) and 100-message produce requests, so several requests of a partition are
#     in flight when one fails: the first copies still arrive in order per aggregate, and no
#     `order broken`. Completeness is not asserted here (see below: the mock's gap).
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
fault_setup 3

insert() { # insert TYPE FROM TO: rows over 50 aggregates, seq grows with id
    insert_rows "$1" "$2" "$3" 50
}
count_of() { # count_of TYPE CONDITION
    psql_q "SELECT count(*) FROM outbox WHERE aggregate_type = '$1' AND ($2)"
}
since() { # since LINE: relay log lines after line LINE
    tail -n +"$(($1 + 1))" "$RELAY_LOG"
}
# check_delivered_counted TYPE [exact]: check_delivered (tests/lib.sh), and print how many
# duplicates; with "exact", also check there are none.
check_delivered_counted() {
    local file=$T/$1.json n distinct
    check_delivered "$1"
    n=$(grep -c '' "$file")
    distinct=$(jq -r .headers.id "$file" | sort -u | grep -c .)
    echo "# $1: $n messages, $((n - distinct)) duplicates"
    [ "${2:-}" = exact ] && check_eq "$1: no duplicates" "$distinct" "$n"
}

# --- 1. brokers down longer than the delivery timeout ---
relay_start --database-url "$DATABASE_URL" "${FAULT_RELAY_OPTS[@]}" --delivery-timeout 2000 \
    --max-attempts 1
insert t1 0 99
wait_for "1: warm-up rows delivered" 30 none_unsent_of t1
mark=$(log_lines)
broker_down
insert t1 100 2099
sleep 6
check "1: relay keeps running while the brokers are down" relay_running
check_eq "1: no row marked sent during the outage" 100 "$(count_of t1 "sent_at IS NOT NULL")"
failed=$(count_of t1 "attempts > 0 AND last_error IS NOT NULL")
echo "# 1: $failed rows with attempts > 0 and last_error after 6 s down; e.g. $(psql_q "SELECT attempts || ' attempts, ' || last_error FROM outbox WHERE attempts > 0 ORDER BY attempts DESC, id LIMIT 1")"
check "1: rows tried during the outage have attempts > 0 and last_error" test "$failed" -gt 0
check_eq "1: none counted as a rejection, none dead-lettered (--max-attempts 1)" "0 0" \
    "$(count_of t1 "rejections > 0") $(count_of t1 "dead_at IS NOT NULL")"
outage=$(since "$mark")
broker_up
wait_for "1: every row sent once the brokers are back" 45 none_unsent_of t1
# The relay's last word on Kafka since the outage began: it may come as soon as the brokers are
# up, or (a broker seen up for a moment while they were down) before.
last_state=$(since "$mark" | grep -E 'msg="kafka (unreachable|reachable again)"' | tail -n 1)
check "1: the last line on Kafka's state says it is reachable again (info)" \
    grep -q 'level=info msg="kafka reachable again"' <<<"$last_state"
check_delivered_counted t1
warns=$(grep -cE 'level=(warn|error)' <<<"$outage")
unreachable=$(grep -c 'msg="kafka unreachable"' <<<"$outage")
undelivered=$(grep -c 'msg="events not delivered' <<<"$outage")
echo "# 1: during the 6 s outage: $warns warn/error lines ($unreachable 'kafka unreachable', $undelivered 'events not delivered')"
check "1: 'kafka unreachable' logged at most twice ($unreachable)" test "$unreachable" -le 2
check "1: 'events not delivered' logged at most twice ($undelivered)" test "$undelivered" -le 2
check "1: at most 8 warn/error lines for the whole outage ($warns)" test "$warns" -le 8
relay_stop
check_eq "1: relay exits 0" 0 $?

# --- 2, 3, 4: injected produce errors and latency ---
# librdkafka's msg debug context logs each failed produce request, which shows the fault hit.
# One produce request in flight per broker connection: the mock broker accepts a later batch of a
# partition after failing an earlier one (Kafka answers OUT_OF_ORDER_SEQUENCE_NUMBER), and
# librdkafka then counts the earlier messages as delivered ("implicitly acked by subsequent batch
# success") though the mock never stored them. With two claim sessions' batches in flight that
# happened here about once in ten runs; it is the mock's gap, not the relay's. Section 5 runs the
# default in-flight setting and checks what the mock keeps faithfully: the order.
# And a linger of 500 ms, as in 76_producer_fatal (whose header says why): MESSAGE_TOO_LARGE in 3
# is fatal with enable.gapless.guarantee, and librdkafka 2.0.2 still sends a request it built
# behind the rejected one, which the mock stores and Kafka would refuse.
relay_start --database-url "$DATABASE_URL" "${FAULT_RELAY_OPTS[@]}" --retry-backoff 500 \
    --log-level debug --kafka debug=msg \
    --kafka max.in.flight.requests.per.connection=1 --kafka linger.ms=500
insert w 0 99
wait_for "2: warm-up rows delivered" 30 none_unsent_of w
for fault in "6 NOT_LEADER_FOR_PARTITION Not leader" "7 REQUEST_TIMED_OUT Request timed out"; do
    read -r code name text <<<"$fault"
    mark=$(log_lines)
    broker_cmd "errors produce 5 $code"
    insert "e$code" 0 999
    wait_for "2: $name x5: every row sent" 30 none_unsent_of "e$code"
    check "2: $name x5: the producer got the error and retried" \
        grep -q "encountered error: Broker: $text" <<<"$(since "$mark")"
    check_delivered_counted "e$code" exact
done

mark=$(log_lines)
broker_cmd "errors produce 5 10"
insert e10 0 999
# The rows of the refused request (64 at most; the rest count a transient failure) go one at a
# time, each waiting out the 500 ms linger: about 32 s, past the 30 s delivery timeout of their
# batch, whose rest is then retried. Measured: 64 and 68 s from the refusal to the last row.
wait_for "3: MESSAGE_TOO_LARGE x5: every row sent after the per-row backoff" 120 none_unsent_of e10
check "3: a request of several rows refused: the warning naming batch.size" grep -q \
    'the broker refused a produce request as too large though .*batch.size' <<<"$(since "$mark")"
check_eq "3: every rejection counted is the broker's too-large error" \
    "$(count_of e10 "rejections > 0")" \
    "$(count_of e10 "rejections > 0 AND last_error LIKE 'message too large for the broker%'")"
echo "# 3: $(count_of e10 "rejections > 0") rows rejected at least once; $(since "$mark" | grep -c 'msg="kafka producer recreated"') producer resets"
check "3: no 'order broken' in the log" lacks "$RELAY_LOG" "order broken"
check_delivered_counted e10

broker_cmd "rtt all 300"
insert r 0 1999
t0=$(date +%s)
wait_for "4: rtt 300 ms: every row sent" 60 none_unsent_of r
echo "# 4: 2000 rows in $(($(date +%s) - t0)) s with rtt 300 ms"
broker_cmd "rtt all 0"
check_delivered_counted r
relay_stop
check_eq "relay exits 0" 0 $?
check "no relay logged 'order broken'" lacks "$RELAY_LOG" "order broken"

# --- 5. the same errors with the default five requests in flight ---
relay_start --database-url "$DATABASE_URL" "${FAULT_RELAY_OPTS[@]}" --retry-backoff 500 \
    --log-level debug --kafka debug=msg \
    --kafka batch.num.messages=100
insert w5 0 99
wait_for "5: warm-up rows delivered" 30 none_unsent_of w5
for fault in "6 NOT_LEADER_FOR_PARTITION Not leader" "7 REQUEST_TIMED_OUT Request timed out"; do
    read -r code name text <<<"$fault"
    mark=$(log_lines)
    broker_cmd "errors produce 5 $code"
    insert "f$code" 0 1999
    wait_for "5: $name x5, five in flight: every row sent" 30 none_unsent_of "f$code"
    check "5: $name x5, five in flight: the producer got the error and retried" \
        grep -q "encountered error: Broker: $text" <<<"$(since "$mark")"
    consume --topic "outbox.event.f$code" --to-end --timeout-ms 30000 >"$T/f$code.json"
    check "5: $name x5, five in flight: first copies in order per aggregate" \
        first_copies_in_order "$T/f$code.json"
    echo "# 5: f$code: $(jq -r .headers.id "$T/f$code.json" | sort -u | grep -c .) of 2000 events in the mock's log"
done
relay_stop
check_eq "5: relay exits 0" 0 $?
check "5: no 'order broken' in the log" lacks "$RELAY_LOG" "order broken"
