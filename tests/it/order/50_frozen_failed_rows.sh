#!/bin/bash
# Proves rows frozen long ago that still hold their aggregates back do not stall the relay once
# 2^31 transactions have passed them. A frozen row keeps its xmin (the xmin column shows it), and
# age() then calls it younger than any transaction: the claim's recheck, which looks for failed
# rows recorded after the claim's snapshot, took each such row as new. With CLAIM_RECHECK_MAX
# (1,000) of them its answer was full, and a full answer of new rows holds every aggregate of
# the batch: on the old code every claim held its whole batch, claim after claim, nothing sent
# ("the events of other aggregates are delivered" timed out, with an "events of this claim
# wait ... all=yes" line per claim).
# Set-up: 1,000 aggregates each with one dead-lettered event (--on-poison hold: they hold their
# aggregates), frozen; the server's next transaction id moved on by 2.2 billion in two steps
# (pg_resetwal -x, each step after VACUUM FREEZE of every database, as anti-wraparound vacuum
# would have done meanwhile). Checks: age() of a dead row's xmin is negative (the set-up did
# what it should), the events of 5 other aggregates are delivered, no claim held anything back,
# and the dead rows stay unsent.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"

psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, attempts,
            dead_at, last_error)
        SELECT 'fz', 'dead-' || a, 'changed', '{}', 1, now(), 'dead-lettered long ago'
        FROM generate_series(1, 1000) AS a" >/dev/null
psql_q "VACUUM FREEZE outbox" >/dev/null
first_xmin=$(psql_q "SELECT min(xmin::text::bigint) FROM outbox")

# freeze_all: VACUUM FREEZE of every database (template0 too), so the server lets transaction
# ids run on past the next step.
freeze_all() {
    local db
    psql_q "UPDATE pg_database SET datallowconn = true WHERE datname = 'template0'" >/dev/null
    for db in $(psql_q "SELECT datname FROM pg_database"); do
        psql -XAtq -v ON_ERROR_STOP=1 -d "$db" -c "VACUUM FREEZE" >>"$T/vacuum.log" 2>&1 ||
            fail "VACUUM FREEZE of $db" "$(tail -n 3 "$T/vacuum.log")"
    done
}
# next_xid XID: the server's next transaction id set to XID (stopped, pg_resetwal, started), with
# the commit log's segment for it in place (pg_resetwal does not make it).
next_xid() {
    local seg
    pg_stop
    seg=$T/pg/pg_xact/$(printf '%04X' $((($1 % 4294967296) / 1048576)))
    if [ ! -f "$seg" ]; then
        head -c 262144 /dev/zero >"$seg" || fail "make the commit log's segment"
        [ "$(id -u)" = 0 ] && chown postgres: "$seg"
    fi
    _as_pg pg_resetwal -x "$1" -D "$T/pg" >"$T/resetwal.log" 2>&1 ||
        fail "pg_resetwal -x $1" "$(cat "$T/resetwal.log")"
    pg_start
}
freeze_all
next_xid $((first_xmin + 1100000000))
freeze_all
next_xid $((first_xmin + 2200000000))
age=$(psql_q "SELECT max(age(xmin)) FROM outbox")
check "a dead row's xmin is younger than any to age() ($age)" test "$age" -lt 0

relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --sessions 1
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'fz', 'live-' || a, 'changed', '{}' FROM generate_series(1, 5) AS a" >/dev/null
live_sent() {
    [ "$(psql_q "SELECT count(*) FROM outbox WHERE aggregate_id LIKE 'live-%'
                 AND sent_at IS NULL")" = 0 ]
}
wait_for "the events of other aggregates are delivered" 30 live_sent
check_eq "no claim held anything back" 0 "$(grep -c 'events of this claim wait' "$RELAY_LOG")"
check_eq "the dead rows stay unsent" 1000 \
    "$(psql_q "SELECT count(*) FROM outbox WHERE aggregate_id LIKE 'dead-%' AND sent_at IS NULL")"
relay_stop
check_eq "the relay exits 0" 0 "$?"
