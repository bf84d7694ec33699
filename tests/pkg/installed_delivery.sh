#!/bin/bash
# Proves the *installed* Debian package relays: /usr/bin/outbox-relay, started by the command line
# of the installed unit (/lib/systemd/system/outbox-relay.service) with the installed
# /etc/outbox-relay/relay.json, the way systemd would start it:
#  - %d (the credentials directory) holds the database URL in the file database-url and the
#    installed kafka.properties, as LoadCredential= puts them there, readable only by the
#    service's user;
#  - the service's user is an unprivileged one (DynamicUser= gives a fresh uid; here nobody), with
#    no capabilities and no_new_privs (CapabilityBoundingSet=, NoNewPrivileges=);
#  - KAFKA_BROKERS comes from the environment, as EnvironmentFile= would give it (it beats the
#    brokers in relay.json, which name localhost:9092);
#  - NOTIFY_SOCKET names a socket standing in for systemd (Type=notify).
# Then: READY=1; 500 rows over 20 aggregates all reach Kafka as stored, in order per aggregate;
# /readyz and /metrics answer on relay.json's metrics address; SIGTERM (systemctl stop) exits 0.
# Not part of `make test`: it needs the package installed (make package-test, as root).
# shellcheck source=tests/lib.sh
RELAY_BIN=${RELAY_BIN:-/usr/bin/outbox-relay}
source "$(dirname "$0")/../lib.sh"
UNIT=${UNIT:-/lib/systemd/system/outbox-relay.service}
[ -x "$RELAY_BIN" ] || fail "$RELAY_BIN is installed"
[ -f "$UNIT" ] || fail "$UNIT is installed"
t_setup

exec_start=$(sed -n 's/^ExecStart=//p' "$UNIT")
check_eq "the unit has one ExecStart= naming the installed binary" "$RELAY_BIN run" \
    "$(printf '%s\n' "$exec_start" | awk '{ print $1, $2 }')"
metrics=$(jq -r '."metrics-listen"' /etc/outbox-relay/relay.json)
[ -n "$metrics" ] && [ "$metrics" != null ] || fail "relay.json names a metrics-listen address"
if ss -Hltn "sport = :${metrics##*:}" | grep -q .; then
    fail "relay.json's metrics address $metrics is free" "another process listens there"
fi

pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate with the installed binary"
psql_q "CREATE ROLE relay_login LOGIN IN ROLE outbox_relay" || fail "create the relay's login role"
ROWS=500
AGGS=20
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'order', 'order-' || (g % $AGGS), 'order.updated',
               jsonb_build_object('aggregate', 'order-' || (g % $AGGS), 'seq', g / $AGGS)
        FROM generate_series(0, $ROWS - 1) AS g ORDER BY g"

# What systemd sets up before it runs ExecStart=.
user=nobody
as_service=()
if [ "$(id -u)" = 0 ]; then
    as_service=(setpriv --reuid="$user" --regid="$(id -g "$user")" --clear-groups --no-new-privs
        --bounding-set=-all --inh-caps=-all)
fi
creds=$T/credentials
mkdir -m 700 "$creds"
printf '%s\n' "postgresql://relay_login@127.0.0.1:$PGPORT/outbox" >"$creds/database-url"
cp /etc/outbox-relay/kafka.properties "$creds/kafka.properties" # as installed (comments only)
chmod 400 "$creds/database-url" "$creds/kafka.properties"
[ "$(id -u)" = 0 ] && chown -R "$user" "$creds"
socat -u "UNIX-RECV:$T/notify" "OPEN:$T/notify.out,creat,append" 2>"$T/socat.log" &
_t_track $!
_poll 10 test -S "$T/notify" || fail "socat listens on $T/notify within 10s"
chmod 777 "$T/notify" # the service's user sends to it, as to systemd's socket
# systemd's specifier %d; no other specifier or variable is in the line (checked just below).
cmdline=${exec_start//%d/$creds}
case $cmdline in *%* | *'$'*) fail "ExecStart= has only %d to expand" "$exec_start" ;; esac

RELAY_LOG=$T/relay.1.log
# shellcheck disable=SC2086 # ExecStart= is split on spaces, as systemd does for a line without quotes
"${as_service[@]}" env -i PATH=/usr/bin:/bin KAFKA_BROKERS="$BROKERS" NOTIFY_SOCKET="$T/notify" \
    $cmdline >"$RELAY_LOG" 2>&1 &
RELAY_PID=$!
_t_track "$RELAY_PID"

got() { grep -qx -e "$1" "$T/notify.out"; }
wait_for "READY=1 from the installed relay" 60 got 'READY=1'
wait_for "every row gets sent_at" 120 no_unsent_rows
check "relay still running after delivering" relay_running
if [ "$(id -u)" = 0 ]; then
    check_eq "it runs as $user, not root" "$user" "$(ps -o user= -p "$RELAY_PID")"
fi

consume --topic outbox.event.order --idle-ms 2000 --timeout-ms 30000 >"$T/order.json"
psql_q "SELECT event_id, aggregate_id, payload::text FROM outbox" -F $'\t' | sort >"$T/rows.tsv"
jq -r '[.headers.id, .key, .value] | @tsv' "$T/order.json" | sort -u >"$T/msgs.tsv"
check "every row is in Kafka as stored: id header, key = aggregate_id, value = payload" \
    diff -q "$T/rows.tsv" "$T/msgs.tsv"
check "first copies in order per aggregate" first_copies_in_order "$T/order.json"

check_eq "/readyz on relay.json's address" "ready" "$(curl -fsS "http://$metrics/readyz")"
published() {
    curl -fsS "http://$metrics/metrics" |
        awk '/^outbox_events_published_total\{topic="outbox.event.order"\}/ { print $2 }'
}
# At least once: a row sent again would count again, so no fewer than the rows.
check "/metrics counts the published events" test "$(published)" -ge "$ROWS"

relay_stop
check_eq "SIGTERM (systemctl stop): exits 0" 0 $?
# socat writes what it received after the relay exited, maybe: wait for it, as for READY=1.
wait_for "STOPPING=1 on SIGTERM" 10 got 'STOPPING=1'
