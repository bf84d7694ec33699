#!/bin/bash
# Proves a relay's claim sessions (--sessions, default 2; --min-sessions, default 1):
#  1. with --min-sessions 2, one relay's two sessions split the 64 lanes between them (each holds
#     some, none twice, on two backends) and both deliver: each commits batches of its own (debug
#     log, session=0 and 1); pg_stat_activity names the lane holders "outbox-relay session-0" and
#     "outbox-relay session-1" (fallback_application_name, as the URL names none);
#  2. terminating the backend of a session whose claim is open while its batch waits for Kafka
#     (300 ms round trips, kept while the rest drains, so the abandoned batch's messages are still
#     in the shared producer while the other session takes its lanes over): the relay logs the
#     batch abandoned, keeps running, the session reconnects and rejoins, and every row is
#     delivered, first copies in order per aggregate, no order break logged;
#  3. with --sessions 1 the relay holds all 64 lanes on one backend;
#  4. --sessions 0 and 9 are refused with one line, exit 2;
#  5. at default settings the second session rests: one backend holds all 64 lanes
#     (outbox_claim_sessions 1), and rows trickling in (claims never full) or 500 rows at once
#     (five full claims of --batch-size 100) leave it so. A backlog (ten full claims in a row)
#     brings the second session in (outbox_claim_sessions 2): it commits batches of
#     its own, and every row is delivered in order; --session-rest-after without a full claim,
#     it gives its lanes back (one backend holds all 64 again, the gauge 1), and a row inserted
#     then is still woken for (--poll-interval 60000), whichever session guarded the sleepers. A
#     second backlog brings it back: one join per backlog, no flapping;
#  6. the claiming session's backend terminated while the other rests, and the database refusing
#     new connections: the resting one takes all 64 lanes and sends rows inserted then; once
#     connections are allowed again, one backend holds the lanes again, every row delivered in
#     order;
#  7. --min-sessions above --sessions, 0 or 9, and --session-rest-after below 1000 are refused
#     with one line, exit 2.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 3
relay_migrate 2>"$T/migrate.log" || fail "migrate"

OPTS=(--database-url "$DATABASE_URL" --brokers "$BROKERS" --kafka reconnect.backoff.max.ms=500)

# lane_holders: "BACKEND_PID LANES" per session holding lanes.
# LOCKS_DB: psql arguments for these looks at pg_locks (another database while test 6 locks
# the relay's out).
LOCKS_DB=()
lane_holders() {
    psql_q "SELECT l.pid, count(*) FROM pg_locks l WHERE $LANE_LOCK GROUP BY 1 ORDER BY 1" \
        "${LOCKS_DB[@]}" | tr '|' ' '
}
# held_by N: N backends hold lanes, some each, the 64 lanes once in all.
held_by() {
    local rows
    rows=$(lane_holders)
    [ "$(grep -c . <<<"$rows")" = "$1" ] &&
        [ "$(awk '{ s += $2 } END { print s + 0 }' <<<"$rows")" = 64 ] &&
        [ "$(psql_q "SELECT count(DISTINCT l.objid) FROM pg_locks l WHERE $LANE_LOCK" \
            "${LOCKS_DB[@]}")" = 64 ]
}
insert() { # insert TYPE FROM TO: rows over 200 aggregates, seq grows with id per aggregate
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            SELECT '$1', '$1-' || (g % 200), 'changed', jsonb_build_object('seq', g)
            FROM generate_series($2, $3) AS g ORDER BY g"
}
committed_by() { # committed_by SESSION: the relay log has a batch committed by that session
    grep -qE "msg=\"batch committed\" rows=[1-9].* session=$1\$" "$RELAY_LOG"
}
# --- 1. two sessions share the lanes and the work ---
relay_start "${OPTS[@]}" --min-sessions 2 --log-level debug
wait_for "1: two backends of the relay hold the 64 lanes, some each" 15 held_by 2
insert a 0 19999
wait_for "1: 20,000 rows sent" 60 no_unsent_rows
check "1: session 0 committed batches" committed_by 0
check "1: session 1 committed batches" committed_by 1
check_eq "1: pg_stat_activity names the lane holders by session" \
    "outbox-relay session-0,outbox-relay session-1" \
    "$(psql_q "SELECT string_agg(DISTINCT a.application_name, ',' ORDER BY a.application_name)
               FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid WHERE $LANE_LOCK")"
check_delivered a

# --- 2. one session's backend terminated mid-batch ---
broker_cmd "rtt all 300"
insert b 0 19999
# claim_open: sets VICTIM to a session backend that holds lanes and has its claim transaction open
# (idle in transaction: the claim is in, the marks are not, so its batch waits for Kafka).
claim_open() {
    VICTIM=$(psql_q "SELECT a.pid FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid
                     WHERE $LANE_LOCK AND a.state = 'idle in transaction' LIMIT 1")
    [ -n "$VICTIM" ]
}
wait_for "2: a session has its claim open, waiting for Kafka" 15 claim_open
check_eq "2: terminated that session's backend" t \
    "$(psql_q "SELECT pg_terminate_backend($VICTIM)")"
wait_for "2: all rows sent after the session was cut" 90 no_unsent_rows
broker_cmd "rtt all 0"
check "2: the relay logged the abandoned batch" grep -q 'msg="batch abandoned' "$RELAY_LOG"
check "2: the relay is still running" relay_running
wait_for "2: the session rejoined: two backends hold the lanes again" 15 held_by 2
check_delivered b
relay_stop
check_eq "2: relay exits 0" 0 $?
check "2: no order break logged" lacks "$RELAY_LOG" "order broken"

# --- 3. one session ---
relay_start "${OPTS[@]}" --sessions 1 --min-sessions 1
wait_for "3: --sessions 1: one backend holds all 64 lanes" 15 held_by 1
relay_stop
check_eq "3: relay exits 0" 0 $?

# --- 4. out of range ---
for n in 0 9; do
    "$RELAY_BIN" run "${OPTS[@]}" --sessions "$n" >"$T/bad.out" 2>&1
    check_eq "4: --sessions $n exits 2" 2 $?
    check_eq "4: --sessions $n: one line" 1 "$(grep -c '' "$T/bad.out")"
    check "4: --sessions $n: names the option" grep -q -- "--sessions" "$T/bad.out"
done

# --- 5. the second session rests while claims are not full, and joins for a backlog ---
JOINED='msg="claims come back full: every claim session takes part"'
RESTED='msg="no full claim for a while: the sessions above --min-sessions rest"'
joins() { grep -c "$JOINED" "$RELAY_LOG"; }
not_committed_by() { ! committed_by "$1"; }
# --poll-interval 60000: rows are picked up within seconds only if the wakeup works, also after
# a session that may have been the sleeping sessions' guard rested.
relay_start "${OPTS[@]}" --log-level debug --batch-size 100 --session-rest-after 6000 \
    --poll-interval 60000 --metrics-listen 127.0.0.1:0
metrics_wait
wait_for "5: at rest, one backend holds all 64 lanes" 15 held_by 1
check "5: outbox_claim_sessions 1" metric_is outbox_claim_sessions 1
for i in $(seq 0 29); do # one row at a time: no claim can come back full
    insert t "$i" "$i"
    sleep 0.05
done
wait_for "5: the trickle is sent" 30 no_unsent_rows
check_eq "5: the trickle brought no session in" 0 "$(joins)"
check "5: still one backend holding all 64 lanes" held_by 1
check_delivered t
insert s 0 499 # five claims' worth: a moment's lag, not a backlog
wait_for "5: 500 rows at once are sent" 30 no_unsent_rows
check_eq "5: five full claims brought no session in" 0 "$(joins)"
check "5: session 1 committed nothing" not_committed_by 1
check_delivered s
insert c 0 19999
wait_for "5: the backlog brought the second session in" 30 grep -q "$JOINED" "$RELAY_LOG"
wait_for "5: outbox_claim_sessions 2" 15 metric_is outbox_claim_sessions 2
wait_for "5: 20,000 rows sent" 60 no_unsent_rows
check "5: session 1 committed batches of the backlog" committed_by 1
check_delivered c
# Which session guarded the sleepers when the second one rested: if session 1, the wakeup lock
# had to be handed over for the next check to pass (the test runs either way; it says which).
wait_for "5: 6 s without a full claim, the second session rests" 40 grep -q "$RESTED" "$RELAY_LOG"
guard=$(sed -n "/$RESTED/q; s/.*msg=\"asleep\" as=guard session=\([0-9]\).*/\1/p" "$RELAY_LOG" | tail -n 1)
echo "# 5: the sleepers' guard when the second session rested: session ${guard:-none}"
wait_for "5: one backend holds all 64 lanes again" 15 held_by 1
check "5: outbox_claim_sessions 1 again" metric_is outbox_claim_sessions 1
# The remaining session falls asleep (--sleep-after 50 ms): its backend, the one holding the
# lanes, guards the wakeup lock then (not the rested one's).
lane_holder_guards() { [ -n "$(guard_pid)" ] && [ "$(guard_pid)" = "$(lane_holders | cut -d' ' -f1)" ]; }
wait_for "5: the remaining session sleeps, guarding the wakeup lock" 15 lane_holder_guards
insert w 0 0
wait_for "5: a row after the rest is sent (woken by a notification)" 15 no_unsent_rows
insert d 0 19999
wait_for "5: the second backlog is sent" 60 no_unsent_rows
check_delivered d
check_eq "5: one join per backlog" 2 "$(joins)"

# --- 6. the claiming session's connection lost: the resting one takes its place ---
# The database refuses new connections meanwhile, so the lost session cannot come back: only the
# resting one can claim. Rows go in and are counted over a psql session opened before.
wait_for "6: at rest again" 40 held_by 1
holder=$(lane_holders | cut -d' ' -f1)
coproc INS { psql -XAtq -v ON_ERROR_STOP=1 2>&1; }
co_q() { # co_q SQL: one line of output from the open session
    local line
    echo "$1" >&"${INS[1]}" && read -r -t 10 line <&"${INS[0]}" && echo "$line"
}
check_eq "6: a psql session open" 1 "$(co_q "SELECT 1;")"
LOCKS_DB=(-d postgres)
psql_q "ALTER DATABASE outbox ALLOW_CONNECTIONS false" -d postgres
check_eq "6: terminated the claiming session's backend" t \
    "$(psql_q "SELECT pg_terminate_backend($holder)" -d postgres)"
other_holds() { held_by 1 && [ "$(lane_holders | cut -d' ' -f1)" != "$holder" ]; }
wait_for "6: the resting session holds all 64 lanes" 15 other_holds
co_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
      SELECT 'e', 'e-' || (g % 200), 'changed', jsonb_build_object('seq', g)
      FROM generate_series(0, 999) AS g ORDER BY g;" >/dev/null
co_unsent_none() { [ "$(co_q "SELECT count(*) FROM outbox WHERE sent_at IS NULL;")" = 0 ]; }
wait_for "6: rows inserted after the loss are sent by the session that took over" 30 co_unsent_none
psql_q "ALTER DATABASE outbox ALLOW_CONNECTIONS true" -d postgres
LOCKS_DB=()
ins_pid=$INS_PID
echo '\q' >&"${INS[1]}"
wait "$ins_pid" 2>/dev/null
check_delivered e
wait_for "6: the lost session back, one backend holds all 64 lanes" 40 held_by 1
relay_stop
check_eq "6: relay exits 0" 0 $?
check "6: no order break logged" lacks "$RELAY_LOG" "order broken"

# --- 7. out of range ---
for bad in "--sessions 2 --min-sessions 3" "--min-sessions 0" "--min-sessions 9" \
    "--session-rest-after 999"; do
    read -r -a args <<<"$bad"
    "$RELAY_BIN" run "${OPTS[@]}" "${args[@]}" >"$T/bad.out" 2>&1
    check_eq "7: $bad exits 2" 2 $?
    check_eq "7: $bad: one line" 1 "$(grep -c '' "$T/bad.out")"
    check "7: $bad: names the option" grep -q -- "${args[-2]}" "$T/bad.out"
done
check "7: min above max names both" grep -q -- "--min-sessions (3) must not exceed --sessions (2)" \
    <("$RELAY_BIN" run "${OPTS[@]}" --sessions 2 --min-sessions 3 2>&1)
