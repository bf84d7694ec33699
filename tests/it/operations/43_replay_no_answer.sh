#!/bin/bash
# Proves `outbox-relay replay` does not wait for ever on a server that stops answering in the
# middle of a batch (stopped, paused, or a proxy that lost it: the network still acknowledges
# every packet, so keepalives cannot tell it from a long statement):
#  1. the answer to a batch's locking SELECT withheld (a proxy holds it for 10 minutes), replay
#     gives up after its bound (--statement-timeout, 30 s by default, plus a millisecond a row of
#     --batch-rows, plus ten times what reading the selection for its summary took: 2 s here),
#     exit 1, one line saying PostgreSQL did not answer, and its last line the bounds of the
#     rest; the batch was not replayed (its COMMIT was never sent): every row is still sent;
#  2. run again directly (no proxy) with those bounds, it replays every row;
#  3. the answer to the summary withheld (before any batch), replay gives up after ten times
#     --statement-timeout (10 s here; the summary reads the whole selection, 43_replay part 6),
#     where it waited for ever, exit 1, one line, nothing replayed;
#  4. the answer to the ROLLBACK that ends the last, empty batch withheld, replay does not wait for
#     it past its bound (it waited for ever): every event was replayed, exit 0.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
relay_migrate 2>"$T/migrate.log" || fail "migrate"

# Sent rows, marked by hand: replay needs no broker.
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'order', 'o-' || (g % 3), 'Updated', '{}' FROM generate_series(1, 30) g"
psql_q "UPDATE outbox SET sent_at = now()"

# --- 1. ---
# Only the answer to the first statement naming "FOR UPDATE OF o" (the first batch's SELECT).
holding_proxy proxy "FOR UPDATE OF o"
# Before: replay waited for the held answer, through timeout's SIGTERM too (its first signal waits
# for the batch under way): killed here.
timeout -k 10 150 "$RELAY_BIN" replay --database-url "postgresql://postgres@127.0.0.1:$PROXY_PORT/outbox" \
    --from-id 1 --batch-rows 10 --yes --statement-timeout 2s >"$T/held.out" 2>"$T/held.err"
check_eq "1: a server that stops answering mid-batch: exit 1" 1 $?
check "1: ... named in one line" grep -q 'PostgreSQL did not answer within 2 s' "$T/held.err"
check "1: ... the last line gives the bounds of the rest" \
    grep -qE "^replay: 0 events replayed before the failure; to replay the rest, run it again with --to-id 30 --sent-before '[^']+'" \
    "$T/held.out"
check_eq "1: ... and nothing was replayed" 0 "$(psql_q "SELECT count(*) FROM outbox WHERE sent_at IS NULL")"

# --- 2. ---
kill "$PROXY_PID" 2>/dev/null
wait "$PROXY_PID" 2>/dev/null
# The held batch's transaction ends with its connection (gone with the proxy) or, at the latest,
# after the minute idle_in_transaction_session_timeout gives it: its row locks go with it.
unlocked() {
    [ "$(psql_q "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
                 WHERE c.relname = 'outbox' AND l.pid <> pg_backend_pid()")" = 0 ]
}
wait_for "2: the held batch's transaction is gone" 90 unlocked
to_id=$(sed -nE 's/.*--to-id ([0-9]+) .*/\1/p' "$T/held.out")
before=$(sed -nE "s/.*--sent-before '([^']+)'.*/\1/p" "$T/held.out")
"$RELAY_BIN" replay --database-url "$DATABASE_URL" --from-id 1 --to-id "$to_id" \
    --sent-before "$before" --batch-rows 10 --yes >"$T/rest.out" 2>"$T/rest.err"
check_eq "2: the rerun with the bounds of the rest: exit 0" 0 $?
check_eq "2: ... replays all 30" 30 "$(psql_q "SELECT count(*) FROM outbox WHERE sent_at IS NULL")"

# --- 3. ---
psql_q "UPDATE outbox SET sent_at = now()"
# Only the answer to the first statement naming "GROUP BY 1, 2" (the summary's read).
holding_proxy proxy3 "GROUP BY 1, 2"
# Before: the summary (and the statements before it) had no bound: replay waited for the held
# answer (timeout's 124 here).
timeout 60 "$RELAY_BIN" replay --database-url "postgresql://postgres@127.0.0.1:$PROXY_PORT/outbox" \
    --from-id 1 --yes --statement-timeout 1s >"$T/summary.out" 2>"$T/summary.err"
check_eq "3: a server that stops answering the summary: exit 1" 1 $?
kill "$PROXY_PID" 2>/dev/null
wait "$PROXY_PID" 2>/dev/null
check_eq "3: ... named in one line" 1 "$(grep -c 'PostgreSQL did not answer within 10 s' "$T/summary.err")"
check_eq "3: ... and nothing was replayed" 0 "$(psql_q "SELECT count(*) FROM outbox WHERE sent_at IS NULL")"

# --- 4. ---
psql_q "UPDATE outbox SET sent_at = now()"
# Only the answer to the first ROLLBACK: the one after the batch that finds nothing left.
holding_proxy proxy4 ROLLBACK
# Before: replay waited for it (blocking libpq), through timeout's SIGTERM too (its first signal
# waits for the batch under way): killed here.
timeout -k 10 60 "$RELAY_BIN" replay --database-url "postgresql://postgres@127.0.0.1:$PROXY_PORT/outbox" \
    --from-id 1 --batch-rows 100 --yes --statement-timeout 1s >"$T/rollback.out" 2>"$T/rollback.err"
check_eq "4: the last ROLLBACK unanswered: exit 0" 0 $?
kill "$PROXY_PID" 2>/dev/null
wait "$PROXY_PID" 2>/dev/null
check "4: ... every event replayed" grep -q '^replay: 30 events replayed' "$T/rollback.out"
check_eq "4: ... all 30 unsent again" 30 "$(psql_q "SELECT count(*) FROM outbox WHERE sent_at IS NULL")"
