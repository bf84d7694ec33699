#!/bin/bash
# Proves the relay recovers from the idempotent producer's sequence errors without loss or
# reorder (docs/guarantees.md#failure-modes): the mock broker answers produce requests with
#   45 OUT_OF_ORDER_SEQUENCE_NUMBER — with enable.gapless.guarantee librdkafka 2.0.2 raises a
#      fatal error; the relay purges the producer, fails what it had in flight, recreates it and
#      retries the rows in order;
#   59 UNKNOWN_PRODUCER_ID — librdkafka 2.0.2 bumps the producer epoch (or, if it cannot, goes
#      fatal as above);
# while 1,000 rows over 50 aggregates are drained. Every row is delivered, first copies in order,
# and the relay keeps running (exit 0 at the end).
# One produce request in flight per connection, as in 75_transient: the mock broker accepts a
# later batch after failing an earlier one (Kafka would answer OUT_OF_ORDER_SEQUENCE_NUMBER), so
# with more in flight librdkafka counts messages the mock never stored as delivered.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
fault_setup 3

insert() { # insert TYPE FROM TO: rows over 50 aggregates, seq grows with id
    insert_rows "$1" "$2" "$3" 50
}

relay_start --database-url "$DATABASE_URL" "${FAULT_RELAY_OPTS[@]}" --delivery-timeout 5000 \
    --log-level debug --kafka debug=msg,eos --kafka max.in.flight.requests.per.connection=1
insert w 1 100
wait_for "warm-up rows delivered" 30 none_unsent_of w
for fault in "45 OUT_OF_ORDER_SEQUENCE_NUMBER" "59 UNKNOWN_PRODUCER_ID"; do
    read -r code name <<<"$fault"
    mark=$(log_lines)
    broker_cmd "errors produce 3 $code"
    insert "f$code" 1 1000
    wait_for "$name x3: every row sent" 60 none_unsent_of "f$code"
    echo "# $name: $(tail -n +"$((mark + 1))" "$RELAY_LOG" | grep -c 'kafka producer recreated') producer recreations, $(tail -n +"$((mark + 1))" "$RELAY_LOG" | grep -c 'fatal') fatal lines"
    check "$name: the producer met the error" \
        grep -qi "$name\|$(tr '_' ' ' <<<"${name,,}")" <<<"$(tail -n +"$((mark + 1))" "$RELAY_LOG")"
    check "$name: the relay keeps running" relay_running
    check_delivered "f$code"
done
check "no 'order broken' in the log" lacks "$RELAY_LOG" "order broken"
relay_stop
check_eq "the relay exits 0" 0 "$?"
