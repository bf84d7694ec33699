#!/bin/bash
# Proves that Kafka refusing events for a fault of the setup (TOPIC_AUTHORIZATION_FAILED: an ACL
# revoked; an unknown topic) is nobody's row's fault (docs/guarantees.md#failure-modes): the
# mock broker answers produce requests with TOPIC_AUTHORIZATION_FAILED (29) for longer than
# --max-attempts 2 retries would last, with --retry-backoff 100 (a rejection's per-row backoff).
# On main every row of the refused requests counted a rejection and was dead-lettered after two
# (its first copy never reached the topic). Now: no rejection is counted and nothing is
# dead-lettered; the relay says once what is wrong, with a hint, and is not ready while it lasts
# (/readyz says why); once the broker accepts again every row is delivered, first copies in
# order, and the relay says so. (Rows of another partition purged by the producer's reset after
# the refusal still count a transient attempt: see the check's comment.)
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
fault_setup 1

count_of() { # count_of CONDITION: rows of aggregate type acl
    psql_q "SELECT count(*) FROM outbox WHERE aggregate_type = 'acl' AND ($1)"
}
ready_is() { # ready_is CODE: /readyz answers CODE
    [ "$(http_code /readyz)" = "$1" ]
}
FAULT_LINE="Kafka refuses events for a fault of the setup"

# One request in flight per connection and a 500 ms linger, as in 76_producer_fatal (whose header
# says why): the refusal is fatal under enable.gapless.guarantee, and the mock would keep a
# request librdkafka 2.0.2 sends behind the refused one.
relay_start --database-url "$DATABASE_URL" "${FAULT_RELAY_OPTS[@]}" --max-attempts 2 \
    --retry-backoff 100 --retry-backoff-max 200 --metrics-listen 127.0.0.1:0 \
    --kafka max.in.flight.requests.per.connection=1 --kafka linger.ms=500
metrics_wait
insert_rows warm 1 10 2
wait_for "warm-up rows delivered" 30 none_unsent_of warm
# Five refused requests: the refusal is fatal under enable.gapless.guarantee, so each round of
# the relay's retry backoff (0.5 s doubling) sends one: five rounds, past --max-attempts 2.
broker_cmd "errors produce 5 29"
insert_rows acl 1 20 2
wait_for "the relay says what is wrong" 30 grep -q "$FAULT_LINE" "$RELAY_LOG"
check "... with a hint" grep -q "$FAULT_LINE.*hint=\".*ACL" "$RELAY_LOG"
check "... and is not ready while it lasts, /readyz saying why" \
    grep -q "Topic authorization failed" <(curl -s --max-time 5 "http://$METRICS/readyz")
wait_for "every row sent once the broker accepts again" 90 none_unsent_of acl
check_eq "no row counted a rejection or was dead-lettered (--max-attempts 2)" "0 0" \
    "$(count_of "rejections > 0") $(count_of "dead_at IS NOT NULL")"
# The refusal is fatal under enable.gapless.guarantee: what the producer held of the other
# partition is purged, a transient failure (an attempt counted, never a rejection).
echo "# rows with a transient attempt counted (purged by the producer's reset): $(count_of "attempts > 0")"
check_eq "the fault is logged once at error level" 1 \
    "$(grep -c "level=error.*$FAULT_LINE" "$RELAY_LOG")"
check "the relay says Kafka accepts the events again" grep -q "Kafka accepts the events again" "$RELAY_LOG"
wait_for "the relay is ready again" 15 ready_is 200
check_delivered acl
check "no 'order broken' in the log" lacks "$RELAY_LOG" "order broken"
relay_stop
check_eq "the relay exits 0" 0 "$?"
