#!/bin/bash
# Proves the --on-poison policies. A poison event P (a 2 MB payload) of aggregate A sits between
# good events of A (seq 0 before it, seq 2 and 3 after it) and is followed by good events of ten
# other aggregates B*. With --max-attempts 2 --retry-backoff 200:
#  hold: P becomes dead; every B* event is delivered; A's seq 2 and 3 stay unsent while P is dead
#        (still so seconds later); after P's payload is fixed and it is requeued, A's events go
#        out after it, so A's topic shows seq 0 1 2 3 in that order;
#  skip: P becomes dead; A's seq 2 and 3 are delivered, only after P died (sent_at > dead_at);
#        P never reaches the topic, so A shows seq 0 2 3.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 3
relay_migrate 2>"$T/migrate.log" || fail "migrate"

OPTS=(--database-url "$DATABASE_URL" --brokers "$BROKERS" --max-attempts 2 --retry-backoff 200
    --kafka reconnect.backoff.max.ms=500)

# scenario TYPE: inserts A seq 0, P (seq 1, 2 MB), A seq 2, 3, then 50 events of b-0..b-9;
# prints P's id.
scenario() {
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            VALUES ('$1', 'a', 'changed', '{\"seq\": 0}')"
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            VALUES ('$1', 'a', 'changed',
                    jsonb_build_object('seq', 1, 'blob', repeat('x', 2 * 1024 * 1024)))
            RETURNING id"
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            VALUES ('$1', 'a', 'changed', '{\"seq\": 2}'), ('$1', 'a', 'changed', '{\"seq\": 3}')"
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            SELECT '$1', 'b-' || (g % 10), 'changed', jsonb_build_object('seq', g)
            FROM generate_series(0, 49) AS g ORDER BY g"
}

is_dead() {
    [ "$(psql_q "SELECT dead_at IS NOT NULL FROM outbox WHERE id = $1")" = t ]
}
is_sent() {
    [ "$(psql_q "SELECT sent_at IS NOT NULL FROM outbox WHERE id = $1")" = t ]
}
unsent() { # unsent TYPE AGG_PREFIX [EXCEPT_ID]
    psql_q "SELECT count(*) FROM outbox WHERE aggregate_type = '$1'
            AND aggregate_id LIKE '$2%' AND id <> ${3:-0} AND sent_at IS NULL"
}
none_unsent() {
    [ "$(unsent "$@")" = 0 ]
}
# a_seqs TYPE: seq values of aggregate a on TYPE's topic, first copies, in consumed order.
a_seqs() {
    consume --topic "outbox.event.$1" --to-end --timeout-ms 20000 >"$T/$1.json"
    jq -r 'select(.key == "a") | [.headers.id, (.value | fromjson | .seq)] | @tsv' "$T/$1.json" |
        awk -F '\t' '!seen[$1]++ { print $2 }' | paste -sd ' '
}

# --- hold ---
P=$(scenario hold)
relay_start "${OPTS[@]}" --on-poison hold
wait_for "hold: P becomes dead" 20 is_dead "$P"
wait_for "hold: the other aggregates' events are all delivered" 20 none_unsent hold b-
check_eq "hold: A's event before P delivered, the two after it unsent" "0|2" \
    "$(psql_q "SELECT count(*) FILTER (WHERE id < $P AND sent_at IS NULL),
                      count(*) FILTER (WHERE id > $P AND sent_at IS NULL)
               FROM outbox WHERE aggregate_type = 'hold' AND aggregate_id = 'a'")"
sleep 3
check_eq "hold: 3 s later A's later events are still held behind dead P" 2 \
    "$(psql_q "SELECT count(*) FROM outbox WHERE aggregate_type = 'hold' AND aggregate_id = 'a'
               AND id > $P AND sent_at IS NULL")"
psql_q "UPDATE outbox SET payload = '{\"seq\": 1, \"fixed\": true}' WHERE id = $P"
"$RELAY_BIN" requeue --id "$P" --database-url "$DATABASE_URL" >"$T/requeue.out" 2>&1
check_eq "hold: requeue of the fixed P exits 0" 0 $?
wait_for "hold: P delivered after the requeue" 20 is_sent "$P"
wait_for "hold: then A's later events" 20 none_unsent hold a
check_eq "hold: A's topic shows seq 0 1 2 3, P in its place" "0 1 2 3" "$(a_seqs hold)"
check "hold: every aggregate in order" first_copies_in_order "$T/hold.json"
relay_stop
check_eq "hold: relay exits 0" 0 $?

# --- skip ---
P=$(scenario skip)
relay_start "${OPTS[@]}" --on-poison skip
wait_for "skip: P becomes dead" 20 is_dead "$P"
wait_for "skip: A's later events are delivered without P" 20 none_unsent skip a "$P"
wait_for "skip: the other aggregates' events are all delivered" 20 none_unsent skip b-
check_eq "skip: P stays unsent" t "$(psql_q "SELECT sent_at IS NULL FROM outbox WHERE id = $P")"
check_eq "skip: A's later events went out only after P was dead" 2 \
    "$(psql_q "SELECT count(*) FROM outbox o, outbox p WHERE p.id = $P
               AND o.aggregate_type = 'skip' AND o.aggregate_id = 'a' AND o.id > p.id
               AND o.sent_at > p.dead_at")"
check_eq "skip: A's topic shows seq 0 2 3; P never reaches it" "0 2 3" "$(a_seqs skip)"
check "skip: every aggregate in order" first_copies_in_order "$T/skip.json"
relay_stop
check_eq "skip: relay exits 0" 0 $?
