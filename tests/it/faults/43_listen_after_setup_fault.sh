#!/bin/bash
# Proves that a session whose connection met a setup fault in the claim floor's check still hears
# producers once the fault is fixed. The session's first request sent LISTEN and the floor's check
# in one pipeline, which PostgreSQL runs as one implicit transaction: with the relay's role
# missing USAGE on the outbox's schema the check fails ("permission denied for schema"), and the
# LISTEN went with it, while the session believed it listened. After the GRANT it claimed again,
# went to sleep as the wakeup guard, and heard no producer: rows waited for --poll-interval.
#  1. USAGE on schema public revoked from outbox_relay (and PUBLIC), the relay (one session,
#     --poll-interval 600000, --table public.outbox: the check names the schema, and fails) started
#     as a member of outbox_relay: it reports the setup fault;
#  2. after GRANT USAGE it delivers the rows inserted before, then sleeps as the wakeup guard;
#  3. rows inserted then are delivered within 20 s (the poll timer is 10 minutes away): the guard
#     hears the producers' notification. On the old code they stayed unsent.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
fault_setup 1
psql_q "CREATE ROLE relay_c LOGIN IN ROLE outbox_relay" || fail "create the login role"
URL=postgresql://relay_c@127.0.0.1:$PGPORT/outbox
psql_q "REVOKE USAGE ON SCHEMA public FROM PUBLIC; REVOKE USAGE ON SCHEMA public FROM outbox_relay" ||
    fail "revoke USAGE"

# --- 1. the setup fault ---
insert_rows order 1 50 5
relay_start --database-url "$URL" "${FAULT_RELAY_OPTS[@]}" --table public.outbox --sessions 1 \
    --poll-interval 600000
schema_denied() { grep -q 'permission denied for schema' "$RELAY_LOG"; }
wait_for "1: the relay reports the missing USAGE" 20 schema_denied
check_eq "1: nothing is delivered meanwhile" 0 "$(sent_of order)"

# --- 2. fixed: delivery, then sleep ---
psql_q "GRANT USAGE ON SCHEMA public TO outbox_relay" || fail "grant USAGE"
wait_for "2: after the GRANT the 50 rows are delivered" 60 none_unsent_of order
wait_for "2: the relay sleeps, guarding the wakeup lock" 20 guard_held

# --- 3. it hears producers ---
insert_rows order 51 100 5
wait_for "3: rows inserted while it sleeps are delivered (it listens)" 20 none_unsent_of order
check "3: relay still running" relay_running
relay_stop
check_eq "3: relay exits 0" 0 $?
