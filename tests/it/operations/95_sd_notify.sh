#!/bin/bash
# Proves the relay speaks systemd's notification protocol (relay/sdnotify.c) the way the unit's
# Type=notify and WatchdogSec= expect, with a datagram socket standing in for systemd:
#  1. while PostgreSQL is down, STATUS= says so and READY=1 is not sent;
#  2. once it is up, READY=1; after a delivery (Kafka acknowledged), STATUS=ready;
#  3. WATCHDOG=1 keeps coming from the event loop (WATCHDOG_USEC set), and STOPPING=1 on SIGTERM,
#     after which the relay exits 0 as usual;
#  5. (run before 4) STATUS= gives /readyz's verdict and reasons: not ready while a session that
#     is not a relay holds member slots;
#  4. a NOTIFY_SOCKET nobody listens on: one warning line, and the relay still delivers;
#  6. with --databases, a socket that goes away is warned about as the process's, naming no
#     database.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"

# socat prints each datagram as it comes (the relay ends every line with a newline).
socat -u "UNIX-RECV:$T/notify" "OPEN:$T/notify.out,creat,append" 2>"$T/socat.log" &
_t_track $!
_poll 10 test -S "$T/notify" || fail "socat listens on $T/notify within 10s"
got() { grep -qx -e "$1" "$T/notify.out"; }
count() { grep -cx -e "$1" "$T/notify.out"; }

# --- 1. ---
pg_stop
RELAY_WRAP=(env NOTIFY_SOCKET="$T/notify" WATCHDOG_USEC=1000000)
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --kafka reconnect.backoff.max.ms=500
wait_for "1: STATUS= says postgres is unreachable" 30 got 'STATUS=not ready: postgres unreachable;.*'
check "1: no READY=1 while postgres is down" lacks "$T/notify.out" "READY=1"

# --- 2. ---
pg_start
wait_for "2: READY=1 once postgres is up" 60 got 'READY=1'
check_eq "2: READY=1 sent once" 1 "$(count 'READY=1')"
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        VALUES ('order', 'o-1', 'created', '{}')"
wait_for "2: the row is delivered" 60 no_unsent_rows
wait_for "2: STATUS=ready after Kafka acknowledged" 30 got 'STATUS=ready: .* lanes owned, .* sessions in the group'

# --- 3. ---
watchdogs_seen() { [ "$(count 'WATCHDOG=1')" -ge "$1" ]; }
wait_for "3: WATCHDOG=1 keeps coming" 30 watchdogs_seen "$(($(count 'WATCHDOG=1') + 3))"
relay_stop
check_eq "3: SIGTERM: relay exits 0" 0 $?
wait_for "3: STOPPING=1 on SIGTERM" 10 got 'STOPPING=1' # socat may write it after the relay exited
check "3: the log names the socket and the watchdog period" \
    grep -q 'msg="notifying systemd" socket=".*/notify" watchdog_ms=1000' "$RELAY_LOG"

# --- 5. STATUS= judges as /readyz does: a session that is not a relay holds member slots ---
# (It said "ready" while /readyz answered 503: it looked at PostgreSQL and Kafka alone.)
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --metrics-listen 127.0.0.1:0
metrics_wait
wait_for "5: STATUS=ready" 60 got 'STATUS=ready: .* lanes owned, .* sessions in the group'
psql -XAtq -c "SELECT count(pg_advisory_lock($MEMBER_NS, k)) FROM generate_series(100, 107) AS k" \
    -c "SELECT pg_sleep(60)" >/dev/null 2>&1 &
SQUATTER=$!
_t_track "$SQUATTER"
wait_for "5: /readyz answers 503" 30 sh -c "[ \"\$(curl -s -o /dev/null -w '%{http_code}' \
    --max-time 5 http://$METRICS/readyz)\" = 503 ]"
wait_for "5: STATUS= says not ready, and why, as /readyz does" 10 \
    got 'STATUS=not ready: sessions that are not relays hold lane locks;'
kill "$SQUATTER" 2>/dev/null
psql_q "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory'
        AND classid = $MEMBER_NS AND objsubid = 2 AND objid BETWEEN 100 AND 107" >/dev/null
relay_stop
check_eq "5: relay exits 0" 0 $?

# --- 4. ---
RELAY_WRAP=(env NOTIFY_SOCKET="$T/nobody-listens")
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS"
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        VALUES ('order', 'o-2', 'created', '{}')"
wait_for "4: the row is delivered all the same" 60 no_unsent_rows
relay_stop
check_eq "4: relay exits 0" 0 $?
check_eq "4: one warning for the unreachable socket, not one per tick" 1 \
    "$(grep -c 'msg="cannot notify systemd"' "$RELAY_LOG")"

# --- 6. with --databases, the process's own lines name no database ---
# The log context is whatever the loop's last callback set (a database's session): the warning
# named the database whose session ran last, as if the socket were that database's.
socat -u "UNIX-RECV:$T/notify6" "OPEN:$T/notify6.out,creat,append" 2>>"$T/socat.log" &
SOCAT6=$!
_t_track "$SOCAT6"
_poll 10 test -S "$T/notify6" || fail "6: socat listens on $T/notify6 within 10s"
# A list names every URL: the environment's DATABASE_URL beside it would be refused.
RELAY_WRAP=(env -u DATABASE_URL NOTIFY_SOCKET="$T/notify6")
relay_start --brokers "$BROKERS" --databases "[{\"name\": \"a\", \"database-url\": \"$DATABASE_URL\"}]"
wait_for "6: READY=1 from the list's relay" 60 grep -qx READY=1 "$T/notify6.out"
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        VALUES ('order', 'o-3', 'created', '{}')"
wait_for "6: the row is delivered (a session of database a ran)" 60 no_unsent_rows
kill "$SOCAT6"
rm -f "$T/notify6"
wait_for "6: the vanished socket is warned about" 15 grep -q 'msg="cannot notify systemd"' "$RELAY_LOG"
check "6: ... as the process's, naming no database" \
    bash -c "! grep 'msg=\"cannot notify systemd\"' '$RELAY_LOG' | grep -q 'database='"
relay_stop
check_eq "6: relay exits 0" 0 $?
