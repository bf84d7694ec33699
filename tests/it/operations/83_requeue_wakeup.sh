#!/bin/bash
# Proves `requeue` and `purge-dead` wake the relays that sleep (waiting for a notification, with
# a poll timer of an hour here), rather than leave the events they free to the next poll:
#  1. a dead-lettered event requeued while the relay sleeps is delivered;
#  2. with --on-poison hold, the events a dead one held back go once it is purged;
#  3. while another transaction holds a dead event locked, requeue --all and purge-dead --all
#     wait at most their lock bound and say so, changing none of the batch; the bound follows a
#     stricter statement_timeout or lock_timeout of the connection, and the line names it.
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

# --- 3. a dead event another transaction holds locked ---
# requeue and purge-dead wait for it at most their lock bound (three quarters of
# --statement-timeout, at most 10 s: here 3 s of 4), then say what held the batch and that none
# of it changed. Before, the batch waited until the statement timeout and said only "canceling
# statement due to statement timeout", which names no cause.
insert_dead l-1
insert_dead l-2
locked=$(psql_q "SELECT id FROM outbox WHERE aggregate_id = 'l-1'")
coproc HOLDER { psql -XAtq -v ON_ERROR_STOP=1 2>&1; }
_t_track "$HOLDER_PID"
holder_pid=$HOLDER_PID
echo "BEGIN; SELECT 'locked' || id FROM outbox WHERE id = $locked FOR UPDATE;" >&"${HOLDER[1]}"
read -r -t 10 seen <&"${HOLDER[0]}" || fail "3: the other client locks a dead event"
[ "$seen" = "locked$locked" ] || fail "3: the other client locks a dead event" "$seen"
LOCKED_LINE='a dead event of the batch, or the outbox table, is locked by another transaction'
for cmd in requeue purge-dead; do
    admin "$cmd" --all --statement-timeout 4s >"$T/$cmd.locked.out" 2>&1
    check_eq "3: $cmd --all exits 1 while a dead event is locked" 1 $?
    check "3: $cmd says a dead event of the batch is locked, and that none of it changed" grep -q \
        "$LOCKED_LINE (a relay publishing its copy to the dead-letter topic, an open transaction, a migration): nothing of the batch was changed.*command=$cmd" \
        "$T/$cmd.locked.out"
    check_eq "3: $cmd prints no generic timeout" 0 "$(grep -c 'canceling statement due to' "$T/$cmd.locked.out")"
done
# The bound follows the statement timeout in force: a stricter one of the connection (2 s, under
# the default --statement-timeout of 30 s) stays, and three quarters of 30 s (10 s) outlasted it:
# the old code printed the generic timeout. And the line names the lock_timeout in force: a
# stricter one of the connection (500 ms) stays, where the old code printed the 3 s it asked for.
PGOPTIONS="-c statement_timeout=2s" admin requeue --all >"$T/requeue.strict_st.out" 2>&1
check_eq "3: requeue --all under a connection's statement_timeout of 2s exits 1" 1 $?
check "3: requeue waits three quarters of the connection's 2s, and says why" grep -q \
    "$LOCKED_LINE.*command=requeue .*waited_ms=1500\$" "$T/requeue.strict_st.out"
PGOPTIONS="-c lock_timeout=500ms" admin purge-dead --all --statement-timeout 4s \
    >"$T/purge-dead.strict_lt.out" 2>&1
check_eq "3: purge-dead --all under a connection's lock_timeout of 500ms exits 1" 1 $?
check "3: purge-dead names the lock_timeout in force (500 ms), not the 3 s it would set" grep -q \
    "$LOCKED_LINE.*command=purge-dead .*waited_ms=500\$" "$T/purge-dead.strict_lt.out"
check_eq "3: both events still dead" 2 \
    "$(psql_q "SELECT count(*) FROM outbox WHERE aggregate_id LIKE 'l-%' AND dead_at IS NOT NULL")"
echo "COMMIT;" >&"${HOLDER[1]}"
echo '\q' >&"${HOLDER[1]}"
wait "$holder_pid" 2>/dev/null
