#!/bin/bash
# Proves `outbox-relay replay` does not wait for ever to *send* a statement to a server that
# stopped reading: a statement is sent whole before its answer is awaited, and a large one (a
# --missing list's ids go whole with the summary's read of the selection; a batch's update names
# up to 100,000 ids) does not fit the sockets' buffers. Sent on a blocking connection, libpq waited to write it
# for as long as the server did not read (up to the connection's tcp_user_timeout, when the
# kernel gives up on a window closed that long), before any answer bound began.
#  1. replay's backend stopped (SIGSTOP) once it has answered the read of the start, the summary's
#     read of a --missing list of some 20 MB is not taken: replay gives up after the summary's
#     bound, ten times --statement-timeout (30 s here: the read of the start is held 2 s), exit
#     1, one line saying PostgreSQL did not read the statement; nothing was replayed;
#  2. the backend let go again, the same replay directly (no proxy) goes through.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
relay_migrate 2>"$T/migrate.log" || fail "migrate"

psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'order', 'o-' || (g % 3), 'Updated', '{}' FROM generate_series(1, 30) g"
psql_q "UPDATE outbox SET sent_at = now()"
# verify's --json list: the 30 rows, then 100,000 entries of long event ids no row has (the
# statement that carries them is then some 20 MB, far more than the buffers on the way hold).
{
    printf '{"result":"failed","missing_events":['
    psql_q "SELECT string_agg(format('{\"id\":%s,\"event_id\":\"%s\",\"topic\":\"t\"}', id, event_id), ',')
            FROM outbox"
    pad=$(printf 'x%.0s' $(seq 1 200))
    seq 1000001 1100000 | sed "s/.*/,{\"id\":&,\"event_id\":\"&-$pad\",\"topic\":\"t\"}/" | tr -d '\n'
    printf ']}\n'
} >"$T/missing.json"
check "the list is some 20 MB" test "$(stat -c %s "$T/missing.json")" -gt 20000000

# --- 1. ---
# The answer to the read of the start (the first statement naming "1 microsecond") is held 2 s
# by the proxy; meanwhile replay's backend, which sent it, is stopped.
PROXY_PORT=$(free_port) || fail "a free port for delay-proxy"
"$BIN/delay-proxy" --listen "$PROXY_PORT" --to "$PGPORT" --delay-us 2000000 \
    --only-after "1 microsecond" --times 1 >"$T/proxy.out" 2>&1 &
PROXY_PID=$!
_t_track "$PROXY_PID"
_poll 10 grep -q listening "$T/proxy.out" || fail "delay-proxy listens"
# The URL's own tcp_user_timeout (10 minutes, for a network that drops for minutes) stands in
# for a kernel that keeps a window closed as long: the default of 30 s (db_connect) ended the
# send then, unrelated to --statement-timeout. Before: replay waited to send the summary's
# statement (timeout's 124 here).
timeout 120 "$RELAY_BIN" replay \
    --database-url "postgresql://postgres@127.0.0.1:$PROXY_PORT/outbox?tcp_user_timeout=600000" \
    --missing "$T/missing.json" --yes --statement-timeout 3s >"$T/unread.out" 2>"$T/unread.err" &
replay_pid=$!
_t_track "$replay_pid"
backend() {
    psql_q "SELECT pid FROM pg_stat_activity WHERE application_name = 'outbox-relay'
            AND query LIKE '%1 microsecond%' AND state = 'idle'"
}
answered() { [ -n "$(backend)" ]; }
# Before its first statement replay reads the 20 MB list (ASan, a loaded machine: it took over 10
# s in a fresh-chroot make test), hence the minute.
wait_for "1: replay's backend has answered the read of the start" 60 answered
stopped=$(backend)
kill -STOP "$stopped"
wait "$replay_pid"
check_eq "1: a server that stops reading: exit 1" 1 $?
kill -CONT "$stopped"
check_eq "1: ... named in one line" 1 \
    "$(grep -c 'PostgreSQL did not read the statement within 30 s' "$T/unread.err")"
check_eq "1: ... and nothing was replayed" 0 \
    "$(psql_q "SELECT count(*) FROM outbox WHERE sent_at IS NULL")"
kill "$PROXY_PID" 2>/dev/null
wait "$PROXY_PID" 2>/dev/null

# --- 2. ---
"$RELAY_BIN" replay --database-url "$DATABASE_URL" --missing "$T/missing.json" --yes \
    >"$T/direct.out" 2>"$T/direct.err"
check_eq "2: directly: exit 0" 0 $?
check_eq "2: ... replays the 30 rows of the list" 30 \
    "$(psql_q "SELECT count(*) FROM outbox WHERE sent_at IS NULL")"
