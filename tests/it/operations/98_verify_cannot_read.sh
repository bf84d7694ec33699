#!/bin/bash
# Proves `outbox-relay verify` says what it could not check, rather than a verdict on it:
#  1. a topic whose metadata the broker answers with an error of its own (not authorised to
#     describe it, no leader while it is created or elected) is a failure to read Kafka (exit 1,
#     one line naming the topic and the error), not every row of it missing: no row is named
#     missing, and `--json` prints no missing_events list that `replay --missing` would publish
#     again whole;
#  2. once the broker answers again, the same check is ok (the rows were there all along);
#  3. given --on-sent delete (the relay's configuration: it deletes each row it sends) verify
#     refuses with one line, exit 2, rather than say ok over a window that can hold no row;
#  4. a window of more rows than --max-rows (verify holds every row of it in memory) is refused
#     with one line, exit 2, naming --since and --max-rows, before anything is read from
#     Kafka, while a window of exactly that many is checked (the bound counts the rows, not one
#     more or one fewer).
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"

# verify [FLAGS...]: stdout to $T/verify.out, stderr to $T/verify.err. --from-beginning: the mock
# cluster cannot look offsets up by time.
verify() {
    "$RELAY_BIN" verify --database-url "$DATABASE_URL" --brokers "$BROKERS" --since 1h \
        --from-beginning "$@" >"$T/verify.out" 2>"$T/verify.err"
}

psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'order', 'o-' || (g % 5), 'Updated', '{}' FROM generate_series(1, 40) g"
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS"
wait_for "every row sent" 60 no_unsent_rows
relay_stop
verify
check_eq "verify exits 0 before the fault" 0 $?

# --- 1. ---
for code in 29 5; do # TOPIC_AUTHORIZATION_FAILED, LEADER_NOT_AVAILABLE
    broker_cmd "topic-error outbox.event.order $code"
    verify
    check_eq "1 ($code): verify exits 1" 1 $?
    check "1 ($code): one line names the topic and the error" grep -q \
        "cannot read the topic's metadata.*topic=outbox.event.order" "$T/verify.err"
    check "1 ($code): no row is called missing" lacks "$T/verify.err" "missing"
    check_eq "1 ($code): no summary on stdout" "" "$(cat "$T/verify.out")"
    verify --json
    check_eq "1 ($code): --json exits 1" 1 $?
    check_eq "1 ($code): --json prints no list to replay" "" "$(cat "$T/verify.out")"
done

# --- 2. ---
broker_cmd "topic-error outbox.event.order 0"
verify
check_eq "2: verify exits 0 once the topic can be read" 0 $?
check "2: every row found" grep -q '^verify: ok: window=3600s rows=40 messages=40 missing=0' \
    "$T/verify.out"

# --- 3. ---
verify --on-sent delete
check_eq "3: verify --on-sent delete exits 2" 2 $?
check_eq "3: one line on stderr" 1 "$(wc -l <"$T/verify.err")"
check "3: the line says why" grep -q "with --on-sent delete the relay deletes each row" \
    "$T/verify.err"
check_eq "3: no verdict on stdout" "" "$(cat "$T/verify.out")"

# --- 4. ---
verify --max-rows 39
check_eq "4: 40 rows over --max-rows 39: verify exits 2" 2 $?
check_eq "4: one line on stderr" 1 "$(wc -l <"$T/verify.err")"
check "4: the line names the bound and what to do" grep -q \
    "the window holds more than --max-rows 39 rows.*narrow --since or raise --max-rows" \
    "$T/verify.err"
check_eq "4: no verdict on stdout" "" "$(cat "$T/verify.out")"
verify --max-rows 40 --json
check_eq "4: 40 rows under --max-rows 40: verify exits 0" 0 $?
check "4: every row checked" grep -q '"rows":40,' "$T/verify.out"
