#!/bin/bash
# Proves that topics Kafka refuses for a fault of the setup do not slow the others down
# (docs/guarantees.md#failure-modes): the mock broker says the topics of aggregate types gone and
# lost do not exist (their metadata answers UNKNOWN_TOPIC_OR_PART: deleted, auto-creation off),
# while rows of type keep share the one session's lanes with them. On main the session claimed
# one batch per retry backoff (0.5 s doubling to 30 s) while any row was refused, and each batch
# began with the refused rows (the oldest): keep's 300 rows (30 batches of --batch-size 10) were
# not delivered within the 60 s bound. Now the refused types are held out of the claims: every keep
# row is delivered while the others stay refused, unsent with no attempt counted; the held rows
# are claimed only by a probe after each hold backoff (counted: no hot loop); the relay says what
# it holds and is not ready; once the topics exist their rows go out, first copies in order, and
# the relay is ready again; outbox_held_aggregate_types counts the types held (2), then 0.
# (librdkafka 2.0.2 does not fail messages on a topic whose metadata says
# TOPIC_AUTHORIZATION_FAILED, the mock's only per-topic refusal: they wait for their timeout, a
# passing failure; 77_kafka_setup_fault covers that error, for every topic at once.)
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
fault_setup 1

count_of() { # count_of TYPE CONDITION: rows of aggregate type TYPE matching CONDITION
    psql_q "SELECT count(*) FROM outbox WHERE aggregate_type = '$1' AND ($2)"
}
ready_is() { # ready_is CODE: /readyz answers CODE
    [ "$(http_code /readyz)" = "$1" ]
}
refusals() { # refusals: batches in which Kafka refused events (logged each, at debug after the first)
    grep -c "Kafka refuses events for a fault of the setup" "$RELAY_LOG"
}
refusals_above() { # refusals_above N: more refused batches than N
    [ "$(refusals)" -gt "$1" ]
}
HOLD_LINE="events of an aggregate type whose topic Kafka refuses are held out of the claims"

broker_cmd "topic-error outbox.event.lost 3"
broker_cmd "topic-error outbox.event.gone 3"
# The oldest rows are the refused ones, so every claim that does not leave them out begins with
# them; a few more of each come after keep's rows.
insert_rows lost 1 20 2
insert_rows gone 1 20 2
insert_rows keep 1 300 3
insert_rows lost 21 30 2
insert_rows gone 21 30 2
# One session, so that every type shares its lanes; a short metadata propagation wait, so that
# the unknown topic is refused within a second (librdkafka waits 30 s by default).
relay_start --database-url "$DATABASE_URL" "${FAULT_RELAY_OPTS[@]}" --sessions 1 \
    --min-sessions 1 --batch-size 10 --log-level debug --metrics-listen 127.0.0.1:0 \
    --kafka topic.metadata.propagation.max.ms=1000
metrics_wait
start=$SECONDS
wait_for "every keep row delivered while lost and gone are refused" 60 none_unsent_of keep
check_eq "lost and gone: every row unsent, none with an attempt counted" "60 0" \
    "$(($(count_of lost "sent_at IS NULL") + $(count_of gone "sent_at IS NULL"))) \
$(($(count_of lost "attempts > 0") + $(count_of gone "attempts > 0")))"
check "the relay says which types it holds (gone)" grep -q "$HOLD_LINE.*aggregate_type=\"gone\"" "$RELAY_LOG"
check "... and lost" grep -q "$HOLD_LINE.*aggregate_type=\"lost\"" "$RELAY_LOG"
check "... and is not ready while they are refused" ready_is 503
check "... and counts the two types it holds (outbox_held_aggregate_types 2)" \
    metric_is outbox_held_aggregate_types 2
# A probe or two more while held: the refused rows are claimed at the hold backoff's pace, not
# in a loop (a loop claims them hundreds of times a second). The bound allows a probe a second.
first=$(refusals)
wait_for "a later probe is refused too" 30 refusals_above "$first"
elapsed=$((SECONDS - start))
n=$(refusals)
echo "# refused batches while held: $n in ${elapsed}s"
check "refused batches stay bounded while held ($n in ${elapsed}s)" [ "$n" -le $((elapsed + 10)) ]
check_eq "lost and gone: still nothing counted against a row" 0 \
    "$(($(count_of lost "attempts > 0") + $(count_of gone "attempts > 0")))"
# The claims that leave the held types out move the claim floor past their rows (on main it stayed
# below the oldest held row for the whole hold, and each claim read past every row sent since);
# the probes still find them (above), and after the release they go out in order (below).
held_min=$(psql_q "SELECT min(id) FROM outbox WHERE aggregate_type IN ('lost', 'gone')")
floor_max=$(grep 'msg="claim floor moved"' "$RELAY_LOG" | sed -E 's/.* floor=([0-9]+).*/\1/' |
    sort -n | tail -n 1)
echo "# claim floor while held: ${floor_max:-0}, oldest held row $held_min"
check "the claim floor moves past the held rows while they are held" \
    [ "${floor_max:-0}" -gt "$held_min" ]

broker_cmd "topic-error outbox.event.lost 0"
broker_cmd "topic-error outbox.event.gone 0"
wait_for "lost and gone delivered once Kafka takes them" 90 no_unsent_rows
check "the relay says Kafka takes a held type again" \
    grep -q "Kafka accepts the events of a held aggregate type again" "$RELAY_LOG"
wait_for "the relay is ready again" 15 ready_is 200
check "... and holds no type (outbox_held_aggregate_types 0)" metric_is outbox_held_aggregate_types 0
check_delivered keep
check_delivered lost
check_delivered gone
check_eq "no row counted a rejection or was dead-lettered" "0 0" \
    "$(psql_q "SELECT count(*) FROM outbox WHERE rejections > 0") $(psql_q "SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL")"
check "no 'order broken' in the log" lacks "$RELAY_LOG" "order broken"
relay_stop
check_eq "the relay exits 0" 0 "$?"
