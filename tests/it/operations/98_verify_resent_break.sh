#!/bin/bash
# Proves that `outbox-relay verify` still reports a real order break whose events were sent again
# (docs/operations.md, "Verify"): a producer's first request to a partition rejected lets the
# events behind it into the topic ahead of the rejected ones' retry (docs/guarantees.md, "In
# Kafka"); those events, cancelled with the producer, go out again after the retried ones. A
# consumer that drops duplicates then saw events 3 and 4 of the aggregate before 1 and 2. Here
# their messages are written by hand in that order (3, 4, 1, 2, 3, 4):
#  1. verify: out of order (exit 1), the pair named (event 3's first copy before event 2's), and
#     a line saying a later copy stands in the row's place and naming --after-replay;
#  2. verify --after-replay (a replay of events Kafka held leaves the same topic): ok, the two
#     rows judged by their later copies, counted on stdout and in --json.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"

OPTS=(--database-url "$DATABASE_URL" --brokers "$BROKERS" --since 1h --from-beginning)
read -r e1 e2 e3 e4 < <(psql_q "WITH r AS (
    INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
    SELECT 'order', 'o-brk', 'Step', jsonb_build_object('n', g), now()
    FROM generate_series(1, 4) g ORDER BY g RETURNING id, event_id)
    SELECT string_agg(event_id::text, ' ' ORDER BY id) FROM r")
check "4 rows inserted" test -n "$e4"
for e in "$e3" "$e4" "$e1" "$e2" "$e3" "$e4"; do
    printf '{"key": "o-brk", "value": "x", "headers": [["id", "%s"]]}\n' "$e"
done | "$BIN/produce" --brokers "$BROKERS" --topic outbox.event.order >/dev/null ||
    fail "produce the hand-made messages"

# --- 1. by default: out of order ---
"$RELAY_BIN" verify "${OPTS[@]}" >"$T/verify.out" 2>"$T/verify.err"
check_eq "1: verify: exit 1" 1 $?
check "1: FAILED, 1 out of order, 2 duplicates, none judged by a later copy" grep -q \
    '^verify: FAILED: window=3600s rows=4 messages=6 missing=0 out_of_order=1 duplicates=2 ' \
    "$T/verify.out"
check_eq "1: ... and no line of rows judged by a later copy" 0 \
    "$(grep -c 'judged by a later copy' "$T/verify.out")"
check "1: event 2's copy named after event 3's first copy" grep -q \
    "out of order: id=[0-9]* event_id=$e2 (partition 0 offset 3) comes after id=[0-9]* event_id=$e3 (partition 0 offset 0)" \
    "$T/verify.err"
check "1: a line says a later copy stands in its place and names --after-replay" grep -q \
    '^verify: 1 row(s) out of order with a later copy in their place, .*--after-replay' \
    "$T/verify.err"
"$RELAY_BIN" verify "${OPTS[@]}" --json >"$T/verify.json" 2>/dev/null
check_eq "1: --json: failed, 1 out of order, 0 judged by a later copy" "false 1 0" \
    "$(jq -r '"\(.ok) \(.out_of_order) \(.judged_by_later_copy)"' "$T/verify.json")"

# --- 2. --after-replay: judged by the later copies ---
"$RELAY_BIN" verify "${OPTS[@]}" --after-replay >"$T/verify.out" 2>"$T/verify.err"
check_eq "2: verify --after-replay: exit 0" 0 $?
check "2: ok, nothing out of order, 2 duplicates" grep -q \
    '^verify: ok: window=3600s rows=4 messages=6 missing=0 out_of_order=0 duplicates=2 ' \
    "$T/verify.out"
check "2: 2 rows judged by a later copy" grep -q '^verify: 2 row(s) judged by a later copy: ' \
    "$T/verify.out"
check_eq "2: nothing on stderr" "" "$(cat "$T/verify.err")"
