#!/bin/bash
# Proves a SIGHUP reload never waits on a secret file that is not a regular file (the reload
# runs on the event loop: a FIFO's open waits for a writer, freezing every database):
#  1. --database-url-file swapped for a FIFO nobody writes to: SIGHUP logs one error line naming
#     the file as not a regular file and keeping the running configuration, within 10 s;
#     /healthz still answers and new rows are still delivered;
#  2. the same with --config (the config file, read by jansson before) a FIFO;
#  3. the file put back: the next SIGHUP reloads, and the relay exits 0 on SIGTERM;
#  4. at start-up a pipe is still read (--database-url-file <(...), a secrets tool's output).
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"

CONF=$T/relay.json URLFILE=$T/database-url
printf '{"brokers": "%s", "batch-size": 50}\n' "$BROKERS" >"$CONF"
printf '%s\n' "$DATABASE_URL" >"$URLFILE"
chmod 600 "$CONF" "$URLFILE"
insert() { # insert TYPE N
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            SELECT '$1', '$1-' || g, 'changed', '{}' FROM generate_series(1, $2) AS g"
}
lines() { grep -c '' "$RELAY_LOG"; }
since() { tail -n +"$(($1 + 1))" "$RELAY_LOG"; } # since LINE: log lines after LINE
# hup DESCRIPTION PATTERN: SIGHUP, then wait (bounded) for a log line matching PATTERN after it.
hup() {
    local mark
    mark=$(lines)
    kill -HUP "$RELAY_PID"
    # shellcheck disable=SC2016
    wait_for "$1" 10 bash -c 'tail -n +"$(($2 + 1))" "$1" | grep -qF -- "$3"' _ "$RELAY_LOG" "$mark" "$2"
}
# fifo_for PATH: PATH becomes a FIFO nobody writes to (the file kept as PATH.saved).
fifo_for() { mv "$1" "$1.saved" && mkfifo -m 600 "$1"; }
# restore PATH: the file back in place of the FIFO.
restore() { rm -f "$1" && mv "$1.saved" "$1"; }

relay_start --config "$CONF" --database-url-file "$URLFILE" --metrics-listen 127.0.0.1:0
metrics_wait
insert a 10
wait_for "relay delivers" 30 none_unsent_of a

n=1
for what in database-url-file config; do
    case $what in
    database-url-file) path=$URLFILE name="database-url-file" ;;
    config) path=$CONF name="config file" ;;
    esac
    fifo_for "$path"
    mark=$(lines)
    hup "$n: --$what a FIFO: the reload is refused at once, not waited on" \
        "msg=\"configuration reload failed; keeping the running configuration\" error=\"$name $path: not a regular file"
    check_eq "$n: ... in one line" 1 "$(since "$mark" | grep -c 'reload failed')"
    check_eq "$n: /healthz still answers" 200 "$(http_code /healthz)"
    insert "b$n" 10
    wait_for "$n: new rows still delivered" 30 none_unsent_of "b$n"
    restore "$path"
    n=$((n + 1))
done

# --- 3. ---
hup "3: the files back, SIGHUP reloads" 'msg="configuration reloaded" changed=none'
relay_stop
check_eq "3: exit 0 on SIGTERM" 0 "$?"

# --- 4. ---
relay_start --config "$CONF" --database-url-file <(printf '%s\n' "$DATABASE_URL") \
    --metrics-listen 127.0.0.1:0
metrics_wait
insert c 10
wait_for "4: at start-up a pipe is read (--database-url-file <(...))" 30 none_unsent_of c
relay_stop
check_eq "4: exit 0 on SIGTERM" 0 "$?"
