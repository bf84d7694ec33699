#!/bin/bash
# Proves text that writers choose cannot forge log lines or drive the operator's terminal
# (lib/log.c, relay/cmd/admin.c, docs/security.md):
#  1. an adopted table with text event ids: a row whose event id holds ESC, an OSC title
#     sequence, U+2028, U+0085, U+202E and a newline followed by a forged "level=error" line is
#     dead-lettered; the relay's log holds no raw ESC, BEL, U+2028, U+0085 or U+202E, no line
#     that starts with the forged text, and the event id escaped (\x1b, \u2028);
#  2. `outbox-relay dead` (table and --json) prints that row without any of those characters
#     raw, and the JSON still decodes to the row's exact event id;
#  3. a prepared transaction whose name (any role chooses it) holds the same characters is
#     named in the "holds back vacuum" warning escaped, never raw;
#  4. `dead --json` on a row whose text is not UTF-8 (a SQL_ASCII database keeps any bytes)
#     says so and exits 1, never a list that leaves the row out and exits 0; `status --json`
#     with a session whose role name is not UTF-8 likewise (before: the session silently left
#     out of "sessions", exit 0), and its text form shows that name escaped (before: ESC raw).
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
# The hostile strings below are written with $'\uXXXX', which bash encodes by the locale's
# charset: in the C locale (a fresh Debian's) they would stay the six characters "\u2028".
export LC_ALL=C.UTF-8
t_setup
pg_start
# Prepared transactions are off by default; the GID test needs a few.
echo "max_prepared_transactions = 4" >>"$T/pg/postgresql.conf"
pg_restart
broker_start 1

psql_q "CREATE TABLE outbox (
            id text NOT NULL PRIMARY KEY,
            aggregatetype varchar(255) NOT NULL,
            aggregateid varchar(255) NOT NULL,
            type varchar(255) NOT NULL,
            payload jsonb)" || fail "create the adopted table"
cat >"$T/adopted.json" <<'EOF'
{
  "layout": "debezium",
  "table.field.event.id": "id",
  "table.field.event.key": "aggregateid",
  "table.field.event.type": "type",
  "table.field.event.payload": "payload",
  "route.by.field": "aggregatetype",
  "route.topic.replacement": "outbox.event.${routedByValue}"
}
EOF
relay_migrate --config "$T/adopted.json" 2>"$T/migrate.log" || fail "migrate adopts the table"

# The hostile text: ESC [2J (clear screen), an OSC window title ended by BEL, U+2028, U+0085,
# U+202E, then a newline and what would be a whole forged line.
HOSTILE="ev-1"$'\e'"[2J"$'\e'"]0;pwned"$'\a'$'\u2028'"level=error"$'\u0085'$'\u202e'"x"$'\n'"2026-01-01T00:00:00.000Z level=error msg=\"forged\""
# Dollar quoting keeps every byte; the topic 'outbox.event.bad topic!' is illegal, so the row
# fails for good and, with --max-attempts 1, is dead at once.
psql_q "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
        VALUES (\$h\$$HOSTILE\$h\$, 'bad topic!', 'a-1', 'Created', '{}'),
               ('ev-2', 'good', 'a-2', 'Created', '{}')" || fail "insert the rows"
check_eq "the event id is stored byte for byte" "$HOSTILE" "$(psql_q "SELECT id FROM outbox WHERE aggregateid = 'a-1'")"

# --- 1. ---
relay_start --config "$T/adopted.json" --database-url "$DATABASE_URL" --brokers "$BROKERS" \
    --max-attempts 1 --horizon-warn 1s --metrics-listen 127.0.0.1:0 \
    --kafka reconnect.backoff.max.ms=500
dead_row() {
    [ "$(psql_q "SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL")" = 1 ]
}
wait_for "1: the hostile row is dead-lettered" 30 dead_row
wait_for "1: the relay logged it" 10 grep -q "event dead-lettered" "$RELAY_LOG"

# raw_free FILE WHAT: no raw ESC, BEL, U+2028, U+0085 or U+202E in FILE, and no line of it
# starts with the forged timestamp.
raw_free() {
    local file=$1 what=$2
    check "$what: no raw ESC" lacks "$file" $'\e'
    check "$what: no raw BEL" lacks "$file" $'\a'
    check "$what: no raw U+2028" lacks "$file" $'\u2028'
    check "$what: no raw U+0085" lacks "$file" $'\u0085'
    check "$what: no raw U+202E" lacks "$file" $'\u202e'
    check_eq "$what: no line starts with the forged text" 0 \
        "$(grep -c '^2026-01-01T00:00:00.000Z' "$file")"
}

# --- 3. --- (the relay is running: with --metrics-listen its upkeep reads the horizon every
# few seconds)
psql_q "CREATE TABLE held (x int)" || fail "create a table for the prepared transaction"
GID="gid-1"$'\e'"]0;pwned"$'\a'$'\u2028'"level=error msg=forged"
psql -XAtq -v ON_ERROR_STOP=1 -c "BEGIN" -c "INSERT INTO held VALUES (1)" \
    -c "PREPARE TRANSACTION \$g\$$GID\$g\$" >/dev/null || fail "prepare a transaction"
wait_for "3: the relay warns about the prepared transaction" 40 \
    grep -q 'holder="prepared transaction"' "$RELAY_LOG"
psql_q "ROLLBACK PREPARED \$g\$$GID\$g\$" >/dev/null
relay_stop
check_eq "1: the relay stops cleanly" 0 $?
raw_free "$RELAY_LOG" "1+3: relay log"
check "1: the event id is in the log, escaped" grep -qF 'ev-1\x1b[2J\x1b]0;pwned\x07\u2028level=error\u0085\u202ex\n2026' "$RELAY_LOG"
check "3: the prepared transaction's name is in the log, escaped" \
    grep -qF 'gid-1\x1b]0;pwned\x07\u2028level=error msg=forged' "$RELAY_LOG"

# --- 2. ---
"$RELAY_BIN" dead --config "$T/adopted.json" --database-url "$DATABASE_URL" >"$T/dead.txt" 2>"$T/dead.err"
check_eq "2: dead exits 0" 0 $?
raw_free "$T/dead.txt" "2: dead"
check "2: dead shows the event id escaped" grep -qF 'ev-1\x1b[2J' "$T/dead.txt"
"$RELAY_BIN" dead --json --config "$T/adopted.json" --database-url "$DATABASE_URL" >"$T/dead.json" 2>>"$T/dead.err"
check_eq "2: dead --json exits 0" 0 $?
raw_free "$T/dead.json" "2: dead --json"
check_eq "2: dead --json decodes to the exact event id" "$HOSTILE" "$(jq -r .event_id "$T/dead.json")"

# --- 4. ---
# A SQL_ASCII database keeps any bytes. Before, the row was left out and the list exited 0.
psql_q "CREATE DATABASE ascii ENCODING 'SQL_ASCII' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'" ||
    fail "create a SQL_ASCII database"
ASCII_URL=${DATABASE_URL%/*}/ascii
"$RELAY_BIN" migrate --database-url "$ASCII_URL" 2>"$T/migrate.ascii.log" || fail "migrate it"
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, attempts, dead_at, last_error)
        VALUES ('t', E'caf\\xe9', 'x', '{}', 1, now(), 'x')" -d ascii || fail "insert a LATIN1 row"
"$RELAY_BIN" dead --json --database-url "$ASCII_URL" >"$T/dead.ascii.json" 2>"$T/dead.ascii.err"
check_eq "4: dead --json on a row that is not UTF-8 exits 1" 1 $?
check "4: and says why" grep -q 'not UTF-8' "$T/dead.ascii.err"
"$RELAY_BIN" dead --database-url "$ASCII_URL" >"$T/dead.ascii.txt" 2>&1
check_eq "4: the table lists it (exit 0)" 0 $?
check "4: with the byte escaped" grep -qF 't/caf\xe9' "$T/dead.ascii.txt"
# A session of a role whose name is not UTF-8 holds a member slot, as a relay's would.
psql_q "DO \$d\$ BEGIN EXECUTE pg_catalog.format('CREATE ROLE %I LOGIN', E'caf\\xe9\\x1b[2J'); END \$d\$" \
    -d ascii || fail "create a role named in LATIN1"
PGAPPNAME=latin1_slot psql -XAtq -d ascii -U $'caf\xe9\e[2J' -c "SELECT pg_advisory_lock($MEMBER_NS, 5)" \
    -c "SELECT pg_sleep(600)" >/dev/null 2>&1 &
_t_track $!
slot_held() {
    [ "$(psql_q "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = $MEMBER_NS
                 AND objid = 5 AND granted" -d ascii)" = 1 ]
}
wait_for "4: the LATIN1 role's session holds a member slot" 15 slot_held
"$RELAY_BIN" status --json --database-url "$ASCII_URL" >"$T/status.ascii.json" 2>"$T/status.ascii.err"
check_eq "4: status --json with that session exits 1" 1 $?
check "4: and says why" grep -q 'not UTF-8' "$T/status.ascii.err"
"$RELAY_BIN" status --database-url "$ASCII_URL" >"$T/status.ascii.txt" 2>&1
check_eq "4: the text form still exits 0" 0 $?
raw_free "$T/status.ascii.txt" "4: status"
check "4: and shows the role name escaped" grep -qF 'caf\xe9\x1b[2J' "$T/status.ascii.txt"
psql_q "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'latin1_slot'" \
    >/dev/null
