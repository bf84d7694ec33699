#!/bin/bash
# Proves that a prepared transaction holding the lane group's locks is named as what it is. A
# transaction-level advisory lock survives PREPARE TRANSACTION: the lane stays held with no
# session at all (pg_locks shows it with a NULL pid) until someone commits or rolls the
# transaction back, and pg_terminate_backend cannot end it. On the old code the squatter look
# grouped holders by pid: two prepared transactions became one row with no pid (the gauge said 1),
# and `check` advised "SELECT pg_terminate_backend()" with nothing between the brackets.
#  A. two prepared transactions of the login stranger hold the 64 lanes, 32 each: the relay names
#     each (what=prepared-transaction, its gid, its owner, its age), counts 2, answers /readyz 503
#     and delivers nothing; status (text and --json) names both by gid; check warns of each,
#     advising ROLLBACK PREPARED 'gid' and no pg_terminate_backend.
#  B. once both are rolled back every event is delivered, the relay is ready again, and status and
#     check name none.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
export OUTBOX_TEST_GAUGE_INTERVAL_S=1 # looks every second (docs/development.md)
pg_start
psql_q "ALTER SYSTEM SET max_prepared_transactions = 4" || fail "allow prepared transactions"
pg_restart
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"
psql_q "CREATE ROLE stranger LOGIN" || fail "create the stranger's role"
STRANGER_URL=postgresql://stranger@127.0.0.1:$PGPORT/outbox
SQUAT_LINE="a prepared transaction that is not a relay holds the lane group's locks"

ready_is() { [ "$(http_code /readyz)" = "$1" ]; }
status_json() { timeout 60 "$RELAY_BIN" status --json --database-url "$DATABASE_URL"; }
run_check() { # run_check OUT
    timeout 60 "$RELAY_BIN" check --database-url "$DATABASE_URL" --brokers "$BROKERS" >"$1" 2>&1
}
# prepare GID FROM TO: the stranger takes lanes FROM..TO in a transaction it prepares as GID.
prepare() {
    psql -XAtq "$STRANGER_URL" -c "BEGIN" \
        -c "SELECT count(pg_advisory_xact_lock($LANE_NS, k)) FROM generate_series($2, $3) AS k" \
        -c "PREPARE TRANSACTION '$1'" >"$T/prepare-$1.out" 2>&1 || fail "prepare $1"
}
prepared_count() { psql_q "SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE 'squat-%'"; }
rollback_all() { # every exit path: a prepared transaction outlives its session
    local gid
    for gid in squat-a squat-b; do
        psql_q "ROLLBACK PREPARED '$gid'" >/dev/null 2>&1
    done
}

# --- A ----------------------------------------------------------------------------------------------
prepare squat-a 0 31
prepare squat-b 32 63
check_eq "A: two prepared transactions hold the 64 lanes" 2 "$(prepared_count)"
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --metrics-listen 127.0.0.1:0
metrics_wait
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'squat', 's-' || (g % 5), 'changed', jsonb_build_object('seq', g)
        FROM generate_series(1, 20) AS g ORDER BY g" || fail "insert"
for gid in squat-a squat-b; do
    wait_for "A: the relay names $gid in its log" 30 grep -Eq \
        "$SQUAT_LINE.*gid=\"$gid\" owner=\"stranger\" age_s=[0-9]+ what=prepared-transaction lanes=32 slots=0" \
        "$RELAY_LOG"
done
check "A: it counts each" metric_is outbox_lane_squatters 2
check "A: /readyz answers 503" ready_is 503
check_eq "A: nothing is delivered while every lane is held" 20 "$(unsent_rows)"
check_eq "A: each is named once" 2 "$(grep -c "$SQUAT_LINE" "$RELAY_LOG")"
timeout 60 "$RELAY_BIN" status --database-url "$DATABASE_URL" >"$T/status-a.out" 2>&1
check "A: status names both by gid" grep -Eq "^  gid:squat-a +prepared-transaction +32 .* stranger\$" \
    "$T/status-a.out"
check "A: ... both" grep -Eq "^  gid:squat-b +prepared-transaction +32 .* stranger\$" "$T/status-a.out"
check_eq "A: status --json names both, with their owner and age" \
    "null squat-a prepared-transaction stranger 32 true;null squat-b prepared-transaction stranger 32 true;" \
    "$(status_json | jq -j '.lane_squatters[] | "\(.pid) \(.gid) \(.what) \(.user) \(.lanes) \(.age_seconds >= 0);"')"
run_check "$T/check-a.out"
for gid in squat-a squat-b; do
    check "A: check warns of $gid, advising ROLLBACK PREPARED" grep -q \
        "^warn  lanes: prepared transaction '$gid' (owner stranger, prepared .* ago) .*(prepared-transaction: 32 lanes, 0 member slots).*ROLLBACK PREPARED '$gid'" \
        "$T/check-a.out"
done
check_eq "A: ... and no pg_terminate_backend" 0 "$(grep -c "SELECT pg_terminate_backend(" "$T/check-a.out")"

# --- B ----------------------------------------------------------------------------------------------
rollback_all
check_eq "B: both are rolled back" 0 "$(prepared_count)"
wait_for "B: every event is delivered" 40 no_unsent_rows
wait_for "B: the relay is ready again" 30 ready_is 200
check "B: the count is back to 0" metric_is outbox_lane_squatters 0
check_eq "B: status --json names none" "[]" "$(status_json | jq -c '.lane_squatters')"
run_check "$T/check-b.out"
check "B: check says none" grep -q \
    "^ok    lanes: no session but relays holds the lane group's locks" "$T/check-b.out"
relay_stop 30
check_eq "the relay exits 0" 0 "$?"
