#!/bin/bash
# Proves the relay rides out outages of either side without losing or reordering events, without
# exiting, and without flooding its log:
#  1. Kafka down when the relay starts: nothing is marked sent meanwhile; all delivered once up.
#  2. Kafka down mid-run, deterministically mid-delivery: the brokers go down while a claimed
#     batch awaits its acknowledgements (seen open) and part of the rows is sent; rows inserted
#     during the outage are delivered once it is back, in order per aggregate.
#  3. PostgreSQL restarted mid-run, with a claimed batch in flight (seen open, part of the rows
#     sent): the relay reconnects and delivers the rest (and new rows).
#  4. PostgreSQL down when the relay starts: it keeps retrying, then delivers once PG is up.
# (Kafka down at start with the relay on a busy CPU, which must run alone, is 54_outage_busy_cpu.)
# Each outage lasts ~5 s and must produce state-change lines (a warn/error when it starts, an
# info line when it ends) but fewer than 20 log lines in all. The relay runs with its default
# librdkafka settings (no message timeout: the order rests on it), only reconnecting faster.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
fault_setup 3

OUTAGE=5

insert() { # insert TYPE FROM TO: rows over 20 aggregates, seq grows with id
    insert_rows "$1" "$2" "$3" 20
}

# mid_delivery TYPE N: part of TYPE's N rows sent and a claimed batch awaiting acknowledgements
# (with 300 ms of round-trip time a batch stays in flight that long; SENT keeps the count).
mid_delivery() {
    SENT=$(sent_of "$1")
    [ "$SENT" -gt 0 ] && [ "$SENT" -lt "$2" ] && claim_open
}

# Checks the log lines written since line $2 for outage $1: state changes, but no flood.
check_outage_log() {
    local what=$1 from=$2 lines n
    lines=$(tail -n +"$((from + 1))" "$RELAY_LOG")
    check "$what: a warn/error line reports the outage" grep -qE 'level=(warn|error)' <<<"$lines"
    n=$(grep -c . <<<"$lines")
    if [ "$n" -lt 20 ]; then
        ok "$what: fewer than 20 log lines during the outage"
    else
        not_ok "$what: fewer than 20 log lines during the outage" "$n lines"
    fi
}

# Checks the log lines since line $2 contain an info line that the outage ended.
check_recovery_log() {
    check "$1: an info line reports the recovery" \
        grep -qE 'level=info.*(again|reconnect|recover|restor|connected|reachable)' \
        <<<"$(tail -n +"$(($2 + 1))" "$RELAY_LOG")"
}

# --- 1. Kafka down at start ---
broker_down
insert k1 0 999
relay_start --database-url "$DATABASE_URL" "${FAULT_RELAY_OPTS[@]}"
sleep "$OUTAGE"
check "1: relay keeps running while Kafka is down" relay_running
check_eq "1: no row marked sent while Kafka is down" 0 "$(sent_of k1)"
check_outage_log "1 (kafka down at start)" 0
mark=$(log_lines)
broker_up
wait_for "1: all rows sent once Kafka is up" 45 no_unsent_rows
check_recovery_log "1 (kafka down at start)" "$mark"
check_delivered k1

# --- 2. Kafka down mid-run ---
broker_cmd "rtt all 300" # slow enough that the outage usually hits mid-delivery
insert k2 0 4999
wait_for "2: delivery under way, a batch in flight" 30 mid_delivery k2 5000
mark=$(log_lines)
broker_down
echo "# 2: $SENT of 5000 rows sent when Kafka went down"
check "2: the outage hit mid-delivery (some but not all rows sent)" \
    test "$(sent_of k2)" -lt 5000
insert k2 5000 5999
sleep "$OUTAGE"
check "2: relay keeps running while Kafka is down" relay_running
check_outage_log "2 (kafka down mid-run)" "$mark"
mark=$(log_lines)
broker_up
broker_cmd "rtt all 0"
wait_for "2: all rows sent once Kafka is back" 45 no_unsent_rows
check_recovery_log "2 (kafka down mid-run)" "$mark"
check_delivered k2

# --- 3. PostgreSQL restarted mid-run ---
broker_cmd "rtt all 300"
insert p1 0 4999
wait_for "3: delivery under way, a batch in flight" 30 mid_delivery p1 5000
mark=$(log_lines)
pg_restart
echo "# 3: $SENT of 5000 rows sent when PostgreSQL restarted"
check "3: the restart hit mid-delivery (some but not all rows sent)" \
    test "$(sent_of p1)" -lt 5000
insert p1 5000 5499 # after the restart: the relay must pick these up too
wait_for "3: all rows sent after PostgreSQL restarted" 45 no_unsent_rows
check "3: relay kept running" relay_running
check_outage_log "3 (postgres restart)" "$mark"
check_recovery_log "3 (postgres restart)" "$mark"
broker_cmd "rtt all 0"
check_delivered p1
relay_stop
check_eq "relay exits 0 after outages 1-3" 0 $?

# --- 4. PostgreSQL down when the relay starts ---
insert p2 0 999
pg_stop
relay_start --database-url "$DATABASE_URL" "${FAULT_RELAY_OPTS[@]}"
sleep "$OUTAGE"
check "4: relay keeps retrying while PostgreSQL is down (did not exit)" relay_running
check_outage_log "4 (postgres down at start)" 0
mark=$(log_lines)
pg_start
wait_for "4: all rows sent once PostgreSQL is up" 45 no_unsent_rows
check_recovery_log "4 (postgres down at start)" "$mark"
check_delivered p2
relay_stop
check_eq "4: relay exits 0" 0 $?
