#!/bin/bash
# Proves a row locked by someone else (an operator's open transaction) never lets the later
# events of its aggregate overtake it (issue 15). On main the claim's SKIP LOCKED skipped the
# locked row and published the aggregate's later events first.
# 30 aggregates with 4 events each; another client locks the first event of aggregate 'held-1'
# for 8 s (SELECT … FOR UPDATE in an open transaction) before the relay starts, and more events
# of every aggregate arrive meanwhile. While the lock is held: every other aggregate is
# delivered, none of 'held-1''s events is, and each session that meets the lock logs the stall
# once, naming the blocking backend's pid. Once the lock is gone: everything is delivered, first copies in order.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../lib.sh"
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
