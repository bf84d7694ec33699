#!/bin/bash
# Proves what happens when an entry's identity probe (48_multi_db_same_server.sh) gets no answer:
# b reaches a's database through a proxy on another port (so the start-up check of the URLs
# cannot see it) that holds the answers to the first three identity queries. Each attempt is
# given up after --session-timeout and asked again on a new connection; b runs meanwhile, as
# every entry does until its answer comes. That went unsaid: the only lines were the
# connection's own ("postgres connection lost conn=identity", twice, then nothing), which read as
# an outage of a database that works, and nothing said the twin check was not done.
#  1. one line, once for the three held attempts, says b's server is not known yet and twins are
#     not detected for it until it answers; when the fourth answers, a line says so, b is caught
#     as a's twin and stops, and every row of a's table is delivered.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"
psql_q "CREATE TABLE other_outbox (id uuid NOT NULL PRIMARY KEY DEFAULT gen_random_uuid(),
            aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL,
            payload jsonb)" || fail "create other_outbox"
relay_migrate --layout debezium --table other_outbox 2>>"$T/migrate.log" ||
    fail "migrate adopts other_outbox"
[ -x "$BIN/delay-proxy" ] || fail "bin/delay-proxy built (make tools)"
PROXY_PORT=$(free_port) || fail "a free port for delay-proxy"
# Holds (ten minutes) the answers to the first three statements naming the probe's function.
"$BIN/delay-proxy" --listen "$PROXY_PORT" --to "$PGPORT" --delay-us 600000000 \
    --only-after pg_postmaster_start_time --times 3 >"$T/proxy.out" 2>&1 &
PROXY_PID=$!
_t_track "$PROXY_PID"
_poll 10 grep -q listening "$T/proxy.out" || fail "delay-proxy listens"

printf '{"brokers": "%s", "session-timeout": 2000, "kafka": {"reconnect.backoff.max.ms": "500"},
"databases": [
  {"name": "a", "database-url": "postgresql://postgres@127.0.0.1:%s/outbox"},
  {"name": "b", "database-url": "postgresql://postgres@127.0.0.1:%s/outbox", "layout": "debezium",
   "table": "other_outbox"}]}\n' "$BROKERS" "$PGPORT" "$PROXY_PORT" >"$T/relay.json"
insert_rows a 1 300 30
unset DATABASE_URL # the list names every URL
relay_start --config "$T/relay.json"

# --- 1. ---
said_unanswered() {
    grep -c 'msg="cannot tell yet which server this database.s URL reaches.* database=b' "$RELAY_LOG"
}
caught() {
    grep -q 'msg="two databases of the list reach the same database.* database=a stopping=b' \
        "$RELAY_LOG"
}
wait_for "1: b's probe answers at its fourth attempt and b is caught as a's twin" 60 caught
check_eq "1: ... the held attempts said once, naming b" 1 "$(said_unanswered)"
check "1: ... that the answer came, said" grep -q \
    'msg="the identity probe answered: this database.s URL is checked against the other entries now" database=b' \
    "$RELAY_LOG"
check_eq "1: ... nothing said of a's probe" 0 \
    "$(grep -c 'msg="cannot tell yet which server.* database=a' "$RELAY_LOG")"
wait_for "1: b drained and gone" 15 grep -q 'msg="database removed" database=b' "$RELAY_LOG"
wait_for "1: every row of a's table delivered" 30 none_unsent_of a
check_delivered a
relay_stop
check_eq "1: the relay exits 0" 0 "$?"
