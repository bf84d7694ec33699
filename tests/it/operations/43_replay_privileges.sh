#!/bin/bash
# Proves `outbox-relay replay` names the privilege a role lacks:
#  1. a role that may not read the outbox: a dry run exits 1 with PostgreSQL's "permission
#     denied for table", not the hint that replay needs UPDATE on the order column (a dry run
#     needs no UPDATE at all);
#  2. the relay's role (outbox_relay: SELECT, UPDATE of the delivery columns only): its dry run
#     works, and a replay exits 1 saying it needs UPDATE on the order column (run it as the
#     table's owner), nothing replayed.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
relay_migrate 2>"$T/migrate.log" || fail "migrate"

psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'order', 'o-' || g, 'Updated', '{}' FROM generate_series(1, 5) g"
psql_q "UPDATE outbox SET sent_at = now()"
psql_q "CREATE ROLE stranger LOGIN; GRANT USAGE ON SCHEMA public TO stranger;
        CREATE ROLE relay_login LOGIN IN ROLE outbox_relay"
replay_as() { # replay_as ROLE OUT ARGS...
    local role=$1 out=$2
    shift 2
    timeout 60 "$RELAY_BIN" replay --database-url "postgresql://$role@127.0.0.1:$PGPORT/outbox" \
        --from-id 1 "$@" >"$out" 2>&1
}

# --- 1. ---
replay_as stranger "$T/stranger.out" --dry-run
check_eq "1: a role that may not read the outbox: exit 1" 1 $?
check "1: ... PostgreSQL's error named" grep -q 'permission denied for table outbox' "$T/stranger.out"
check "1: ... not the hint about UPDATE on the order column" \
    lacks "$T/stranger.out" "needs UPDATE on the order column"

# --- 2. ---
replay_as relay_login "$T/relay-dry.out" --dry-run
check_eq "2: the relay's role: a dry run exits 0" 0 $?
check "2: ... and counts the 5 events" grep -q '^replay: dry run: 5 events would be replayed' \
    "$T/relay-dry.out"
replay_as relay_login "$T/relay.out"
check_eq "2: the relay's role: replay exits 1" 1 $?
check "2: ... saying it needs UPDATE on the order column" \
    grep -q 'replay needs UPDATE on the order column' "$T/relay.out"
check_eq "2: ... nothing replayed" 0 "$(psql_q "SELECT count(*) FROM outbox WHERE sent_at IS NULL")"
