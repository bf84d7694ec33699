#!/bin/bash
# Proves what happens when an entry's identity probe (48_multi_db_same_server.sh) is refused: an
# error, not a lost answer (48_multi_db_probe_silent.sh). b reaches a's database through a proxy
# on another port (so the start-up check of the URLs cannot see it), as a login that may not run
# pg_postmaster_start_time(), which the server revoked from PUBLIC. The refusal was logged once
# and never asked again: the connection was fine, so nothing else ever did, and b ran beside a
# for the process's life, unchecked, after the function was granted back.
#  1. b's refusal is said once, naming b, however often it is asked again; it is asked again on
#     a backoff, not in a loop (the server's log has its fourth refusal at least 3 s after the
#     first: 0.5 + 1 + 2 s at the least); once the function is granted back, the answer is said,
#     b is caught as a's twin and stops, and every row of a's table is delivered.
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
psql_q "CREATE ROLE relay_login LOGIN IN ROLE outbox_relay" >/dev/null &&
    psql_q "REVOKE EXECUTE ON FUNCTION pg_catalog.pg_postmaster_start_time() FROM PUBLIC" \
        >/dev/null || fail "create the relay's login, revoke pg_postmaster_start_time"
[ -x "$BIN/delay-proxy" ] || fail "bin/delay-proxy built (make tools)"
PROXY_PORT=$(free_port) || fail "a free port for delay-proxy"
"$BIN/delay-proxy" --listen "$PROXY_PORT" --to "$PGPORT" --delay-us 0 >"$T/proxy.out" 2>&1 &
PROXY_PID=$!
_t_track "$PROXY_PID"
_poll 10 grep -q listening "$T/proxy.out" || fail "delay-proxy listens"

printf '{"brokers": "%s", "kafka": {"reconnect.backoff.max.ms": "500"},
"databases": [
  {"name": "a", "database-url": "postgresql://postgres@127.0.0.1:%s/outbox"},
  {"name": "b", "database-url": "postgresql://relay_login@127.0.0.1:%s/outbox",
   "layout": "debezium", "table": "other_outbox"}]}\n' "$BROKERS" "$PGPORT" "$PROXY_PORT" \
    >"$T/relay.json"
insert_rows a 1 300 30
unset DATABASE_URL # the list names every URL
relay_start --config "$T/relay.json"

# --- 1. ---
said_refused() {
    grep -c 'msg="cannot tell yet which server this database.s URL reaches (its identity probe failed.* database=b .*permission denied' \
        "$RELAY_LOG"
}
refusals() { grep -c 'ERROR:  permission denied for function pg_postmaster_start_time' "$T/pg.log"; }
caught() {
    grep -q 'msg="two databases of the list reach the same database.* database=a stopping=b' \
        "$RELAY_LOG"
}
refused_4_times() { [ "$(refusals)" -ge 4 ]; }
wait_for "1: b's probe is refused, and asked again, four times" 60 refused_4_times
check_eq "1: ... the refusal said once, naming b and the error" 1 "$(said_refused)"
# The server's clock on each refusal, in seconds (log_line_prefix '%m': date time.ms zone).
refusal_span_ok() {
    grep 'ERROR:  permission denied for function pg_postmaster_start_time' "$T/pg.log" |
        head -4 | while read -r day time _; do date -d "$day $time" +%s.%N; done |
        awk 'NR == 1 { first = $1 } NR == 4 { exit !($1 - first >= 3) }'
}
check "1: ... on a backoff: the fourth refusal 3 s or more after the first" refusal_span_ok
check "1: ... b not caught while refused" sh -c "! grep -q 'reach the same database' '$RELAY_LOG'"
psql_q "GRANT EXECUTE ON FUNCTION pg_catalog.pg_postmaster_start_time() TO PUBLIC" >/dev/null ||
    fail "grant pg_postmaster_start_time back"
wait_for "1: granted back, b's probe answers and b is caught as a's twin" 90 caught
check "1: ... that the answer came, said" grep -q \
    'msg="the identity probe answered: this database.s URL is checked against the other entries now" database=b' \
    "$RELAY_LOG"
check_eq "1: ... the refusal still said once" 1 "$(said_refused)"
check_eq "1: ... nothing said of a's probe" 0 \
    "$(grep -c 'msg="cannot tell .*server.* database=a' "$RELAY_LOG")"
wait_for "1: b drained and gone" 15 grep -q 'msg="database removed" database=b' "$RELAY_LOG"
wait_for "1: every row of a's table delivered" 30 none_unsent_of a
check_delivered a
relay_stop
check_eq "1: the relay exits 0" 0 "$?"
