#!/bin/bash
# Proves that the line each SIGHUP of a --databases relay ends with counts what it says:
# `databases reloaded ... running=N` counted every entry not dropped by that very reload, so an
# entry an earlier reload dropped that was still draining (its batch waiting for Kafka's
# acknowledgements) was counted running. Now running= counts the entries serving their database
# and draining= those dropped that have not left yet.
#  1. a and b run; the brokers answer 30 s late (rtt: more than the two reloads take on a loaded
#     machine, so b is still draining at the second) and b has a batch in flight: a SIGHUP
#     drops b (running=1 draining=1), a second SIGHUP, b still draining, says running=1
#     draining=1 again (it said running=2); once the brokers answer b leaves, every row of both
#     delivered, and a third SIGHUP says running=1 draining=0.
#  2. a SIGHUP once a shutdown has begun (a's batch held by 30 s late acknowledgements, the list
#     rewritten to add b) is refused in one line, "reload ignored: shutting down": no
#     "configuration reloaded" (it was logged while databases_reload applied nothing), no
#     "databases reloaded", no b added.
#  3. a list rewritten into one database-url is refused first and alone: one error line, the
#     running list kept (it said "configuration reloaded" and then that the list was kept), and
#     a still delivers.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1

for db in a b; do
    psql_q "CREATE DATABASE db_$db" -d postgres || fail "create db_$db"
    "$RELAY_BIN" migrate --database-url "postgresql://postgres@127.0.0.1:$PGPORT/db_$db" \
        2>>"$T/migrate.log" || fail "migrate db_$db"
done
unset DATABASE_URL # the list names every URL
url() { echo "postgresql://postgres@127.0.0.1:$PGPORT/db_$1"; }
CONF=$T/relay.json
write_conf() { # write_conf NAME...: the config file, atomically, listing these databases
    local list="" db
    for db in "$@"; do
        list="$list${list:+, }{\"name\": \"$db\", \"database-url\": \"$(url "$db")\"}"
    done
    # A batch waits for the late acknowledgements, and a drain for that batch.
    printf '{"brokers": "%s", "delivery-timeout": 120000, "shutdown-timeout": %s,
"kafka": {"reconnect.backoff.max.ms": "500"}, "databases": [%s]}\n' "$BROKERS" \
        "${SHUTDOWN_MS:-120000}" "$list" >"$CONF.tmp" && mv "$CONF.tmp" "$CONF"
}
insert() { # insert DB FROM TO
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            SELECT '$1', '$1-' || (g % 5), 'changed', jsonb_build_object('seq', g)
            FROM generate_series($2, $3) AS g ORDER BY g" -d "db_$1"
}
drained() { [ "$(psql_q "SELECT count(*) FROM outbox WHERE sent_at IS NULL" -d "db_$1")" = 0 ]; }
# claimed DB: some of DB's unsent rows are locked (a batch in flight).
claimed() {
    [ "$(psql_q "SELECT count(*) FROM outbox WHERE sent_at IS NULL" -d "db_$1")" -gt \
        "$(psql_q "SELECT count(*) FROM (SELECT 1 FROM outbox WHERE sent_at IS NULL
                                          FOR UPDATE SKIP LOCKED) s" -d "db_$1")" ]
}
reloads() { grep -c 'msg="databases reloaded"' "$RELAY_LOG"; }
reloaded() { [ "$(reloads)" -ge "$1" ]; }
reload_line() { grep 'msg="databases reloaded"' "$RELAY_LOG" | sed -n "$1p"; }
b_gone() { grep -q 'msg="database removed" database=b' "$RELAY_LOG"; }

# --- 1. ---
write_conf a b
insert a 1 50
insert b 1 50
relay_start --config "$CONF"
wait_for "1: a delivers" 30 drained a
wait_for "1: b delivers" 30 drained b
broker_cmd "rtt all 30000"
insert b 51 60
wait_for "1: b has a batch in flight" 15 claimed b
write_conf a
kill -HUP "$RELAY_PID"
wait_for "1: the first reload is done" 15 reloaded 1
check "1: ... it drops b: running=1 draining=1" grep -q \
    'msg="databases reloaded" added=0 removed=1 running=1 draining=1' <(reload_line 1)
check "1: ... b still drains" bash -c "! grep -q 'msg=\"database removed\" database=b' '$RELAY_LOG'"
kill -HUP "$RELAY_PID"
wait_for "1: the second reload is done" 15 reloaded 2
# The count is only meaningful while b drains: b must not have left before that line.
check "1: ... b still draining then" bash -c "! grep -q 'msg=\"database removed\" database=b' '$RELAY_LOG'"
check "1: ... b counted draining, not running" grep -q \
    'msg="databases reloaded" added=0 removed=0 running=1 draining=1' <(reload_line 2)
broker_cmd "rtt all 0"
wait_for "1: b's batch acknowledged, b leaves" 75 b_gone
wait_for "1: b's rows all delivered" 30 drained b
insert a 51 60
wait_for "1: a keeps delivering" 30 drained a
kill -HUP "$RELAY_PID"
wait_for "1: the third reload is done" 15 reloaded 3
check "1: ... b gone: running=1 draining=0" grep -q \
    'msg="databases reloaded" added=0 removed=0 running=1 draining=0' <(reload_line 3)
relay_stop
check_eq "1: the relay exits 0" 0 "$?"

# --- 2. SIGHUP during shutdown ---
SHUTDOWN_MS=3000 write_conf a
relay_start --config "$CONF"
wait_for "2: a delivers" 30 drained a
broker_cmd "rtt all 30000"
insert a 61 70
wait_for "2: a has a batch in flight" 15 claimed a
kill -TERM "$RELAY_PID"
wait_for "2: the shutdown begins" 15 grep -q 'msg="shutting down"' "$RELAY_LOG"
SHUTDOWN_MS=3000 write_conf a b
kill -HUP "$RELAY_PID"
wait_for "2: the SIGHUP is answered" 15 grep -q 'msg="reload ignored: shutting down"' "$RELAY_LOG"
after_stop() { sed -n '/msg="shutting down"/,$p' "$RELAY_LOG"; }
check_eq "2: ... in one line" 1 "$(after_stop | grep -c 'reload ignored: shutting down')"
check_eq "2: ... nothing said reloaded, nothing added" 0 \
    "$(after_stop | grep -v 'reload ignored' | grep -cE 'reload|database added')"
wait_for "2: the relay ends its shutdown by itself" 30 bash -c "! kill -0 $RELAY_PID 2>/dev/null"
relay_stop
check "2: b was never added" bash -c "! grep -q 'database=b' '$RELAY_LOG'"
broker_cmd "rtt all 0"

# --- 3. a list rewritten into one database-url ---
write_conf a
relay_start --config "$CONF"
wait_for "3: a delivers (the rows part 2 left)" 30 drained a
printf '{"brokers": "%s", "database-url": "%s"}\n' "$BROKERS" "$(url a)" >"$CONF.tmp" &&
    mv "$CONF.tmp" "$CONF"
mark=$(grep -c '' "$RELAY_LOG")
kill -HUP "$RELAY_PID"
wait_for "3: the reload is refused" 15 grep -q \
    'level=error msg="configuration reload failed; keeping the running configuration" error="the databases list is gone' \
    "$RELAY_LOG"
check_eq "3: ... in one line (no \"configuration reloaded\" before it)" 1 \
    "$(tail -n +$((mark + 1)) "$RELAY_LOG" | grep -cE 'reload|restart|kept')"
insert a 71 80
wait_for "3: a still delivers" 30 drained a
relay_stop
check_eq "3: the relay exits 0" 0 "$?"
