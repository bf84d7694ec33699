#!/bin/bash
# Proves that a session which is not a relay cannot stall delivery silently by taking the lane
# group's advisory locks (advisory locks need no privilege; on main a login with no grants at all
# took the 64 lane locks: 20 of 20 new events unsent after 30 s, /readyz 200, nothing logged):
#  A. a stranger (a login with no grants) holds all 64 lane locks: the relay names it in the log
#     (pid, what it holds), counts it (outbox_lane_squatters), answers /readyz 503, delivers
#     nothing meanwhile; once the stranger's session ends, every event is delivered, the relay is
#     ready again and says so.
#  B. a stranger holds eight member slots (no relay holds more than one): named, counted, 503,
#     and ready again once it lets them go.
#  C. the same while a table lock makes the backlog count slow: ready again within 30 s of the
#     stranger leaving (the looks no longer wait for the count's pace).
#  D. a stranger holds the away and trying mark locks of every member slot (a relay's marks are
#     its own slot's only): a relay that could not reach Kafka could not mark itself away and
#     would keep its lanes, their rows timing out, while other relays reach Kafka. Named
#     (what=stray-marks), 503, and ready again once it lets them go (on the old code nothing: the
#     look read member and lane locks only).
#  E. a stranger holds one member slot and no lanes: the relays leave it its share of the lanes,
#     which no one claims. Named (what=slot-without-lanes, at two looks in a row: a relay joining
#     holds its slot without lanes for a moment), 503, ready again once it lets go.
# In A, D and E `status` (text and --json) and `check` name the stranger too (pid, what, role; check
# as a warn line saying what to do), and say none once it has gone: before, only a relay with
# --metrics-listen did, and status listed the relays' sessions alone.
#  F. the marks of D held while the relay's Kafka is down: it wants its away mark and is refused;
#     its own log says so, naming the holder's pid, once a session (on the old code it said
#     nothing), and every event goes out once Kafka is back and the stranger gone.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
# The relay looks every second, not every 5 s (a test build's knob, docs/development.md): the
# waits below are for its looks, and each waited out up to 5 s of a tick; the looks are the same.
export OUTBOX_TEST_GAUGE_INTERVAL_S=1
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"
psql_q "CREATE ROLE stranger LOGIN" || fail "create the stranger's role"
STRANGER_URL=postgresql://stranger@127.0.0.1:$PGPORT/outbox
SQUAT_LINE="a session that is not a relay holds the lane group's locks"

ready_is() { # ready_is CODE: /readyz answers CODE
    [ "$(http_code /readyz)" = "$1" ]
}
insert() { # insert FROM TO
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            SELECT 'squat', 's-' || (g % 5), 'changed', jsonb_build_object('seq', g)
            FROM generate_series($1, $2) AS g ORDER BY g"
}
# squat NS FROM TO OUT: the stranger takes locks (NS, FROM..TO), prints its pid, then holds them
# for 60 s (or until terminated).
squat() {
    psql -XAtq "$STRANGER_URL" -c "SELECT pg_backend_pid()" \
        -c "SELECT count(pg_advisory_lock($1, k)) FROM generate_series($2, $3) AS k" \
        -c "SELECT pg_sleep(60)" >"$4" 2>&1 &
    SQUATTER=$!
    _t_track "$SQUATTER"
}
status_json() { timeout 60 "$RELAY_BIN" status --json --database-url "$DATABASE_URL"; }
# commands_name PART PID WHAT: status, status --json and check name the session PID as WHAT.
commands_name() {
    local part=$1 pid=$2 what=$3
    timeout 60 "$RELAY_BIN" status --database-url "$DATABASE_URL" >"$T/status-$part.out" 2>&1
    check "$part: status names it" grep -Eq "^  $pid +$what +.* stranger\$" "$T/status-$part.out"
    check "$part: ... under a line that says what it does" grep -q \
        "^lane squatters: 1 session that is not a relay holds the lane group's locks" \
        "$T/status-$part.out"
    check_eq "$part: status --json names it" "$pid $what stranger" \
        "$(status_json | jq -r '.lane_squatters[] | "\(.pid) \(.what) \(.user)"')"
    timeout 60 "$RELAY_BIN" check --database-url "$DATABASE_URL" --brokers "$BROKERS" \
        >"$T/check-$part.out" 2>&1
    check "$part: check warns of it, saying what to do" grep -q \
        "^warn  lanes: session pid $pid (role stranger, .*($what: .*pg_terminate_backend($pid)" \
        "$T/check-$part.out"
}
# commands_name_none PART: status --json and check say that no session squats.
commands_name_none() {
    check_eq "$1: status --json names none" "[]" "$(status_json | jq -c '.lane_squatters')"
    timeout 60 "$RELAY_BIN" check --database-url "$DATABASE_URL" --brokers "$BROKERS" \
        >"$T/check-$1-none.out" 2>&1
    check "$1: check says none" grep -q \
        "^ok    lanes: no session but relays holds the lane group's locks" "$T/check-$1-none.out"
}
holds() { # holds OUT: the squat's locks are taken
    [ "$(sed -n 2p "$1")" != "" ]
}
end_squat() { # end_squat OUT
    psql_q "SELECT pg_terminate_backend($(head -n 1 "$1"))" >/dev/null
    wait "$SQUATTER" 2>/dev/null
}

# --- A: every lane lock ---------------------------------------------------------------------------
squat "$LANE_NS" 0 63 "$T/squat-a.out"
_poll 10 holds "$T/squat-a.out" || fail "A: the stranger holds the 64 lane locks"
A_PID=$(head -n 1 "$T/squat-a.out")
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --metrics-listen 127.0.0.1:0 \
    --kafka reconnect.backoff.max.ms=500 --delivery-timeout 2000
metrics_wait
insert 1 20
wait_for "A: the relay names the stranger in its log" 30 \
    grep -q "$SQUAT_LINE.*pid=$A_PID what=lanes-without-slot lanes=64 slots=0 role=\"stranger\"" \
    "$RELAY_LOG"
check "A: it counts it" metric_at_least outbox_lane_squatters 1
check "A: /readyz answers 503" ready_is 503
check "A: outbox_ready says so" metric_is outbox_ready 0
check "A: ... saying why" grep -q "sessions that are not relays hold lane locks" <(
    curl -s --max-time 5 "http://$METRICS/readyz"
)
check_eq "A: nothing is delivered while every lane is held" 20 "$(unsent_rows)"
check_eq "A: the stranger is named once" 1 "$(grep -c "$SQUAT_LINE.*pid=$A_PID " "$RELAY_LOG")"
commands_name A "$A_PID" lanes-without-slot
end_squat "$T/squat-a.out"
wait_for "A: once it is gone every event is delivered" 40 no_unsent_rows
wait_for "A: the relay is ready again" 30 ready_is 200
check "A: and says the locks are free" grep -q "no session but relays holds the lane group's locks" \
    "$RELAY_LOG"
check "A: the count is back to 0" metric_is outbox_lane_squatters 0
check "A: outbox_ready is back to 1" metric_is outbox_ready 1
commands_name_none A

# --- B: member slots ---------------------------------------------------------------------------------
squat "$MEMBER_NS" 100 107 "$T/squat-b.out"
_poll 10 holds "$T/squat-b.out" || fail "B: the stranger holds eight member slots"
B_PID=$(head -n 1 "$T/squat-b.out")
wait_for "B: the relay names it" 30 \
    grep -q "$SQUAT_LINE.*pid=$B_PID what=several-slots lanes=0 slots=8" "$RELAY_LOG"
check "B: /readyz answers 503" ready_is 503
end_squat "$T/squat-b.out"
wait_for "B: ready again once it lets them go" 30 ready_is 200
insert 21 30
wait_for "B: events go out" 30 no_unsent_rows

# --- C: the squatter leaves while the backlog count is slow ----------------------------------------
# The count waits for a table lock for 12 s; it paced the next refresh to ten times that, and the
# squatter look, which went in the same request behind it, with it: /readyz kept refusing for a
# minute or more after the squatter had gone. The looks now go every 5 s, before the count.
squat "$MEMBER_NS" 100 107 "$T/squat-c.out"
_poll 10 holds "$T/squat-c.out" || fail "C: the stranger holds eight member slots"
wait_for "C: /readyz answers 503" 30 ready_is 503
psql -XAtq -c "BEGIN" -c "LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE" -c "SELECT pg_sleep(12)" \
    -c "COMMIT" >/dev/null 2>&1 &
LOCKER=$!
_t_track "$LOCKER"
wait "$LOCKER"
end_squat "$T/squat-c.out"
wait_for "C: ready again soon after it leaves, though the count was slow" 30 ready_is 200

# --- D: the away and trying marks of every slot ------------------------------------------------
squat "$AWAY_NS" 0 2047 "$T/squat-d.out"
_poll 10 holds "$T/squat-d.out" || fail "D: the stranger holds the mark locks of every slot"
D_PID=$(head -n 1 "$T/squat-d.out")
wait_for "D: the relay names it" 30 \
    grep -q "$SQUAT_LINE.*pid=$D_PID what=stray-marks lanes=0 slots=0" "$RELAY_LOG"
check "D: /readyz answers 503" ready_is 503
commands_name D "$D_PID" stray-marks
end_squat "$T/squat-d.out"
wait_for "D: ready again once it lets them go" 30 ready_is 200
insert 31 40
wait_for "D: events go out" 30 no_unsent_rows
# --- E: one member slot, no lanes ------------------------------------------------------------------
squat "$MEMBER_NS" 100 100 "$T/squat-e.out"
_poll 10 holds "$T/squat-e.out" || fail "E: the stranger holds a member slot"
E_PID=$(head -n 1 "$T/squat-e.out")
wait_for "E: the relay names it" 30 \
    grep -q "$SQUAT_LINE.*pid=$E_PID what=slot-without-lanes lanes=0 slots=1" "$RELAY_LOG"
check "E: /readyz answers 503" ready_is 503
commands_name E "$E_PID" slot-without-lanes
end_squat "$T/squat-e.out"
wait_for "E: ready again once it lets go" 30 ready_is 200
commands_name_none E
insert 41 50
wait_for "E: events go out" 30 no_unsent_rows

# --- F: the marks held while the relay's Kafka is down -----------------------------------------
squat "$AWAY_NS" 0 2047 "$T/squat-f.out"
_poll 10 holds "$T/squat-f.out" || fail "F: the stranger holds the mark locks of every slot"
F_PID=$(head -n 1 "$T/squat-f.out")
REFUSED="lane mark refused.*mark=away slot=[0-9]* holder_pid=$F_PID "
broker_down
insert 51 60
wait_for "F: the relay, away, says its away mark was refused, naming the holder" 60 \
    grep -q "$REFUSED" "$RELAY_LOG"
check_eq "F: once a session (no slot said twice)" "" \
    "$(grep -o "$REFUSED" "$RELAY_LOG" | grep -o 'slot=[0-9]*' | sort | uniq -d)"
broker_up
end_squat "$T/squat-f.out"
wait_for "F: events go out once Kafka is back and the stranger gone" 60 no_unsent_rows
check_delivered squat
relay_stop
check_eq "the relay exits 0" 0 "$?"
