#!/bin/bash
# Proves claims cost what they return, not the dead row versions an old snapshot keeps, and that
# the claim floor that makes it so (relay/engine/floor.h) neither loses nor reorders an event
# (docs/architecture.md#the-claim-and-its-floor). Another client holds a REPEATABLE READ
# snapshot for the whole test, so no marked row's old version can be vacuumed away.
#  A. 20,000 events are sent (20,000 dead versions in the unsent index). Then 1,000 more arrive
#     in 20 transactions: the claims' buffer accesses per claim (pg_stat_statements) stay below
#     a fourth of the pages that history fills with the floor (the default), and are above
#     that with --claim-floor off, the claim of before (so the check can fail).
#  B. A transaction inserts event 1 of aggregate 'late' and stays open while 1,000 events of
#     other aggregates go out: the floor never passes its row while it is open. It commits, event
#     2 follows: both are delivered, in order; then the floor passes them.
#  C. With --on-poison skip, a poison event (2 MB) dies, 2,000 events go out and the floor passes
#     it; fixed and requeued, it is claimed from below the floor and delivered.
#  D. An id given by hand far above the sequence (OVERRIDING SYSTEM VALUE): the floor is not
#     lifted over the events drawn after it; all are delivered.
#  E. Five events of part A replayed by hand (sent_at cleared): sent again, found below the floor.
#  F. An event below the floor made unsent again by a session with session_replication_role =
#     replica (logical replication's apply workers, pglogical, loaders), then the next event of
#     its aggregate inserted: the trigger of 0008 fires there too (enabled ALWAYS), so the event
#     is claimed from below the floor and published before the next one, with one session
#     (--sessions 1: no lanes move, so nothing else starts the floor again from 0).
#  G. The id's sequence given a cache (values no longer drawn in order): the relay says so once
#     and keeps its floor at 0; events still go out.
# Every event of every part is delivered, first copies in order per aggregate.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
echo "shared_preload_libraries = 'pg_stat_statements'" >>"$T/pg/postgresql.conf"
pg_restart
psql_q "CREATE EXTENSION pg_stat_statements" >/dev/null || fail "pg_stat_statements"
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"

OPTS=(--database-url "$DATABASE_URL" --brokers "$BROKERS" --log-level debug
    --kafka reconnect.backoff.max.ms=500)

# Every event is of type 'f' (topic outbox.event.f, checked once at the end); each part has
# aggregates of its own.
# insert PREFIX FROM TO [AGGREGATES]: events FROM..TO (seq in the payload) of aggregates
# PREFIX-0.. round robin over AGGREGATES of them (default 50), one transaction.
insert() {
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            SELECT 'f', '$1-' || (s % ${4:-50}), 'changed', jsonb_build_object('seq', s)
            FROM generate_series($2, $3) AS s ORDER BY s"
}
# trickle PREFIX: 1,000 events in 20 transactions, each a claim or so apart.
trickle() {
    local i
    for i in $(seq 0 19); do
        insert "$1" $((i * 50)) $((i * 50 + 49))
        sleep 0.05
    done
}
# one VALUES_SQL: a single event (aggregate, seq) inserted, its id printed.
one() {
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) $1 RETURNING id"
}
# The claim's buffer accesses per call since the last reset (pg_stat_statements).
claim_cost() {
    psql_q "SELECT (sum(shared_blks_hit + shared_blks_read) / greatest(sum(calls), 1))::bigint
            FROM pg_stat_statements WHERE query LIKE '%above AS (SELECT%'"
}
# The highest floor the relay logged so far (0: none).
floor_logged() {
    grep -o 'msg="claim floor moved" floor=[0-9]*' "$RELAY_LOG" | sed 's/.*floor=//' |
        sort -n | tail -n 1 | grep . || echo 0
}

old_snapshot_open
_poll 10 old_snapshot_held || fail "another client holds a snapshot"

# --- A: the cost of a claim after a dead history ---
insert h 1 20000 1000
relay_start "${OPTS[@]}"
wait_for "20,000 events are sent behind the old snapshot" 90 no_unsent_rows
psql_q "SELECT pg_stat_statements_reset()" >/dev/null
trickle n
wait_for "1,000 more are sent" 60 no_unsent_rows
with_floor=$(claim_cost)
relay_stop
check_eq "the relay exits 0" 0 "$?"
relay_start "${OPTS[@]}" --claim-floor off
psql_q "SELECT pg_stat_statements_reset()" >/dev/null
trickle o
wait_for "1,000 more are sent with --claim-floor off" 60 no_unsent_rows
without_floor=$(claim_cost)
relay_stop
echo "# buffer accesses per claim: $with_floor with the floor, $without_floor without"
# The history fills about 450 pages (the heap's and the unsent index's): a claim that walks it
# touches each of them; one that starts at the floor touches the few its rows are on.
check "with the floor, a claim touches fewer than 100 buffers (a fourth of the history)" \
    test "$with_floor" -lt 100
check "without it, more: the check can fail" test "$without_floor" -ge 100

# --- B: a row committed behind the rows already sent ---
relay_start "${OPTS[@]}"
# The writer's transaction stays open until the floor is checked (a coprocess, not a sleep: on a
# loaded machine a fixed sleep could end before the other aggregates were sent).
coproc WRITER { psql -XAtq -v ON_ERROR_STOP=1 2>&1; }
writer_pid=$WRITER_PID
_t_track "$writer_pid"
echo "BEGIN; INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
      VALUES ('f', 'late', 'changed', '{\"seq\": 1}') RETURNING id;" >&"${WRITER[1]}"
read -r -t 10 LATE <&"${WRITER[0]}" || fail "the open transaction inserted its event"
[[ $LATE =~ ^[0-9]+$ ]] || fail "the open transaction inserted its event: $LATE"
trickle b
others_sent() {
    [ "$(psql_q "SELECT count(*) FROM outbox WHERE aggregate_id LIKE 'b-%'
                 AND sent_at IS NULL")" = 0 ]
}
wait_for "the other aggregates' events are sent while the transaction is open" 30 others_sent
held=$(floor_logged)
check "the floor stays at or below the open transaction's row ($LATE) while it is open" \
    test "$held" -le "$LATE"
echo "COMMIT;" >&"${WRITER[1]}"
echo '\q' >&"${WRITER[1]}"
wait "$writer_pid" 2>/dev/null
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        VALUES ('f', 'late', 'changed', '{\"seq\": 2}')" >/dev/null
wait_for "both events of the late aggregate are sent" 30 no_unsent_rows
trickle bl
wait_for "later events are sent" 30 no_unsent_rows
passed() {
    [ "$(floor_logged)" -gt "$LATE" ]
}
wait_for "then the floor passes the late row" 30 passed
relay_stop
check_eq "the relay exits 0" 0 "$?"

# --- C: a dead event below the floor, requeued ---
relay_start "${OPTS[@]}" --on-poison skip --max-attempts 2 --retry-backoff 200
POISON=$(psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
                 VALUES ('f', 'poison', 'changed',
                         jsonb_build_object('seq', 1, 'blob', repeat('x', 2 * 1024 * 1024)))
                 RETURNING id")
is_dead() {
    [ "$(psql_q "SELECT dead_at IS NOT NULL FROM outbox WHERE id = $POISON")" = t ]
}
wait_for "the poison event dies" 30 is_dead
trickle cp
trickle cp2
past_poison() {
    [ "$(floor_logged)" -gt "$POISON" ]
}
wait_for "the floor passes the dead event" 30 past_poison
psql_q "UPDATE outbox SET payload = '{\"seq\": 1}' WHERE id = $POISON" >/dev/null
"$RELAY_BIN" requeue --database-url "$DATABASE_URL" --id "$POISON" >"$T/requeue.out" 2>&1
check_eq "requeue exits 0" 0 "$?"
wait_for "the requeued event is claimed from below the floor and sent" 30 no_unsent_rows

# --- D: an id given by hand, far above the sequence ---
psql_q "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
        OVERRIDING SYSTEM VALUE VALUES (1000000000000, 'f', 'hand', 'changed', '{\"seq\": 1}')" \
    >/dev/null
trickle dh
trickle dh2
wait_for "the events drawn after it are sent too" 30 no_unsent_rows
check "the floor stays below the sequence (not lifted by the id given by hand)" \
    test "$(floor_logged)" -lt 1000000000000

# --- E: events replayed by hand, far below the floor ---
psql_q "UPDATE outbox SET sent_at = NULL WHERE id <= 5" >/dev/null
wait_for "the replayed events are sent again" 30 no_unsent_rows
check_eq "the trigger of 0008 counted them as tried once" 5 \
    "$(psql_q "SELECT count(*) FROM outbox WHERE id <= 5 AND attempts = 1")"
replayed_twice() {
    consume --topic outbox.event.f --to-end --timeout-ms 30000 >"$T/replayed.json"
    [ "$(psql_q "SELECT event_id FROM outbox WHERE id <= 5" | sort |
        comm -12 - <(jq -r .headers.id "$T/replayed.json" | sort | uniq -d) | wc -l)" = 5 ]
}
check "each replayed event is in the topic twice" replayed_twice
relay_stop
check_eq "the relay exits 0" 0 "$?"

# --- F: an event made unsent again by a replicating session ---
# A trigger enabled the ordinary way does not fire in a session with session_replication_role =
# replica: 0008's left such a row with attempts 0 below the floor, on neither index the claims
# read, and the next event of its aggregate, above the floor, went out first; the row waited until
# the floor started again from 0 (a reconnect, lanes gained). Enabled ALWAYS, it fires there too.
relay_start "${OPTS[@]}" --sessions 1
check_eq "F: the floor's trigger fires in replica sessions too" A \
    "$(psql_q "SELECT tgenabled FROM pg_trigger WHERE tgname = 'outbox_floor_visible'
               AND tgrelid = 'outbox'::regclass")"
REP=$(one "VALUES ('f', 'rep', 'changed', '{\"seq\": 1}')")
[[ $REP =~ ^[0-9]+$ ]] || fail "F: the event is inserted: $REP"
trickle g
past_rep() {
    [ "$(floor_logged)" -gt "$REP" ]
}
wait_for "F: the floor passes the event" 30 past_rep
psql_q "SET session_replication_role = replica; UPDATE outbox SET sent_at = NULL WHERE id = $REP" \
    >/dev/null || not_ok "F: a replicating session makes the event unsent again"
check_eq "F: the trigger counted it as tried once" 1 \
    "$(psql_q "SELECT attempts FROM outbox WHERE id = $REP")"
NEXT=$(one "VALUES ('f', 'rep', 'changed', '{\"seq\": 2}')")
[[ $NEXT =~ ^[0-9]+$ ]] || fail "F: the next event is inserted: $NEXT"
wait_for "F: the event and the next of its aggregate are sent" 30 no_unsent_rows
# The aggregate's messages in the topic, by event: the first copy, the replayed one, then the next.
rep_order() {
    consume --topic outbox.event.f --to-end --timeout-ms 30000 |
        jq -r 'select(.key == "rep") | .headers.id' >"$T/rep.ids"
    diff "$T/rep.ids" <(psql_q "SELECT event_id FROM outbox, (VALUES (1, $REP), (2, $REP),
                                (3, $NEXT)) AS w(k, row_id) WHERE id = w.row_id ORDER BY w.k")
}
check "F: the replayed event is published again before the next one of its aggregate" rep_order
relay_stop
check_eq "the relay exits 0" 0 "$?"

# --- G: a sequence that does not hand out values in order ---
# (the snapshot's holder read the table: ALTER TABLE would wait for it)
old_snapshot_close
psql_q "SET lock_timeout = '10s'; ALTER TABLE outbox ALTER COLUMN id SET CACHE 20" >/dev/null ||
    fail "give the sequence a cache"
relay_start "${OPTS[@]}"
trickle cc
wait_for "events go out" 30 no_unsent_rows
relay_stop
check_eq "the relay exits 0" 0 "$?"
check_eq "it says once that claims read from the index's start" 1 \
    "$(grep -c 'claims read the unsent index from its start' "$RELAY_LOG")"
check "and its floor never moves" lacks "$RELAY_LOG" 'claim floor moved'
check_delivered f "every event of every part is delivered"
