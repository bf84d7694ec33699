#!/bin/bash
# Proves a dead event's copy the broker refuses as too large (MESSAGE_TOO_LARGE, 10) is judged
# as an event is (docs/guarantees.md, "Poison events"): refused with other messages, no fault of
# its own, it goes again alone; refused alone, its own size is over the dead-letter topic's
# max.message.bytes, and it goes again without its payload (dlq.payload_omitted), as a payload
# too large for the producer always did. Poison rows here have an illegal topic name, so they
# die (--max-attempts 1) before Kafka sees them: the only produce requests are the copies', which
# lets the mock's request-wide error reach exactly them.
#  A. 4 copies produced together (linger 300 ms), the first produce request refused with code
#     10 (librdkafka 2.0.2 sends each partition's messages in a request of their own: here the
#     copies of p-0 and p-2, whose keys share a partition; the warning, said only for a refusal
#     of a request with other messages, shows they were together; enable.gapless.guarantee
#     makes the refusal fatal, and the producer is recreated as for any broker refusal):
#     every copy published to the dead-letter topic within 20 s, each with its payload,
#     none recorded as a failed publication (an attempt more and a retry time), and the
#     warning that tells the operator to lower batch.size logged once. (On the old code each copy was recorded as a failed
#     publication and waited 30 s, doubling, to go again together: none published in 20 s.)
#  B. 1 copy produced alone, refused with code 10: published within 20 s, without its payload
#     (null value, dlq.payload_omitted: true), no second warning. (On the old code it waited
#     30 s to go again with its payload, its own size never judged: refused alone for good by a
#     real topic, it went again every 30 s doubling to an hour, for ever.)
#  C. 1 copy refused alone twice, with its payload and then bare: it can never fit, so it is
#     parked (a retry time of infinity: never claimed again, neither bare nor with its payload),
#     said in one error line with its sizes, and counted by `status` as a dead event whose copy
#     failed. (On the old code it was a plain failed publication, to go again with its payload
#     30 s later, doubling to an hour, for ever.) `dead` and `dead --json` show each dead
#     event's copy state: published, pending (not tried), retrying (with its retry time; one is
#     recorded so by SQL, as the relay records a failed copy) or parked (with why). (On the old
#     code neither told a parked copy from one waiting to retry: no such column or field.)
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
fault_setup 1

WARNING='the broker refused a produce request as too large though its messages were within'
count_where() { # count_where CONDITION: rows of the poison type matching it
    psql_q "SELECT count(*) FROM outbox WHERE aggregate_type = 'bad topic!' AND ($1)"
}
published() { # published N CONDITION: N rows matching CONDITION were published to dlq
    [ "$(count_where "dead_letter_topic = 'dlq' AND ($2)")" = "$1" ]
}
dead() { # dead N: N poison rows are dead
    [ "$(count_where "dead_at IS NOT NULL")" = "$1" ]
}
insert_poison() { # insert_poison FROM TO: rows FROM..TO of an illegal topic, an aggregate each (all die at once)
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            SELECT 'bad topic!', 'p-' || g, 'changed', jsonb_build_object('seq', g)
            FROM generate_series($1, $2) AS g ORDER BY g"
}
dlq_copy() { # dlq_copy SEQ: the dead-letter message of the poison row with payload seq SEQ
    jq -c --arg e "$(psql_q "SELECT event_id FROM outbox WHERE aggregate_type = 'bad topic!'
                                 AND (payload->>'seq')::int = $1")" \
        'select(.headers.id == $e)' "$T/dlq.json" | head -n 1 # the first, if repeated
}

relay_start --database-url "$DATABASE_URL" "${FAULT_RELAY_OPTS[@]}" --sessions 1 \
    --max-attempts 1 --retry-backoff 200 --dead-letter-topic dlq --kafka linger.ms=300
insert_rows w 0 9 2
wait_for "warm-up rows delivered" 30 none_unsent_of w

# --- A. one request of 4 dead-letter copies refused whole ---
broker_cmd "errors produce 1 10"
insert_poison 0 3
wait_for "A: the 4 poison rows dead" 30 dead 4
wait_for "A: the 4 copies published to the dead-letter topic within 20 s" 20 \
    published 4 "(payload->>'seq')::int < 4"
FAILED_COPY="attempts > 1 OR next_attempt_at IS NOT NULL" # what a failed publication records
echo "# A: poison rows recorded as a failed publication: $(count_where "$FAILED_COPY")"
check_eq "A: no copy recorded as a failed publication" 0 "$(count_where "$FAILED_COPY")"
check_eq "A: the warning logged once" 1 "$(grep -c "$WARNING" "$RELAY_LOG")"
check "A: it names the dead-letter topic" grep -q "$WARNING.*topic=dlq" "$RELAY_LOG"

# --- B. one copy refused alone ---
broker_cmd "errors produce 1 10"
insert_poison 4 4
wait_for "B: the copy published to the dead-letter topic within 20 s" 20 \
    published 1 "(payload->>'seq')::int = 4"

# --- C. one copy refused alone with its payload, then bare ---
broker_cmd "errors produce 2 10"
insert_poison 5 5
parked() { [ "$(count_where "(payload->>'seq')::int = 5 AND next_attempt_at IS NOT NULL")" = 1 ]; }
wait_for "C: the copy refused bare recorded as a failed publication" 30 parked
check_eq "C: parked: never retried (a retry time of infinity), not published" "infinity|" \
    "$(psql_q "SELECT next_attempt_at, dead_letter_topic FROM outbox
               WHERE aggregate_type = 'bad topic!' AND (payload->>'seq')::int = 5" | tr -d ' ')"
check "C: said in one error line with its sizes" grep -q \
    "a dead event's copy is too large for the dead-letter topic even without its payload.*bytes=[0-9]* key=3 headers=[0-9]* topic=dlq" \
    "$RELAY_LOG"
check_eq "C: status counts it as a dead event whose copy failed" 1 \
    "$("$RELAY_BIN" status --database-url "$DATABASE_URL" --json | jq -r .dead_letter_failed)"
check "C: status says such a copy may be parked" grep -q "^dead-lettered:  6 (1 whose copy.*parked" \
    <<<"$("$RELAY_BIN" status --database-url "$DATABASE_URL")"
relay_stop
check_eq "relay exits 0" 0 $?

# --- C. dead shows each dead event's copy state, with its when or why ---
# Row 4's published copy is made one that failed and waits for its retry, recorded as the relay
# records it (SQL_MARK_DEAD_LETTER_FAILED: no dead_letter_topic, a retry time), and row 3's one
# not tried yet (neither: a dead event's state before its first copy, or without a dead-letter
# topic), so that every state shows.
psql_q "UPDATE outbox SET dead_letter_topic = NULL, next_attempt_at = '2030-01-02 03:04:05+00'
        WHERE aggregate_type = 'bad topic!' AND (payload->>'seq')::int = 4" >/dev/null
psql_q "UPDATE outbox SET dead_letter_topic = NULL, next_attempt_at = NULL
        WHERE aggregate_type = 'bad topic!' AND (payload->>'seq')::int = 3" >/dev/null
"$RELAY_BIN" dead --json --database-url "$DATABASE_URL" >"$T/dead.json" 2>>"$T/dead.err"
check_eq "C: dead --json exits 0" 0 $?
check_eq "C: dead --json: each copy's state (published, pending, retrying with when, parked with why)" \
    "p-0 published dlq null null
p-1 published dlq null null
p-2 published dlq null null
p-3 pending null null null
p-4 retrying null 2030-01-02T03:04:05Z null
p-5 parked null null too large for the dead-letter topic even without its payload" \
    "$(jq -r 'select(.aggregate_type == "bad topic!") | "\(.aggregate_id) \(.dead_letter_copy) \(.dead_letter_topic) \(.dead_letter_retry_at) \(.dead_letter_parked)"' "$T/dead.json")"
"$RELAY_BIN" dead --database-url "$DATABASE_URL" >"$T/dead.txt" 2>>"$T/dead.err"
check_eq "C: dead exits 0" 0 $?
check "C: dead has a COPY column" grep -qE '^ID +EVENT_ID +AGGREGATE +ATTEMPTS +DEAD_AT +COPY +LAST_ERROR$' "$T/dead.txt"
for want in "p-0 .* published " "p-3 .* pending " "p-4 .* retry 2030-01-02T03:04:05Z " "p-5 .* parked: too large "; do
    check "C: dead shows '$want'" grep -qE "bad topic!/$want" "$T/dead.txt"
done

consume --topic dlq --to-end --timeout-ms 30000 >"$T/dlq.json"
echo "# dlq: $(jq -r .headers.id "$T/dlq.json" | wc -l) messages (at-least-once allows repeats)"
check_eq "A: the refused request held two copies (p-0's and p-2's share a partition)" \
    "$(jq -r 'select(.key == "p-0") | .partition' "$T/dlq.json" | head -n 1)" \
    "$(jq -r 'select(.key == "p-2") | .partition' "$T/dlq.json" | head -n 1)"
check_eq "dlq: a copy of each poison row" 5 "$(jq -r .headers.id "$T/dlq.json" | sort -u | wc -l)"
for seq in 0 1 2 3; do
    check_eq "A: copy of row $seq with its payload" "$seq|null" \
        "$(dlq_copy "$seq" | jq -r '"\(.value | fromjson | .seq)|\(.headers["dlq.payload_omitted"])"')"
done
check_eq "B: the copy refused alone went without its payload" "null|true|p-4" \
    "$(dlq_copy 4 | jq -r '"\(.value)|\(.headers["dlq.payload_omitted"])|\(.key)"')"
check_eq "B: no second warning (refused alone is not the batch's size)" 1 \
    "$(grep -c "$WARNING" "$RELAY_LOG")"
