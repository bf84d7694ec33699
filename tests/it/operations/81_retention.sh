#!/bin/bash
# Proves retention (--retention) and purge-dead:
#  1. with --retention 3s, sent rows are deleted within seconds of turning 3 s old — 2,500 rows
#     sent an hour ago (more than one 1,000-row statement) and 200 the relay sends itself — while
#     rows waiting for a retry and dead-lettered rows (both unsent) stay, and the relay keeps
#     delivering new rows meanwhile; outbox_retention_deleted_rows_total counts the deletions;
#  2. a sent row younger than the retention survives two whole sweeps (it is deleted once old);
#  3. without --retention (the default) nothing is deleted;
#  4. purge-dead --id deletes exactly that dead-lettered row (exit 0), refuses a row that is not
#     dead-lettered (exit 1, row kept), and purge-dead --all deletes the remaining dead rows only;
#     requeue --id and purge-dead --id take an id below 1 (-7) as any other;
#  5. a sweep reads each row about once (sequential scans and sent_at index entries counted);
#  6. a sweep goes on where its last batch ended whatever the session's DateStyle and TimeZone;
#  7. rows marked sent by the UPDATE docs/debezium.md gives (an adopted table's old rows) are
#     swept reading each about once too: one sent_at for all made each batch walk again the
#     index entries of every row the sweep had deleted;
#  8. and on a table without statistics (never analyzed: autovacuum off, or just after
#     pg_upgrade), where PostgreSQL's cheapest-looking plan read and sorted every old row a batch;
#  9. outbox_retention_overdue_seconds says whether retention keeps up: under a minute while it
#     does, past 3,000 s while a session holds an hour-old sent row locked (every sweep skips
#     it), and under a minute again once the lock is gone; a row sent at -infinity (held locked)
#     is overdue without end (+Inf), and neither it nor one sent at infinity (the only sent row
#     left) stops the backlog refreshes (a refresh whose age read fails sets no gauge at all:
#     tests/unit/test_upkeep.c).
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
# The relay's gauges refresh every second, not every 5 s (a test build's knob, docs/development.md):
# part 9 waits for their refreshes, each up to 5 s of a tick; the sweeps keep their own timer.
export OUTBOX_TEST_GAUGE_INTERVAL_S=1
pg_start
broker_start 3
relay_migrate 2>"$T/migrate.log" || fail "migrate"

insert() { # insert TYPE N
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            SELECT '$1', '$1-' || (g % 20), 'changed', jsonb_build_object('seq', g)
            FROM generate_series(1, $2) AS g ORDER BY g"
}
count() { psql_q "SELECT count(*) FROM outbox WHERE $1"; }
none_where() { [ "$(count "$1")" = 0 ]; }

# Old sent rows, rows waiting for a retry an hour from now, and dead-lettered rows. Each kind is
# its own aggregate type: the waiting and dead rows hold back nothing else.
insert old 2500
psql_q "UPDATE outbox SET sent_at = now() - interval '1 hour' WHERE aggregate_type = 'old'"
insert waiting 30
psql_q "UPDATE outbox SET attempts = 1, last_error = 'broker down',
        next_attempt_at = now() + interval '1 hour' WHERE aggregate_type = 'waiting'"
insert dead 20
psql_q "UPDATE outbox SET attempts = 10, rejections = 10, last_error = 'rejected',
        dead_at = now() WHERE aggregate_type = 'dead'"

# --- 3. no retention: nothing deleted ---
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS"
insert fresh0 50
wait_for "3: default relay sends new rows" 30 none_where "aggregate_type = 'fresh0' AND sent_at IS NULL"
sleep 3
check_eq "3: without --retention the old sent rows stay" 2500 "$(count "aggregate_type = 'old'")"
relay_stop
check_eq "3: relay exits 0" 0 $?

# --- 1. --retention 3s ---
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --retention 3s \
    --metrics-listen 127.0.0.1:0 --log-level debug
metrics_wait
wait_for "1: 2,500 rows sent an hour ago are deleted" 15 none_where "aggregate_type = 'old'"
check "1: it took several statements (a sweep logged more than 1,000 deletions)" \
    grep -qE 'msg="retention sweep done" deleted=(1[0-9]{3}|[2-9][0-9]{3})' "$RELAY_LOG"
insert fresh 200
wait_for "1: new rows are delivered meanwhile" 30 none_where "aggregate_type = 'fresh' AND sent_at IS NULL"
check_eq "1: just sent rows are still there (younger than 3 s)" 200 \
    "$(count "aggregate_type = 'fresh' AND sent_at > now() - interval '3 seconds'")"
wait_for "1: they are deleted within seconds of turning 3 s old" 15 \
    none_where "aggregate_type IN ('fresh', 'fresh0')"
check_eq "1: rows waiting for a retry stay" 30 "$(count "aggregate_type = 'waiting'")"
check_eq "1: dead-lettered rows stay" 20 "$(count "aggregate_type = 'dead' AND dead_at IS NOT NULL")"
check_eq "1: no sent row is left" 0 "$(count "sent_at IS NOT NULL")"
check "1: outbox_retention_deleted_rows_total counts them (>= 2,750)" \
    metric_at_least outbox_retention_deleted_rows_total 2750

# --- 2. not early: a young sent row survives two whole sweeps ---
# Its sent_at lies an hour ahead, so it is younger than the retention however long the sweeps
# take; an age-blind sweep would delete it. Two more "retention sweep done" lines than before the
# insert mean at least one whole sweep ran after it.
sweeps() { grep -c 'msg="retention sweep done"' "$RELAY_LOG"; }
sweeps_over() { [ "$(sweeps)" -ge "$1" ]; }
before=$(sweeps)
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
        VALUES ('young', 'y-1', 'changed', '{}', now() + interval '1 hour')"
wait_for "2: two more retention sweeps ran after the young row was sent" 15 \
    sweeps_over $((before + 2))
check_eq "2: a sent row younger than the retention is kept" 1 "$(count "aggregate_type = 'young'")"
psql_q "UPDATE outbox SET sent_at = now() - interval '4 seconds' WHERE aggregate_type = 'young'"
wait_for "2: and deleted once older" 10 none_where "aggregate_type = 'young'"
check "2: relay still running" relay_running

# --- 9. whether retention keeps up: outbox_retention_overdue_seconds ---
# Nothing said whether retention kept up: a sweep that fails, times out or is skipped by locks
# showed only as a deletion rate that did not move. The gauge is how far past --retention the
# oldest sent row is. A sent row an hour old that a session holds locked is skipped by every
# sweep (SKIP LOCKED): the gauge passes 3,000 s; the lock released, the row goes and it is 0.
overdue_under() { # overdue_under MAX: the gauge is served and below MAX
    local v
    v=$(metric outbox_retention_overdue_seconds) && awk -v v="$v" -v m="$1" 'BEGIN { exit !(v + 0 < m + 0) }'
}
wait_for "9: outbox_retention_overdue_seconds is served, under a minute while retention keeps up" \
    15 overdue_under 60
coproc RHOLD { psql -XAtq -v ON_ERROR_STOP=1 -d "$DATABASE_URL" 2>&1; }
rhold_pid=$RHOLD_PID
_t_track "$rhold_pid"
echo "BEGIN; INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
      VALUES ('held', 'h-1', 'changed', '{}', now() - interval '1 hour'); COMMIT;
      BEGIN; SELECT 'locked' FROM outbox WHERE aggregate_type = 'held' FOR UPDATE;" >&"${RHOLD[1]}"
read -r -t 30 rheld <&"${RHOLD[0]}" || fail "9: a session holds an old sent row locked"
[ "$rheld" = locked ] || fail "9: a session holds an old sent row locked: $rheld"
wait_for "9: the held row overdue: the gauge passes 3,000 s" 30 \
    metric_at_least outbox_retention_overdue_seconds 3000
check_eq "9: the row is still there (skipped, not deleted)" 1 "$(count "aggregate_type = 'held'")"
echo "COMMIT; \\q" >&"${RHOLD[1]}"
wait "$rhold_pid" 2>/dev/null
wait_for "9: released, the row is deleted" 15 none_where "aggregate_type = 'held'"
wait_for "9: and the gauge is back under a minute" 15 overdue_under 60
# A row sent at an infinite time failed the read of the oldest sent row's age for good
# (PostgreSQL 15 cannot subtract it from now()), and with it every backlog gauge of the refresh
# (whole or none, test_upkeep): the backlog hidden for as long as the row stayed. One at
# -infinity, held locked so that no sweep deletes it, is now overdue without end (+Inf), and the
# refreshes go on.
coproc RHOLD { psql -XAtq -v ON_ERROR_STOP=1 -d "$DATABASE_URL" 2>&1; }
rhold_pid=$RHOLD_PID
_t_track "$rhold_pid"
echo "BEGIN; INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
      VALUES ('infinite', 'i-1', 'changed', '{}', '-infinity'); COMMIT;
      BEGIN; SELECT 'locked' FROM outbox WHERE aggregate_type = 'infinite' FOR UPDATE;" >&"${RHOLD[1]}"
read -r -t 30 rheld <&"${RHOLD[0]}" || fail "9: a session holds a row sent at -infinity locked"
[ "$rheld" = locked ] || fail "9: a session holds a row sent at -infinity locked: $rheld"
overdue_is() { [ "$(metric outbox_retention_overdue_seconds)" = "$1" ]; }
wait_for "9: a row sent at -infinity is overdue without end (+Inf)" 30 overdue_is +Inf
stamp=$(metric outbox_backlog_refresh_timestamp_seconds)
stamp_moved() { [ "$(metric outbox_backlog_refresh_timestamp_seconds)" != "$stamp" ]; }
wait_for "9: ...and the backlog refreshes go on" 30 stamp_moved
check "9: ...no upkeep query fails over it" lacks "$RELAY_LOG" 'upkeep query failed'
echo "COMMIT; \\q" >&"${RHOLD[1]}"
wait "$rhold_pid" 2>/dev/null
wait_for "9: released, the row sent at -infinity is deleted" 15 none_where "aggregate_type = 'infinite'"
wait_for "9: and the gauge is back under a minute" 15 overdue_under 60
# A row sent at infinity is never due: once retention deleted every other sent row it was the
# oldest, and the read failed for good (a quiet spell longer than --retention, or a Kafka outage
# in which nothing is sent: the backlog gauge stood still while the backlog grew).
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
        VALUES ('infinite', 'i-2', 'changed', '{}', 'infinity')"
wait_for "9: retention leaves a row sent at infinity the only sent row" 15 \
    none_where "sent_at < 'infinity'"
stamp=$(metric outbox_backlog_refresh_timestamp_seconds)
wait_for "9: ...and the backlog refreshes go on" 30 stamp_moved
check "9: ...retention keeping up (0)" overdue_is 0.000
check "9: ...no upkeep query fails over it" lacks "$RELAY_LOG" 'upkeep query failed'
psql_q "DELETE FROM outbox WHERE aggregate_type = 'infinite'"
relay_stop
check_eq "1: relay exits 0" 0 $?

# --- 4. purge-dead ---
first_dead=$(psql_q "SELECT min(id) FROM outbox WHERE aggregate_type = 'dead'")
waiting_id=$(psql_q "SELECT min(id) FROM outbox WHERE aggregate_type = 'waiting'")
"$RELAY_BIN" purge-dead --database-url "$DATABASE_URL" --id "$first_dead" >"$T/purge1.out" 2>&1
check_eq "4: purge-dead --id exits 0" 0 $?
check_eq "4: that row is gone" 0 "$(count "id = $first_dead")"
check_eq "4: the other dead rows stay" 19 "$(count "aggregate_type = 'dead'")"
check "4: it says how many" grep -q 'purged 1 event$' "$T/purge1.out"
"$RELAY_BIN" purge-dead --database-url "$DATABASE_URL" --id "$waiting_id" >"$T/purge2.out" 2>&1
check_eq "4: purge-dead --id of a row that is not dead-lettered exits 1" 1 $?
check_eq "4: and keeps it" 1 "$(count "id = $waiting_id")"
# A dead-lettered event of id 0 or below (a sequence started there, an adopted table's own ids:
# the relay sends and dead-letters them as any other): --id refused every id below 1, so only
# --all could requeue or purge it.
psql_q "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, attempts,
                            rejections, last_error, dead_at) OVERRIDING SYSTEM VALUE
        VALUES (-7, 'dead', 'd-neg', 'changed', '{}', 10, 10, 'rejected', now())" >/dev/null ||
    fail "4: insert a dead row of id -7"
"$RELAY_BIN" requeue --database-url "$DATABASE_URL" --id -7 >"$T/requeue-neg.out" 2>&1
check_eq "4: requeue --id -7 exits 0" 0 $?
check_eq "4: ...and puts that row back in line (no longer dead, unsent)" 1 \
    "$(count "id = -7 AND dead_at IS NULL AND sent_at IS NULL")"
psql_q "UPDATE outbox SET dead_at = now() WHERE id = -7" >/dev/null || fail "4: dead-letter -7 again"
"$RELAY_BIN" purge-dead --database-url "$DATABASE_URL" --id -7 >"$T/purge-neg.out" 2>&1
check_eq "4: purge-dead --id -7 exits 0" 0 $?
check_eq "4: ...and that row is gone" 0 "$(count "id = -7")"
"$RELAY_BIN" purge-dead --database-url "$DATABASE_URL" --all >"$T/purge3.out" 2>&1
check_eq "4: purge-dead --all exits 0" 0 $?
check_eq "4: every dead row is gone" 0 "$(count "dead_at IS NOT NULL")"
check_eq "4: rows waiting for a retry are untouched" 30 "$(count "aggregate_type = 'waiting'")"
"$RELAY_BIN" purge-dead --database-url "$DATABASE_URL" >"$T/purge4.out" 2>&1
check_eq "4: purge-dead without --id or --all is bad input (2)" 2 $?

# --- 5. a sweep's cost: each row about once ---
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, attempts, rejections,
                            last_error, dead_at)
        SELECT 'bulk', 'b-' || (g % 100), 'changed', '{}', 10, 10, 'rejected', now()
        FROM generate_series(1, 60000) g"
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
        SELECT 'old', 'o-' || (g % 100), 'changed', '{}', now() - interval '1 hour' + g * interval '1 ms'
        FROM generate_series(1, 20000) g"
psql_q "ANALYZE outbox"
old_snapshot_open
wait_for "5: an old snapshot is held" 10 old_snapshot_held
stat() { # stat EXPR: of the outbox's statistics (flushed by a session when it ends)
    psql_q "SELECT $1 FROM pg_stat_user_tables t, pg_stat_user_indexes i
            WHERE t.relid = 'outbox'::regclass AND i.indexrelid = 'outbox_sent_at_idx'::regclass"
}
seq_before=$(stat t.seq_tup_read)
idx_before=$(stat i.idx_tup_read)
del_before=$(stat t.n_tup_del)
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --retention 3s --log-level debug
# Waited for in the relay's log: a count of the table would read it by a sequential scan itself.
swept_total() {
    sed -n 's/.*msg="retention sweep done" deleted=\([0-9]*\).*/\1/p' "$RELAY_LOG" |
        awk '{ n += $1 } END { print n + 0 }'
}
swept_all() { [ "$(swept_total)" -ge 20000 ]; }
wait_for "5: the relay's sweeps deleted 20,000 rows" 120 swept_all
relay_stop
deletions_counted() { [ "$(stat t.n_tup_del)" -ge $((del_before + 20000)) ]; }
wait_for "5: the relay's sessions ended (their statistics are in)" 10 deletions_counted
seq_read=$(($(stat t.seq_tup_read) - seq_before))
idx_read=$(($(stat i.idx_tup_read) - idx_before))
check "5: rows read by sequential scans ($seq_read) are fewer than the table held (80,000)" \
    test "$seq_read" -lt 80000
check "5: entries of the sent_at index read ($idx_read) are fewer than 60,000" \
    test "$idx_read" -lt 60000
check_eq "5: the old rows are gone" 0 "$(count "aggregate_type = 'old'")"
check_eq "5: the unsent rows stay" 60000 "$(count "aggregate_type = 'bulk'")"
old_snapshot_close

# --- 6. where a batch ended reads back the same whatever the session's DateStyle and TimeZone ---
# An operator's settings for the database: India's time, written with its abbreviation IST,
# which PostgreSQL reads back as Israel's (+02, not +05:30), three and a half hours later.
psql_q "ALTER DATABASE outbox SET DateStyle = 'SQL, DMY'"
psql_q "ALTER DATABASE outbox SET TimeZone = 'Asia/Kolkata'"
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
        SELECT 'zoned', 'z-' || (g % 100), 'changed', '{}', now() - interval '1 hour' + g * interval '1 ms'
        FROM generate_series(1, 3000) g"
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --retention 3s --log-level debug
first_sweep() {
    sed -n 's/.*msg="retention sweep done" deleted=\([0-9]*\).*/\1/p' "$RELAY_LOG" | head -n 1
}
swept_once() { [ -n "$(first_sweep)" ]; }
wait_for "6: a sweep ended" 60 swept_once
relay_stop
check_eq "6: the first sweep deleted the 3,000 old rows (it went on from where each batch ended)" \
    3000 "$(first_sweep)"
psql_q "ALTER DATABASE outbox RESET DateStyle; ALTER DATABASE outbox RESET TimeZone"

# --- 7. rows marked sent as docs/debezium.md says, then swept ---
mark_sql=$(sed -n 's/.*(`\(UPDATE outbox SET sent_at = [^`]*\)`).*/\1/p' "$ROOT/docs/debezium.md")
[ -n "$mark_sql" ] || fail "7: docs/debezium.md gives no UPDATE ... SET sent_at"
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'adopted', 'a-' || (g % 100), 'changed', '{}' FROM generate_series(1, 20000) g"
# Kept to this part's rows: the 60,000 dead-lettered rows of part 5 are unsent too, and stay so.
psql_q "$mark_sql AND aggregate_type = 'adopted'" >/dev/null || fail "7: $mark_sql"
psql_q "ANALYZE outbox"
# Every row past the retention before the relay starts, so that its first sweep deletes them all:
# a sweep that found only the first part of the UPDATE's rows past it leaves their entries (kept by
# the old snapshot) for the next sweep, which starts again at -infinity and reads them once more,
# as many as 20,000 extra entries by the luck of when the sweep ran (41,883 read once).
past_retention() {
    [ "$(psql_q "SELECT count(*) FROM outbox WHERE aggregate_type = 'adopted'
                 AND sent_at >= now() - interval '4 s'")" = 0 ]
}
wait_for "7: every marked row is past the retention" 20 past_retention
old_snapshot_open
wait_for "7: an old snapshot is held" 10 old_snapshot_held
idx_before=$(stat i.idx_tup_read)
del_before=$(stat t.n_tup_del)
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --retention 3s --log-level debug
adopted_swept() { [ "$(swept_total)" -ge 20000 ]; }
wait_for "7: the relay's sweeps deleted the 20,000 rows" 120 adopted_swept
relay_stop
deletions_counted() { [ "$(stat t.n_tup_del)" -ge $((del_before + 20000)) ]; }
wait_for "7: the relay's sessions ended (their statistics are in)" 10 deletions_counted
idx_read=$(($(stat i.idx_tup_read) - idx_before))
check "7: entries of the sent_at index read ($idx_read) are fewer than 40,000 (\`$mark_sql\`)" \
    test "$idx_read" -lt 40000
old_snapshot_close

# --- 8. a sweep's cost on a table without statistics ---
# The earlier parts' deleted rows vacuumed away: their index entries would be read once here.
psql_q "ALTER TABLE outbox SET (autovacuum_enabled = off)"
psql_q "VACUUM outbox"
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
        SELECT 'unanalyzed', 'u-' || (g % 100), 'changed', '{}', now() - interval '1 hour' + g * interval '1 ms'
        FROM generate_series(1, 20000) g"
psql_q "DELETE FROM pg_statistic WHERE starelid = 'outbox'::regclass" >/dev/null
old_snapshot_open
wait_for "8: an old snapshot is held" 10 old_snapshot_held
seq_before=$(stat t.seq_tup_read)
idx_before=$(stat i.idx_tup_read)
del_before=$(stat t.n_tup_del)
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --retention 3s --log-level debug
wait_for "8: the relay's sweeps deleted the 20,000 rows" 120 adopted_swept
relay_stop
wait_for "8: the relay's sessions ended (their statistics are in)" 10 deletions_counted
seq_read=$(($(stat t.seq_tup_read) - seq_before))
idx_read=$(($(stat i.idx_tup_read) - idx_before))
check "8: rows read by sequential scans ($seq_read) are fewer than the table held (80,000)" \
    test "$seq_read" -lt 80000
check "8: entries of the sent_at index read ($idx_read) are fewer than 40,000" \
    test "$idx_read" -lt 40000
check_eq "8: the table is still without statistics" 0 \
    "$(psql_q "SELECT count(*) FROM pg_statistic WHERE starelid = 'outbox'::regclass")"
old_snapshot_close
psql_q "ALTER TABLE outbox RESET (autovacuum_enabled)"
