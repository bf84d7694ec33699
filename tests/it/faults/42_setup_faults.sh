#!/bin/bash
# Proves that a fault of the setup (privileges, a missing table: lib/sqlstate.h) is nobody's row's
# fault and that a relay which cannot work holds no lanes and is not ready
# (docs/guarantees.md#failure-modes):
#  A. --on-sent delete --max-attempts 2, run as a member of outbox_relay, after REVOKE DELETE ON
#     outbox FROM outbox_relay (migration 0006 itself suggests it where deletes are not used):
#     the marks fail with 42501. On main every event was dead-lettered within 8 s, 20 messages in
#     the topic. Now: the relay says once what to fix, gives its lanes up, answers /readyz 503,
#     counts no attempt and dead-letters nothing (checked 8 s after it said so); once DELETE is
#     granted again it takes lanes again, is ready, and every event is delivered, first copies in
#     order.
#  B. A relay whose role may not read the outbox, started first beside a healthy one: it holds 0
#     lanes and answers /readyz 503, the healthy one delivers every aggregate; once the role is
#     granted outbox_relay both claim, and everything is delivered.
#  C. A relay against a database that was never migrated says to run `outbox-relay migrate`.
#  D. A relay whose role may not read pg_locks (REVOKE SELECT ON pg_catalog.pg_locks FROM PUBLIC,
#     a hardening step), beside a healthy one: its look at the lane group fails with 42501. On
#     main the session took it for a passing failure: it reconnected and looked again for as long
#     as it lasted (a warning each time) and never said what to fix. Now it is a setup fault as
#     in B: said once (what="dividing the lanes", with the hint), one reconnect, 0 lanes, /readyz
#     503, and the healthy relay delivers every aggregate; once SELECT is granted again it takes
#     lanes, and all is delivered.
#  E. A relay whose role may not call pg_try_advisory_lock(integer, integer) (EXECUTE revoked from
#     PUBLIC, a hardening step as D's): its join fails with 42501, a setup fault as in D. Its
#     probe checks the lock functions too: while they stay refused it fails (said at debug level),
#     so the session neither says the setup is fixed nor joins again; on main the probe read only
#     pg_locks, passed, and after every retry backoff the session said "the setup is fixed",
#     joined, failed, said the fault again at error level and reconnected. Once EXECUTE is
#     granted again it takes lanes, and all is delivered.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
fault_setup 1
psql_q "CREATE ROLE relay_a LOGIN IN ROLE outbox_relay; CREATE ROLE relay_b LOGIN" ||
    fail "create login roles"
URL_A=postgresql://relay_a@127.0.0.1:$PGPORT/outbox
URL_B=postgresql://relay_b@127.0.0.1:$PGPORT/outbox

insert() { # insert TYPE FROM TO: one event of each of 10 aggregates per seq
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            SELECT '$1', 'a-' || a, 'changed', jsonb_build_object('seq', s)
            FROM generate_series($2, $3) AS s, generate_series(1, 10) AS a ORDER BY s, a"
}
ready_is() { # ready_is CODE: /readyz answers CODE
    [ "$(http_code /readyz)" = "$1" ]
}
SETUP_LINE="the relay cannot work with this database as it is set up"

# --- A: a revoked grant -------------------------------------------------------------------------
psql_q "REVOKE DELETE ON outbox FROM outbox_relay" || fail "A: revoke"
insert setup 1 1
relay_start --database-url "$URL_A" "${FAULT_RELAY_OPTS[@]}" --on-sent delete --max-attempts 2 \
    --retry-backoff 100 --metrics-listen 127.0.0.1:0
metrics_wait
wait_for "A: the relay says what is wrong, once" 30 grep -q "$SETUP_LINE" "$RELAY_LOG"
check "A: ... naming the failed privilege and what to do" \
    grep -q "sqlstate=42501 .*hint=\"grant the relay's role its privileges" "$RELAY_LOG"
# migrate gives DELETE only with a role's first grants: the hint names the GRANT that gives it back
# (before, it said to run migrate, which would not have).
check "A: ... with the GRANT that gives DELETE back" \
    grep -q 'hint=".*only GRANT DELETE ON public.outbox TO outbox_relay gives DELETE back' "$RELAY_LOG"
wait_for "A: it gives its lanes up" 15 metric_is outbox_lanes_owned 0
wait_for "A: and is not ready" 15 ready_is 503
check "A: /readyz says why" grep -q "claims fail until the setup is fixed" <(
    curl -s --max-time 5 "http://$METRICS/readyz"
)
sleep 8 # main dead-lettered all ten within 8 s
check_eq "A: no event is dead-lettered or counted as failed" "0 0" \
    "$(psql_q "SELECT count(*) FILTER (WHERE dead_at IS NOT NULL) || ' ' ||
                      count(*) FILTER (WHERE attempts > 0) FROM outbox")"
check_eq "A: the error is logged once for the relay" 1 "$(grep -c "level=error.*$SETUP_LINE" "$RELAY_LOG")"
psql_q "GRANT DELETE ON outbox TO outbox_relay" || fail "A: grant"
outbox_empty() {
    [ "$(psql_q "SELECT count(*) FROM outbox")" = 0 ]
}
wait_for "A: once granted, every event is delivered (and deleted)" 40 outbox_empty
wait_for "A: it is ready again" 15 ready_is 200
check "A: and says the setup is fixed" grep -q "the setup is fixed" "$RELAY_LOG"
check "A: it owns lanes again" metric_at_least outbox_lanes_owned 1
consume --topic outbox.event.setup --to-end --timeout-ms 30000 >"$T/setup.json"
check_eq "A: all ten events are in the topic" 10 "$(jq -r .headers.id "$T/setup.json" | sort -u | wc -l)"
check "A: first copies in order per aggregate" first_copies_in_order "$T/setup.json"
relay_stop
check_eq "A: the relay exits 0" 0 "$?"

# --- B: a relay that may not read the outbox beside a healthy one --------------------------------
relay_start --database-url "$URL_B" "${FAULT_RELAY_OPTS[@]}" --metrics-listen 127.0.0.1:0
BROKEN_PID=$RELAY_PID BROKEN_LOG=$RELAY_LOG
metrics_wait
BROKEN_METRICS=$METRICS
wait_for "B: the broken relay says what is wrong" 30 grep -q "$SETUP_LINE.*sqlstate=42501" "$BROKEN_LOG"
relay_start --database-url "$DATABASE_URL" "${FAULT_RELAY_OPTS[@]}" --metrics-listen 127.0.0.1:0
metrics_wait
HEALTHY_METRICS=$METRICS
insert broken 1 3
wait_for "B: the healthy relay delivers every aggregate" 40 no_unsent_rows
METRICS=$BROKEN_METRICS
check "B: the broken relay holds no lanes" metric_is outbox_lanes_owned 0
check "B: and answers /readyz 503" ready_is 503
check "B: and counts no claim session" metric_is outbox_claim_sessions 0
METRICS=$HEALTHY_METRICS
check "B: the healthy relay owns all 64 lanes" metric_is outbox_lanes_owned 64
psql_q "GRANT outbox_relay TO relay_b" || fail "B: grant"
METRICS=$BROKEN_METRICS
wait_for "B: once granted, the broken relay is ready" 40 ready_is 200
wait_for "B: and takes lanes" 20 metric_at_least outbox_lanes_owned 1
insert broken 4 6
wait_for "B: every event is delivered" 40 no_unsent_rows
check_delivered broken
relay_stop
check_eq "B: the healthy relay exits 0" 0 "$?"
RELAY_PID=$BROKEN_PID
relay_stop
check_eq "B: the once broken relay exits 0" 0 "$?"

# --- C: a database that was never migrated ------------------------------------------------------
psql_q "CREATE DATABASE bare" || fail "C: create database"
relay_start --database-url "postgresql://postgres@127.0.0.1:$PGPORT/bare" "${FAULT_RELAY_OPTS[@]}"
wait_for "C: the relay says to run migrate" 30 grep -q "42P01.*run \`outbox-relay migrate\`" "$RELAY_LOG"
relay_stop
check_eq "C: the relay exits 0" 0 "$?"

# --- D: a relay whose role may not read pg_locks, beside a healthy one -------------------------
psql_q "CREATE ROLE relay_d LOGIN IN ROLE outbox_relay" || fail "D: create the login role"
psql_q "REVOKE SELECT ON pg_catalog.pg_locks FROM PUBLIC" || fail "D: revoke"
relay_start --database-url "postgresql://relay_d@127.0.0.1:$PGPORT/outbox" "${FAULT_RELAY_OPTS[@]}" \
    --sessions 1 --metrics-listen 127.0.0.1:0
BROKEN_PID=$RELAY_PID BROKEN_LOG=$RELAY_LOG
metrics_wait
BROKEN_METRICS=$METRICS
wait_for "D: the relay says what is wrong" 30 \
    grep -q "$SETUP_LINE.* what=\"dividing the lanes\" sqlstate=42501 " "$BROKEN_LOG"
relay_start --database-url "$DATABASE_URL" "${FAULT_RELAY_OPTS[@]}" --metrics-listen 127.0.0.1:0
metrics_wait
HEALTHY_METRICS=$METRICS
insert locks 1 3
wait_for "D: the healthy relay delivers every aggregate" 40 no_unsent_rows
METRICS=$HEALTHY_METRICS
check "D: the healthy relay owns all 64 lanes" metric_is outbox_lanes_owned 64
METRICS=$BROKEN_METRICS
check "D: the relay that may not read pg_locks holds no lanes" metric_is outbox_lanes_owned 0
check "D: and answers /readyz 503" ready_is 503
# One reset gives up what the failed look may have left held; then it probes, connected.
check_eq "D: and reconnected once, not after every look" 1 \
    "$(grep -c 'msg="postgres connection lost"' "$BROKEN_LOG")"
check_eq "D: said once" 1 "$(grep -c "$SETUP_LINE" "$BROKEN_LOG")"
psql_q "GRANT SELECT ON pg_catalog.pg_locks TO PUBLIC" || fail "D: grant"
wait_for "D: once granted, the relay is ready" 40 ready_is 200
wait_for "D: and takes lanes" 20 metric_at_least outbox_lanes_owned 1
insert locks 4 6
wait_for "D: every event is delivered" 40 no_unsent_rows
check_delivered locks
relay_stop
check_eq "D: the healthy relay exits 0" 0 "$?"
RELAY_PID=$BROKEN_PID
relay_stop
check_eq "D: the once refused relay exits 0" 0 "$?"

# --- E: a relay whose role may not call the advisory lock functions ----------------------------
psql_q "REVOKE EXECUTE ON FUNCTION pg_catalog.pg_try_advisory_lock(integer, integer) FROM PUBLIC" ||
    fail "E: revoke"
relay_start --database-url "postgresql://relay_d@127.0.0.1:$PGPORT/outbox" "${FAULT_RELAY_OPTS[@]}" \
    --sessions 1 --metrics-listen 127.0.0.1:0 --log-level debug
metrics_wait
wait_for "E: the relay says what is wrong" 30 \
    grep -q "level=error.*$SETUP_LINE.* what=\"dividing the lanes\" sqlstate=42501 " "$RELAY_LOG"
probes_refused() { # three probes after it, each refused by the lock function's privilege
    [ "$(grep -c "level=debug.*$SETUP_LINE.*permission denied for function pg_try_advisory_lock" \
        "$RELAY_LOG")" -ge 3 ]
}
wait_for "E: its probes are refused while the privilege is" 60 probes_refused
check_eq "E: it never says the setup is fixed meanwhile" 0 \
    "$(grep -c 'the setup is fixed' "$RELAY_LOG")"
check_eq "E: nor the fault again" 1 "$(grep -c "level=error.*$SETUP_LINE" "$RELAY_LOG")"
check_eq "E: and reconnected once" 1 "$(grep -c 'msg="postgres connection lost"' "$RELAY_LOG")"
check "E: holds no lanes" metric_is outbox_lanes_owned 0
check "E: and answers /readyz 503" ready_is 503
psql_q "GRANT EXECUTE ON FUNCTION pg_catalog.pg_try_advisory_lock(integer, integer) TO PUBLIC" ||
    fail "E: grant"
wait_for "E: once granted, the relay is ready" 40 ready_is 200
wait_for "E: and takes every lane" 20 metric_is outbox_lanes_owned 64
insert lockfn 1 3
check_delivered lockfn
relay_stop
check_eq "E: the relay exits 0" 0 "$?"
