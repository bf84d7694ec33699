#!/bin/bash
# Proves a dead event keeps why it died when its copy to the dead-letter topic fails once
# (docs/guarantees.md, "Poison events"): the row's last_error is still the death reason, the copy
# published after the failure carries it in dlq.error, and the failure itself is told to the
# operator in the log (with the broker's error) and in outbox_failures_total. Poison rows have an
# illegal topic name whose text holds "dead-letter publish failed: " (the old marker), so they die
# (--max-attempts 1) before Kafka sees them: after the refusal is set up, the only produce
# requests are the copies', which lets the mock's one refused request reach exactly the first.
#  - P: its copy refused once (TOPIC_AUTHORIZATION_FAILED, as a missing ACL): recorded as a failed
#    publication (a retry time within 30 s, no dead_letter_topic) with last_error unchanged and
#    attempts still 1, the event's own; refused again on the retry (its wait cut short, and its
#    death moved 2 h back): the next wait is as long as it has been dead, capped at an hour
#    (over 30 minutes), attempts still 1; retried again, published, last_error still the same,
#    and its copy says dlq.attempts 1. On the old code each failed publication counted an
#    attempt: attempts 2, and the copy said dlq.attempts 3, not the event's 1;
#  - Q: same poison, its copy not refused: its last_error is P's (the reason does not depend on
#    the failed publication), and both copies carry that reason in dlq.error.
#  - status: while P's copy waits for its retry, `outbox-relay status` counts it as a dead event
#    whose copy failed (text and --json dead_letter_failed); once published, none. The row keeps why it died, so only this count says so after the warn line
#    rotated away. /metrics says the same (outbox_dead_letter_unpublished_rows, from the upkeep's
#    backlog count): 1 while P's copy waits, 0 once published, so an alert can fire while copies
#    keep failing; on the old code /metrics had no such gauge.
#  - R: a dead event requeued between a batch's rollback and its record row by row keeps its
#    requeue: a batch holds D's copy (acknowledged) and event X whose sent mark a trigger refuses,
#    so the batch is recorded row by row, X first; X's failure record also requeues D, as a
#    `requeue` waiting for D's row lock does when the batch rolls back (a trigger makes that
#    order certain). D's dead-lettered record must leave the live row alone: D dies again (its
#    topic is illegal) and its second copy is published. On the old code the record set
#    dead_letter_topic on the live row, so after its second death D was listed as published to
#    dlq and its copy never went: 1 copy of D on dlq, not 2.
#  - R2: the same with D2's copy refused (the dead-letter topic dlq2 not authorised): D2's failed
#    publication record must leave the live row alone too (a trigger notes each of D2's states).
#    On the old code it counted an attempt and set a retry time of 60 s on the requeued, live D2.
# On the old code the failure overwrote last_error with "dead-letter publish failed: Broker:
# Topic authorization failed", and the retried copy carried that in dlq.error; before status
# counted them, nothing but the log told a dead row whose copy failed from one published.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
fault_setup 1

TYPE='dead-letter publish failed: x'
poison() { # poison AGG: a row of the illegal topic, its own aggregate; prints its id
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            VALUES ('$TYPE', '$1', 'changed', '{\"seq\": 0}') RETURNING id"
}
col() { # col ID EXPR
    psql_q "SELECT $2 FROM outbox WHERE id = $1"
}
copy_failed() { # copy_failed ID: a failed dead-letter publication recorded (a retry time)
    [ "$(col "$1" "next_attempt_at > now() AND dead_letter_topic IS NULL")" = t ]
}
dead_lettered() { # dead_lettered ID: its copy is published and recorded
    [ "$(col "$1" "dead_at IS NOT NULL AND dead_letter_topic = 'dlq'")" = t ]
}

relay_start --database-url "$DATABASE_URL" "${FAULT_RELAY_OPTS[@]}" --sessions 1 \
    --max-attempts 1 --retry-backoff 200 --dead-letter-topic dlq --metrics-listen 127.0.0.1:0
metrics_wait
insert_rows w 0 9 2
wait_for "warm-up rows delivered" 30 none_unsent_of w
FAILURES_BEFORE=$(metric 'outbox_failures_total{class="transient"}' || echo 0)

broker_cmd "errors produce 1 29"
P=$(poison p-1)
wait_for "P: its copy's refusal recorded as a failed publication" 30 copy_failed "$P"
check_eq "P: no attempt counted (the event's own 1), the first retry within 30 s" "1|t" \
    "$(col "$P" "attempts, next_attempt_at <= now() + interval '30 s'")"
REASON_P=$(col "$P" last_error)
echo "# P: last_error after the failed publication: $REASON_P"
check "P: the failure is logged with the broker's error" grep -q \
    "dead events not published to the dead-letter topic.*first_id=$P .*error=.*uthorization" \
    "$RELAY_LOG"
check "P: ... and counted in outbox_failures_total" test \
    "$(metric 'outbox_failures_total{class="transient"}' || echo 0)" -gt "$FAILURES_BEFORE"
status() { "$RELAY_BIN" status --database-url "$DATABASE_URL" "$@"; }
status >"$T/status.txt" 2>&1
sed 's/^/# status: /' "$T/status.txt"
check "status: P counted as a dead event whose copy failed" \
    grep -q "^dead-lettered:  1 (1 whose copy to the dead-letter topic failed" "$T/status.txt"
check_eq "status --json: dead_letter_failed" 1 \
    "$(status --json | jq -r .dead_letter_failed)"
unpublished_is() { # unpublished_is N: the gauge, refreshed by the upkeep every 5 s, reads N
    [ "$(metric outbox_dead_letter_unpublished_rows)" = "$1" ]
}
wait_for "metrics: outbox_dead_letter_unpublished_rows counts P while its copy waits" 30 \
    unpublished_is 1
broker_cmd "errors produce 1 29"
# Skip the 30 s wait; dead for 2 h, its next wait is the cap of an hour.
psql_q "UPDATE outbox SET next_attempt_at = now() - interval '1 s',
        dead_at = dead_at - interval '2 h' WHERE id = $P" >/dev/null
p_failed_twice() { [ "$(col "$P" "next_attempt_at > now() + interval '30 min'")" = t ]; }
wait_for "P: its copy refused again, its wait as long as it has been dead, capped at 1 h" 30 \
    p_failed_twice
check_eq "P: still no attempt counted, at most an hour" "1|t" \
    "$(col "$P" "attempts, next_attempt_at <= now() + interval '1 h'")"
psql_q "UPDATE outbox SET next_attempt_at = now() WHERE id = $P" >/dev/null # skip the hour
wait_for "P: its copy published on the retry" 30 dead_lettered "$P"
wait_for "metrics: outbox_dead_letter_unpublished_rows back to 0 once published" 30 \
    unpublished_is 0
check_eq "status --json: none once published" 0 \
    "$(status --json | jq -r .dead_letter_failed)"
check_eq "status: the dead-lettered line is the plain count again" "dead-lettered:  1" \
    "$(status | grep '^dead-lettered:')"
check_eq "P: last_error unchanged by the publication" "$REASON_P" "$(col "$P" last_error)"

Q=$(poison q-1)
wait_for "Q: its copy published" 30 dead_lettered "$Q"
REASON_Q=$(col "$Q" last_error)
echo "# Q: last_error: $REASON_Q"
check "Q: the reason names the illegal topic" grep -qF "topic name 'outbox.event.$TYPE' has a character outside" \
    <<<"$REASON_Q"
check_eq "P: last_error is the death reason, as Q's (not the failed publication's)" \
    "$REASON_Q" "$REASON_P"
relay_stop
check_eq "relay exits 0" 0 $?

consume --topic dlq --to-end --timeout-ms 30000 >"$T/dlq.json"
for id in "$P" "$Q"; do
    check_eq "copy of row $id: dlq.error is the death reason, dlq.attempts the event's 1" \
        "$REASON_Q|1" "$(jq -r --arg e "$(col "$id" event_id)" 'select(.headers.id == $e)
               | "\(.headers["dlq.error"])|\(.headers["dlq.attempts"])"' "$T/dlq.json" | sort -u)"
done

# R: the relay stopped, D dead with its copy due and X pending, so the first claim takes both.
D=$(poison r-d)
psql_q "UPDATE outbox SET attempts = 1, rejections = 1, dead_at = now(), last_error = 'poison'
        WHERE id = $D" >/dev/null || fail "R: D dead"
X=$(psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            VALUES ('r', 'r-x', 'changed', '{\"seq\": 0}') RETURNING id")
psql_q "CREATE FUNCTION refuse_sent() RETURNS trigger LANGUAGE plpgsql AS \$\$
        BEGIN RAISE EXCEPTION 'no sent mark for %', NEW.aggregate_id; END \$\$;
        CREATE TRIGGER refuse_sent BEFORE UPDATE OF sent_at ON outbox FOR EACH ROW
        WHEN (NEW.sent_at IS NOT NULL AND NEW.aggregate_id LIKE 'r-x%') EXECUTE FUNCTION refuse_sent();
        CREATE FUNCTION requeue_d() RETURNS trigger LANGUAGE plpgsql AS \$\$
        BEGIN UPDATE outbox SET dead_at = NULL, rejections = 0, next_attempt_at = NULL,
              dead_letter_topic = NULL WHERE aggregate_id = 'r-d' || substr(NEW.aggregate_id, 4)
              AND dead_at IS NOT NULL AND attempts = 1;
              RETURN NULL; END \$\$;
        CREATE TRIGGER requeue_d AFTER UPDATE OF attempts ON outbox FOR EACH ROW
        WHEN (NEW.aggregate_id LIKE 'r-x%') EXECUTE FUNCTION requeue_d()" >/dev/null ||
    fail "R: the triggers"
relay_start --database-url "$DATABASE_URL" "${FAULT_RELAY_OPTS[@]}" --sessions 1 \
    --max-attempts 1 --retry-backoff 200 --dead-letter-topic dlq
x_dead() { [ "$(col "$X" "dead_at IS NOT NULL")" = t ]; }
wait_for "R: X's refused sent mark recorded row by row (X dead)" 30 x_dead
check "R: D's copy and X were one batch, recorded row by row" \
    grep -q "batch recorded row by row.*rows=2 " "$RELAY_LOG"
d_dead_again() { [ "$(col "$D" "dead_at IS NOT NULL AND attempts = 2")" = t ]; }
wait_for "R: D, requeued, dies again" 30 d_dead_again
wait_for "R: D's second copy recorded" 30 dead_lettered "$D"
relay_stop
check_eq "R: relay exits 0" 0 $?
consume --topic dlq --to-end --timeout-ms 30000 >"$T/dlq-r.json"
check_eq "R: both copies of D on dlq (its requeue kept)" 2 \
    "$(jq -r --arg e "$(col "$D" event_id)" 'select(.headers.id == $e) | .headers.id' \
        "$T/dlq-r.json" | wc -l)"

# R2: D2 dead with its copy due, X2 pending; the copies' topic refused.
D2=$(poison r-d2)
psql_q "UPDATE outbox SET attempts = 1, rejections = 1, dead_at = now(), last_error = 'poison'
        WHERE id = $D2" >/dev/null || fail "R2: D2 dead"
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        VALUES ('r', 'r-x2', 'changed', '{\"seq\": 0}')" >/dev/null || fail "R2: X2"
psql_q "CREATE TABLE d2_states (live bool, retry bool);
        CREATE FUNCTION note_d2() RETURNS trigger LANGUAGE plpgsql AS \$\$
        BEGIN INSERT INTO d2_states VALUES (NEW.dead_at IS NULL, NEW.next_attempt_at IS NOT NULL);
              RETURN NULL; END \$\$;
        CREATE TRIGGER note_d2 AFTER UPDATE ON outbox FOR EACH ROW
        WHEN (NEW.aggregate_id = 'r-d2') EXECUTE FUNCTION note_d2()" >/dev/null ||
    fail "R2: the trigger noting D2's states"
broker_cmd "topic-error dlq2 29"
relay_start --database-url "$DATABASE_URL" "${FAULT_RELAY_OPTS[@]}" --sessions 1 \
    --max-attempts 1 --retry-backoff 200 --dead-letter-topic dlq2 --delivery-timeout 3000
d2_died_again() { # after its requeue (live), dead again
    [ "$(psql_q "SELECT count(*) FROM d2_states WHERE NOT live")" -ge 1 ] &&
        [ "$(psql_q "SELECT count(*) FROM d2_states WHERE live")" -ge 1 ]
}
wait_for "R2: D2, requeued, dies again" 90 d2_died_again
relay_stop
check_eq "R2: relay exits 0" 0 $?
psql_q "SELECT * FROM d2_states" | sed 's/^/# R2: D2 state (live, retry): /'
check "R2: D2's copy and X2 were one batch, recorded row by row" \
    grep -q "batch recorded row by row.*rows=2 " "$RELAY_LOG"
check_eq "R2: the requeued D2 was never given a retry time (its failed copy's record)" 0 \
    "$(psql_q "SELECT count(*) FROM d2_states WHERE live AND retry")"
