#!/bin/bash
# Proves the relay rides out Kafka down at start while it shares one CPU with a busy process (3
# times): it still delivers once Kafka is up. librdkafka queues events while the relay is
# starting; one that only arms its wake-up afterwards may never hear of them, and CPU contention
# widens that window. (Part 5 of 50_outages before: the rest of that test need not run alone.)
# run.sh: alone (it keeps a CPU busy on purpose: a test beside it would crawl)
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
fault_setup 3

insert() { # insert TYPE FROM TO: rows over 20 aggregates, seq grows with id
    insert_rows "$1" "$2" "$3" 20
}

cpu=$(taskset -cp $$ | sed 's/.*: *//; s/[,-].*//')
taskset -c "$cpu" sh -c 'while :; do :; done' &
hog=$!
_t_track "$hog"
RELAY_WRAP=(taskset -c "$cpu")
for i in 1 2 3; do
    broker_down
    insert "s$i" 0 99
    relay_start --database-url "$DATABASE_URL" "${FAULT_RELAY_OPTS[@]}"
    sleep 3
    broker_up
    wait_for "5.$i: all rows sent once Kafka is up (relay on a busy CPU)" 30 no_unsent_rows
    relay_stop
    check_eq "5.$i: relay exits 0" 0 $?
done
RELAY_WRAP=()
kill "$hog"
