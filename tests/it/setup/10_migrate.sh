#!/bin/bash
# Proves: `outbox-relay migrate` creates the outbox schema the relay and applications rely on
# (columns and defaults), records one schema_migrations row per migrations/*.sql file, is a no-op
# when run again, is safe when several instances start at once, and that the SQL files also
# apply with plain psql in order (so operators can review and run them by hand); --table
# public.outbox is the relay's own table (migrated, not adopted), and a --schema that does not
# exist is refused in one line (exit 1), as is adopting a table whose index names another relation
# holds (a table renamed keeps them) or a bookkeeping column of its own that does not work as the
# relay's (attempts that may be NULL); a table another transaction holds makes migrate give up
# after its lock_timeout (exit 1), not wait for ever. With PostgreSQL
# down it fails at once, or with --connect-wait retries until the server is up (exit 0) or the
# wait is over (exit 1, one error line).
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start

mapfile -t files < <(ls "$ROOT"/migrations/*.sql | sort)
[ ${#files[@]} -gt 0 ] || fail "migrations/*.sql exist"

# Rows of schema_migrations naming this file (by file name, name without .sql, or its number).
recorded() {
    local db=$1 f
    f=$(basename "$2")
    psql_q "SELECT count(*) FROM schema_migrations
            WHERE version IN ('$f', '${f%.sql}', '${f%%_*}')" -d "$db"
}

# Checks that database $1 has one schema_migrations row per file, and nothing else.
check_recorded() {
    local db=$1 label=$2 f
    check_eq "$label: one schema_migrations row per file" "${#files[@]}" \
        "$(psql_q "SELECT count(*) FROM schema_migrations" -d "$db")"
    for f in "${files[@]}"; do
        check_eq "$label: $(basename "$f") recorded once" 1 "$(recorded "$db" "$f")"
    done
}

# --- first run, second run ---
relay_migrate 2>"$T/migrate1.log"
check_eq "first migrate exits 0" 0 $?
check_eq "outbox has the documented columns" \
    "aggregate_id aggregate_type attempts created_at dead_at dead_letter_topic event_id event_type headers id lane last_error next_attempt_at payload rejections sent_at" \
    "$(psql_q "SELECT string_agg(column_name, ' ' ORDER BY column_name)
               FROM information_schema.columns WHERE table_name = 'outbox'")"
check_recorded outbox "after first migrate"

# An application inserts only its own fields; everything else must default sensibly.
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        VALUES ('order', 'o-1', 'created', '{\"n\": 1}')" >/dev/null
check_eq "defaults: event_id set, attempts 0, sent_at and last_error null, created_at set" \
    "t|0|t|t|t" \
    "$(psql_q "SELECT event_id IS NOT NULL, attempts, sent_at IS NULL, last_error IS NULL,
                      created_at IS NOT NULL FROM outbox")"
dup=$(psql_q "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload)
              SELECT event_id, 'order', 'o-2', 'created', '{}' FROM outbox" 2>&1)
check "event_id is unique" grep -q 'duplicate key' <<<"$dup"

before=$(psql_q "SELECT string_agg(version || '@' || applied_at, ',' ORDER BY version)
                 FROM schema_migrations")
relay_migrate 2>"$T/migrate2.log"
check_eq "second migrate exits 0" 0 $?
check_eq "second migrate changes nothing in schema_migrations" "$before" \
    "$(psql_q "SELECT string_agg(version || '@' || applied_at, ',' ORDER BY version)
               FROM schema_migrations")"
check_eq "second migrate keeps the rows" 1 "$(psql_q "SELECT count(*) FROM outbox")"

# --- concurrent runs on a fresh database ---
psql_q "CREATE DATABASE outbox_conc" -d postgres
conc_url=postgresql://postgres@127.0.0.1:$PGPORT/outbox_conc
pids=()
for i in 1 2 3 4; do
    "$RELAY_BIN" migrate --database-url "$conc_url" 2>"$T/conc.$i.log" &
    pids+=($!)
done
for i in 1 2 3 4; do
    wait "${pids[$((i - 1))]}"
    check_eq "concurrent migrate $i of 4 exits 0" 0 $?
done
check_recorded outbox_conc "concurrent"

# --- plain psql, file by file ---
psql_q "CREATE DATABASE outbox_psql" -d postgres
for f in "${files[@]}"; do
    check "psql -f $(basename "$f") applies to a fresh database" \
        psql -Xq -v ON_ERROR_STOP=1 -d outbox_psql -f "$f"
done
check_eq "psql-applied schema has the outbox table" 1 \
    "$(psql_q "SELECT count(*) FROM information_schema.tables WHERE table_name = 'outbox'" \
        -d outbox_psql)"

# --- the relay's own table written out, and a --schema that does not exist ---
# --table public.outbox is the relay's own table: it used to take the adopt path for a table of
# the application's and fail "relation public.outbox does not exist" on a fresh database.
psql_q "CREATE DATABASE outbox_qual" -d postgres
qual_url=postgresql://postgres@127.0.0.1:$PGPORT/outbox_qual
"$RELAY_BIN" migrate --database-url "$qual_url" --table public.outbox 2>"$T/qual.log"
check_eq "--table public.outbox on a fresh database: migrate exits 0" 0 $?
check_recorded outbox_qual "--table public.outbox"
check "...applying the migrations, not adopting" grep -q 'msg="migrations up to date"' "$T/qual.log"
# A missing --schema: search_path "nosuch, pg_temp" put every object in pg_temp, said "migration
# applied", then failed. Now one line, exit 1, nothing created.
"$RELAY_BIN" migrate --database-url "$qual_url" --schema nosuch 2>"$T/noschema.log"
check_eq "--schema of a schema that does not exist: migrate exits 1" 1 $?
check_eq "...with one line, saying so" 1 "$(grep -c 'msg="schema does not exist; nothing migrated" schema="nosuch"' "$T/noschema.log")"
check_eq "...and nothing else on stderr (no migration said applied)" 1 "$(grep -c '' "$T/noschema.log")"

# --- an adopted table whose index names another relation holds ---
# A table renamed keeps its indexes' names: a new table of the old name, adopted, got none of
# its indexes (CREATE INDEX IF NOT EXISTS only noticed the names taken), so duplicates in its
# existing order column went unseen and a mark by that column would mark both rows sent.
psql_q "CREATE DATABASE outbox_adopt" -d postgres
adopt_url=postgresql://postgres@127.0.0.1:$PGPORT/outbox_adopt
psql_adopt() { psql_q "$1" -d outbox_adopt; }
psql_adopt "CREATE TABLE events (event_id uuid NOT NULL DEFAULT gen_random_uuid(),
            aggregate_type text NOT NULL, aggregate_id text NOT NULL,
            event_type text NOT NULL, payload jsonb)" || fail "create the table to adopt"
"$RELAY_BIN" migrate --database-url "$adopt_url" --table events 2>"$T/adopt1.log"
check_eq "adopting a table: migrate exits 0" 0 $?
psql_adopt "ALTER TABLE events RENAME TO events_old;
            CREATE TABLE events (event_id uuid NOT NULL DEFAULT gen_random_uuid(),
            aggregate_type text NOT NULL, aggregate_id text NOT NULL,
            event_type text NOT NULL, payload jsonb, id bigint);
            INSERT INTO events (aggregate_type, aggregate_id, event_type, id)
            VALUES ('a', '1', 'e', 7), ('a', '2', 'e', 7)" || fail "rename, create again"
"$RELAY_BIN" migrate --database-url "$adopt_url" --table events 2>"$T/adopt2.log"
check_eq "adopting a table whose index names the old one holds: migrate exits 1" 1 $?
check "...naming the index that is another table's" \
    grep -q 'msg="migration failed: an index name the table needs is another relation.s.*index="events_seq_idx"' \
    "$T/adopt2.log"
check_eq "...and adopting nothing (rolled back)" "" \
    "$(psql_adopt "SELECT attname FROM pg_attribute WHERE attrelid = 'events'::regclass
                   AND attname = 'sent_at'")"

# --- an adopted table with a bookkeeping column of its own ---
# ADD COLUMN IF NOT EXISTS keeps a column the table has: an attempts that may be NULL (a home-made
# outbox's) left a failed row on neither index the claims read once the floor passed it.
psql_adopt "CREATE TABLE own_attempts (event_id uuid NOT NULL DEFAULT gen_random_uuid(),
            aggregate_type text NOT NULL, aggregate_id text NOT NULL,
            event_type text NOT NULL, payload jsonb, attempts integer)" || fail "create own_attempts"
"$RELAY_BIN" migrate --database-url "$adopt_url" --table own_attempts 2>"$T/own_attempts.log"
check_eq "adopting a table whose attempts may be NULL: migrate exits 1" 1 $?
check "...naming the column and what it must be" \
    grep -q 'column="attempts" expected="integer NOT NULL DEFAULT 0"' "$T/own_attempts.log"
psql_adopt "ALTER TABLE own_attempts ALTER COLUMN attempts SET DEFAULT 0,
            ALTER COLUMN attempts SET NOT NULL" || fail "fix attempts"
"$RELAY_BIN" migrate --database-url "$adopt_url" --table own_attempts 2>"$T/own_attempts2.log"
check_eq "...adopted once it is" 0 $?

# --- a table another transaction holds ---
# Adoption's ALTER TABLE waits for every transaction holding the table, and every writer's INSERT
# queues behind it: migrate waited without end. Now it gives up after its lock_timeout (10 s),
# exit 1, saying why, and changes nothing.
psql_adopt "CREATE TABLE held (event_id uuid NOT NULL DEFAULT gen_random_uuid(),
            aggregate_type text NOT NULL, aggregate_id text NOT NULL,
            event_type text NOT NULL, payload jsonb)" || fail "create the held table"
coproc HOLDER { psql -XAtq -v ON_ERROR_STOP=1 -d outbox_adopt 2>&1; }
holder_pid=$HOLDER_PID
_t_track "$holder_pid"
echo "BEGIN; SELECT count(*) FROM held;" >&"${HOLDER[1]}"
read -r -t 10 held_rows <&"${HOLDER[0]}" || fail "the holder reads the table"
[ "$held_rows" = 0 ] || fail "the holder reads the table: $held_rows"
timeout 60 "$RELAY_BIN" migrate --database-url "$adopt_url" --table held 2>"$T/held.log"
check_eq "adopting a table another transaction holds: migrate exits 1 (not waiting for ever)" 1 $?
check "...saying that a lock was not had in time, and to run it again" \
    grep -q 'msg="migration failed" step=adopt error=".*canceling statement due to lock timeout.*run migrate again' \
    "$T/held.log"
echo "COMMIT;" >&"${HOLDER[1]}"
echo '\q' >&"${HOLDER[1]}"
wait "$holder_pid" 2>/dev/null
"$RELAY_BIN" migrate --database-url "$adopt_url" --table held 2>"$T/held2.log"
check_eq "...and adopts it once the transaction ended" 0 $?

# --- a database that is still starting (--connect-wait) ---
# As in docker compose: migrate starts while PostgreSQL does not accept connections yet. Without
# --connect-wait it tries once and fails; with it, it retries until the server is up.
psql_q "CREATE DATABASE outbox_wait" -d postgres
wait_url=postgresql://postgres@127.0.0.1:$PGPORT/outbox_wait
pg_stop
relay_migrate_at() { "$RELAY_BIN" migrate --database-url "$wait_url" "$@"; }
relay_migrate_at 2>"$T/nowait.log"
check_eq "PostgreSQL down, no --connect-wait: migrate exits 1" 1 $?
check "it says it cannot connect" grep -q 'msg="cannot connect to PostgreSQL"' "$T/nowait.log"
relay_migrate_at --connect-wait 2s 2>"$T/wait-gone.log"
check_eq "PostgreSQL down for the whole --connect-wait 2s: migrate exits 1" 1 $?
check "it said it would retry, then that it cannot connect" \
    grep -q 'msg="cannot connect to PostgreSQL yet, retrying" wait_s=2 ' "$T/wait-gone.log"
check_eq "the final error is logged once" 1 \
    "$(grep -c 'msg="cannot connect to PostgreSQL" ' "$T/wait-gone.log")"
relay_migrate_at --connect-wait 60s 2>"$T/wait.log" &
wait_pid=$!
_t_track "$wait_pid"
wait_for "migrate --connect-wait 60s waits while PostgreSQL is down" 30 \
    grep -q 'retrying' "$T/wait.log"
check "it is still waiting" kill -0 "$wait_pid"
pg_start
if _poll 60 _t_dead "$wait_pid"; then
    wait "$wait_pid"
    check_eq "once PostgreSQL is up, migrate exits 0" 0 $?
else
    not_ok "once PostgreSQL is up, migrate exits within 60 s" "still running"
fi
check_recorded outbox_wait "after waiting for PostgreSQL"
usage_out=$("$RELAY_BIN" migrate --database-url "$wait_url" --connect-wait 5x 2>&1)
check_eq "--connect-wait 5x: exit 2" 2 $?
check "it names the option" grep -q 'connect-wait' <<<"$usage_out"
