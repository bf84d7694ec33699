#!/bin/bash
# Proves the claim floor (relay/engine/floor.h) follows the id's sequence when it changes under a
# running relay. First, when it is set back:
# `TRUNCATE outbox RESTART IDENTITY` (or ALTER SEQUENCE ... RESTART, setval) while a relay runs
# makes new events take ids from 1 again, far below a floor that had risen with the events sent
# before. Such rows have attempts 0, so the claims, which read below the floor only the index on
# failed rows, never found them: they stayed unsent until the relay was restarted. Now a session
# that sees the sequence's last value below what it saw before starts its floor again from 0.
#  1. 1,000 events go out in 20 transactions; the floor rises above 500.
#  2. TRUNCATE ... RESTART IDENTITY; 100 events of the same aggregates (ids 1-100) follow, in 5
#     transactions: every one is delivered, first copies in order per aggregate.
# A reset that new rows overtake before the relay looks again went unseen: the floor restarted
# only on a last value lower than at the last look, and TRUNCATE ... RESTART IDENTITY followed by
# one transaction of more rows than the old last value (while the relay slept, or as here in
# the same transaction) leaves it higher. Rows below the old floor stayed unsent until the relay
# reconnected. Now the look also reads the table's and the sequence's relfilenodes, which the
# TRUNCATE replaces.
#  2b. 1,000 more events raise the floor above 500 again; then, in one transaction, TRUNCATE ...
#     RESTART IDENTITY and 2,000 events (ids 1-2,000, past the old last value): all delivered.
# And the claim that ran on the old floor, before the look that saw the reset (its $5 was built
# before that look, even when the look ran in its own transaction), sent the new rows above that
# floor before those below it: each of the 2,000 events' aggregates (v-0..v-9, rows on both
# sides) came out of order once. Now the claim itself compares the table's and the sequence's
# relfilenodes and the sequence's last value with what the floor was computed against, and reads
# from the table's start when they differ.
#     The 2,000 events (aggregate type v) arrive in order per aggregate (checked at the end).
# Then, when it is given a cache (ALTER SEQUENCE ... CACHE 20): values are no longer drawn in
# the order of the inserts, and the floor, checked only at connect, rose past values a session
# had cached and inserted later.
#  3. A writer's session inserts one event (and caches 19 more ids), other sessions insert 1,000
#     events after it, each a block of ids above; the writer's next event takes a cached id, far
#     below them: it is delivered, and the relay says that its floor is off.
# And when the relay's role loses SELECT on it (a REVOKE, or an identity re-created with a new
# sequence): the floor's look failed on a privilege, the session gave its lanes up as for a
# broken setup, its probe (which has no floor) passed, it took them again and failed again, and
# nothing was delivered.
#  4. A relay running as a member of outbox_relay delivers; SELECT on the sequence is revoked;
#     100 more events are delivered all the same, the floor off (said), no lanes given up.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"

# insert FROM TO: events FROM..TO (seq in the payload) of aggregates r-0..r-9, one transaction.
insert() {
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            SELECT 'r', 'r-' || (s % 10), 'changed', jsonb_build_object('seq', s)
            FROM generate_series($1, $2) AS s ORDER BY s"
}
# The highest floor the relay logged so far (0: none).
floor_logged() {
    grep -o 'msg="claim floor moved" floor=[0-9]*' "$RELAY_LOG" | sed 's/.*floor=//' |
        sort -n | tail -n 1 | grep . || echo 0
}
floor_above() {
    [ "$(floor_logged)" -gt "$1" ]
}

relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --log-level debug
for i in $(seq 0 19); do
    insert $((i * 50)) $((i * 50 + 49))
    sleep 0.05
done
wait_for "the first 1,000 events are sent" 30 no_unsent_rows
# Each claim may raise the floor, so a few more (after the others were sent) bring it up.
more=1000
floor_high() {
    insert "$more" "$more"
    more=$((more + 1))
    floor_above 500
}
wait_for "the floor rises above 500" 30 floor_high
wait_for "those events are sent too" 30 no_unsent_rows

psql_q "SET lock_timeout = '10s'; TRUNCATE outbox RESTART IDENTITY" || fail "truncate"
for i in $(seq 0 4); do
    insert $((10000 + i * 20)) $((10000 + i * 20 + 19))
    sleep 0.05
done
check_eq "the new events have ids from 1" 1 "$(psql_q "SELECT min(id) FROM outbox")"
wait_for "the events after the restart of the sequence are sent" 30 no_unsent_rows
check "it said the floor starts again" grep -q 'the claim floor starts again' "$RELAY_LOG"

log_at=$(wc -l <"$RELAY_LOG")
floor_high_again() { # as floor_high, counting only what the relay logged since log_at
    insert "$more" "$more"
    more=$((more + 1))
    [ "$(tail -n +$((log_at + 1)) "$RELAY_LOG" | grep -o 'msg="claim floor moved" floor=[0-9]*' |
        sed 's/.*floor=//' | sort -n | tail -n 1 | grep . || echo 0)" -gt 500 ]
}
for i in $(seq 0 19); do
    insert $((11000 + i * 50)) $((11000 + i * 50 + 49))
    sleep 0.05
done
more=12000
wait_for "the floor rises above 500 again" 30 floor_high_again
wait_for "those events are sent" 30 no_unsent_rows
old_last=$(psql_q "SELECT last_value FROM outbox_id_seq")
log_at=$(wc -l <"$RELAY_LOG")
psql_q "SET lock_timeout = '10s'; BEGIN; TRUNCATE outbox RESTART IDENTITY;
        INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'v', 'v-' || (s % 10), 'changed', jsonb_build_object('seq', s)
        FROM generate_series(13000, 14999) AS s ORDER BY s; COMMIT" || fail "truncate and insert"
check "the sequence went past its old last value ($old_last)" \
    test "$(psql_q "SELECT last_value FROM outbox_id_seq")" -gt "$old_last"
wait_for "the events of the overtaken reset are sent, those below the old floor too" 30 \
    no_unsent_rows
check "it said the floor starts again" \
    grep -q 'the claim floor starts again' <(tail -n +$((log_at + 1)) "$RELAY_LOG")

psql_q "ALTER SEQUENCE outbox_id_seq CACHE 20" || fail "give the sequence a cache"
coproc WRITER { psql -XAtq -v ON_ERROR_STOP=1 2>&1; }
writer_pid=$WRITER_PID
_t_track "$writer_pid"
writer_insert() { # writer_insert SEQ: one event of aggregate r-0 in the writer's session, its id
    echo "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
          VALUES ('r', 'r-0', 'changed', '{\"seq\": $1}') RETURNING id;" >&"${WRITER[1]}"
    read -r -t 10 WRITER_ID <&"${WRITER[0]}" && [[ $WRITER_ID =~ ^[0-9]+$ ]]
}
writer_insert 20000 || fail "the writer inserts: $WRITER_ID"
first_cached=$WRITER_ID
for i in $(seq 0 19); do
    insert $((20001 + i * 50)) $((20001 + i * 50 + 49))
    sleep 0.05
done
wait_for "the other sessions' events are sent" 30 no_unsent_rows
writer_insert 30000 || fail "the writer inserts again: $WRITER_ID"
check "the writer's second event took a cached id, below the others" \
    test "$WRITER_ID" -eq $((first_cached + 1))
wait_for "the event with the cached id is sent" 30 no_unsent_rows
echo '\q' >&"${WRITER[1]}"
wait "$writer_pid" 2>/dev/null
relay_stop
check_eq "the relay exits 0" 0 "$?"
check "it said that the floor is off" \
    grep -q 'sequence no longer hands out its values in order' "$RELAY_LOG"

psql_q "ALTER SEQUENCE outbox_id_seq CACHE 1" || fail "take the cache back"
psql_q "CREATE ROLE relay_login LOGIN IN ROLE outbox_relay" || fail "create relay_login"
relay_start --database-url "postgresql://relay_login@127.0.0.1:$PGPORT/outbox" --brokers "$BROKERS" \
    --log-level debug
insert 40000 40049
wait_for "the least-privileged relay delivers" 30 no_unsent_rows
psql_q "REVOKE SELECT ON SEQUENCE outbox_id_seq FROM outbox_relay" || fail "revoke the sequence"
for i in $(seq 0 4); do
    insert $((40050 + i * 20)) $((40050 + i * 20 + 19))
    sleep 0.05
done
wait_for "the events after the REVOKE are delivered too" 30 no_unsent_rows
relay_stop
check_eq "the relay exits 0" 0 "$?"
check "it said that the floor is off, naming the privilege" \
    grep -q 'msg="the claim floor.s look failed; the floor is off.*permission denied' "$RELAY_LOG"
check "and gave no lanes up for it" lacks "$RELAY_LOG" 'the session gives its lanes up'

# The topic also holds the events the TRUNCATE removed: each row left must be among its messages.
consume --topic outbox.event.r --to-end --timeout-ms 30000 >"$T/r.json"
check_eq "every event after the restart is in the topic" "" \
    "$(comm -23 <(psql_q "SELECT event_id FROM outbox WHERE aggregate_type = 'r'" | sort) <(jq -r .headers.id "$T/r.json" | sort -u))"
check "first copies in order per aggregate" first_copies_in_order "$T/r.json"
check_delivered v "the events of the overtaken reset are in the topic"
