#!/bin/bash
# Proves that `outbox-relay verify --after-replay` judges an aggregate's order after a replay of
# events Kafka still holds (docs/operations.md, "Verify" and "Replay"); without the flag verify
# reports those rows out of order (part 1), as it must a real break whose events were sent again
# (98_verify_resent_break), which the topic and the table cannot tell from a replay:
#  1. 5 aggregates of 12 events each delivered, then 3 events of one aggregate replayed
#     (--aggregate-id, --to-id) while their first copies are still in the topic, and sent again,
#     then 2 new events of that aggregate: the replayed rows' new ids put them after events their
#     first copies precede, yet verify says ok (exit 0), counts the 3 later copies as duplicates
#     and says that 3 rows were judged by a later copy; --json gives the same counts; without
#     --after-replay: out of order (exit 1), and a line names the flag;
#  2. one of those rows replayed a second time, and a replay by the time the rows were sent of
#     every event of another aggregate: still ok, the duplicates counted (13 more);
#  3. two new rows of one aggregate whose messages a hand-run producer wrote in the wrong order
#     (one copy each): reported out of order (exit 1), beside the replays that stay ok;
#  4. a row replayed and its later copy written by hand before the copy of an earlier row (both
#     copies of the row out of place): reported out of order too.
# The mock cluster cannot look offsets up by time: verify reads the topic whole
# (--from-beginning), where every first copy is found.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"

OPTS=(--database-url "$DATABASE_URL" --brokers "$BROKERS")
verify() {
    "$RELAY_BIN" verify "${OPTS[@]}" --since 1h --from-beginning --after-replay "$@" \
        >"$T/verify.out" 2>"$T/verify.err"
}
replay() {
    "$RELAY_BIN" replay --database-url "$DATABASE_URL" "$@" >>"$T/replay.out" 2>>"$T/replay.err"
}
drain() { # LABEL: a relay sends every unsent row, then stops
    relay_start "${OPTS[@]}"
    wait_for "$1" 60 no_unsent_rows
    relay_stop
}
insert() { # AGGREGATE N: N new events of the aggregate, in order
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            SELECT 'order', '$1', 'Step', jsonb_build_object('n', 100 + g)
            FROM generate_series(1, $2) g ORDER BY g"
}

# --- 1. a replay of events Kafka still holds ---
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'order', 'o-' || (g % 5), 'Step', jsonb_build_object('n', g)
        FROM generate_series(1, 60) g ORDER BY g"
drain "1: every row sent"
third=$(psql_q "SELECT id FROM outbox WHERE aggregate_id = 'o-1' ORDER BY id OFFSET 2 LIMIT 1")
replay --aggregate-id o-1 --to-id "$third"
check_eq "1: replay of o-1's first 3 events: exit 0" 0 $?
drain "1: the replayed rows sent again"
insert o-1 2
drain "1: 2 new events of o-1 sent"
check_eq "1: the replayed rows now come after events their first copies precede" 3 \
    "$(psql_q "SELECT count(*) FROM outbox r WHERE r.aggregate_id = 'o-1' AND r.id > (
                 SELECT min(id) FROM outbox WHERE aggregate_id = 'o-1'
                                            AND payload->>'n' = '16')
               AND (r.payload->>'n')::int < 16")"
verify
check_eq "1: verify after the replay: exit 0" 0 $?
check "1: ok, 62 rows, 65 messages, nothing out of order, 3 duplicates" grep -q \
    '^verify: ok: window=3600s rows=62 messages=65 missing=0 out_of_order=0 duplicates=3 unknown=0' \
    "$T/verify.out"
check "1: ... and 3 rows judged by a later copy, said in a line" grep -q \
    '^verify: 3 row(s) judged by a later copy: ' "$T/verify.out"
check_eq "1: ... no problem named on stderr" "" "$(cat "$T/verify.err")"
verify --json
check_eq "1: --json: ok, 0 out of order, 3 duplicates, 3 judged by a later copy" "true 0 3 3" \
    "$(jq -r '"\(.ok) \(.out_of_order) \(.duplicates) \(.judged_by_later_copy)"' "$T/verify.out")"
"$RELAY_BIN" verify "${OPTS[@]}" --since 1h --from-beginning >"$T/strict.out" 2>"$T/strict.err"
check_eq "1: without --after-replay: exit 1" 1 $?
check "1: ... the first replayed row out of order (the other two in order after it)" grep -q \
    '^verify: FAILED: window=3600s rows=62 messages=65 missing=0 out_of_order=1 duplicates=3 ' \
    "$T/strict.out"
check "1: ... and a line names --after-replay" grep -q \
    '^verify: 1 row(s) out of order with a later copy in their place, .*--after-replay' \
    "$T/strict.err"

# --- 2. a row replayed twice, and a whole aggregate replayed by the time it was sent ---
again=$(psql_q "SELECT max(id) FROM outbox WHERE aggregate_id = 'o-1'
                  AND (payload->>'n')::int < 16")
replay --from-id "$again" --to-id "$again"
check_eq "2: the last replayed row replayed again: exit 0" 0 $?
drain "2: sent a third time"
t0=$(psql_q "SELECT min(sent_at) - interval '1 ms' FROM outbox WHERE aggregate_id = 'o-2'")
t1=$(psql_q "SELECT max(sent_at) + interval '1 ms' FROM outbox WHERE aggregate_id = 'o-2'")
replay --sent-after "$t0" --sent-before "$t1" --aggregate-id o-2
check_eq "2: o-2 replayed by the time it was sent: exit 0" 0 $?
drain "2: o-2 sent again"
verify
check_eq "2: verify: exit 0" 0 $?
check "2: ok, nothing out of order, 3 + 1 + 12 duplicates" grep -q \
    '^verify: ok: window=3600s rows=62 messages=78 missing=0 out_of_order=0 duplicates=16 ' \
    "$T/verify.out"
# o-2's copies keep their order among themselves: only o-1's 3 rows are judged by a later copy.
check "2: ... still 3 rows judged by a later copy" grep -q '^verify: 3 row(s) judged by a later copy' \
    "$T/verify.out"

# --- 3. first copies really out of order, beside the replays ---
read -r first second < <(psql_q "WITH r AS (
    INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
    SELECT 'order', 'o-hand', 'Step', jsonb_build_object('n', g), now()
    FROM generate_series(1, 2) g ORDER BY g RETURNING id, event_id)
    SELECT string_agg(event_id::text, ' ' ORDER BY id) FROM r")
printf '%s\n' \
    "{\"key\": \"o-hand\", \"value\": \"2\", \"headers\": [[\"id\", \"$second\"]]}" \
    "{\"key\": \"o-hand\", \"value\": \"1\", \"headers\": [[\"id\", \"$first\"]]}" |
    "$BIN/produce" --brokers "$BROKERS" --topic outbox.event.order >/dev/null ||
    fail "3: produce the hand-made messages"
verify
check_eq "3: two first copies out of their order: exit 1" 1 $?
check "3: one pair out of order, the replays' duplicates still counted" grep -q \
    '^verify: FAILED: .* missing=0 out_of_order=1 duplicates=16 ' "$T/verify.out"
check "3: the pair is named" grep -q \
    "out of order: id=[0-9]* event_id=$first .* comes after id=[0-9]* event_id=$second" \
    "$T/verify.err"
check_eq "3: ... and nothing else" 1 "$(grep -c '' "$T/verify.err")"

# --- 4. a replayed row whose later copy is out of place too ---
# o-3's first event replayed, marked sent by hand, and its later copy written before a copy of
# o-3's (new) next event: neither copy of the replayed row is where its new id puts it.
next=$(psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
               VALUES ('order', 'o-3', 'Step', '{}', now()) RETURNING event_id")
replay --aggregate-id o-3 --to-id "$(psql_q "SELECT min(id) FROM outbox WHERE aggregate_id = 'o-3'")"
check_eq "4: replay of o-3's first event: exit 0" 0 $?
moved=$(psql_q "UPDATE outbox SET sent_at = now() WHERE sent_at IS NULL RETURNING event_id")
check "4: one row replayed" test "$(wc -l <<<"$moved")" = 1 -a -n "$moved"
printf '%s\n' \
    "{\"key\": \"o-3\", \"value\": \"r\", \"headers\": [[\"id\", \"$moved\"]]}" \
    "{\"key\": \"o-3\", \"value\": \"n\", \"headers\": [[\"id\", \"$next\"]]}" |
    "$BIN/produce" --brokers "$BROKERS" --topic outbox.event.order >/dev/null ||
    fail "4: produce the hand-made copies"
verify
check_eq "4: verify: exit 1" 1 $?
check "4: part 3's pair and this one out of order" grep -q 'out_of_order=2 ' "$T/verify.out"
check "4: the replayed row is named after o-3's next event" grep -q \
    "out of order: id=[0-9]* event_id=$next .* comes after id=[0-9]* event_id=$moved" \
    "$T/verify.err"
