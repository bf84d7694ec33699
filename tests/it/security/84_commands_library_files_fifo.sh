#!/bin/bash
# Proves the commands that make a librdkafka client (check's producer, verify's consumer) never
# wait on one of its TLS files that is not a regular file: librdkafka opens them in rd_kafka_new,
# and a FIFO's open waits for a writer, past every bound --statement-timeout promises. As run's
# producers (84_library_files_fifo parts 3 and 4), each is handed the files the command opened
# without waiting, after the PostgreSQL part that may take long:
#  1. check: ssl.ca.location swapped for a FIFO while check waits on a locked outbox (its Kafka
#     configuration already built and checked): check ends, its kafka line naming the FIFO;
#  2. verify: ssl.ca.location a FIFO from the start is bad input (exit 2, one line naming the
#     property and the path), refused before any row is read;
#  3. verify: the file swapped for a FIFO while verify waits on the locked outbox: verify ends
#     (exit 1, "cannot create the Kafka consumer" naming the FIFO).
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=127.0.0.1" \
    -keyout "$T/ca.key" -out "$T/ca.pem" >"$T/openssl.log" 2>&1 || fail "openssl"
KAFKA_CA=$T/kafka-ca.pem
TLS=(--kafka security.protocol=ssl --kafka "ssl.ca.location=$KAFKA_CA")
waits_on_lock() { # waits_on_lock APPNAME: a session of APPNAME waits for a lock
    [ "$(psql_q "SELECT count(*) FROM pg_stat_activity
                 WHERE application_name = '$1' AND wait_event_type = 'Lock'")" -ge 1 ]
}
exited() { ! kill -0 "$1" 2>/dev/null; }
# The reason, true of the commands too (it said "on the relay's event loop whenever it makes a
# producer" for check's and verify's clients, which are made on no loop).
WHY="not a regular file or a directory (librdkafka opens it whenever a client is made, and a\
 pipe's, device's or socket's open could wait without end: on the running relay's event loop, or\
 past a command's --statement-timeout)"
swap_for_fifo() { # the path becomes a FIFO in one rename (as a rotation renames a file over it)
    mkfifo -m 600 "$KAFKA_CA.fifo" && mv -f "$KAFKA_CA.fifo" "$KAFKA_CA"
}

# --- 1. ---
cp "$T/ca.pem" "$KAFKA_CA"
table_lock_open
wait_for "1: the outbox is locked" 20 table_lock_held
"$RELAY_BIN" check --brokers "$BROKERS" --statement-timeout 20s "${TLS[@]}" >"$T/check.out" 2>&1 &
CMD_PID=$!
_t_track "$CMD_PID"
wait_for "1: check waits on the outbox (its Kafka configuration built)" 20 \
    waits_on_lock "outbox-relay check"
swap_for_fifo
table_lock_close
# Bounded by check's own: its PostgreSQL checks go on at once, and its broker wait is 20 s.
wait_for "1: check ends (not waiting on the FIFO)" 60 exited "$CMD_PID"
check "1: its kafka line names the FIFO" \
    grep -qF "kafka: cannot create a producer: kafka ssl.ca.location $KAFKA_CA: $WHY" \
    "$T/check.out"

# --- 2. --- (the path is a FIFO still)
timeout 60 "$RELAY_BIN" verify --brokers "$BROKERS" --statement-timeout 20s "${TLS[@]}" \
    >"$T/verify2.out" 2>&1
check_eq "2: verify refuses a FIFO as bad input" 2 "$?"
check "2: in one line naming the property and the path" \
    grep -qF "kafka ssl.ca.location $KAFKA_CA: $WHY" "$T/verify2.out"

# --- 3. ---
rm -f "$KAFKA_CA" && cp "$T/ca.pem" "$KAFKA_CA"
table_lock_open
wait_for "3: the outbox is locked" 20 table_lock_held
"$RELAY_BIN" verify --brokers "$BROKERS" --statement-timeout 20s "${TLS[@]}" \
    >"$T/verify3.out" 2>&1 &
CMD_PID=$!
_t_track "$CMD_PID"
wait_for "3: verify waits on the outbox (its Kafka configuration checked)" 20 \
    waits_on_lock outbox-relay
swap_for_fifo
table_lock_close
wait_for "3: verify ends (not waiting on the FIFO)" 60 exited "$CMD_PID"
rc=still-waiting
exited "$CMD_PID" && { wait "$CMD_PID"; rc=$?; }
check_eq "3: verify fails (exit 1)" 1 "$rc"
check "3: naming the FIFO" grep -qF \
    "cannot create the Kafka consumer\" error=\"kafka ssl.ca.location $KAFKA_CA: $WHY" \
    "$T/verify3.out"
