#!/bin/bash
# Proves a produce request the broker refuses whole as too large (MESSAGE_TOO_LARGE, 10: Kafka
# applies a topic's max.message.bytes to a whole record batch, and librdkafka 2.0.2 does not
# split it) counts nothing against the small events in it (docs/guarantees.md, "Poison events"):
#  A. 20 small rows over 4 aggregates, produced together (linger 300 ms), the mock refusing
#     the first produce request with code 10, --max-attempts 1: no rejection counted, none
#     dead-lettered, every row delivered, first copies in order per aggregate, and the warning
#     that tells the operator to lower batch.size logged once for the episode. (On the old code
#     10 rows were counted a rejection each and dead-lettered, the other 10 held behind them.)
#  B. rows of two aggregates the broker refuses even alone (every produce request refused):
#     genuinely too large, each is rejected and dead-lettered as before, with the broker's
#     too-large error in last_error, and none is delivered.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
fault_setup 1

count_of() { # count_of TYPE CONDITION
    psql_q "SELECT count(*) FROM outbox WHERE aggregate_type = '$1' AND ($2)"
}
settled() { # settled TYPE: every row of TYPE delivered or dead-lettered
    [ "$(count_of "$1" "sent_at IS NULL AND dead_at IS NULL")" = 0 ]
}
WARNING='the broker refused a produce request as too large though its messages were within'

relay_start --database-url "$DATABASE_URL" "${FAULT_RELAY_OPTS[@]}" --sessions 1 \
    --max-attempts 1 --retry-backoff 200 --kafka linger.ms=300
insert_rows w 0 9 2
wait_for "warm-up rows delivered" 30 none_unsent_of w

# --- A. one request of 20 small rows refused whole ---
broker_cmd "errors produce 1 10"
insert_rows a 0 19 4
wait_for "A: every row delivered or dead-lettered" 30 settled a
echo "# A: $(count_of a "rejections > 0") rows counted a rejection, $(count_of a "dead_at IS NOT NULL") dead-lettered"
check_eq "A: no rejection counted, none dead-lettered" "0 0" \
    "$(count_of a "rejections > 0") $(count_of a "dead_at IS NOT NULL")"
check_delivered a
check_eq "A: the warning logged once" 1 "$(grep -c "$WARNING" "$RELAY_LOG")"
check "A: it names the fix (batch.size)" grep -q "$WARNING.*batch.size" "$RELAY_LOG"

# --- B. rows refused even alone ---
broker_cmd "errors produce 1000 10"
insert_rows b 0 1 2
wait_for "B: both rows dead-lettered" 60 settled b
check_eq "B: each dead-lettered with one rejection and the broker's too-large error; none sent" \
    "2 0" "$(count_of b "dead_at IS NOT NULL AND rejections = 1 AND last_error LIKE 'message too large for the broker%'") $(count_of b "sent_at IS NOT NULL")"
relay_stop
check_eq "relay exits 0" 0 $?
check "no 'order broken' in the log" lacks "$RELAY_LOG" "order broken"
