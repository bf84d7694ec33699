#!/bin/bash
# Proves that `outbox-relay verify --json` never drops a missing row from missing_events, which
# `replay --missing` reads, when its event id is not valid UTF-8 (a SQL_ASCII database holds any
# bytes in a text column; JSON text is UTF-8):
#  1. a row marked sent with no message, its id holding the byte 0xe9: exit 1, counted missing,
#     listed in missing_events with its id and the id's bytes in hex (event_id_hex), and a line
#     on stderr says why and what to run; a row beside it with a plain id is listed as before;
#  2. `replay --missing` refuses that list (exit 2, one line) rather than put back all but the
#     row it cannot match and call the rest done.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1
psql_q "CREATE DATABASE ascii ENCODING 'SQL_ASCII' TEMPLATE template0" -d postgres ||
    fail "create the SQL_ASCII database"
export DATABASE_URL=postgresql://postgres@127.0.0.1:$PGPORT/ascii PGDATABASE=ascii
relay_migrate 2>"$T/migrate.log" || fail "migrate"

# Two rows marked sent that Kafka never got; a view gives one of them an id with a Latin-1 byte
# (the outbox's own event_id column is a uuid). A message to the topic makes it exist.
read -r plain odd < <(psql_q "WITH r AS (
    INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
    SELECT 'order', 'o-' || g, 'Created', '{}', now() FROM generate_series(1, 2) g
    RETURNING id) SELECT string_agg(id::text, ' ' ORDER BY id) FROM r")
psql_q "CREATE VIEW odd_ids AS SELECT o.id,
            CASE WHEN o.id = $odd THEN 'caf' || E'\\xe9' || '-' || o.id ELSE o.event_id::text END
                AS event_id,
            o.aggregate_type, o.aggregate_id, o.event_type, o.payload, o.sent_at
        FROM outbox o"
plain_eid=$(psql_q "SELECT event_id FROM odd_ids WHERE id = $plain")
echo '{"key": "o-0", "value": "0", "headers": [["id", "unrelated"]]}' |
    "$BIN/produce" --brokers "$BROKERS" --topic outbox.event.order >/dev/null ||
    fail "produce a message"

# --- 1. verify --json lists both ---
"$RELAY_BIN" verify --database-url "$DATABASE_URL" --brokers "$BROKERS" --since 1h \
    --from-beginning --table odd_ids --json >"$T/verify.json" 2>"$T/verify.err"
check_eq "1: two rows missing: exit 1" 1 $?
check_eq "1: ... counted missing, and both listed" "2 2" \
    "$(jq -r '"\(.missing) \(.missing_events | length)"' "$T/verify.json")"
check_eq "1: ... the plain id as it was" "$plain $plain_eid outbox.event.order" \
    "$(jq -r --argjson id "$plain" \
        '.missing_events[] | select(.id == $id) | "\(.id) \(.event_id) \(.topic)"' \
        "$T/verify.json")"
check_eq "1: ... the other with its bytes in hex and no event_id" \
    "$odd 636166e92d$(printf '%s' "$odd" | od -An -tx1 | tr -d ' \n') null outbox.event.order" \
    "$(jq -r --argjson id "$odd" \
        '.missing_events[] | select(.id == $id) | "\(.id) \(.event_id_hex) \(.event_id) \(.topic)"' \
        "$T/verify.json")"
check "1: ... a line on stderr says why and how to replay them" grep -q \
    '^verify: 1 missing event(s) have an event_id or topic that is not valid UTF-8.*--from-id' \
    "$T/verify.err"

# --- 2. replay --missing refuses the list ---
"$RELAY_BIN" replay --database-url "$DATABASE_URL" --table odd_ids --missing - --dry-run \
    <"$T/verify.json" >"$T/replay.out" 2>"$T/replay.err"
check_eq "2: replay --missing refuses the list: exit 2" 2 $?
check "2: ... naming the entry it cannot match" grep -q \
    'missing_events lacks an integer id or a string event_id' "$T/replay.err"
check_eq "2: ... one line" 1 "$(wc -l <"$T/replay.err")"

