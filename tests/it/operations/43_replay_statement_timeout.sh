#!/bin/bash
# Proves that a replay whose batch the server cancels for a statement_timeout of the role's (or
# of PGOPTIONS, or postgresql.conf: replay leaves any in place) says so: one line names the
# setting, its value and who set it (the role, the connection, the server's configuration), and
# what lifts it (smaller batches, or a longer one in the URL's
# options), since --statement-timeout, which bounds replay's own waits, does not; before, the
# server's "canceling statement due to statement timeout" alone sent operators to raise that, to
# the same end. Then the remedy it names works as written: the same replay with the line's
# ?options=-c%20statement_timeout%3D0 in the URL replays every row. A trigger that sleeps 0.3 s a row makes every
# batch outlast the role's 100 ms, however fast the machine. A statement someone cancels
# (pg_cancel_backend: the same SQLSTATE 57014) gets no such line, with the role's 1h set. A
# summary the setting cancels gets the summary's remedies (fewer events), not smaller batches.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
relay_migrate 2>"$T/migrate.log" || fail "migrate"

psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
        SELECT 'order', 'o-1', 'Updated', jsonb_build_object('n', g), now()
        FROM generate_series(1, 3) g ORDER BY g"
psql_q "CREATE FUNCTION slow_row() RETURNS trigger LANGUAGE plpgsql AS
        \$\$ BEGIN PERFORM pg_sleep(0.3); RETURN NEW; END \$\$"
psql_q "CREATE TRIGGER slow_row BEFORE UPDATE ON outbox FOR EACH ROW EXECUTE FUNCTION slow_row()"
psql_q "ALTER ROLE postgres SET statement_timeout = '100ms'"
# The test's own statements go without it (psql reads PGOPTIONS); replay's connections do not.
export PGOPTIONS="-c statement_timeout=0"
replay() {
    env -u PGOPTIONS "$RELAY_BIN" replay --aggregate-type order --statement-timeout 600s "$@"
}

replay --database-url "$DATABASE_URL" >"$T/replay.out" 2>"$T/replay.err"
check_eq "exit 1" 1 $?
check "... the server's error" grep -q 'canceling statement due to statement timeout' "$T/replay.err"
check "... a line naming the session's statement_timeout, who set it (the role), and what lifts it" grep -q \
    "statement_timeout for this session .* --statement-timeout does not lift it: .*--batch-rows.*options=-c%20statement_timeout%3D0 in the URL.* statement_timeout=\"100ms\" set_by=\"the role (ALTER ROLE ... SET)\"" \
    "$T/replay.err"
check "... and the bounds of the rest" grep -q '^replay: 0 events replayed before the failure' \
    "$T/replay.out"
check_eq "... nothing replayed" 0 "$(psql_q "SELECT count(*) FROM outbox WHERE sent_at IS NULL")"

# Who set it, wherever it was set: the line named "the role's, the database's or the connection
# string's" whatever the source, and sent operators past PGOPTIONS and postgresql.conf.
PGOPTIONS="-c statement_timeout=150ms" "$RELAY_BIN" replay --aggregate-type order \
    --statement-timeout 600s --database-url "$DATABASE_URL" >"$T/replay-pgo.out" 2>"$T/replay-pgo.err"
check_eq "a statement_timeout of PGOPTIONS: exit 1" 1 $?
check "... the line says the connection set it" grep -q \
    'statement_timeout="150ms" set_by="the connection (options in the URL or PGOPTIONS)"' \
    "$T/replay-pgo.err"
psql_q "ALTER ROLE postgres RESET statement_timeout" >/dev/null
psql_q "ALTER SYSTEM SET statement_timeout = '120ms'" >/dev/null
psql_q "SELECT pg_reload_conf()" >/dev/null
conf_timeout() {
    [ "$(env -u PGOPTIONS psql -XAtq -d "$DATABASE_URL" -c "SELECT setting || source FROM pg_settings
          WHERE name = 'statement_timeout'")" = "120configuration file" ]
}
wait_for "postgresql.conf's statement_timeout (ALTER SYSTEM) in force for new sessions" 30 conf_timeout
replay --database-url "$DATABASE_URL" >"$T/replay-conf.out" 2>"$T/replay-conf.err"
check_eq "a statement_timeout of the server's configuration: exit 1" 1 $?
check "... the line says the server's configuration set it" grep -q \
    'statement_timeout="120ms" set_by="the server.s configuration (postgresql.conf, ALTER SYSTEM)"' \
    "$T/replay-conf.err"
psql_q "ALTER SYSTEM RESET statement_timeout" >/dev/null
psql_q "SELECT pg_reload_conf()" >/dev/null
psql_q "ALTER ROLE postgres SET statement_timeout = '100ms'" >/dev/null
check_eq "... nothing replayed by either" 0 \
    "$(psql_q "SELECT count(*) FROM outbox WHERE sent_at IS NULL")"

# The remedy exactly as the line gives it: libpq refuses a URL whose options carry a bare space
# or a second = ("extra key/value separator"), as the line's first wording had it.
hint=$(grep -o '?options=-c[^ ),"]*' "$T/replay.err" | head -n 1)
replay --database-url "$DATABASE_URL$hint" >"$T/replay2.out" 2>"$T/replay2.err"
check_eq "with the line's options in the URL ($hint): exit 0" 0 $?
check "... 3 events replayed" grep -q '^replay: 3 events replayed in ' "$T/replay2.out"
check_eq "... every row unsent" 3 "$(psql_q "SELECT count(*) FROM outbox WHERE sent_at IS NULL")"

# A statement someone cancels (pg_cancel_backend, an operator's Ctrl-C in another tool) ends with
# the same SQLSTATE 57014 as a statement timeout, but the server's words say which: with a
# statement_timeout of the role's far from expired, the cancel is not blamed on it (the line
# sent the operator to lift a setting that had nothing to do with the failure).
psql_q "UPDATE outbox SET sent_at = now()"
psql_q "CREATE OR REPLACE FUNCTION slow_row() RETURNS trigger LANGUAGE plpgsql AS
        \$\$ BEGIN PERFORM pg_sleep(120); RETURN NEW; END \$\$"
psql_q "ALTER ROLE postgres SET statement_timeout = '1h'"
replay --database-url "$DATABASE_URL" >"$T/replay3.out" 2>"$T/replay3.err" &
replay_pid=$!
_t_track "$replay_pid"
replay_sleeping() {
    [ "$(psql_q "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'
                 AND query LIKE 'DO \$replay\$%'")" = 1 ]
}
wait_for "a replay's batch under way (its trigger sleeping)" 60 replay_sleeping
psql_q "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE wait_event = 'PgSleep'
        AND query LIKE 'DO \$replay\$%'" >/dev/null
wait_for "... cancelled by pg_cancel_backend, replay ends" 60 _t_dead "$replay_pid"
wait "$replay_pid"
check_eq "... exit 1" 1 $?
check "... the server's error" grep -q 'canceling statement due to user request' "$T/replay3.err"
check "... no line blaming the session's statement_timeout (1h, far from expired)" \
    lacks "$T/replay3.err" "statement_timeout for this session"
check_eq "... nothing replayed" 0 "$(psql_q "SELECT count(*) FROM outbox WHERE sent_at IS NULL")"

# The summary, which reads the whole selection once, is cut short by the same setting: its line
# names the remedies for it. Smaller batches (the batch's remedy) do not shorten it. An aggregate
# type column whose cast to text sleeps 0.2 s makes the summary (which groups by it) outlast
# the role's 100 ms whatever the machine; the statements before it do not read that column.
psql_q "CREATE TYPE slow_type AS ENUM ('order')"
psql_q "CREATE FUNCTION slow_text(slow_type) RETURNS text LANGUAGE plpgsql AS
        \$\$ BEGIN PERFORM pg_sleep(0.2); RETURN 'order'; END \$\$"
psql_q "CREATE CAST (slow_type AS text) WITH FUNCTION slow_text(slow_type)"
psql_q "ALTER TABLE outbox ADD COLUMN slow_type slow_type NOT NULL DEFAULT 'order'"
psql_q "ALTER ROLE postgres SET statement_timeout = '100ms'"
env -u PGOPTIONS "$RELAY_BIN" replay --aggregate-type-column slow_type --event-type Updated \
    --statement-timeout 600s --database-url "$DATABASE_URL" >"$T/replay4.out" 2>"$T/replay4.err"
check_eq "the summary cancelled by the role's statement_timeout: exit 1" 1 $?
check "... the server's error, on the read of the selection" grep -q \
    'cannot read the selection.*canceling statement due to statement timeout' "$T/replay4.err"
check "... a line naming the setting and the summary's remedies: fewer events or a longer one" \
    grep -q "statement_timeout for this session cancelled the read of the selection.*: select fewer events (--sent-after.*options=-c%20statement_timeout%3D0 in the URL.* statement_timeout=\"100ms\" set_by=\"the role (ALTER ROLE ... SET)\"" \
    "$T/replay4.err"
check "... not smaller batches, which do not shorten it" lacks "$T/replay4.err" "--batch-rows"
check_eq "... nothing replayed" 0 "$(psql_q "SELECT count(*) FROM outbox WHERE sent_at IS NULL")"
