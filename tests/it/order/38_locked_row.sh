#!/bin/bash
# Proves a row locked by someone else (an operator's open transaction) never lets the later
# events of its aggregate overtake it. On main the claim's SKIP LOCKED skipped the locked row and
# published the aggregate's later events first.
# 30 aggregates with 4 events each; another client locks the first event of aggregate 'held-1'
# for 8 s (SELECT … FOR UPDATE in an open transaction) before the relay starts, and more events
# of every aggregate arrive meanwhile. While the lock is held: every other aggregate is
# delivered, none of 'held-1''s events is, and each session that meets the lock logs the stall
# once, naming the blocking backend's pid. Once the lock is gone: everything is delivered, first copies in order.
# D. A locked row far into the backlog, beyond the rows a claim around locks first looks
# at (four times the row limit), stalls only its own aggregate: --sessions 1 --batch-size 10,
# aggregate G with 60 unsent rows, H with 1, then K-1..K-10; another client holds G's and H's rows
# FOR UPDATE until the checks are done. On main the K-* events all stayed unsent (77 rounds of lock
# timeouts).
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 3
relay_migrate 2>"$T/migrate.log" || fail "migrate"

insert() { # insert FROM TO: one event of each of the 30 aggregates per seq
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            SELECT 'lk', 'held-' || a, 'changed', jsonb_build_object('seq', s)
            FROM generate_series($1, $2) AS s, generate_series(1, 30) AS a ORDER BY s, a"
}
insert 1 4
FIRST=$(psql_q "SELECT min(id) FROM outbox WHERE aggregate_id = 'held-1'")

LOCK_S=8
psql -XAtq -c "BEGIN" -c "SELECT pg_backend_pid() FROM outbox WHERE id = $FIRST FOR UPDATE" \
    -c "SELECT pg_sleep($LOCK_S)" -c "COMMIT" >"$T/locker.out" 2>&1 &
LOCKER=$!
_t_track "$LOCKER"
locker_pid() {
    head -n 1 "$T/locker.out"
}
has_locker() {
    [ -n "$(locker_pid)" ]
}
_poll 10 has_locker || fail "the other client holds the row lock"
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --kafka reconnect.backoff.max.ms=500
insert 5 6 # arriving while the lock is held

others_sent() {
    [ "$(psql_q "SELECT count(*) FROM outbox WHERE aggregate_id <> 'held-1'
                 AND sent_at IS NULL")" = 0 ]
}
wait_for "the other aggregates are delivered while the row is locked" 30 others_sent
held_sent=$(psql_q "SELECT count(*) FROM outbox WHERE aggregate_id = 'held-1'
                    AND sent_at IS NOT NULL")
if kill -0 "$LOCKER" 2>/dev/null; then
    check_eq "none of the locked aggregate's events is sent while its first is locked" 0 \
        "$held_sent"
else
    not_ok "the lock is still held when the locked aggregate is checked" \
        "the other client ended first: raise LOCK_S"
fi
wait "$LOCKER"
wait_for "every row is delivered once the lock is gone" 30 no_unsent_rows
check_delivered lk
# Once per session that met it (both may: lanes move between the sessions at start-up).
stalls=$(grep "locked by another transaction.*id=$FIRST blocking_pid=$(locker_pid) " "$RELAY_LOG" |
    grep -o 'session=[0-9]*')
check "the stall is logged, with the blocking pid" test -n "$stalls"
check_eq "once per session" "$(sort -u <<<"$stalls")" "$(sort <<<"$stalls")"
wait_for "and its end, once a plain claim goes through again" 20 \
    grep -q "no locked row holds claims up any more" "$RELAY_LOG"
relay_stop
check_eq "the relay exits 0" 0 "$?"

# --- B: a locked aggregate with more unsent rows than a batch, updated by its locker ------------
# One session, batches of 20: 30 events of 'hot' (the first locked and updated by another client,
# which commits once that is checked), then 10 other aggregates. The others must not wait behind
# hot's tail, and hot's first event goes out as its locker left it (the row as locked, not an
# older version).
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'hot', 'hot', 'changed', jsonb_build_object('seq', s)
        FROM generate_series(1, 30) AS s ORDER BY s"
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'hot', 'cold-' || a, 'changed', jsonb_build_object('seq', 1)
        FROM generate_series(1, 10) AS a ORDER BY a"
HOT=$(psql_q "SELECT min(id) FROM outbox WHERE aggregate_id = 'hot'")
# The other client holds the lock until the checks below are done (a coprocess, not a sleep: on a
# loaded machine a fixed sleep could end before the relay even started).
coproc LOCKB { psql -XAtq -v ON_ERROR_STOP=1 2>&1; }
_t_track "$LOCKB_PID"
lockb_pid=$LOCKB_PID
echo "BEGIN; UPDATE outbox SET payload = payload || '{\"edited\": true}' WHERE id = $HOT
      RETURNING pg_backend_pid();" >&"${LOCKB[1]}"
read -r -t 10 locker_b <&"${LOCKB[0]}" || fail "B: the other client holds the row lock"
[ -n "$locker_b" ] || fail "B: the other client holds the row lock"
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --sessions 1 --batch-size 20 \
    --kafka reconnect.backoff.max.ms=500
cold_sent() {
    [ "$(psql_q "SELECT count(*) FROM outbox WHERE aggregate_id LIKE 'cold-%'
                 AND sent_at IS NULL")" = 0 ]
}
wait_for "B: the other aggregates are not held up by the locked one's 30 rows" 30 cold_sent
check_eq "B: none of hot's events is sent while its first is locked" 0 \
    "$(psql_q "SELECT count(*) FROM outbox WHERE aggregate_id = 'hot' AND sent_at IS NOT NULL")"
echo "COMMIT;" >&"${LOCKB[1]}"
echo '\q' >&"${LOCKB[1]}"
wait "$lockb_pid" 2>/dev/null
wait_for "B: every row is delivered once the lock is gone" 30 no_unsent_rows
check_delivered hot
check_eq "B: hot's first event went out as its locker left it" true \
    "$(jq -r --arg id "$(psql_q "SELECT event_id FROM outbox WHERE id = $HOT")" \
        'select(.headers.id == $id) | .value | fromjson | .edited' "$T/hot.json" | head -n 1)"
relay_stop
check_eq "B: the relay exits 0" 0 "$?"

# --- C: a lock on the whole table (as some DDL takes) while batches are recorded -------------------
# SHARE mode lets the claim through but not the marks: they must wait for it, not fail after the
# claim's lock_timeout and fall back to recording row by row. The rows are there before the lock,
# the relay starts while it is held.
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'tl', 'tl-' || (g % 10), 'changed', jsonb_build_object('seq', g)
        FROM generate_series(1, 100) AS g ORDER BY g"
psql -XAtq -c "BEGIN" -c "LOCK TABLE outbox IN SHARE MODE" -c "SELECT 'locked'" \
    -c "SELECT pg_sleep(3)" -c "COMMIT" >"$T/table-locker.out" 2>&1 &
TABLE_LOCKER=$!
_t_track "$TABLE_LOCKER"
table_locked() {
    grep -q locked "$T/table-locker.out"
}
_poll 10 table_locked || fail "C: the other client locks the table"
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --kafka reconnect.backoff.max.ms=500
wait "$TABLE_LOCKER"
wait_for "C: every row is delivered after the table lock" 30 no_unsent_rows
check_delivered tl
check "C: no batch fell back to recording row by row" lacks "$RELAY_LOG" "recording the batch failed"
relay_stop
check_eq "C: the relay exits 0" 0 "$?"

# --- D: a locked row beyond the first window of a claim around locks -----------------------------
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'far', 'G', 'changed', jsonb_build_object('seq', s)
        FROM generate_series(1, 60) AS s ORDER BY s"
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        VALUES ('far', 'H', 'changed', '{\"seq\": 1}')"
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'far', 'K-' || k, 'changed', jsonb_build_object('seq', 1)
        FROM generate_series(1, 10) AS k ORDER BY k"
# The other client holds the locks until the checks below are done, as in B (it held them for a
# fixed 20 s, of which the test then waited out most).
coproc LOCKD { psql -XAtq -v ON_ERROR_STOP=1 2>&1; }
_t_track "$LOCKD_PID"
lockd_pid=$LOCKD_PID
echo "BEGIN; SELECT count(*) FROM (SELECT id FROM outbox WHERE aggregate_id IN ('G', 'H')
      FOR UPDATE) l;" >&"${LOCKD[1]}"
read -r -t 10 locked_d <&"${LOCKD[0]}" || fail "D: the other client locks G's and H's rows"
[ "$locked_d" = 61 ] || fail "D: the other client locks G's and H's rows" "it locked '$locked_d'"
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --sessions 1 --batch-size 10 \
    --kafka reconnect.backoff.max.ms=500
k_sent() {
    [ "$(psql_q "SELECT count(*) FROM outbox WHERE aggregate_id LIKE 'K-%'
                 AND sent_at IS NULL")" = 0 ]
}
wait_for "D: K-1..K-10 are delivered while G and H are locked" 15 k_sent
if kill -0 "$lockd_pid" 2>/dev/null; then
    check_eq "D: none of G's or H's events is sent while they are locked" 0 \
        "$(psql_q "SELECT count(*) FROM outbox WHERE aggregate_id IN ('G', 'H')
                   AND sent_at IS NOT NULL")"
else
    not_ok "D: the lock is still held when G and H are checked" "the other client ended first"
fi
echo "COMMIT;" >&"${LOCKD[1]}"
echo '\q' >&"${LOCKD[1]}"
wait "$lockd_pid" 2>/dev/null
wait_for "D: every row is delivered once the lock is gone" 30 no_unsent_rows
check_delivered far
wait_for "D: the stall's end is logged" 20 grep -q "no locked row holds claims up any more" \
    "$RELAY_LOG"
relay_stop
check_eq "D: the relay exits 0" 0 "$?"
