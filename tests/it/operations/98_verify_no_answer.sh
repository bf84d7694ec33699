#!/bin/bash
# Proves `outbox-relay verify` does not wait for ever on a server that stops answering (stopped,
# paused, or a proxy that lost it: the network still acknowledges every packet, so keepalives
# cannot tell it from a long statement):
#  1. the answer to the read of the window's rows withheld (a proxy holds it for 10 minutes),
#     verify gives up after its bound (--statement-timeout, 30 s by default, plus a millisecond a
#     row of --max-rows: 3 s with --statement-timeout 2s --max-rows 1000), exit 1, one line
#     saying PostgreSQL did not answer, and no verdict;
#  2. run directly (no proxy), the same check is ok.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"

psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'order', 'o-' || (g % 3), 'Updated', '{}' FROM generate_series(1, 30) g"
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS"
wait_for "every row sent" 60 no_unsent_rows
relay_stop

# --- 1. ---
# Only the answer to the first statement naming "make_interval" (the read of the window's rows).
holding_proxy proxy "make_interval"
# Before: verify waited for the held answer (ten minutes here, for ever on a stopped server):
# killed here.
timeout -k 10 150 "$RELAY_BIN" verify \
    --database-url "postgresql://postgres@127.0.0.1:$PROXY_PORT/outbox" --brokers "$BROKERS" \
    --since 1h --from-beginning --max-rows 1000 --statement-timeout 2s >"$T/held.out" 2>"$T/held.err"
check_eq "1: a server that stops answering: exit 1" 1 $?
check "1: ... named in one line" grep -q 'PostgreSQL did not answer within 3 s' "$T/held.err"
check_eq "1: ... and no verdict on stdout" "" "$(cat "$T/held.out")"
kill "$PROXY_PID" 2>/dev/null
wait "$PROXY_PID" 2>/dev/null

# --- 2. ---
"$RELAY_BIN" verify --database-url "$DATABASE_URL" --brokers "$BROKERS" --since 1h \
    --from-beginning --max-rows 1000 >"$T/direct.out" 2>"$T/direct.err"
check_eq "2: directly: exit 0" 0 $?
check "2: ... every row found" grep -q '^verify: ok: window=3600s rows=30 messages=30 missing=0' \
    "$T/direct.out"
