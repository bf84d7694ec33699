#!/bin/bash
# Proves one relay process serving several databases (--databases), each isolated:
#  1. four databases (a, b, c, d) on one PostgreSQL, listed in the config file, one relay: each
#     database's rows go to Kafka at least once, first copies in order per aggregate; every
#     metric carries database="NAME", /readyz lists each database ready;
#  2. at once: b made unavailable to the relay (REVOKE CONNECT, its sessions terminated), c's
#     outbox locked (LOCK TABLE in a psql coprocess, rows inserted in that transaction), d's
#     grants revoked (REVOKE SELECT ON outbox): meanwhile rows of a are delivered while more keep
#     coming, /readyz answers 200 naming b and d not ready, outbox_database_ready says which, and
#     the log lines of the faults carry database=b and database=d; after the faults end, b, c and
#     d catch up: every row of every database delivered, first copies in order;
#  3. SIGHUP with d removed and e added (migrated with `migrate --database e`): e starts and
#     delivers, d drains (no session of the relay left in db_d), a keeps delivering throughout;
#     before that, an entry added by SIGHUP that start-up would refuse (a template that breaks
#     order) refuses the whole reload with one line naming it (a batch-size change beside it is
#     not applied either), and never starts; after it, an entry naming the
#     database a kept entry still serves (that entry's URL changed, which takes a restart) refuses
#     the whole reload likewise (a batch-size change beside it not applied): one database, one entry;
#  4. two relay processes with the same list share every database's lanes (each database's 64
#     lanes held by two backends, both processes own lanes of each), and deliver in order;
#  5. commands take a database name: `status --database a` works, without --database it is
#     refused naming the choices (exit 2); more databases than the cap are refused (exit 2);
#  6. an idle database costs one connection: with the list's defaults (no sessions given) and the
#     metrics endpoint on, a drained database is left with one backend of the relay (its claim
#     session; the upkeep connects only for each refresh), and its backlog gauges still refresh:
#     a later refresh, on a connection opened after that look, says "postgres connected" no more;
#  7. librdkafka's own lines, logged from its threads (--kafka debug=broker), name their database;
#     a database's retention works with its upkeep connecting on demand: a's sent rows are deleted
#     (b's, without retention, kept), and a is left with its claim session's connection alone;
#     a retention of 1s sweeps on the upkeep's 15 s tick, not every second;
#  8. --session-timeout (a process option) is every database's session timeout with a list.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 3

for db in a b c d e; do
    psql_q "CREATE DATABASE db_$db" -d postgres || fail "create db_$db"
done
for db in a b c d; do
    "$RELAY_BIN" migrate --database-url "postgresql://postgres@127.0.0.1:$PGPORT/db_$db" \
        2>>"$T/migrate.log" || fail "migrate db_$db"
done
psql_q "CREATE ROLE relay_login LOGIN IN ROLE outbox_relay" -d postgres || fail "create relay_login"
# The list names every database's URL: one from the environment beside it is refused.
unset DATABASE_URL
url() { echo "postgresql://relay_login@127.0.0.1:$PGPORT/db_$1"; }

CONF=$T/relay.json
write_conf() { # write_conf NAME...: the config file, atomically, listing these databases
    local list="" db
    for db in "$@"; do
        list="$list${list:+, }{\"name\": \"$db\", \"database-url\": \"$(url "$db")\"}"
    done
    # No sessions given: a database of a list has its min-sessions (1) by default (part 6).
    printf '{"brokers": "%s", "metrics-listen": "127.0.0.1:0",
"kafka": {"reconnect.backoff.max.ms": "500"}, "databases": [%s]}\n' "$BROKERS" "$list" \
        >"$CONF.tmp" && mv "$CONF.tmp" "$CONF"
}
insert() { # insert DB FROM TO: rows over 20 aggregates of type DB, seq grows with id
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            SELECT '$1', '$1-' || (g % 20), 'changed', jsonb_build_object('seq', g)
            FROM generate_series($2, $3) AS g ORDER BY g" -d "db_$1"
}
drained() { # drained DB: no unsent row left in db_DB
    [ "$(psql_q "SELECT count(*) FROM outbox WHERE sent_at IS NULL" -d "db_$1")" = 0 ]
}
delivered() { # delivered DB [WHAT]: check_delivered against db_DB
    PGDATABASE=db_$1 check_delivered "$1" "${2:-}"
}
ready_line() { # ready_line PATTERN: /readyz's body has a line matching PATTERN
    curl -s --max-time 5 "http://$METRICS/readyz" | grep -qE "$1"
}
lines() { grep -c '' "$RELAY_LOG"; }

# --- 1: four databases, one relay ----------------------------------------------------------------
write_conf a b c d
for db in a b c d; do insert "$db" 1 200; done
relay_start --config "$CONF"
metrics_wait
for db in a b c d; do
    wait_for "1: $db drained" 30 drained "$db"
done
for db in a b c d; do delivered "$db"; done
check "1: metrics carry the database label" \
    metric_at_least 'outbox_events_published_total{database="c",topic="outbox.event.c"}' 200
check "1: one gauge per database" metric_is 'outbox_lanes_owned{database="b"}' 64
wait_for "1: /readyz: 4 of 4 ready" 15 ready_line '^ready: 4 of 4 databases ready'
check "1: the log lines carry the database" grep -q 'msg="postgres connected".* database=d' "$RELAY_LOG"

# --- 6: an idle database costs one connection -------------------------------------------------------
backends() { # backends DB: the relay's backends in db_DB, by application_name
    psql_q "SELECT string_agg(application_name, ',' ORDER BY application_name) FROM pg_stat_activity
            WHERE datname = 'db_$1' AND usename = 'relay_login'" -d postgres
}
# The upkeep connects every 15 s for a few milliseconds: the claim session alone is what is seen
# between refreshes (before this change, a standing upkeep connection made it two, or three
# with the two sessions a database had by default).
idle_one() { [ "$(backends "$1")" = "outbox-relay session-0" ]; }
for db in a b; do
    wait_for "6: idle, $db holds one connection: its claim session's" 20 idle_one "$db"
done
# No upkeep connection of a was open at its idle look: a refresh finished after it came on a new
# one, so the gauges go on refreshing with the upkeep connecting on demand.
metric_above() { # metric_above SAMPLE VALUE: the sample exists and exceeds VALUE
    local v
    v=$(metric "$1") && awk -v v="$v" -v t="$2" 'BEGIN { exit !(v + 0 > t + 0) }'
}
refreshed=$(metric 'outbox_backlog_refresh_timestamp_seconds{database="a"}')
check "6: a's backlog gauges have been refreshed" [ -n "$refreshed" ]
wait_for "6: ... and are refreshed again, the upkeep reconnecting for it (every 15 s)" 45 \
    metric_above 'outbox_backlog_refresh_timestamp_seconds{database="a"}' "${refreshed:-0}"

# --- 2: one unavailable, one locked, one revoked; a goes on --------------------------------------
psql_q "REVOKE CONNECT ON DATABASE db_b FROM PUBLIC" -d postgres || fail "2: revoke connect"
psql_q "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
        WHERE datname = 'db_b' AND usename = 'relay_login'" -d postgres >/dev/null
insert b 201 400
coproc LOCKC { psql -XAtq -v ON_ERROR_STOP=1 -d db_c 2>&1; }
echo "BEGIN; LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE; SELECT 'locked';" >&"${LOCKC[1]}"
read -r -t 10 said <&"${LOCKC[0]}"
check_eq "2: the coprocess holds c's outbox locked" locked "$said"
echo "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
      SELECT 'c', 'c-' || (g % 20), 'changed', jsonb_build_object('seq', g)
      FROM generate_series(201, 400) AS g ORDER BY g;" >&"${LOCKC[1]}"
psql_q "REVOKE SELECT ON outbox FROM outbox_relay" -d db_d || fail "2: revoke select"
insert d 201 400
wait_for "2: d's fault is logged with its name" 30 \
    grep -qE 'level=error msg="the relay cannot work with this database.* database=d' "$RELAY_LOG"
wait_for "2: b's lost connection is logged with its name" 30 \
    grep -qE 'msg="postgres (connection lost|unreachable)".* database=b' "$RELAY_LOG"
for round in 1 2 3; do
    insert a $((200 + round * 100 - 99)) $((200 + round * 100))
    wait_for "2: a keeps delivering meanwhile (round $round)" 20 drained a
done
check "2: /readyz stays 200" [ "$(http_code /readyz)" = 200 ]
check "2: ... naming b not ready" ready_line '^b not ready: postgres unreachable'
check "2: ... and d's setup fault" ready_line '^d not ready:.* claims fail until the setup is fixed'
check "2: outbox_database_ready says a is" metric_is 'outbox_database_ready{database="a"}' 1
check "2: ... and d is not" metric_is 'outbox_database_ready{database="d"}' 0
check_eq "2: b's rows wait" 200 "$(psql_q "SELECT count(*) FROM outbox WHERE sent_at IS NULL" -d db_b)"
check_eq "2: d's rows wait" 200 "$(psql_q "SELECT count(*) FROM outbox WHERE sent_at IS NULL" -d db_d)"
# The faults end.
psql_q "GRANT CONNECT ON DATABASE db_b TO PUBLIC" -d postgres || fail "2: grant connect"
echo "COMMIT; SELECT 'done';" >&"${LOCKC[1]}"
read -r -t 10 said <&"${LOCKC[0]}"
check_eq "2: c's locking transaction commits its rows" "done" "$said"
echo '\q' >&"${LOCKC[1]}"
psql_q "GRANT SELECT ON outbox TO outbox_relay" -d db_d || fail "2: grant select"
for db in b c d; do
    wait_for "2: $db catches up" 60 drained "$db"
done
for db in a b c d; do delivered "$db" "every row delivered after the faults"; done
wait_for "2: /readyz: 4 of 4 ready again" 30 ready_line '^ready: 4 of 4 databases ready'

# --- 3: SIGHUP removes d and adds e ---------------------------------------------------------------
# First an entry start-up would refuse ({event_type} without --order-scope topic): a reload
# refuses it too, and the running databases go on.
jq --arg url "$(url f)" '.databases += [{"name": "f", "database-url": $url,
                                         "topic-template": "f.{event_type}"}] |
                          ."batch-size" = 3' "$CONF" \
    >"$CONF.tmp" && mv "$CONF.tmp" "$CONF"
mark=$(lines)
kill -HUP "$RELAY_PID"
wait_for "3: a reload with an entry start-up refuses: refused whole, one line naming it" 15 \
    bash -c "tail -n +$((mark + 1)) '$RELAY_LOG' | grep 'configuration reload failed; keeping the running configuration' | grep -q 'database f: --topic-template'"
check "3: ... and f never started" bash -c "! grep -q 'database=f' '$RELAY_LOG'"
check "3: ... and nothing of that reload applied (no 'configuration reloaded')" \
    bash -c "! tail -n +$((mark + 1)) '$RELAY_LOG' | grep -q 'configuration reloaded'"
"$RELAY_BIN" migrate --config "$CONF" --database e 2>/dev/null # not listed yet: refused
check "3: migrate --database names an unknown database: exit 2" [ $? = 2 ]
write_conf a b c e
sed 's/relay_login@/postgres@/g' "$CONF" >"$CONF.owner" # migrate runs as the owner
"$RELAY_BIN" migrate --config "$CONF.owner" --database e 2>>"$T/migrate.log"
check "3: migrate --database e" [ $? = 0 ]
insert e 1 200
mark=$(lines)
kill -HUP "$RELAY_PID"
wait_for "3: e is added" 15 bash -c "tail -n +$((mark + 1)) '$RELAY_LOG' | grep -q 'msg=\"database added\" database=e'"
insert a 501 600
wait_for "3: d is drained and removed" 30 \
    bash -c "tail -n +$((mark + 1)) '$RELAY_LOG' | grep -q 'msg=\"database removed\" database=d'"
wait_for "3: e delivers" 30 drained e
wait_for "3: a keeps delivering" 30 drained a
check_eq "3: no session of the relay is left in db_d" 0 \
    "$(psql_q "SELECT count(*) FROM pg_stat_activity WHERE datname = 'db_d' AND usename = 'relay_login'" -d postgres)"
check "3: d's series left /metrics" bash -c "! curl -s 'http://$METRICS/metrics' | grep -q 'database=\"d\"'"
wait_for "3: /readyz: 4 of 4 ready" 15 ready_line '^ready: 4 of 4 databases ready'
# a's URL changes (restart-only: a goes on serving db_a) and a new entry g names db_a: the list
# itself has each database once, but g would be a second entry serving db_a, splitting its lanes.
jq --arg url "$(url d)" --arg a "$(url a)" \
    '(.databases[] | select(.name == "a") | ."database-url") = $url |
     .databases += [{"name": "g", "database-url": $a}] | ."batch-size" = 3' "$CONF" \
    >"$CONF.tmp" && mv "$CONF.tmp" "$CONF"
mark=$(lines)
kill -HUP "$RELAY_PID"
wait_for "3: an entry naming the database a kept entry still serves: the reload refused whole, one line" 15 \
    bash -c "tail -n +$((mark + 1)) '$RELAY_LOG' | grep 'configuration reload failed; keeping the running configuration' |
             grep -q 'database g: names the same database .* as database a'"
check "3: ... and g never started" bash -c "! grep -q 'database=g' '$RELAY_LOG'"
# Nothing of it applied: the kept entries keep their options (batch-size 3 would be taken over
# before the refusal on the old code, which said 'configuration reloaded').
check "3: ... and nothing of that reload applied (no 'configuration reloaded')" \
    bash -c "! tail -n +$((mark + 1)) '$RELAY_LOG' | grep -q 'configuration reloaded'"
check_eq "3: ... db_a has one relay session" 1 \
    "$(psql_q "SELECT count(*) FROM pg_stat_activity WHERE datname = 'db_a'
               AND application_name LIKE 'outbox-relay session-%'" -d postgres)"
write_conf a b c e
delivered e
delivered a "every row of a delivered through the reload"
FIRST_PID=$RELAY_PID FIRST_METRICS=$METRICS FIRST_LOG=$RELAY_LOG

# --- 4: two processes share every database's lanes ------------------------------------------------
relay_start --config "$CONF"
metrics_wait
lanes_split() { # lanes_split DB: two backends hold db_DB's 64 lanes, some each
    [ "$(psql_q "SELECT count(DISTINCT l.pid) || ' ' || count(DISTINCT l.objid) FROM pg_locks l
                 JOIN pg_stat_activity a ON a.pid = l.pid
                 WHERE $LANE_LOCK AND a.datname = 'db_$1'" -d postgres)" = "2 64" ]
}
for db in a b c e; do
    wait_for "4: $db's lanes are split between the two processes" 30 lanes_split "$db"
    check "4: the first process owns lanes of $db" bash -c \
        "curl -s 'http://$FIRST_METRICS/metrics' | grep -qE '^outbox_lanes_owned\{database=\"$db\"\} [1-9]'"
    check "4: the second process owns lanes of $db" \
        metric_at_least "outbox_lanes_owned{database=\"$db\"}" 1
done
for db in a b c e; do insert "$db" 1001 1300; done
for db in a b c e; do wait_for "4: $db drained by the two" 30 drained "$db"; done
for db in a b c e; do delivered "$db" "every row delivered by two processes"; done
relay_stop
check_eq "4: the second relay exits 0" 0 "$?"
RELAY_PID=$FIRST_PID
relay_stop
check_eq "4: the first relay exits 0" 0 "$?"
# Part 6 again, over the first relay's minute and more of refreshes: the upkeep of a connected
# for each one (part 6 saw one after its connection had closed), and said so once.
check_eq "6: a's upkeep logged \"postgres connected\" once, not at every refresh" 1 \
    "$(grep -c 'msg="postgres connected" database=a conn=upkeep' "$FIRST_LOG")"

# --- 5: commands take a database name; the cap ------------------------------------------------------
sed 's/relay_login@/postgres@/g' "$CONF" >"$CONF.owner"
"$RELAY_BIN" status --config "$CONF.owner" --database a >"$T/status.out" 2>&1
check "5: status --database a: exit 0" [ $? = 0 ]
"$RELAY_BIN" status --config "$CONF.owner" >"$T/status2.out" 2>&1
check "5: status without --database: exit 2" [ $? = 2 ]
check "5: ... naming the choices" grep -q 'pass --database NAME, one of a, b, c, e' "$T/status2.out"
list=$(for i in $(seq 1 101); do printf '{"name": "t%d", "database-url": "%s"},' "$i" "$(url a)"; done)
printf '{"brokers": "%s", "databases": [%s]}\n' "$BROKERS" "${list%,}" >"$T/many.json"
"$RELAY_BIN" run --config "$T/many.json" >"$T/many.out" 2>&1
check "5: 101 databases: exit 2" [ $? = 2 ]
check "5: ... saying the cap" grep -q '101 entries, at most 100 in one process' "$T/many.out"

# --- 7: librdkafka's own lines name their database --------------------------------------------------
# Its broker threads log (debug=broker) through the relay's log callback, outside the loop: the
# line must still name the database whose producer it is.
printf '{"brokers": "%s", "log-level": "debug", "kafka": {"debug": "broker"},
"databases": [{"name": "a", "database-url": "%s", "retention": "1s"}, {"name": "b", "database-url": "%s"}]}\n' \
    "$BROKERS" "$(url a)" "$(url b)" >"$T/kafka-log.json"
started=$(date +%s)
relay_start --config "$T/kafka-log.json"
rdk_lines() { grep 'msg="librdkafka"' "$RELAY_LOG"; }
# A broker thread's own line ([thrd:HOST:PORT/...]), as opposed to one of the loop's calls.
wait_for "7: librdkafka logs from its broker threads" 15 \
    bash -c "grep -q 'msg=\"librdkafka\".*text=\"\\[thrd:127' '$RELAY_LOG'"
rows() { psql_q "SELECT count(*) FROM outbox" -d "db_$1"; }
emptied() { [ "$(rows "$1")" = 0 ]; }
wait_for "7: a's retention (1s) deletes its sent rows" 30 emptied a
check "7: ... b's, without retention, stay" [ "$(rows b)" -gt 0 ]
wait_for "7: ... and a, its sweep done, holds its claim session's connection alone" 20 idle_one a
# The upkeep sweeps at start, then on each 15 s tick (the first within the first 15 s), however
# short the retention: by any moment t s after the start, at most t/15 + 2 sweeps. A sweep every
# second, as a retention timer of its own made (1s / 4, at least 1 s), exceeds that within
# seconds; a loaded machine only makes fewer. (It also let a's idle look above wait for a gap
# between connections opened every second.)
sweeps() { grep -c 'msg="retention sweep done" database=a ' "$RELAY_LOG"; }
swept_thrice() { [ "$(sweeps)" -ge 3 ]; }
wait_for "7: a's retention sweeps again on the upkeep's tick" 40 swept_thrice
n=$(sweeps) elapsed=$(($(date +%s) - started))
check "7: ... at most every 15 s, not every second ($n sweeps in ${elapsed}s)" \
    [ "$n" -le $((elapsed / 15 + 2)) ]
relay_stop
check_eq "7: the relay exits 0 (under ASan: nothing leaked by the upkeep's connections)" 0 "$?"
check "7: ... lines naming database a" bash -c "grep -q 'msg=\"librdkafka\" database=a ' '$RELAY_LOG'"
check "7: ... and b" bash -c "grep -q 'msg=\"librdkafka\" database=b ' '$RELAY_LOG'"
check_eq "7: no librdkafka line without its database" 0 \
    "$(rdk_lines | grep -vc '^[^ ]* level=[a-z]* msg="librdkafka" database=[ab] ')"

# --- 8: --session-timeout, a process option, holds for every database of a list ------------------
# Each connection's setup sets idle_in_transaction_session_timeout from it: the server's log of
# every statement shows the value the relay sent.
psql_q "ALTER SYSTEM SET log_statement = 'all'" -d postgres && psql_q "SELECT pg_reload_conf()" \
    -d postgres >/dev/null || fail "8: log every statement"
printf '{"brokers": "%s", "session-timeout": 4000,
"databases": [{"name": "a", "database-url": "%s"}, {"name": "b", "database-url": "%s"}]}\n' \
    "$BROKERS" "$(url a)" "$(url b)" >"$T/timeout.json"
relay_start --config "$T/timeout.json"
set_4000() { [ "$(grep -c "idle_in_transaction_session_timeout', '4000'" "$T/pg.log")" -ge 2 ]; }
wait_for "8: both databases' sessions set up with the 4 s session timeout" 20 set_4000
check "8: ... none with the default 15 s" lacks "$T/pg.log" "idle_in_transaction_session_timeout', '15000'"
relay_stop
check_eq "8: the relay exits 0" 0 "$?"
psql_q "ALTER SYSTEM RESET log_statement" -d postgres && psql_q "SELECT pg_reload_conf()" -d postgres >/dev/null

