#!/bin/bash
# Proves that `outbox-relay verify` counts a message whose `id` header holds a NUL byte as an
# unknown message, never as the event named by the header's text up to the NUL: read as a C
# string, "<event id>\0xyz" (a broken or hostile writer's) counted as that event's copy, and the
# row, which Kafka never got, was not missing (verify said ok, exit 0).
#  1. two rows marked sent: one with its own message, one with only a message whose id is its
#     event id, a NUL and more: exit 1, that row missing, the message unknown, one line on stderr
#     saying where the NUL is (shown escaped, as \x00), no NUL byte on stderr.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"

read -r good lost < <(psql_q "WITH r AS (
    INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
    SELECT 'order', 'o-' || g, 'Created', '{}', now() FROM generate_series(1, 2) g
    RETURNING id, event_id) SELECT string_agg(event_id::text, ' ' ORDER BY id) FROM r")
[ -n "$lost" ] || fail "insert the rows"
printf '%s\n' \
    "{\"key\": \"o-1\", \"value\": \"1\", \"headers\": [[\"id\", \"$good\"]]}" \
    "{\"key\": \"o-2\", \"value\": \"2\", \"headers\": [[\"id\", \"$lost\\u0000xyz\"]]}" |
    "$BIN/produce" --brokers "$BROKERS" --topic outbox.event.order >/dev/null ||
    fail "produce the messages"

# --- 1. ---
"$RELAY_BIN" verify --database-url "$DATABASE_URL" --brokers "$BROKERS" --since 1h \
    --from-beginning >"$T/verify.out" 2>"$T/verify.err"
check_eq "1: the row the NUL message names is missing: exit 1" 1 $?
check "1: ... counted: one missing, one unknown" grep -q \
    '^verify: FAILED: .*messages=2 missing=1 out_of_order=0 duplicates=0 unknown=1' "$T/verify.out"
check "1: ... the missing row named" grep -q "$lost" "$T/verify.err"
check_eq "1: ... one line for the message, saying where the NUL is" 1 \
    "$(grep -cF "unknown message: id=$lost\\x00... (40 bytes, a NUL byte at 36: no event id holds one)" \
        "$T/verify.err")"
check_eq "1: ... no NUL byte on stderr" 0 "$(tr -cd '\000' <"$T/verify.err" | wc -c)"
