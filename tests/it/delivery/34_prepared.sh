#!/bin/bash
# Proves the claim and the sent-mark run as statements prepared on each session's connection
# (planned once, not at every claim), and that the relay gets past what breaks a prepared
# statement: (1) a column type change under a running relay ("cached plan must not change result
# type") is claimed past by preparing the claim afresh; (2) a table missing when a new connection
# prepares its statements (the preparation fails) is prepared again once the table is back. Rows
# inserted meanwhile are all delivered, in order per aggregate.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 3
relay_migrate 2>"$T/migrate.log" || fail "migrate"

# The server logs every statement, with the name of the prepared statement it ran as.
cat >>"$T/pg/postgresql.conf" <<'EOF'
log_statement = 'all'
EOF
psql_q "SELECT pg_reload_conf()" >/dev/null

# insert FROM TO: rows with seq FROM..TO over 20 aggregates.
insert() {
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            SELECT 'order', 'order-' || (g % 20), 'order.updated', jsonb_build_object('seq', g)
            FROM generate_series($1, $2) AS g ORDER BY g"
}
# log_since LINE: the server log from LINE on.
log_since() {
    tail -n "+$1" "$T/pg.log"
}
log_lines() {
    grep -c '' "$T/pg.log"
}

relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --log-level debug
insert 1 200
wait_for "1: every row gets sent_at" 60 no_unsent_rows
check "1: claims run as prepared statements" \
    grep -qE 'execute outbox_relay_[0-9]+: SELECT w.seq, CASE WHEN w.too_big' "$T/pg.log"
check "1: no claim is sent as a one-off statement" lacks "$T/pg.log" 'execute <unnamed>: SELECT w.seq, CASE WHEN w.too_big'
check "1: sent-marks run as prepared statements" \
    grep -qE 'execute outbox_relay_[0-9]+: UPDATE "outbox" SET sent_at' "$T/pg.log"
check "1: no sent-mark is sent as a one-off statement" \
    lacks "$T/pg.log" 'execute <unnamed>: UPDATE "outbox" SET sent_at'

# 1. A column of the claim's result changes type while the relay runs.
from=$(log_lines)
check "1: event_type changed from text to varchar" \
    psql_q "ALTER TABLE outbox ALTER COLUMN event_type TYPE varchar(200)"
insert 201 300
wait_for "1: rows inserted after the type change get sent_at" 60 no_unsent_rows
check "1: the stale claim failed as PostgreSQL says" \
    grep -q 'cached plan must not change result type' "$RELAY_LOG"
check "1: then the relay claimed again" grep -q 'msg="claiming rows works again"' "$RELAY_LOG"
check "1: claims after the change run prepared afresh" \
    grep -qE 'execute outbox_relay_[0-9]+: SELECT w.seq, CASE WHEN w.too_big' <(log_since "$from")

# 2. The sessions' connections drop while the table is away: the new connections' preparations
# fail, then succeed once the table is back.
check "2: the table renamed away" psql_q "ALTER TABLE outbox RENAME TO outbox_away"
from=$(log_lines)
# By name, not by lane lock: a session whose claim already failed on the missing table has given
# its lanes up (a setup fault), and holds none.
check "2: the relay's session backends were terminated" test "$(psql_q "
    SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
    WHERE application_name LIKE 'outbox-relay session-%'")" -ge 1
prepare_failed() {
    log_since "$from" | grep -A1 'ERROR:  relation "outbox" does not exist' |
        grep -qE 'STATEMENT:  SELECT w.seq, CASE WHEN w.too_big'
}
wait_for "2: a new connection's claim preparation failed" 30 prepare_failed
check "2: the table renamed back" psql_q "ALTER TABLE outbox_away RENAME TO outbox"
from=$(log_lines)
insert 301 400
wait_for "2: rows inserted after the table came back get sent_at" 60 no_unsent_rows
check "2: claims run prepared again" \
    grep -qE 'execute outbox_relay_[0-9]+: SELECT w.seq, CASE WHEN w.too_big' <(log_since "$from")
check "2: the relay is still running" relay_running

relay_stop
check_eq "the relay exits 0 on SIGTERM" 0 $?
check_delivered order
