#!/bin/bash
# Proves the relay makes an old snapshot visible (claims slow down while one holds back vacuum, so
# an operator must see it and who holds it: docs/operations.md#dead-rows-and-old-snapshots):
#  - with no long transaction, outbox_vacuum_horizon_held_seconds stays below --horizon-warn and
#    nothing is logged;
#  - another client opens a REPEATABLE READ transaction and keeps it (as a forgotten BEGIN or a
#    long report would): outbox_vacuum_horizon_held_seconds grows past --horizon-warn (2 s here),
#    the relay logs "an old snapshot holds back vacuum" once, naming the holder's pid and
#    application_name, and outbox_vacuum_horizon_age_xids counts the transactions committed since;
#  - once the transaction ends, the relay logs "nothing holds back vacuum any more" (or, when
#    another snapshot younger than --horizon-warn is the oldest left, that the one logged is gone);
#  - IDLE: a READ COMMITTED writer idle in its transaction (no snapshot between statements, but a
#    transaction id, which holds vacuum back as well) is named too; a lazy VACUUM running
#    meanwhile, its snapshot older, is not (PostgreSQL's horizon skips it; it was named instead);
#  - PREP: two prepared transactions whose 150-byte names begin alike: once the older one, logged,
#    is committed, the younger one is logged too (the holder logged was compared on 128 bytes);
#  - HEALTHY: a healthy standby with hot_standby_feedback through a replication slot, while
#    transactions commit for three times --horizon-warn, is not logged: its feedback moves the
#    slot's xmin on every second here (wal_receiver_status_interval), so no snapshot is old;
#  - SLOT: a query on that standby holding a snapshot keeps the slot's xmin, whose start
#    PostgreSQL does not keep: timed from when the relay first saw transactions commit behind
#    it, logged past --horizon-warn, its gauge past it too;
#  - a session logged as holding back vacuum that ends while the slot still holds names the slot
#    next, never "nothing holds back vacuum any more", which was false: the slot held vacuum back
#    all along.
#  - OVERLAP: long queries on the standby that overlap move the slot's xmin on every few seconds,
#    each time to one almost as old: the slot is logged once its horizon has stood past
#    --horizon-warn (its xmin is dated, not timed from its last change).
#  - QUIET: after a quiet spell longer than --horizon-warn, a producer's transaction that has a
#    transaction id and has not committed yet does not make the slot (its xmin past every commit,
#    holding nothing back) read as old: the slot's xmin is read against the same next transaction
#    id as the samples, not as that id less age(), which counts the uncommitted one too.
#  - SLOTLESS: a healthy standby with hot_standby_feedback and no slot (the feedback is its
#    walsender's xmin, in no transaction) is not logged: its xmin is dated as a slot's, not timed
#    from the walsender's start.
#  - RENEW: a backend logged that ends its transaction and begins another while a younger holder
#    is the oldest is logged again once its new transaction is the oldest and past --horizon-warn.
#  - FAILOVER: the upkeep reconnecting to a standby promoted while it lagged (its next transaction
#    id lower than the relay's samples) says so once and drops the samples.
#  - PROMOTED: a standby promoted that commits past the relay's last sample before it takes the
#    primary's port (its next transaction id not lower) is another server too: its new timeline
#    says so once and drops the samples.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
# The relay looks every second, not every 5 s (a test build's knob, docs/development.md): the
# waits below are for its looks, and each waited out up to 5 s of a tick; the looks are the same.
export OUTBOX_TEST_GAUGE_INTERVAL_S=1
pg_start
# Part PREP prepares transactions (the standby of part SLOT copies the setting, as it must).
echo "max_prepared_transactions = 4" >>"$T/pg/postgresql.conf"
pg_restart
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"

relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --metrics-listen 127.0.0.1:0 \
    --horizon-warn 2s --kafka reconnect.backoff.max.ms=500
metrics_wait
gauge() { # gauge NAME: the metric's value
    curl -s --max-time 5 "http://$METRICS/metrics" | awk -v n="$1" '$1 == n { print $2 }'
}
has_gauge() {
    [ -n "$(gauge outbox_vacuum_horizon_age_xids)" ]
}
wait_for "the vacuum horizon gauges are served" 30 has_gauge
check "nothing is logged while no snapshot is old" lacks "$RELAY_LOG" "holds back vacuum"

# The holder: a REPEATABLE READ transaction that took its snapshot, then sleeps until the checks
# below cancel it (120 s at most: a 12 s sleep could end before them on a loaded machine).
PGAPPNAME=forgotten-report psql -XAtq -c "BEGIN ISOLATION LEVEL REPEATABLE READ" \
    -c "SELECT pg_backend_pid() FROM outbox LIMIT 0" -c "SELECT pg_backend_pid()" \
    -c "SELECT pg_sleep(120)" -c "COMMIT" >"$T/holder.out" 2>&1 &
HOLDER=$!
_t_track "$HOLDER"
holder_pid() {
    head -n 1 "$T/holder.out"
}
has_holder() {
    [ -n "$(holder_pid)" ]
}
_poll 10 has_holder || fail "the other client holds its snapshot"
for g in $(seq 1 20); do # transactions that commit behind the old snapshot
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            VALUES ('h', 'h-$g', 'changed', '{\"seq\": $g}')"
done
logged() {
    grep -q "an old snapshot holds back vacuum.*holder=\"session\" id=\"$(holder_pid)\" application=\"forgotten-report\"" \
        "$RELAY_LOG"
}
wait_for "the relay names the holder once it has held its snapshot past --horizon-warn" 20 logged
held=$(gauge outbox_vacuum_horizon_held_seconds)
xids=$(gauge outbox_vacuum_horizon_age_xids)
echo "# while held: outbox_vacuum_horizon_held_seconds $held, outbox_vacuum_horizon_age_xids $xids"
check "the held-seconds gauge is past --horizon-warn" awk -v h="$held" 'BEGIN { exit !(h >= 2) }'
check "the xids gauge counts the transactions committed behind it" test "${xids%.*}" -ge 20
psql_q "SELECT pg_cancel_backend($(holder_pid))" >/dev/null
wait "$HOLDER"
released() {
    grep -q -e "nothing holds back vacuum any more" \
        -e "the old snapshot logged as holding back vacuum is gone" "$RELAY_LOG"
}
wait_for "its end is logged" 20 released
check_eq "the holder was logged once" 1 "$(grep -c "an old snapshot holds back vacuum" "$RELAY_LOG")"

# IDLE: a producer's READ COMMITTED transaction that wrote a row and waits, idle, holds no
# snapshot between its statements (backend_xmin NULL) but its transaction id holds vacuum back
# all the same (PostgreSQL's horizon is the older of a session's xmin and xid): the forgotten
# BEGIN of a writer, read by xmin alone, was never named.
psql_q "CREATE TABLE idle_t (x int)" >/dev/null || fail "IDLE: create the writer's table"
# VACUUM (the same part): a lazy VACUUM's snapshot, older than the writer's id, holds nothing
# back (PostgreSQL's horizon skips a process in VACUUM), yet it was the oldest by xids: named in
# the writer's place, as an autovacuum worker on a large table was, for as long as it ran. Paced
# to a page every 100 ms, it runs past the checks below, which cancel it.
psql_q "CREATE TABLE vac_t AS SELECT g, repeat('v', 200) AS v FROM generate_series(1, 20000) g" \
    >/dev/null || fail "VACUUM: create a table to vacuum"
PGAPPNAME=slow-vacuum psql -XAtq -c "SET vacuum_cost_delay = 100" -c "SET vacuum_cost_limit = 1" \
    -c "VACUUM vac_t" >"$T/vac.out" 2>&1 &
VAC=$!
_t_track "$VAC"
vac_pid() { psql_q "SELECT pid FROM pg_stat_progress_vacuum WHERE relid = 'vac_t'::regclass"; }
has_vac_pid() { [ -n "$(vac_pid)" ]; }
_poll 10 has_vac_pid || fail "VACUUM: the vacuum runs"
VAC_PID=$(vac_pid)
mkfifo "$T/idle.fifo"
PGAPPNAME=idle-writer psql -XAtq <"$T/idle.fifo" >"$T/idle.out" 2>&1 &
IDLE=$!
_t_track "$IDLE"
exec 8>"$T/idle.fifo" # the writer's session, written to until its COMMIT below
echo "BEGIN; INSERT INTO idle_t VALUES (1); SELECT pg_backend_pid();" >&8
idle_pid() { head -n 1 "$T/idle.out"; }
has_idle_pid() { [ -n "$(idle_pid)" ]; }
_poll 10 has_idle_pid || fail "IDLE: the writer holds its transaction id"
for g in $(seq 1 20); do # transactions that commit behind it
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            VALUES ('i', 'i-$g', 'changed', '{\"seq\": $g}')"
done
idle_logged() {
    grep -q "an old snapshot holds back vacuum.*holder=\"session\" id=\"$(idle_pid)\" application=\"idle-writer\"" \
        "$RELAY_LOG"
}
wait_for "IDLE: the idle writer is named once past --horizon-warn" 20 idle_logged
check "VACUUM: the vacuum ran all along" has_vac_pid
check "VACUUM: a lazy vacuum is never named" lacks "$RELAY_LOG" "id=\"$VAC_PID\""
psql_q "SELECT pg_cancel_backend($VAC_PID)" >/dev/null
wait "$VAC"
echo "COMMIT;" >&8
exec 8>&-
wait "$IDLE"
relay_stop
check_eq "the relay exits 0" 0 "$?"

# --- PREP: two prepared transactions whose names begin alike ------------------------------------
# The holder was kept as "KIND NAME" in 128 bytes: once the first was committed, a second prepared
# transaction whose 150-byte name began as the first's compared equal to the one logged and was
# never logged itself, though it held vacuum back as long.
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --metrics-listen 127.0.0.1:0 \
    --horizon-warn 2s --kafka reconnect.backoff.max.ms=500
metrics_wait
prefix=$(printf 'g%.0s' $(seq 1 150))
# Not into outbox: its trigger notifies the relays, which a prepared transaction may not.
psql_q "CREATE TABLE prep_side (x text)" || fail "PREP: create a table"
for x in a b; do
    psql -XAtq -c "BEGIN" -c "INSERT INTO prep_side VALUES ('$x')" \
        -c "PREPARE TRANSACTION '$prefix-$x'" >/dev/null || fail "PREP: prepare $x"
done
prep_logged() { # prep_logged a|b: the relay named that prepared transaction as the holder
    grep -q "an old snapshot holds back vacuum.*holder=\"prepared transaction\" id=\"$prefix-$1\"" \
        "$RELAY_LOG"
}
wait_for "PREP: the older one is logged once past --horizon-warn" 20 prep_logged a
# The younger one, prepared just after it, past --horizon-warn too when the older one ends (else
# the relay would log the older one gone and start afresh, and the test would prove nothing).
prep_past_warn() { # prep_past_warn a|b: that prepared transaction is older than --horizon-warn
    [ "$(psql_q "SELECT now() - prepared > interval '2 s' FROM pg_prepared_xacts
                 WHERE gid = '$prefix-$1'")" = t ]
}
wait_for "PREP: the younger one is past --horizon-warn too" 10 prep_past_warn b
psql_q "COMMIT PREPARED '$prefix-a'" >/dev/null || fail "PREP: commit a"
wait_for "PREP: then the younger one, its name beginning as the first's, is logged" 20 prep_logged b
psql_q "COMMIT PREPARED '$prefix-b'" >/dev/null || fail "PREP: commit b"
relay_stop
check_eq "PREP: the relay exits 0" 0 "$?"

# --- a replication slot: PostgreSQL keeps no start time for it -------------------------------------
# A standby with hot_standby_feedback streams through a slot. The relay times a slot's snapshot
# from its own looks (it logged nothing, its gauge said 0, and OutboxVacuumHorizonHeld could never
# fire, for a slot nobody reads any more), by the slot's xmin: a healthy standby's feedback moves
# it on at each wal_receiver_status_interval (1 s here), and a slot timed by its name alone was
# logged as an old snapshot once the relay had run --horizon-warn beside a healthy standby.
psql_q "SELECT pg_create_physical_replication_slot('horizon_slot')" >/dev/null ||
    fail "SLOT: create the slot"
standby_start
printf '%s\n' "primary_slot_name = 'horizon_slot'" "hot_standby_feedback = on" \
    "wal_receiver_status_interval = 1s" >>"$SB/postgresql.auto.conf"
_as_pg pg_ctl -D "$SB" reload >/dev/null || fail "SLOT: reload the standby"
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --metrics-listen 127.0.0.1:0 \
    --horizon-warn 4s --kafka reconnect.backoff.max.ms=500
metrics_wait
slot_xmin() {
    psql_q "SELECT xmin FROM pg_replication_slots WHERE slot_name = 'horizon_slot'"
}
slot_holds() { [ -n "$(slot_xmin)" ]; }
wait_for "HEALTHY: the standby's feedback gives the slot an xmin" 20 slot_holds
# HEALTHY: transactions commit for three times --horizon-warn while the standby runs no query.
first_xmin=$(slot_xmin)
for g in $(seq 1 40); do
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            VALUES ('k', 'k-$g', 'changed', '{\"seq\": $g}')"
    sleep 0.3
done
check "HEALTHY: (the feedback moved the slot's xmin on meanwhile)" test "$(slot_xmin)" != "$first_xmin"
check "HEALTHY: a healthy standby's slot is not logged as holding back vacuum" \
    lacks "$RELAY_LOG" "holds back vacuum"

# SLOT: a session on the primary holds the oldest snapshot first, and is logged; the slot comes
# behind it once a query on the standby holds a snapshot there.
: >"$T/holder.out"
PGAPPNAME=forgotten-report psql -XAtq -c "BEGIN ISOLATION LEVEL REPEATABLE READ" \
    -c "SELECT pg_backend_pid() FROM outbox LIMIT 0" -c "SELECT pg_backend_pid()" \
    -c "SELECT pg_sleep(600)" -c "COMMIT" >"$T/holder.out" 2>&1 &
HOLDER=$!
_t_track "$HOLDER"
_poll 10 has_holder || fail "SLOT: the session holds its snapshot"
for g in $(seq 1 5); do # transactions that commit behind the session's snapshot
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            VALUES ('p', 'p-$g', 'changed', '{\"seq\": $g}')"
done
wait_for "SLOT: the session is logged as holding back vacuum" 20 logged
psql -XAtq -p "$SB_PORT" -c "BEGIN ISOLATION LEVEL REPEATABLE READ" \
    -c "SELECT backend_xmin FROM pg_stat_activity WHERE pid = pg_backend_pid()" \
    -c "SELECT pg_sleep(120)" -c "COMMIT" >"$T/sb-holder.out" 2>&1 &
SB_HOLDER=$!
_t_track "$SB_HOLDER"
sb_xmin() { head -n 1 "$T/sb-holder.out"; }
has_sb_xmin() { [ -n "$(sb_xmin)" ]; }
_poll 20 has_sb_xmin || fail "SLOT: the standby's query holds its snapshot"
slot_pinned() { # the standby's feedback holds the slot's xmin at or before its query's snapshot
    [ "$(psql_q "SELECT age(xmin) >= age('$(sb_xmin)'::xid) FROM pg_replication_slots
                 WHERE slot_name = 'horizon_slot'")" = t ]
}
wait_for "SLOT: the standby's feedback holds the slot's xmin behind its query" 20 slot_pinned
for g in $(seq 1 20); do # transactions that commit behind the standby's snapshot
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            VALUES ('s', 's-$g', 'changed', '{\"seq\": $g}')"
done
psql_q "SELECT pg_terminate_backend($(holder_pid))" >/dev/null || fail "SLOT: end the session"
wait "$HOLDER"
slot_logged() {
    grep -q 'an old snapshot holds back vacuum.*holder="replication slot" id="horizon_slot"' \
        "$RELAY_LOG"
}
# The session's end: the slot is named next, as gone (the slot had held its snapshot less than
# --horizon-warn) or as holding (more), never "nothing holds back vacuum".
gone() {
    grep -q 'the old snapshot logged as holding back vacuum is gone.*holder="replication slot" id="horizon_slot"' \
        "$RELAY_LOG" || slot_logged
}
wait_for "SLOT: after the session's end the relay names the slot that still holds" 20 gone
check "SLOT: not that nothing holds back vacuum" lacks "$RELAY_LOG" "nothing holds back vacuum"
wait_for "SLOT: the relay names the slot once it has held past --horizon-warn" 20 slot_logged
check "SLOT: the held-seconds gauge counts its time (past --horizon-warn)" \
    awk -v h="$(gauge outbox_vacuum_horizon_held_seconds)" 'BEGIN { exit !(h >= 4) }'
# Done with the standby's snapshot: end its sleep now (120 s, so that a loaded machine cannot
# end it before the checks above: at 15 s the gauge once read 0) rather than wait it out.
psql -XAtq -p "$SB_PORT" -c "SELECT pg_cancel_backend(pid) FROM pg_stat_activity
                             WHERE query = 'SELECT pg_sleep(120)'" >/dev/null
wait "$SB_HOLDER"
relay_stop
check_eq "SLOT: the relay exits 0" 0 "$?"


# --- OVERLAP: long queries on the standby that overlap --------------------------------------------
# Ten queries on the standby, begun 0.3 s apart (a commit between each two), the k-th ending at
# 3k s: each is the oldest for 3 s, and then the slot's xmin moves on to the next one's, begun
# at 0.3 (k - 1) s, older each time. Timed from when its xmin last changed, the slot never passed
# --horizon-warn (6 s), however far behind the horizon stood; its xmin is dated.
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --metrics-listen 127.0.0.1:0 \
    --horizon-warn 6s --kafka reconnect.backoff.max.ms=500
metrics_wait
start=$(psql_q "SELECT now()")
for k in $(seq 1 10); do
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            VALUES ('v', 'v-$k', 'changed', '{}')"
    psql -XAtq -p "$SB_PORT" -c "BEGIN ISOLATION LEVEL REPEATABLE READ" \
        -c "SELECT count(*) FROM outbox" \
        -c "SELECT pg_sleep_until('$start'::timestamptz + interval '$((3 * k)) s')" -c "COMMIT" \
        >/dev/null 2>&1 &
    _t_track "$!"
    sleep 0.3
done
(
    for g in $(seq 1 110); do # transactions that commit behind the queries' snapshots
        psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
                VALUES ('w', 'w-$g', 'changed', '{}')" || exit 1
        slot_xmin >>"$T/xmins"
        sleep 0.3
    done
) &
INSERTER=$!
_t_track "$INSERTER"
wait_for "OVERLAP: the slot is named once its horizon has stood past --horizon-warn" 45 slot_logged
# With looks every second the slot is named about 7 s in, when the samples (from the last
# query's start on) may hold two of the queries' xmins only: this waits for a third, which the
# next query's end (every 3 s) brings, rather than reading the samples once.
xmins_moved() { [ "$(sort -u "$T/xmins" | grep -c .)" -ge 3 ]; }
wait_for "OVERLAP: (its xmin moved on meanwhile, more often than --horizon-warn)" 20 xmins_moved
psql -XAtq -p "$SB_PORT" -c "SELECT pg_cancel_backend(pid) FROM pg_stat_activity
                             WHERE query LIKE 'SELECT pg_sleep_until(%'" >/dev/null
kill "$INSERTER" 2>/dev/null
wait "$INSERTER" 2>/dev/null
relay_stop
check_eq "OVERLAP: the relay exits 0" 0 "$?"


# --- QUIET: a transaction in flight after a quiet spell -------------------------------------------
# The standby runs no query and nothing commits for longer than --horizon-warn: its feedback
# keeps the slot's xmin at the next transaction id, holding nothing back. Then a producer's
# transaction takes a transaction id and waits, idle, before its commit. age(xmin) counts from
# the next id to be assigned (past the uncommitted one), the snapshot's xmax from the last
# commit, so the xmin read as xmax - age was one before the slot's, and it was dated to when the
# last commit before the quiet spell was first seen: "holds back vacuum" for a slot that held
# nothing back.
psql_q "CREATE TABLE quiet_t (x int)" >/dev/null || fail "QUIET: create the producer's table"
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --metrics-listen 127.0.0.1:0 \
    --horizon-warn 4s --kafka reconnect.backoff.max.ms=500
metrics_wait
wait_for "QUIET: the vacuum horizon gauges are served" 30 has_gauge
slot_quiet() { # the slot's xmin is the next transaction id: no commit behind it
    [ "$(psql_q "SELECT xmin::text = pg_snapshot_xmax(pg_current_snapshot())::text
                 FROM pg_replication_slots WHERE slot_name = 'horizon_slot'")" = t ]
}
wait_for "QUIET: the standby's feedback brings the slot's xmin to the next transaction id" 30 slot_quiet
sleep 8 # the quiet spell, twice --horizon-warn, that the relay's first look dates from
slot_quiet || fail "QUIET: nothing committed during the quiet spell (the slot's xmin moved)"
mkfifo "$T/quiet.fifo"
psql -XAtq <"$T/quiet.fifo" >"$T/quiet.out" 2>&1 &
QUIET=$!
_t_track "$QUIET"
exec 7>"$T/quiet.fifo" # the producer's session, written to until its COMMIT below
echo "BEGIN; INSERT INTO quiet_t VALUES (1); SELECT 'in-flight';" >&7
in_flight() { grep -q in-flight "$T/quiet.out"; }
_poll 10 in_flight || fail "QUIET: the producer's transaction has its transaction id"
looked() { # a look saw the uncommitted transaction id: age(xmin) counts it
    awk -v x="$(gauge outbox_vacuum_horizon_age_xids)" 'BEGIN { exit !(x >= 1) }'
}
wait_for "QUIET: the relay looks while the transaction is in flight" 30 looked
check "QUIET: the slot, holding nothing back, is not logged as holding back vacuum" \
    lacks "$RELAY_LOG" "holds back vacuum"
check "QUIET: its held-seconds gauge is below --horizon-warn" \
    awk -v h="$(gauge outbox_vacuum_horizon_held_seconds)" 'BEGIN { exit !(h < 4) }'
echo "COMMIT;" >&7
exec 7>&-
wait "$QUIET"
relay_stop
check_eq "QUIET: the relay exits 0" 0 "$?"

# --- SLOTLESS: a healthy standby with hot_standby_feedback and no slot ----------------------------
# Without a slot the feedback is the walsender's own xmin, a session whose xact_start is NULL:
# timed from its backend_start, it held for as long as the standby stayed connected, and a
# healthy standby was logged as an old snapshot once connected for --horizon-warn. Its xmin is
# dated, as a slot's is.
psql -XAtq -p "$SB_PORT" -c "ALTER SYSTEM SET primary_slot_name = ''" -c "SELECT pg_reload_conf()" \
    >/dev/null || fail "SLOTLESS: the standby streams without its slot"
slot_unused() {
    [ "$(psql_q "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'horizon_slot' AND active")" = 0 ]
}
wait_for "SLOTLESS: the standby no longer uses the slot" 30 slot_unused
psql_q "SELECT pg_drop_replication_slot('horizon_slot')" >/dev/null || fail "SLOTLESS: drop the slot"
walsender_holds() {
    [ "$(psql_q "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender'
                 AND backend_xmin IS NOT NULL")" = 1 ]
}
wait_for "SLOTLESS: the standby's feedback gives its walsender an xmin" 30 walsender_holds
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --metrics-listen 127.0.0.1:0 \
    --horizon-warn 4s --kafka reconnect.backoff.max.ms=500
metrics_wait
wait_for "SLOTLESS: the vacuum horizon gauges are served" 30 has_gauge
first_wxmin=$(psql_q "SELECT backend_xmin FROM pg_stat_activity WHERE backend_type = 'walsender'")
for g in $(seq 1 40); do # commits for three times --horizon-warn; the feedback moves the xmin on
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            VALUES ('n', 'n-$g', 'changed', '{\"seq\": $g}')"
    sleep 0.3
done
check "SLOTLESS: (the feedback moved the walsender's xmin on meanwhile)" \
    test "$(psql_q "SELECT backend_xmin FROM pg_stat_activity WHERE backend_type = 'walsender'")" != "$first_wxmin"
check "SLOTLESS: a healthy standby's walsender is not logged as holding back vacuum" \
    lacks "$RELAY_LOG" "holds back vacuum"
relay_stop
check_eq "SLOTLESS: the relay exits 0" 0 "$?"

# --- RENEW: a backend logged ends its transaction and begins another while a younger holder is
# the oldest ------------------------------------------------------------------------------------
# The holder logged was kept by kind and id alone ("session PID"): while the younger holder was
# the oldest, the backend "held" still, in its new transaction, and once that one was the oldest
# again and past --horizon-warn it was the holder logged, never logged itself. Here the younger
# holder is a transaction whose id comes before the backend's new one, prepared a few seconds
# after the backend began (a prepared transaction is timed from its PREPARE), so it stays below
# --horizon-warn (6 s) while the backend's new transaction passes it.
psql -XAtq -p "$SB_PORT" -c "ALTER SYSTEM SET hot_standby_feedback = off" -c "SELECT pg_reload_conf()" \
    >/dev/null || fail "RENEW: the standby's feedback off"
walsender_free() {
    [ "$(psql_q "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender'
                 AND backend_xmin IS NOT NULL")" = 0 ]
}
wait_for "RENEW: the standby's feedback no longer holds the horizon" 30 walsender_free
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --metrics-listen 127.0.0.1:0 \
    --horizon-warn 6s --kafka reconnect.backoff.max.ms=500
metrics_wait
mkfifo "$T/renew_a.fifo" "$T/renew_b.fifo"
PGAPPNAME=renew-a psql -XAtq <"$T/renew_a.fifo" >"$T/renew_a.out" 2>&1 &
RENEW_A=$!
_t_track "$RENEW_A"
exec 5>"$T/renew_a.fifo" # the backend's session, written to until its last COMMIT below
echo "BEGIN; INSERT INTO idle_t VALUES (2); SELECT pg_backend_pid();" >&5
a_pid() { head -n 1 "$T/renew_a.out"; }
a_lines() { [ "$(wc -l <"$T/renew_a.out")" -ge "$1" ]; }
_poll 10 a_lines 1 || fail "RENEW: the backend holds its first transaction id"
for g in $(seq 1 20); do # transactions that commit behind it
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            VALUES ('r', 'r-$g', 'changed', '{\"seq\": $g}')"
done
a_logged() { # a_logged N: the backend was named N times
    [ "$(grep -c "an old snapshot holds back vacuum.*holder=\"session\" id=\"$(a_pid)\"" \
        "$RELAY_LOG")" = "$1" ]
}
wait_for "RENEW: the backend's first transaction is logged past --horizon-warn" 20 a_logged 1
PGAPPNAME=renew-b psql -XAtq <"$T/renew_b.fifo" >"$T/renew_b.out" 2>&1 &
RENEW_B=$!
_t_track "$RENEW_B"
exec 6>"$T/renew_b.fifo"
echo "BEGIN; INSERT INTO idle_t VALUES (3); SELECT pg_backend_pid();" >&6
b_lines() { [ "$(wc -l <"$T/renew_b.out")" = 1 ]; }
_poll 10 b_lines || fail "RENEW: the younger holder has its transaction id"
# One line, so that no look falls between the two transactions (the backend holds nothing there).
echo "COMMIT; BEGIN; INSERT INTO idle_t VALUES (4); SELECT 'new';" >&5
_poll 10 a_lines 2 || fail "RENEW: the backend holds its new transaction id"
a_past() { # a_past S: the backend's new transaction is older than S seconds
    [ "$(psql_q "SELECT now() - xact_start > interval '$1 s' FROM pg_stat_activity
                 WHERE pid = $(a_pid)")" = t ]
}
wait_for "RENEW: the backend's new transaction runs 3 s" 20 a_past 3
echo "PREPARE TRANSACTION 'renew-b';" >&6
b_prepared() { [ "$(psql_q "SELECT count(*) FROM pg_prepared_xacts WHERE gid = 'renew-b'")" = 1 ]; }
_poll 10 b_prepared || fail "RENEW: the younger holder is prepared"
wait_for "RENEW: the backend's new transaction runs past --horizon-warn" 20 a_past 7
psql_q "COMMIT PREPARED 'renew-b'" >/dev/null || fail "RENEW: commit the younger holder"
wait_for "RENEW: the backend's new transaction, the oldest again past --horizon-warn, is logged" \
    20 a_logged 2
b_unwarned() { # the younger holder, prepared or its session before, was never logged as holding
    ! grep -q -e "holds back vacuum;.* id=\"renew-b\"" \
        -e "holds back vacuum;.* id=\"$(head -n 1 "$T/renew_b.out")\"" "$RELAY_LOG"
}
check "RENEW: (the younger holder was never logged: it stayed below --horizon-warn)" b_unwarned
echo "COMMIT;" >&5
exec 5>&- 6>&-
wait "$RENEW_A" "$RENEW_B"
relay_stop
check_eq "RENEW: the relay exits 0" 0 "$?"

# --- FAILOVER: the upkeep reconnects to a server whose next transaction id is lower -------------
# The standby stops receiving (a standby that lags); the primary commits transactions it never
# sees, and a look samples them; then the primary stops and the standby is promoted on the
# primary's port (the relay's URL unchanged, as a moved address would have it). Its next
# transaction id is behind the samples: they are another server's, and are dropped (test_xiddate
# shows what dating by them did: a slot made there was held since the old server passed its xmin).
psql -XAtq -p "$SB_PORT" -c "ALTER SYSTEM SET primary_conninfo = ''" -c "SELECT pg_reload_conf()" \
    >/dev/null || fail "FAILOVER: the standby stops receiving"
sb_unfed() { [ "$(psql -XAtq -p "$SB_PORT" -c "SELECT count(*) FROM pg_stat_wal_receiver")" = 0 ]; }
wait_for "FAILOVER: the standby receives no more" 30 sb_unfed
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --metrics-listen 127.0.0.1:0 \
    --horizon-warn 6s --kafka reconnect.backoff.max.ms=500
metrics_wait
# A transaction held open behind them, so that a look that has seen them all is known: its age is
# past them.
mkfifo "$T/failover.fifo"
psql -XAtq <"$T/failover.fifo" >/dev/null 2>&1 &
FO=$!
_t_track "$FO"
exec 5>"$T/failover.fifo"
echo "BEGIN; INSERT INTO idle_t VALUES (0);" >&5
fo_holds() { [ "$(psql_q "SELECT count(*) FROM pg_stat_activity WHERE backend_xid IS NOT NULL
                          AND pid <> pg_backend_pid()")" -ge 1 ]; }
_poll 10 fo_holds || fail "FAILOVER: a transaction holds its id"
for g in $(seq 1 30); do # transactions the standby never sees
    psql_q "INSERT INTO idle_t VALUES ($g)" >/dev/null
done
seen() { awk -v x="$(gauge outbox_vacuum_horizon_age_xids)" 'BEGIN { exit !(x >= 31) }'; }
wait_for "FAILOVER: a look samples the primary's next transaction id past them" 30 seen
echo "COMMIT;" >&5
exec 5>&-
wait "$FO"
check_eq "FAILOVER: nothing said of a transaction id going back yet" 0 \
    "$(grep -c "the next transaction id went back" "$RELAY_LOG")"
pg_stop
_as_pg pg_ctl -D "$SB" -m fast -w -t 30 stop >/dev/null 2>&1 || fail "FAILOVER: stop the standby"
echo "port = $PGPORT" >>"$SB/postgresql.conf"
_as_pg pg_ctl -D "$SB" -l "$T/standby.log" -w -t 30 start >/dev/null 2>&1 ||
    fail "FAILOVER: start the standby on the primary's port"
_as_pg pg_ctl -D "$SB" -w -t 30 promote >/dev/null 2>&1 || fail "FAILOVER: promote the standby"
# A holder there: a look samples the next transaction id only when something holds vacuum back
# (the samples date holders; with none, nothing is dated and nothing was sampled).
psql -XAtq <"$T/failover.fifo" >/dev/null 2>&1 &
FO=$!
_t_track "$FO"
exec 5>"$T/failover.fifo"
echo "BEGIN; INSERT INTO idle_t VALUES (0);" >&5
went_back() { grep -q "the next transaction id went back" "$RELAY_LOG"; }
wait_for "FAILOVER: the relay says the next transaction id went back (samples dropped)" 60 went_back
echo "COMMIT;" >&5
exec 5>&-
wait "$FO"
grep "the next transaction id went back" "$RELAY_LOG" | sed 's/^/# /'
back_by() { # the line's next_xid is below its before= (by 10 at least of the 31 unseen)
    grep "the next transaction id went back" "$RELAY_LOG" | head -n 1 |
        sed -n 's/.*next_xid=\([0-9]*\) before=\([0-9]*\).*/\1 \2/p' |
        awk '{ exit !($2 - $1 >= 10) }'
}
check "FAILOVER: by the transactions the standby never saw" back_by
check_eq "FAILOVER: said once" 1 "$(grep -c "the next transaction id went back" "$RELAY_LOG")"
relay_stop
check_eq "FAILOVER: the relay exits 0" 0 "$?"

# --- PROMOTED: a promoted standby whose ids already passed the relay's samples ------------------
# Under any write load a promoted standby passes the old server's last id within moments: by the
# next transaction id alone the samples were kept, nothing said, and the old server's history
# dated the new one's slots. The server of FAILOVER (timeline 2, on the primary's port) is looked
# at, then stops; a copy of it (the primary's data directory, no longer needed) starts as a
# standby on a port of its own, is promoted (timeline 3), commits 100 transactions there and
# takes the primary's port.
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --metrics-listen 127.0.0.1:0 \
    --kafka reconnect.backoff.max.ms=500
metrics_wait
psql -XAtq <"$T/failover.fifo" >/dev/null 2>&1 &
FO=$!
_t_track "$FO"
exec 5>"$T/failover.fifo"
echo "BEGIN; INSERT INTO idle_t VALUES (0);" >&5
# A look that saw the holder (with none, the gauge reads 0 and nothing is sampled).
looked() { awk -v x="$(gauge outbox_vacuum_horizon_age_xids)" 'BEGIN { exit !(x >= 1) }'; }
wait_for "PROMOTED: a look samples the server of FAILOVER" 30 looked
echo "COMMIT;" >&5
exec 5>&-
wait "$FO"
before=$(psql_q "SELECT pg_snapshot_xmax(pg_current_snapshot())")
_as_pg pg_ctl -D "$SB" -m fast -w -t 30 stop >/dev/null 2>&1 || fail "PROMOTED: stop the old server"
rm -rf "$T/pg" && cp -a "$SB" "$T/pg" && _as_pg touch "$T/pg/standby.signal" ||
    fail "PROMOTED: copy the old server as a standby"
NEW_PORT=$(free_port) || fail "PROMOTED: a free port"
_T_PG_STARTED=1
_as_pg pg_ctl -D "$T/pg" -l "$T/pg.log" -o "-p $NEW_PORT" -w -t 30 start >/dev/null 2>&1 ||
    fail "PROMOTED: start the standby on a port of its own"
_as_pg pg_ctl -D "$T/pg" -w -t 30 promote >/dev/null 2>&1 || fail "PROMOTED: promote the standby"
seq 1 100 | sed 's/.*/INSERT INTO idle_t VALUES (&);/' | psql -XAtq -v ON_ERROR_STOP=1 -p "$NEW_PORT" ||
    fail "PROMOTED: 100 transactions on the promoted server"
after=$(psql_q "SELECT pg_snapshot_xmax(pg_current_snapshot())" -p "$NEW_PORT")
check "PROMOTED: the promoted server's next transaction id ($after) passed the old one's ($before)" \
    test "$after" -gt "$before"
_as_pg pg_ctl -D "$T/pg" -m fast -w -t 30 stop >/dev/null 2>&1 || fail "PROMOTED: stop it"
_as_pg pg_ctl -D "$T/pg" -l "$T/pg.log" -w -t 30 start >/dev/null 2>&1 ||
    fail "PROMOTED: start it on the primary's port"
psql -XAtq <"$T/failover.fifo" >/dev/null 2>&1 &
FO=$!
_t_track "$FO"
exec 5>"$T/failover.fifo"
echo "BEGIN; INSERT INTO idle_t VALUES (0);" >&5
changed() { grep -q "the server's timeline or system identifier changed" "$RELAY_LOG"; }
wait_for "PROMOTED: the relay says the server's timeline changed (samples dropped)" 30 changed
echo "COMMIT;" >&5
exec 5>&-
wait "$FO"
grep "the server's timeline or system identifier changed" "$RELAY_LOG" | sed 's/^/# /'
check "PROMOTED: from timeline 2 to 3, the same system identifier" \
    grep -q 'timeline="00000003" before="00000002" system_identifier="\([0-9]*\)"'\
' before_system_identifier="\1"' "$RELAY_LOG"
check_eq "PROMOTED: said once" 1 \
    "$(grep -c "the server's timeline or system identifier changed" "$RELAY_LOG")"
check_eq "PROMOTED: nothing said of a transaction id going back" 0 \
    "$(grep -c "the next transaction id went back" "$RELAY_LOG")"
relay_stop
check_eq "PROMOTED: the relay exits 0" 0 "$?"
