#!/bin/bash
# Proves a producer queue that holds a single message (queue.buffering.max.messages=1, the least
# the relay accepts; likewise a queue.buffering.max.kbytes that holds one large message) costs no
# row an attempt: librdkafka counts a message in its queue until its delivery report callback has
# returned, so the next row, tried from inside that callback, meets a full queue with nothing of
# the relay's left in flight. It waits for the room the report frees, and is produced then: 12
# rows over 3 aggregates are all delivered, first copies in order, none with attempts > 0 or a
# last_error, no `Queue full` in the log, outbox_failures_total stays 0.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
fault_setup 1

insert_rows q 1 12 3
relay_start --database-url "$DATABASE_URL" "${FAULT_RELAY_OPTS[@]}" \
    --metrics-listen 127.0.0.1:0 --kafka queue.buffering.max.messages=1
metrics_wait
wait_for "every row sent" 60 none_unsent_of q
check_eq "no row got an attempt counted" 0 \
    "$(psql_q "SELECT count(*) FROM outbox WHERE attempts > 0 OR last_error IS NOT NULL")"
check "no 'Queue full' in the log" lacks "$RELAY_LOG" "Queue full"
check_eq "outbox_failures_total stays 0" 0 \
    "$(http_get /metrics | awk '/^outbox_failures_total/ { n += $2 } END { print n + 0 }')"
check_delivered q
relay_stop
check_eq "SIGTERM: relay exits 0" 0 $?
