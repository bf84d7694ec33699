#!/bin/bash
# Proves `outbox-relay status` read from a standby (dead, status and verify may read one) does not
# report the relays as gone: their sessions and lane locks are on the primary, which a standby's
# pg_locks does not show. The relay sessions are "-" there (null in --json), while the backlog and
# the dead-lettered count, replicated, are read as on the primary.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"
standby_start

psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'order', 'o-' || g, 'Updated', '{}' FROM generate_series(1, 7) g"
psql_q "UPDATE outbox SET attempts = 2, rejections = 2, dead_at = now() WHERE id <= 2"
# Kafka down: the relay's session holds its lanes and the five rows stay unsent.
broker_down
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --delivery-timeout 600000 \
    --kafka reconnect.backoff.max.ms=500
SB_URL="postgresql://postgres@127.0.0.1:$SB_PORT/outbox"
status() { "$RELAY_BIN" status "$@"; }
active() { status --json --database-url "$DATABASE_URL" | jq -e '.sessions | length > 0' >/dev/null; }
wait_for "the relay's sessions show on the primary" 30 active
replicated() { [ "$(psql -XAtq -h 127.0.0.1 -p "$SB_PORT" -U postgres -d outbox \
    -c "SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL" 2>/dev/null)" = 2 ]; }
wait_for "the standby has the rows" 30 replicated

status --database-url "$SB_URL" >"$T/sb.txt" 2>&1
check_eq "status on the standby exits 0" 0 $?
check "... reads the backlog" grep -qE '^backlog: +5 unsent events' "$T/sb.txt"
check "... and the dead-lettered count" grep -qE '^dead-lettered: +2$' "$T/sb.txt"
check "... but does not call the relays gone" lacks "$T/sb.txt" "0 active"
check "... it says the sessions are on the primary" \
    grep -q "^relay sessions: - (a standby: the relays' sessions and their locks are on the primary)" \
    "$T/sb.txt"
status --json --database-url "$SB_URL" >"$T/sb.json" 2>&1
check_eq "status --json on the standby exits 0" 0 $?
check_eq "... backlog 5, dead 2, sessions null" "5 2 null" \
    "$(jq -r '"\(.backlog) \(.dead_lettered) \(.sessions)"' "$T/sb.json")"
relay_stop
