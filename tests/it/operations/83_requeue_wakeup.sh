#!/bin/bash
# Proves `requeue` and `purge-dead` wake the relays that sleep (waiting for a notification, with
# a poll timer of an hour here), rather than leave the events they free to the next poll:
#  1. a dead-lettered event requeued while the relay sleeps is delivered;
#  2. with --on-poison hold, the events a dead one held back go once it is purged.
# An UPDATE or a DELETE fires no wakeup trigger (that is an INSERT's): before, each waited for the
# relay's --poll-interval.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"

admin() { timeout 60 "$RELAY_BIN" "$@" --database-url "$DATABASE_URL"; }
sent() { [ "$(psql_q "SELECT count(*) FROM outbox WHERE aggregate_id = '$1' AND sent_at IS NOT NULL")" = "$2" ]; }
# A dead-lettered event of aggregate $1, as the relay leaves one (attempts and rejections counted).
insert_dead() {
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            VALUES ('order', '$1', 'Broken', '{}');
            UPDATE outbox SET attempts = 2, rejections = 2, dead_at = now(), last_error = 'x'
            WHERE aggregate_id = '$1'"
}
insert_dead a-1
insert_dead h-1
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'order', 'h-1', 'Later', '{}' FROM generate_series(1, 3)"
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --poll-interval 3600000 \
    --on-poison hold
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        VALUES ('order', 'w-1', 'Woke', '{}')"
wait_for "the relay runs (a fresh event is sent)" 30 sent w-1 1
wait_for "the relay sleeps (it holds the wakeup lock)" 30 guard_held
check "the held aggregate's later events wait behind its dead one" sent h-1 0

# --- 1. ---
admin requeue --id "$(psql_q "SELECT id FROM outbox WHERE aggregate_id = 'a-1'")" >"$T/rq.out" 2>&1
check_eq "1: requeue exits 0" 0 $?
wait_for "1: the requeued event is delivered while the relay sleeps" 30 sent a-1 1

# --- 2. ---
wait_for "2: the relay sleeps again" 30 guard_held
admin purge-dead --id "$(psql_q "SELECT id FROM outbox WHERE aggregate_id = 'h-1' AND dead_at IS NOT NULL")" \
    >"$T/purge.out" 2>&1
check_eq "2: purge-dead exits 0" 0 $?
wait_for "2: the events it held back are delivered" 30 sent h-1 3
relay_stop
