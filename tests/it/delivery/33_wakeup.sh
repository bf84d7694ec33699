#!/bin/bash
# Proves the wakeup (migrations/0007_wakeup_lock.sql). Every relay here polls only once a minute
# (--poll-interval 60000), so a delivery within seconds was brought about by a notification:
#  1. the insert trigger notifies only while some session holds the wakeup lock exclusively (a
#     sleeping relay's guard), and an insert never waits for that lock;
#  2. sessions that find the lock held by another session sleep as followers and are woken by
#     producers; when that guard gives the lock up (outbox_relay_wake), they wake, ask again, and
#     one of them becomes the guard, so later inserts still wake them;
#  3. a producer transaction that inserted while the relay was awake keeps it from sleeping
#     (the relay cannot take the lock): its row goes out as soon as it commits;
#  4. a guard whose poll timer wakes it (nothing notified) keeps the lock: no notification;
#  5. two relays of two sessions each go to sleep with exactly one guard among them, rows of every
#     lane are delivered promptly, round after round, and once asleep the sessions stay asleep
#     (the lock is not handed round);
#  6. a producer whose session sets session_replication_role = replica wakes a sleeping relay;
#  7. so do the rows logical replication's apply worker brings in (an outbox fed by a
#     subscription).
#  8. the twin queues one notification a transaction, not one a row: a replica session's insert of
#     500 rows while a guard sleeps runs outbox_wakeup() twice (the statement trigger and the
#     twin's first row), and its next transaction notifies again;
#  9. while a producer's transaction holds the lock shared for 12 s, the relay's sessions do not
#     ask to sleep as fast as they can (thousands of calls before) but sleep: the relay's waiter
#     queues for the lock, so another producer's insert meanwhile notifies, and its rows go out
#     at once; the long transaction's row too, once it commits. So also under a statement_timeout
#     of 1 s, which ends the waits of 1 s before their lock_timeout does.
# 10. a relay killed while its waiter waits (--session-timeout 3 s): the wait runs to its end on
#     the server and notifies; the connection check did not end it first.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 3
relay_migrate 2>"$T/migrate.log" || fail "migrate"

# Two sessions always claiming (--min-sessions 2): the protocol among a relay's sessions is the
# subject.
OPTS=(--database-url "$DATABASE_URL" --brokers "$BROKERS" --poll-interval 60000 --log-level debug
    --min-sessions 2)
N=0 # rows inserted so far
insert() { # insert COUNT: rows over 200 aggregates (every lane)
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            SELECT 'order', 'o-' || (g % 200), 'changed', jsonb_build_object('seq', g)
            FROM generate_series($((N + 1)), $((N + $1))) AS g ORDER BY g" || return 1
    N=$((N + $1))
}
# listen SECS [SQL]: one session LISTENs, runs SQL (an insert: a session hears its own
# notifications; it may not wait for a lock) and waits SECS seconds; prints how many
# notifications it heard, or "failed".
listen() {
    local out=$T/listen.$RANDOM args=(-c "LISTEN outbox_relay")
    [ -z "${2:-}" ] || args+=(-c "SET statement_timeout = 2000" -c "$2" -c "RESET statement_timeout")
    psql -XAt -v ON_ERROR_STOP=1 "${args[@]}" -c "SELECT pg_sleep($1)" -c "SELECT 'done'" \
        >"$out" 2>&1 && grep -q '^done$' "$out" || {
        echo failed
        return
    }
    grep -c 'Asynchronous notification "outbox_relay"' "$out"
}
ONE_ROW="INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
         VALUES ('order', 'x', 'changed', '{}')"
asleep_count() { grep -c "msg=\"asleep\" as=$1" "$RELAY_LOG"; }
at_least() { [ "$("$2" "$3")" -ge "$1" ]; }

# --- 1. the trigger ---
check_eq "1: nobody holds the lock: an insert does not notify" 0 "$(listen 0 "$ONE_ROW")"
# An outside session stands in for a sleeping relay's guard. It gives the lock up (as a woken
# guard does) once it can take a second lock, which the session "go" holds until the test ends it.
GO_KEY=424242
PGAPPNAME=go psql -XAtq -c "SELECT pg_advisory_lock($GO_KEY)" -c "SELECT pg_sleep(600)" \
    >/dev/null 2>&1 &
_t_track $!
go_held() { [ "$(psql_q "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
                         AND objid = $GO_KEY AND granted")" = 1 ]; }
wait_for "1: the go session holds its lock" 5 go_held
PGAPPNAME=stand-in psql -XAtq -c "SELECT pg_advisory_lock($WAKEUP_KEY)" \
    -c "SELECT pg_advisory_lock($GO_KEY)" -c "SELECT outbox_relay_wake()" -c "SELECT pg_sleep(600)" \
    >"$T/stand-in.out" 2>&1 &
_t_track $!
wait_for "1: the stand-in holds the wakeup lock" 5 guard_held
STAND_IN_BACKEND=$(guard_pid)
check_eq "1: the lock held: an insert notifies, without waiting for the lock" 1 \
    "$(listen 0 "$ONE_ROW")"
psql_q "TRUNCATE outbox" || fail "truncate"

# --- 2. followers ---
relay_start "${OPTS[@]}"
wait_for "2: both sessions fall asleep as followers" 10 at_least 2 asleep_count follow
check "2: the stand-in is still the guard" test "$(guard_pid)" = "$STAND_IN_BACKEND"
insert 400 || not_ok "2: a producer inserts"
wait_for "2: followers woken by the producer deliver every row" 10 no_unsent_rows
check "2: no session became the guard meanwhile" lacks "$RELAY_LOG" 'msg="asleep" as=guard'
# The stand-in gives the lock up: the followers wake and one guards.
psql_q "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'go'" \
    >/dev/null || fail "end the go session"
relay_guards() { local p; p=$(guard_pid) && [ -n "$p" ] && [ "$p" != "$STAND_IN_BACKEND" ]; }
wait_for "2: after the stand-in's outbox_relay_wake, a relay session is the guard" 20 relay_guards
insert 400 || not_ok "2: a producer inserts"
wait_for "2: the new guard's sleep is woken: every row delivered" 10 no_unsent_rows

# --- 3. a producer transaction open while the relay is awake ---
relay_stop || not_ok "2: relay exits 0"
relay_start "${OPTS[@]}" --sleep-after 3000
wait_for "3: the relay guards" 10 guard_held
awake() { [ -z "$(guard_pid)" ]; }
# slow_producer [SECS]: a producer transaction begun while no session guards. It takes the wakeup
# lock shared first, as its insert's trigger does, which succeeds only while no session holds it
# exclusively; then it says "held" (at once: \! writes past psql's buffer), inserts a row and
# keeps its transaction open SECS (5) s. If a session guards after all (on a busy machine the relay's
# 3 s awake spell can end before this runs), it rolls back and says "guarded".
slow_producer() {
    psql -XAtq -v ON_ERROR_STOP=1 <<SQL
BEGIN;
SELECT pg_try_advisory_xact_lock_shared(1331849732) AS got \gset
\if :got
\! echo held
${2:-$ONE_ROW};
SELECT pg_sleep(${1:-5});
COMMIT;
\else
ROLLBACK;
\! echo guarded
\endif
SQL
}
said() { grep -qx "$1" "$T/slow.out"; }
decided() { said held || said guarded; }
for try in 1 2 3 4 5; do
    insert 100 || not_ok "3: a producer inserts (wakes the relay, which stays awake 3 s)"
    _poll 10 no_unsent_rows || break
    slow_producer >"$T/slow.out" 2>&1 &
    SLOW=$!
    _poll 10 decided
    said held && break
    wait "$SLOW"
done
check "3: rows delivered, and a producer's transaction begun while the relay was awake" said held
echo "# 3: the producer found the relay awake at try $try"
sleep 4 # past --sleep-after: the relay would sleep now, but the producer holds the lock shared
check "3: while the producer's transaction is open, the relay does not guard" awake
wait "$SLOW" || not_ok "3: the slow producer commits" "$(cat "$T/slow.out")"
N=$((N + 1))
wait_for "3: its row goes out soon after its commit" 5 no_unsent_rows
check "3: relay still running" relay_running
relay_stop || not_ok "3: relay exits 0"

# --- 4. a guard stays asleep through its poll timer ---
relay_start "${OPTS[@]}" --poll-interval 200
wait_for "4: the relay guards" 10 guard_held
check_eq "4: polling every 200 ms for 2 s, the guard does not leave (no notification)" 0 \
    "$(listen 2)"
relay_stop || not_ok "4: relay exits 0"

# --- 5. two relays, four sessions ---
relay_start "${OPTS[@]}"
RELAY_A=$RELAY_PID A_LOG=$RELAY_LOG
relay_start "${OPTS[@]}"
for round in 1 2 3; do
    wait_for "5.$round: the relays fall asleep, one guard" 15 guard_held
    sleep 0.5
    insert 300 || not_ok "5.$round: a producer inserts"
    wait_for "5.$round: rows of every lane delivered" 10 no_unsent_rows
done
# Asleep, they stay asleep: the lock is not handed round between them.
asleep_lines() { cat "$A_LOG" "$RELAY_LOG" | grep -c 'msg="asleep"'; }
stay_asleep() {
    local before
    before=$(asleep_lines)
    sleep 2
    [ "$(asleep_lines)" = "$before" ]
}
wait_for "5: the relays fall asleep again, then stay asleep (no wakeups for 2 s)" 20 stay_asleep
for log in "$A_LOG" "$RELAY_LOG"; do
    check "5: no wakeup problem logged ($(basename "$log"))" lacks "$log" "cannot take part"
done
relay_stop || not_ok "5: relay B exits 0"
RELAY_PID=$RELAY_A
relay_stop || not_ok "5: relay A exits 0"

# --- 6. a producer whose session replicates (session_replication_role = replica) ---
# Logical replication's apply workers, pglogical and some loaders write so; a trigger enabled the
# ordinary way does not fire for them. The wakeup trigger is enabled ALWAYS: such a producer
# takes the lock shared as any other and notifies a sleeping relay. Before, its insert neither
# notified nor kept the relay from guarding, and its row waited for the poll (a minute here).
relay_start "${OPTS[@]}"
wait_for "6: the relay guards" 10 guard_held
replica_insert() {
    psql_q "SET session_replication_role = replica;
            INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            SELECT 'order', 'o-' || (g % 200), 'changed', jsonb_build_object('seq', g)
            FROM generate_series($((N + 1)), $((N + $1))) AS g ORDER BY g" >/dev/null || return 1
    N=$((N + $1))
}
check_eq "6: the wakeup trigger fires in replica sessions too" A \
    "$(psql_q "SELECT tgenabled FROM pg_trigger WHERE tgname = 'outbox_wakeup'
               AND tgrelid = 'outbox'::regclass")"
replica_insert 50 || not_ok "6: a replicating producer inserts"
wait_for "6: its rows woke the guard: every row delivered" 10 no_unsent_rows
relay_stop || not_ok "6: relay exits 0"

# --- 7. a producer that is logical replication's apply worker ---
# An outbox fed by a subscription (the relay on the subscriber). The apply worker inserts with
# session_replication_role = replica and fires row triggers only, never statement triggers, not
# even one enabled ALWAYS: the wakeup's row-level twin, enabled REPLICA (0012), takes the lock
# shared and notifies for it. Before, the subscription's rows waited for the poll (a minute
# here). The publisher is another database of the same cluster; its ids start above ours.
echo "wal_level = logical" >>"$T/pg/postgresql.conf"
pg_restart
psql_q "CREATE DATABASE outbox_pub" -d postgres || fail "7: create the publisher's database"
PUB_URL=postgresql://postgres@127.0.0.1:$PGPORT/outbox_pub
"$RELAY_BIN" migrate --database-url "$PUB_URL" 2>>"$T/migrate.log" || fail "7: migrate the publisher"
# (The slot is made apart: CREATE SUBSCRIPTION cannot make one in its own cluster.)
psql_q "SELECT setval(pg_get_serial_sequence('outbox', 'id'), 1000000)" -d outbox_pub >/dev/null &&
    psql_q "CREATE PUBLICATION outbox_pub FOR TABLE outbox" -d outbox_pub &&
    psql_q "SELECT pg_create_logical_replication_slot('outbox_sub', 'pgoutput')" -d outbox_pub \
        >/dev/null || fail "7: publish the publisher's outbox"
check_eq "7: the wakeup's row-level twin fires in replica sessions only" R \
    "$(psql_q "SELECT tgenabled FROM pg_trigger WHERE tgname = 'outbox_wakeup_replica'
               AND tgrelid = 'outbox'::regclass")"
relay_start "${OPTS[@]}"
wait_for "7: the relay guards" 10 guard_held
psql_q "CREATE SUBSCRIPTION outbox_sub
        CONNECTION 'host=127.0.0.1 port=$PGPORT dbname=outbox_pub user=postgres'
        PUBLICATION outbox_pub WITH (create_slot = false, slot_name = 'outbox_sub',
        copy_data = false)" || fail "7: subscribe"
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'order', 'o-' || (g % 200), 'changed', jsonb_build_object('seq', g)
        FROM generate_series($((N + 1)), $((N + 50))) AS g ORDER BY g" -d outbox_pub ||
    not_ok "7: the publisher inserts"
N=$((N + 50))
subscribed_rows() { [ "$(psql_q "SELECT count(*) FROM outbox WHERE id > 1000000")" = 50 ]; }
wait_for "7: the apply worker brought the rows in" 20 subscribed_rows
wait_for "7: its rows woke the guard: every row delivered" 10 no_unsent_rows
relay_stop || not_ok "7: relay exits 0"
psql_q "DROP SUBSCRIPTION outbox_sub" >/dev/null || not_ok "7: unsubscribe"
check_delivered order

# --- 8. the twin queues one notification a transaction ---
# Each row ran the twin's WHEN and, while a relay slept, queued an after-trigger event, kept in
# the backend's memory until the statement ended (a subscription's initial COPY: one per row of
# the table), then ran outbox_wakeup() for each. A session holds the wakeup lock as a sleeping
# guard does; pg_stat_user_functions counts the function's calls in the replica session.
PGAPPNAME=guard8 psql -XAtq -c "SELECT pg_advisory_lock(1331849732)" -c "SELECT pg_sleep(300)" \
    >/dev/null 2>&1 &
GUARD8=$!
_t_track "$GUARD8"
guard8_held() {
    [ "$(psql_q "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
                 WHERE a.application_name = 'guard8' AND l.locktype = 'advisory'
                 AND l.objid = 1331849732 AND l.granted")" = 1 ]
}
wait_for "8: a session holds the wakeup lock" 10 guard8_held
psql_q "SELECT pg_stat_reset_single_function_counters('outbox_wakeup()'::regprocedure)" \
    >/dev/null || fail "8: reset the function's counters"
psql_q "SET track_functions = 'pl'; SET session_replication_role = replica;
        INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'order', 'o-' || (g % 200), 'changed', jsonb_build_object('seq', g)
        FROM generate_series($((N + 1)), $((N + 500))) AS g ORDER BY g" >/dev/null ||
    not_ok "8: a replica session inserts 500 rows"
N=$((N + 500))
# The session's counts reach the statistics when its backend exits, all at once.
wakeup_calls() {
    psql_q "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions
            WHERE funcid = 'outbox_wakeup()'::regprocedure"
}
calls_counted() { [ "$(wakeup_calls)" -gt 0 ]; }
wait_for "8: the inserting session's calls are counted" 10 calls_counted
check_eq "8: outbox_wakeup() ran twice (the statement trigger, the twin's first row), not per row" \
    2 "$(wakeup_calls)"
TWO_TX="SET session_replication_role = replica;
        BEGIN; $ONE_ROW; $ONE_ROW; COMMIT; BEGIN; $ONE_ROW; $ONE_ROW; COMMIT"
check_eq "8: each transaction of a replica session notifies (the mark goes at commit)" 2 \
    "$(listen 0 "$TWO_TX")"
_t_reap "$GUARD8" || : # its psql ends by SIGTERM: not the test's status

# --- 9. a producer's transaction held open while the relay is awake: no hot loop ---
# The sessions told "busy" (the lock held shared) asked again every --busy-poll-interval, each
# time with a claim: 2,402 calls of outbox_relay_sleep in 10 s with 4 sessions, measured. Now the
# relay's waiter queues for the lock and they sleep until its bounded wait ends (wakeup.h). The
# calls are counted by pg_stat_user_functions (track_functions for the relay's connections),
# which the sessions' backends report in full as they exit (the relay stopped).
psql_q "ALTER DATABASE outbox SET track_functions = 'pl'" >/dev/null || fail "9: track functions"
# Part 8's stand-in guard: its backend sleeps on after its psql ended.
psql_q "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'guard8'" \
    >/dev/null || fail "9: end part 8's guard"
wait_for "9: nobody holds the wakeup lock" 10 awake
row9() { # row9 AGGREGATE: one row of its own aggregate, with the seq check_delivered reads
    echo "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
          VALUES ('order', '$1', 'changed', '{\"seq\": 1}')"
}
LONG_ROW=$(row9 long9)
# The relay's sessions under a statement_timeout of 1 s (as a role's or database's would set it):
# the waiter's waits reach their cap, a lock_timeout of 1 s, and the statement_timeout ended each
# such wait first, an error: no notification, a failure logged, the sessions polling 5 s after it.
relay_start --database-url "$DATABASE_URL?options=-c%20statement_timeout%3D1000" \
    --brokers "$BROKERS" --poll-interval 60000 --log-level debug --min-sessions 2 --sleep-after 3000
wait_for "9: the relay guards" 10 guard_held
for try in 1 2 3 4 5; do
    insert 100 || not_ok "9: a producer inserts (wakes the relay, which stays awake 3 s)"
    _poll 10 no_unsent_rows || break
    slow_producer 12 "$LONG_ROW" >"$T/slow.out" 2>&1 &
    SLOW=$!
    _poll 10 decided
    said held && break
    wait "$SLOW"
done
check "9: a producer's transaction begun while the relay was awake" said held
psql_q "SELECT pg_stat_reset_single_function_counters('outbox_relay_sleep()'::regprocedure)" \
    >/dev/null || fail "9: reset the function's counters"
sleep 4 # past --sleep-after: the sessions ask to sleep, and are told busy
notified=$(psql -XAt -v ON_ERROR_STOP=1 -c "LISTEN outbox_relay" -c "SET statement_timeout = 2000" \
    -c "$(row9 notify9)" 2>&1 | grep -c 'Asynchronous notification "outbox_relay" received') || :
N=$((N + 1))
check_eq "9: meanwhile another producer's insert notifies (the waiter queues for the lock)" 1 \
    "$notified"
insert 100 || not_ok "9: another producer inserts meanwhile"
wait_for "9: its rows go out while the long transaction is open (--poll-interval: a minute)" 10 \
    no_unsent_rows
check "9: the long transaction still open as they went" kill -0 "$SLOW"
wait "$SLOW" || not_ok "9: the slow producer commits" "$(cat "$T/slow.out")"
N=$((N + 1))
wait_for "9: its row goes out soon after its commit" 5 no_unsent_rows
wait_for "9: a session guards again" 10 guard_held
relay_stop || not_ok "9: relay exits 0"
relay_gone() {
    [ "$(psql_q "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'outbox-relay%'")" = 0 ]
}
wait_for "9: the relay's server processes have ended (their counts reported)" 10 relay_gone
calls=$(psql_q "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions
                WHERE funcid = 'outbox_relay_sleep()'::regprocedure")
echo "# 9: outbox_relay_sleep called $calls times in the ~13 s from the reset (2 sessions)"
check "9: the sessions asked to sleep at most 150 times in those ~13 s (thousands before)" \
    test "${calls:-99999}" -le 150
check "9: waits reached their cap of 1 s (the statement_timeout's)" \
    grep -q "waiting for producers' transactions.*lock_timeout_ms=1000" "$RELAY_LOG"
check "9: the relay logged no failure of its waiter" lacks "$RELAY_LOG" "waiter failed"
psql_q "ALTER DATABASE outbox RESET track_functions" >/dev/null || not_ok "9: reset track_functions"

# --- 10. a relay killed while its waiter waits -------------------------------------------------
# The waiter's wait ends with a notification, which wakes the sessions asleep on it, this relay's
# and other relays'. A relay killed mid-wait leaves its wait running on the server, and the
# notification must still go out at its end. With --session-timeout 3 s (1 s or more below),
# the connection check (client_connection_check_interval, T/3 and at least 1 s: pg.c) came due
# within almost every wait of 1 s: the backend found its client gone and ended with "FATAL:
# connection to client lost" before the wait ended, and nothing was notified (the sessions of
# other relays that slept on that wait slept on until their --poll-interval). A kill lands before
# or after that check's moment in its wait: four kills, each must leave the wait to end.
PGAPPNAME=slow10 slow_producer 300 "$(row9 long10)" >"$T/slow.out" 2>&1 &
SLOW=$!
_t_track "$SLOW"
wait_for "10: a producer's transaction holds the wakeup lock shared (no relay runs)" 30 said held
waiting_waiter() { # the waiter's server process while it queues for the wakeup lock
    psql_q "SELECT pid FROM pg_stat_activity WHERE application_name = 'outbox-relay wakeup'
            AND wait_event_type = 'Lock'"
}
has_waiting_waiter() { [ -n "$(waiting_waiter)" ]; }
waiter_at_cap() { grep -q "waiting for producers' transactions.*lock_timeout_ms=1000" "$RELAY_LOG"; }
backend_gone() { [ "$(psql_q "SELECT count(*) FROM pg_stat_activity WHERE pid = $1")" = 0 ]; }
# A session LISTENs throughout, fed through a fifo: the waiter's notification itself is read,
# by the process that sent it, since the server log alone passes as well for a waiter that ended
# without a word or never reached its pg_notify. The waiter's earlier waits notified too: only
# one heard after the kill counts.
mkfifo "$T/listen10.in" || fail "10: mkfifo"
psql -XAt <"$T/listen10.in" >"$T/listen10.out" 2>&1 &
_t_track $!
exec 7>"$T/listen10.in"
# A subshell takes a SIGPIPE (a listener gone), not the test.
ask10() { (echo "$1" >&7) 2>/dev/null; }
ask10 "LISTEN outbox_relay; SELECT 'listening';"
listening10() { grep -qx listening "$T/listen10.out"; }
# heard10 PID: how many "guard left" the listener printed from PID (it prints what it heard after
# each statement's result).
heard10() {
    grep -c "notification \"outbox_relay\" with payload \"guard left\" received from server process with PID $1\." \
        "$T/listen10.out"
}
this_wait10() { # the waiter's process and its wait's start, while it queues for the lock
    psql_q "SELECT pid || '|' || query_start FROM pg_stat_activity
            WHERE application_name = 'outbox-relay wakeup' AND wait_event_type = 'Lock'"
}
# synced10 TAG: the listener answered TAG, so printed all it heard before it.
synced10() { grep -qx "$1" "$T/listen10.out"; }
heard10_more() { # heard10_more PID COUNT: more than COUNT heard from PID
    ask10 "SELECT 1;"
    [ "$(heard10 "$1")" -gt "$2" ]
}
wait_for "10: a listener listens" 10 listening10
for kill10 in 1 2 3 4; do
    relay_start "${OPTS[@]}" --sleep-after 1000 --session-timeout 3000
    wait_for "10.$kill10: the relay's waiter waits its cap, 1 s" 30 waiter_at_cap
    # What the waiter's earlier waits notified (committed before this wait began) is heard
    # first, and the wait (its statement's start) is the same after: the kill lands in it.
    for try10 in 1 2 3 4 5; do
        _poll 10 has_waiting_waiter
        WAIT10=$(this_wait10)
        WAITER=${WAIT10%%|*}
        ask10 "SELECT 'sync10.$kill10.$try10.a';"
        _poll 10 synced10 "sync10.$kill10.$try10.a"
        ask10 "SELECT 'sync10.$kill10.$try10.b';"
        _poll 10 synced10 "sync10.$kill10.$try10.b"
        HEARD=$(heard10 "${WAITER:-0}")
        [ -n "$WAIT10" ] && [ "$(this_wait10)" = "$WAIT10" ] && break
    done
    relay_kill
    wait_for "10.$kill10: the killed relay's waiter process ends" 20 backend_gone "${WAITER:-0}"
    check "10.$kill10: its wait ran to its end (and its notification), not ended by the connection check" \
        lacks "$T/pg.log" "[${WAITER:-0}] FATAL:  connection to client lost"
    wait_for "10.$kill10: a listener hears its \"guard left\" (from that process, after the kill)" 10 \
        heard10_more "${WAITER:-0}" "$HEARD"
done
exec 7>&-
psql_q "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'slow10'" \
    >/dev/null || not_ok "10: end the producer's transaction"
wait "$SLOW" 2>/dev/null || :
