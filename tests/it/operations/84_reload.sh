#!/bin/bash
# Proves SIGHUP reloads the configuration safely (relay started with --config FILE):
#  1. changing log-level (info -> debug), batch-size (1000 -> 7) and retention in the file, plus
#     topic-template (restart-only): one SIGHUP logs the applied options by name and, as a
#     warning, that topic-template needs a restart; afterwards debug lines appear, claims take 7
#     rows at a time, and events still go to the old topic (nothing to the new one);
#  2. a SIGHUP with nothing changed logs changed=none;
#  3. a malformed file and an out-of-range value are each logged as one error line and ignored:
#     the relay keeps running at the running values (still at debug level, still 7 per claim);
#  4. a flag beats the reloaded file (precedence as at start-up): --log-level given on the command
#     line wins over the file's (the reload is seen to happen: its restart-only warning shows);
#  5. growing batch-size past the first allocation (7 -> 5000) takes effect between batches;
#  6. the relay exits 0 on SIGTERM after all this;
#  7. a reload start-up would refuse beyond loading (a --delivery-timeout past the running
#     producer's message.timeout.ms) is refused whole, in one line naming it: its valid
#     batch-size is not applied either (claims still take 7), and the relay goes on delivering.
#  8. a SIGHUP while the relay still starts (reading its --database-url-file, a pipe) neither ends
#     it nor is lost: once its loop runs it reloads (the file, a regular one by then, read again),
#     and it delivers;
#  9. SIGHUPs all through a shutdown, the teardown after the loop included (Kafka down, rows in
#     flight, so the producer's last flush takes its second): the relay still exits 0 by itself,
#     and each SIGHUP during the drain (the file changed: log-level) says "reload ignored:
#     shutting down" and applies nothing (it said "configuration reloaded changed=log-level").
# 10. LIBEV_FLAGS in the environment asking for a signalfd (EVFLAG_SIGNALFD, 2097152) leaves the
#     relay's loop in libev's default mode, the one every part above tests: no signalfd among its
#     descriptors, and a SIGHUP reloads.
# 11. a file that switches from one database-url to a databases list is refused first and alone:
#     one error line (it said "configuration reloaded changed=log-level" and then that databases
#     needs a restart), its log-level not applied, and the relay goes on delivering.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 3
relay_migrate 2>"$T/migrate.log" || fail "migrate"

CONF=$T/relay.json
write_conf() { # write_conf JSON-BODY: the config file, atomically
    printf '{"database-url": "%s", "brokers": "%s", %s}\n' "$DATABASE_URL" "$BROKERS" "$1" \
        >"$CONF.tmp" && mv "$CONF.tmp" "$CONF"
}
insert() { # insert TYPE N
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            SELECT '$1', '$1-' || g, 'changed', '{}' FROM generate_series(1, $2) AS g"
}
unsent_of() { [ "$(psql_q "SELECT count(*) FROM outbox WHERE aggregate_type = '$1' AND sent_at IS NULL")" = 0 ]; }
lines() { grep -c '' "$RELAY_LOG"; }
since() { tail -n +"$(($1 + 1))" "$RELAY_LOG"; } # since LINE: log lines after LINE
# hup DESCRIPTION PATTERN: SIGHUP, then wait for a log line matching PATTERN after the mark.
hup() {
    local mark
    mark=$(lines)
    kill -HUP "$RELAY_PID"
    # shellcheck disable=SC2016
    wait_for "$1" 10 bash -c 'tail -n +"$(($2 + 1))" "$1" | grep -qE "$3"' _ "$RELAY_LOG" "$mark" "$2"
}

write_conf '"log-level": "info", "batch-size": 1000'
relay_start --config "$CONF"
insert a 30
wait_for "relay delivers" 30 unsent_of a
check_eq "no debug lines at log-level info" 0 "$(grep -c 'level=debug' "$RELAY_LOG")"

# --- 1. ---
write_conf '"log-level": "debug", "batch-size": 7, "retention": "1h",
            "topic-template": "renamed.{aggregate_type}"'
mark=$(lines)
hup "1: SIGHUP logs the reload" 'msg="configuration reloaded"'
check "1: it names the applied options (batch-size, log-level, retention)" \
    grep -qE 'msg="configuration reloaded" changed=batch-size,log-level,retention$' \
    <(since "$mark")
check "1: a warning names topic-template as needing a restart" \
    grep -qE 'level=warn msg="changed options need a restart; they keep their running values" options=topic-template$' \
    <(since "$mark")
check "1: the reload lines name options, never values" \
    bash -c "! tail -n +$((mark + 1)) '$RELAY_LOG' | grep -E 'reloaded|restart' |
    grep -qE 'renamed|outbox\.event|127\.0\.0\.1|debug\"|=7'"
check "1: relay still running" relay_running
insert b 20
wait_for "1: new rows delivered" 30 unsent_of b
check "1: debug lines now appear" grep -q 'level=debug' <(since "$mark")
check "1: claims take 7 rows at a time (batch-size applied)" \
    grep -q 'msg="claimed batch" rows=7 ' <(since "$mark")
check "1: no claim took more than 7" bash -c "! tail -n +$((mark + 1)) '$RELAY_LOG' |
    grep -oE 'msg=\"claimed batch\" rows=[0-9]+' | grep -vE 'rows=[1-7]$'"
check_eq "1: events still go to the old topic" 20 \
    "$(consume --topic outbox.event.b --to-end --timeout-ms 20000 | grep -c '')"
# Every b row is marked, so acknowledged: read up to the ends Kafka gives now (a topic nothing was
# ever produced to does not exist, and --to-end reads it as empty at once).
check_eq "1: nothing went to the new topic" 0 \
    "$(consume --topic renamed.b --to-end --timeout-ms 20000 | grep -c '')"

# --- 2. ---
mark=$(lines)
hup "2: an unchanged reload logs changed=none" 'msg="configuration reloaded" changed=none'
check "2: and still warns about the restart-only change" grep -q 'options=topic-template' \
    <(since "$mark")

# --- 3. ---
printf '{"log-level": "info", "batch-size": 5,\n' >"$CONF"
mark=$(lines)
hup "3: a malformed file is logged as an error" 'level=error msg="configuration reload failed'
check_eq "3: in one line" 1 "$(since "$mark" | grep -c 'reload')"
write_conf '"log-level": "info", "batch-size": 0'
hup "3: an out-of-range value is logged as an error" 'level=error msg="configuration reload failed.*batch-size'
check "3: relay keeps running" relay_running
mark=$(lines)
insert c 10
wait_for "3: rows still delivered" 30 unsent_of c
check "3: still at debug level, still 7 per claim (old values kept)" \
    grep -q 'msg="claimed batch" rows=7 ' <(since "$mark")
relay_stop
check_eq "3: relay exits 0" 0 $?

# --- 4. a flag beats the file on reload too ---
write_conf '"log-level": "debug"'
relay_start --config "$CONF" --log-level warn
insert d 10
wait_for "4: relay up and delivering" 30 unsent_of d
mark=$(lines)
# The reload must be seen to happen: its info line is below warn, but a restart-only change in
# the file brings a warning, which shows.
write_conf '"log-level": "debug", "topic-template": "other.{aggregate_type}"'
hup "4: the reload happened (its restart-only warning shows at warn level)" \
    'level=warn msg="changed options need a restart.*topic-template'
insert d2 10
wait_for "4: rows delivered after the reload" 30 unsent_of d2
check_eq "4: --log-level warn on the command line wins over the file's debug" 0 \
    "$(since "$mark" | grep -cE 'level=(debug|info)')"
relay_stop
check_eq "4: relay exits 0" 0 $?

# --- 5. growing the batch past the first allocation ---
write_conf '"log-level": "debug", "batch-size": 7'
relay_start --config "$CONF"
insert e 5
wait_for "5: relay delivers" 30 unsent_of e
write_conf '"log-level": "debug", "batch-size": 5000'
hup "5: batch-size reloaded" 'changed=batch-size$'
mark=$(lines)
insert f 3000
wait_for "5: 3,000 rows delivered" 60 unsent_of f
check "5: a claim took more than the first allocation (7 + 100 dead-letter rows)" \
    bash -c "tail -n +$((mark + 1)) '$RELAY_LOG' | grep -oE 'msg=\"claimed batch\" rows=[0-9]+' |
    awk -F= '\$3 > 107 { found = 1 } END { exit !found }'"

# --- 6. ---
relay_stop
check_eq "6: relay exits 0" 0 $?

# --- 7. a reload start-up would refuse is refused whole ---
write_conf '"log-level": "debug", "batch-size": 7, "delivery-timeout": 30000,
            "kafka": {"message.timeout.ms": "60000"}'
relay_start --config "$CONF"
insert g 5
wait_for "7: relay delivers" 30 unsent_of g
write_conf '"log-level": "debug", "batch-size": 5, "delivery-timeout": 90000,
            "kafka": {"message.timeout.ms": "60000"}'
mark=$(lines)
hup "7: a --delivery-timeout past message.timeout.ms is refused, naming both" \
    'level=error msg="configuration reload failed; keeping the running configuration" error=".*--delivery-timeout \(90000 ms\) is longer than the running producer.s .*message\.timeout\.ms=60000'
check_eq "7: in one line, nothing reloaded" 1 "$(since "$mark" | grep -c 'reload')"
insert h 30
wait_for "7: rows still delivered" 30 unsent_of h
check "7: still 7 per claim (the refused file's batch-size 5 not applied)" \
    grep -q 'msg="claimed batch" rows=7 ' <(since "$mark")
check "7: no claim took 5" bash -c "! tail -n +$((mark + 1)) '$RELAY_LOG' |
    grep -qE 'msg=\"claimed batch\" rows=5 '"
relay_stop
check_eq "7: relay exits 0" 0 $?

# --- 8. SIGHUP during start-up ---
URL_FILE=$T/url.pipe
mkfifo "$URL_FILE" || fail "8: mkfifo"
write_conf '"log-level": "debug"'
# The writer opens the pipe once the relay does (so the relay is loading its configuration),
# writes the URL and holds the pipe open, the relay still reading, until told to close it.
(
    exec 3>"$URL_FILE"
    printf '%s\n' "$DATABASE_URL" >&3
    touch "$T/url.opened"
    for _ in $(seq 300); do [ -e "$T/url.close" ] && exit 0; sleep 0.1; done
) &
_t_track $!
relay_start --config "$CONF" --database-url-file "$URL_FILE"
wait_for "8: the relay reads its --database-url-file pipe" 10 test -e "$T/url.opened"
kill -HUP "$RELAY_PID"
# A reload reads only regular files: the pipe's path holds the same URL in one by then.
printf '%s\n' "$DATABASE_URL" >"$T/url.file" && mv "$T/url.file" "$URL_FILE"
touch "$T/url.close" # the pipe's end: the relay starts
wait_for "8: once its loop runs it reloads (the SIGHUP kept, not lost)" 30 \
    grep -q 'msg="configuration reloaded" changed=none' "$RELAY_LOG"
check "8: the relay outlived a SIGHUP sent while it started" relay_running
insert i 10
wait_for "8: rows delivered" 30 unsent_of i
check_eq "8: no reload before the relay started" 0 \
    "$(sed -n '1,/msg="outbox-relay starting"/p' "$RELAY_LOG" | grep -c 'reload')"
relay_stop
check_eq "8: relay exits 0" 0 $?

# --- 9. SIGHUP during shutdown ---
write_conf '"log-level": "debug", "shutdown-timeout": 1000'
broker_cmd "down all"
relay_start --config "$CONF" --kafka reconnect.backoff.max.ms=500
insert j 20
wait_for "9: a batch is in flight" 30 grep -q 'msg="claimed batch"' "$RELAY_LOG"
write_conf '"log-level": "info", "shutdown-timeout": 1000' # what a reload would change
kill -TERM "$RELAY_PID"
hups=0
while kill -HUP "$RELAY_PID" 2>/dev/null; do
    hups=$((hups + 1))
    sleep 0.02
    [ "$hups" -lt 3000 ] || break # 60 s: the relay_stop below reports it
done
relay_stop
check_eq "9: the relay exits 0 with SIGHUPs all through its shutdown ($hups sent)" 0 $?
check "9: it got to its last line" grep -q 'msg="stopped"' "$RELAY_LOG"
check "9: the SIGHUPs during the drain were answered: reload ignored" grep -q \
    'level=warn msg="reload ignored: shutting down"' <(sed -n '/msg="shutting down"/,$p' "$RELAY_LOG")
check_eq "9: ... and none taken" 0 \
    "$(sed -n '/msg="shutting down"/,$p' "$RELAY_LOG" | grep -c 'configuration reload')"
broker_cmd "up all"
check_eq "9: the rows in flight stay unsent, to go again" 20 \
    "$(psql_q "SELECT count(*) FROM outbox WHERE aggregate_type = 'j' AND sent_at IS NULL")"

# --- 10. LIBEV_FLAGS does not change libev's signal mode ---
write_conf '"log-level": "debug"'
export LIBEV_FLAGS=2097152
relay_start --config "$CONF"
unset LIBEV_FLAGS
insert k 10
wait_for "10: relay delivers" 30 unsent_of k
# The SIGHUP watcher is in once rows are delivered (ops_start precedes the loop's first turn).
check_eq "10: no signalfd among the relay's descriptors with LIBEV_FLAGS=2097152" 0 \
    "$(ls -l "/proc/$RELAY_PID/fd" | grep -c 'anon_inode:\[signalfd\]')"
hup "10: a SIGHUP reloads" 'msg="configuration reloaded"'
relay_stop
check_eq "10: relay exits 0" 0 $?

# --- 11. one database switched to a databases list ---
write_conf '"log-level": "info"'
# Not in the relay's environment, which a reload reads again: beside the list it would be refused
# for naming both ("databases and database-url ... are both set"), not for the switch.
export -n DATABASE_URL
relay_start --config "$CONF"
export DATABASE_URL
insert m 10
wait_for "11: rows delivered" 30 unsent_of m
printf '{"brokers": "%s", "log-level": "debug", "databases": [{"name": "one", "database-url": "%s"}]}\n' \
    "$BROKERS" "$DATABASE_URL" >"$CONF.tmp" && mv "$CONF.tmp" "$CONF"
mark=$(lines)
hup "11: the switch is refused, naming it" \
    'level=error msg="configuration reload failed; keeping the running configuration" error="a databases list appeared'
check_eq "11: in one line (no \"configuration reloaded\" nor a restart warning)" 1 \
    "$(since "$mark" | grep -cE 'reload|restart')"
insert n 10
wait_for "11: rows still delivered" 30 unsent_of n
check_eq "11: log-level debug not applied" 0 "$(since "$mark" | grep -c 'level=debug')"
relay_stop
check_eq "11: relay exits 0" 0 $?
