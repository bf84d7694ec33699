#!/bin/bash
# Proves the relay's own commits wait neither for the WAL flush nor for a synchronous standby
# (relay/io/pg.c, setup_sql). The primary's synchronous_standby_names names its
# streaming standby, which then freezes (SIGSTOP, as a host that stops answering without closing
# anything): a producer committing on the server's setting waits (seen waiting on SyncRep). Then:
#  1. rows producers commit with synchronous_commit = local are delivered, first copies in order
#     per aggregate, and marked sent: the sessions' commits (claims, marks) do not wait;
#  2. --retention deletes them once sent: the upkeep connection's commits do not wait either;
#  3. rows committed later are delivered too: the relay goes on claiming (and, as the producer
#     waiting mid-commit may still add rows, does not fall asleep but polls: wakeup.h);
#  4. a batch that records a failure (a row whose aggregate type names no legal topic) does not
#     wait for the standby either (it waits for the local flush only: statements.h);
#  5. once the standby answers again, the producer that waited commits and its row is delivered;
#  6. with the standby frozen again, a relay whose URL sets synchronous_commit (options) keeps it:
#     its commits wait, its rows stay unmarked until the standby answers;
#  7. replay's COMMIT, which waits for the frozen standby as the server is set, is given up after
#     30 s with exit 1, a line saying the batch's outcome is unknown and how to find it out, and
#     the bounds of the rest; the COMMIT is left waiting on the server (not turned into a local
#     commit) and completes once the standby answers;
#  8. so do requeue's and purge-dead's batches (each a statement in its own transaction): given
#     up after admin_query's 35 s with exit 1, a line saying the batch's outcome is unknown and
#     how to find it out (not "PostgreSQL did not answer" alone), the count done before it; the
#     commit is left waiting and completes once the standby answers. Parts 7 and 8 run at once,
#     under one freeze of the standby.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
# shellcheck source=tests/netns_lib.sh
source "$(dirname "$0")/../../netns_lib.sh"
t_setup
fault_init
fault_setup 1

# insert_local TYPE FROM TO: rows over 10 aggregates, seq growing with id, committed without
# waiting for the standby; their event ids are appended to $T/TYPE.ids.
insert_local() {
    PGOPTIONS='-c synchronous_commit=local' psql_q "
        INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT '$1', '$1-' || (g % 10), 'changed', jsonb_build_object('seq', g)
        FROM generate_series($2, $3) AS g ORDER BY g RETURNING event_id" >>"$T/$1.ids"
}
# delivered TYPE: every event id of $T/TYPE.ids is in Kafka, first copies in order per aggregate.
delivered() {
    local file=$T/$1.json
    consume --topic "outbox.event.$1" --to-end --timeout-ms 30000 >"$file"
    check "$2: every row delivered" diff <(jq -r .headers.id "$file" | sort -u) <(sort "$T/$1.ids")
    check "$2: first copies in order per aggregate" first_copies_in_order "$file"
}
producer_waits_for_standby() {
    [ "$(psql_q "SELECT count(*) FROM pg_stat_activity
                 WHERE wait_event = 'SyncRep' AND query LIKE 'INSERT INTO outbox%'")" = 1 ]
}
no_rows_of() {
    [ "$(rows_of "$1")" = 0 ]
}

standby_start
check_eq "the standby is in recovery" t "$(psql_q "SELECT pg_is_in_recovery()" -p "$SB_PORT")"
standby_make_synchronous
wait_for "the standby is synchronous" 30 sync_standby

# freeze_standby: SIGSTOP to the standby's postmaster, then to its children (read now: a
# walreceiver the primary timed out is started anew, with another pid).
freeze_standby() {
    local postmaster
    postmaster=$(head -n 1 "$SB/postmaster.pid")
    stop_pid "$postmaster"
    SB_PIDS="$postmaster $(pgrep -P "$postmaster" | tr '\n' ' ')"
    for pid in $SB_PIDS; do
        [ "$pid" = "$postmaster" ] || stop_pid "$pid"
    done
}
continue_standby() {
    for pid in $SB_PIDS; do
        cont_pid "$pid"
    done
}
# relay_waits_for_standby: a session of the relay waits for the standby at a commit.
relay_waits_for_standby() {
    [ "$(psql_q "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'
                 AND application_name LIKE 'outbox-relay session-%'")" -gt 0 ]
}
attempts_of() {
    psql_q "SELECT attempts FROM outbox WHERE aggregate_type = '$1'"
}

freeze_standby
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        VALUES ('waited', 'waited-1', 'changed', '{\"seq\": 1}') RETURNING event_id" \
    >"$T/waited.ids" 2>"$T/waited.err" &
WAITED_PID=$!
wait_for "a producer on the server's synchronous_commit waits for the frozen standby" 30 \
    producer_waits_for_standby

# --- 1. and 2. ---
insert_local a 1 200
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --retention 2s
wait_for "1: the rows are marked sent (or deleted once sent)" 60 none_unsent_of a
delivered a 1
wait_for "2: retention deletes the sent rows" 60 no_rows_of a

# --- 3. ---
insert_local b 1 20
wait_for "3: later rows are marked sent (or deleted once sent)" 30 none_unsent_of b
delivered b 3
check "1-3: the standby was still frozen" producer_waits_for_standby
check "1-3: the relay logged no error" lacks "$RELAY_LOG" 'level=error'

# --- 4. --- An aggregate type no topic may be named after: the relay fails the row.
insert_local 'bad type' 1 1
recorded() { [ "$(attempts_of 'bad type')" -ge 1 ]; }
wait_for "4: a failure is recorded, its commit not waiting for the standby" 30 recorded
no_session_waits() { ! relay_waits_for_standby; }
check "4: no session of the relay waits for the standby" no_session_waits
check "4: the standby was still frozen" producer_waits_for_standby

# --- 5. ---
continue_standby
wait_for "5: the waiting producer commits once the standby answers" 60 _t_dead "$WAITED_PID"
wait "$WAITED_PID"
check_eq "5: its INSERT succeeded" 0 "$?"
wait_for "5: its row is marked sent (or deleted once sent)" 30 none_unsent_of waited
delivered waited 5
PGOPTIONS='-c synchronous_commit=local' psql_q "DELETE FROM outbox WHERE aggregate_type = 'bad type'"
relay_stop
check_eq "5: the relay exits 0 on SIGTERM" 0 "$?"

# --- 6. ---
wait_for "6: the standby is synchronous again" 60 sync_standby
freeze_standby
relay_start --database-url "$DATABASE_URL?options=-c%20synchronous_commit%3Don" --brokers "$BROKERS"
insert_local c 1 20
wait_for "6: a relay whose URL sets synchronous_commit waits for the standby at its commits" 30 \
    relay_waits_for_standby
check_eq "6: meanwhile its rows are not marked sent" 20 "$(unsent_of c)"
continue_standby
wait_for "6: they are once the standby answers" 30 none_unsent_of c
delivered c 6
relay_stop
check_eq "6: the relay exits 0 on SIGTERM" 0 "$?"

# --- 7. and 8. ---
# replay's batches, and requeue's and purge-dead's (each a statement in its own transaction),
# commit as the server is set (a replay the standby never got would be lost at a failover): their
# COMMITs wait for the frozen standby. They used to wait as long as the standby stayed frozen,
# saying nothing; `timeout` stands in for the operator who gives up. The three run at once under
# one freeze: each gives up after its own bound (30 s, 35 s), which they spend side by side.
wait_for "7: the standby is synchronous again" 60 sync_standby
PGOPTIONS='-c synchronous_commit=local' psql_q "
    INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
    SELECT 'replayed', 'replayed-' || (g % 3), 'changed', jsonb_build_object('seq', g), now()
    FROM generate_series(1, 5) AS g ORDER BY g"
PGOPTIONS='-c synchronous_commit=local' psql_q "
    INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, attempts, dead_at)
    VALUES ('requeued', 'requeued-1', 'changed', '{\"seq\": 1}', 1, now()),
           ('purged', 'purged-1', 'changed', '{\"seq\": 1}', 1, now())"
dead_of() { psql_q "SELECT count(*) FROM outbox WHERE aggregate_type = '$1' AND dead_at IS NOT NULL"; }
none_dead_of() { [ "$(dead_of "$1")" = 0 ]; }
none_sent_of() { [ "$(sent_of "$1")" = 0 ]; }
# commands_wait N: N sessions of the commands (application_name outbox-relay) wait on SyncRep.
commands_wait() {
    [ "$(psql_q "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'
                 AND application_name = 'outbox-relay'")" = "$1" ]
}
requeued_id=$(psql_q "SELECT id FROM outbox WHERE aggregate_type = 'requeued'")
purged_id=$(psql_q "SELECT id FROM outbox WHERE aggregate_type = 'purged'")
freeze_standby
(
    timeout -k 5 120 "$RELAY_BIN" replay --database-url "$DATABASE_URL" \
        --aggregate-type replayed >"$T/replay.out" 2>"$T/replay.err"
    echo $? >"$T/replay.rc"
) &
replay_job=$!
(
    timeout -k 5 120 "$RELAY_BIN" requeue --database-url "$DATABASE_URL" --id "$requeued_id" \
        >"$T/requeue.out" 2>"$T/requeue.err"
    echo $? >"$T/requeue.rc"
) &
requeue_job=$!
(
    timeout -k 5 120 "$RELAY_BIN" purge-dead --database-url "$DATABASE_URL" --id "$purged_id" \
        >"$T/purge-dead.out" 2>"$T/purge-dead.err"
    echo $? >"$T/purge-dead.rc"
) &
purge_job=$!
wait "$replay_job" "$requeue_job" "$purge_job"
check_eq "7: replay gives up on a COMMIT the frozen standby holds: exit 1" 1 "$(cat "$T/replay.rc")"
check "7: ... saying the batch's outcome is unknown, and how to find it out" grep -q \
    'level=error msg="a batch.s COMMIT got no verdict: whether that batch was replayed is unknown.*wait_event SyncRep.*replay --dry-run' \
    "$T/replay.err"
check "7: ... its last line gives the bounds of the rest" grep -q \
    '^replay: 0 events replayed before the batch whose outcome is unknown; to replay the rest, run it again with --to-id' \
    "$T/replay.out"
for cmd in requeue purge-dead; do
    type=$([ "$cmd" = requeue ] && echo requeued || echo purged)
    id=$([ "$cmd" = requeue ] && echo "$requeued_id" || echo "$purged_id")
    check_eq "8: $cmd gives up on a commit the frozen standby holds: exit 1" 1 "$(cat "$T/$cmd.rc")"
    check "8: ... in one line saying the batch's outcome is unknown, and how to find it out" grep -q \
        "level=error msg=\"a batch got no verdict from PostgreSQL: whether its events were changed is unknown.*wait_event SyncRep.*\`dead\` lists.*command=$cmd batch=\"id $id, up to 1\"" \
        "$T/$cmd.err"
    check_eq "8: ... one line on stderr" 1 "$(grep -c '' "$T/$cmd.err")"
    check "8: ... its last line says what was done before that batch" grep -q \
        "^$type 0 events before the batch whose outcome is unknown" "$T/$cmd.out"
    check_eq "8: ... so its row is still dead-lettered" 1 "$(dead_of "$type")"
done
check "7, 8: the three COMMITs still wait on the server, not cancelled into local commits" \
    commands_wait 3
check_eq "7: ... so replay's rows are not unsent yet" 0 "$(unsent_of replayed)"
continue_standby
wait_for "7: once the standby answers, the replay's batch commits: its rows are unsent" 30 \
    none_sent_of replayed
wait_for "8: once the standby answers, the requeue commits" 30 none_dead_of requeued
wait_for "8: once the standby answers, the purge commits" 30 no_rows_of purged
