#!/bin/bash
# Proves that relays follow a PostgreSQL failover through a multi-host URL
# (primary,standby + target_session_attrs=read-write), on default settings:
#  1. a streaming standby (pg_basebackup -R) runs beside the primary while two relays deliver
#     rows arriving steadily;
#  2. the primary crashes (immediate stop) mid-stream and the standby is promoted: both relays are
#     on the new primary, holding its 64 lanes, and deliver a row committed there, within 15 s of
#     the promotion (time printed);
#  3. no row of the new primary is lost (every one in Kafka), first copies in order per aggregate;
#     phantom events (in Kafka, but their row never reached the new primary: committed on the old
#     primary after the last WAL it shipped) and duplicates are counted and printed.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
# shellcheck source=tests/netns_lib.sh
source "$(dirname "$0")/../../netns_lib.sh"
t_setup
fault_init
fault_setup 1
P1=$PGPORT

# --- 1. the standby ---
standby_start
P2=$SB_PORT
check_eq "1: the standby is in recovery" t "$(psql_q "SELECT pg_is_in_recovery()" -p "$P2")"

URL="postgresql://postgres@127.0.0.1:$P1,127.0.0.1:$P2/outbox?target_session_attrs=read-write"
COMMON=(--database-url "$URL" "${FAULT_RELAY_OPTS[@]}")
relay_start "${COMMON[@]}"
A_PID=$RELAY_PID
relay_start "${COMMON[@]}"
B_PID=$RELAY_PID
lanes_held() { # lanes_held PORT: lane locks granted on the server at PORT
    psql_q "SELECT count(*) FROM pg_locks l WHERE $LANE_LOCK" -p "$1"
}
held_all() {
    [ "$(lanes_held "$1")" = 64 ]
}
wait_for "1: the relays hold the 64 lanes on the primary" 30 held_all "$P1"

# --- 2. crash and promote ---
load_for fo 20 200
sleep 5
_as_pg pg_ctl -D "$T/pg" -m immediate -w -t 20 stop >/dev/null 2>&1 || fail "crash the primary"
_T_PG_STARTED=0
t_crash=$(now_ms)
_as_pg pg_ctl -D "$SB" -w -t 30 promote >/dev/null 2>&1 || fail "promote the standby"
t0=$(now_ms)
echo "# 2: primary crashed, standby promoted $(secs_since "$t_crash")s later"
export PGPORT=$P2 # from here on the test's own queries go to the new primary
DATABASE_URL=postgresql://postgres@127.0.0.1:$P2/outbox
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        VALUES ('after', 'after-1', 'changed', '{\"seq\": 1}')" || fail "insert on the new primary"
on_new_primary() {
    held_all "$P2" && none_unsent_of after
}
if _poll 15 on_new_primary; then
    ok "2: relays on the new primary (64 lanes, a new row delivered) within 15 s of the promotion"
    echo "# 2: relays on the new primary $(secs_since "$t0")s after the promotion"
else
    not_ok "2: relays on the new primary within 15 s" \
        "lanes $(lanes_held "$P2"), unsent $(unsent_of after)"
fi
for log in "$T"/relay.*.log; do
    grep -m 1 'msg="postgres reconnected".*port="'"$P2"'"' "$log" | sed 's/^/# 2: /'
done

# --- 3. nothing of the new primary lost; phantoms counted ---
wait_for "3: every row of the new primary acknowledged" 60 none_unsent_of fo
consume --topic outbox.event.fo --to-end --timeout-ms 30000 >"$T/fo.json"
jq -r .headers.id "$T/fo.json" | sort -u >"$T/fo.kafka"
psql_q "SELECT event_id FROM outbox WHERE aggregate_type = 'fo'" | sort >"$T/fo.table"
check_eq "3: rows of the new primary missing from Kafka (lost)" 0 \
    "$(comm -13 "$T/fo.kafka" "$T/fo.table" | grep -c .)"
phantoms=$(comm -23 "$T/fo.kafka" "$T/fo.table" | grep -c .)
echo "# 3: rows on the new primary: $(grep -c . "$T/fo.table"); events in Kafka: $(grep -c . "$T/fo.kafka") (phantoms, no row on the new primary: $phantoms); duplicates: $(duplicates_in "$T/fo.json") of $(grep -c . "$T/fo.json") messages"
check "3: first copies in order per aggregate" first_copies_in_order "$T/fo.json"
check_delivered after
for pid in "$A_PID" "$B_PID"; do
    RELAY_PID=$pid
    relay_stop
    check_eq "3: relay exits 0" 0 $?
done
