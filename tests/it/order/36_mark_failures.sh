#!/bin/bash
# Proves that recording a batch's outcome can fail without replaying the batch for ever. Both
# parts failed on main before the fix: the good rows were published again after every backoff
# and never marked, and the poison row was never dead-lettered.
#  A. A row whose aggregate type is 50 'a' and an 'é' has an illegal topic; the error text names
#     the topic cut at 64 bytes, inside the 'é'. That text is stored as the row's last_error
#     (made valid UTF-8), so the row is dead-lettered after --max-attempts with its error, and the
#     ten good rows of its batch are delivered once each.
#  B. A row that refuses its sent mark (a trigger raises): the batch's marks fail, so each row is
#     recorded on its own; the good rows are marked and delivered once each, the refusing row is
#     failed as a rejection and, after --max-attempts, dead-lettered; the failure is logged once
#     at error level, not once per batch.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 3
relay_migrate 2>"$T/migrate.log" || fail "migrate"

DLQ=outbox.dead
RELAY_OPTS=(--database-url "$DATABASE_URL" --brokers "$BROKERS" --max-attempts 2
    --retry-backoff 100 --dead-letter-topic "$DLQ" --kafka reconnect.backoff.max.ms=500)

insert_good() { # insert_good TYPE N: N rows over N aggregates of TYPE
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            SELECT '$1', '$1-' || g, 'changed', jsonb_build_object('seq', g)
            FROM generate_series(1, $2) AS g ORDER BY g"
}

# copies_per_event TYPE: "N" when every event of TYPE is in its topic exactly N times, else a
# description of the counts seen.
copies_per_event() {
    consume --topic "outbox.event.$1" --to-end --timeout-ms 30000 >"$T/$1.json"
    jq -r '.headers.id' "$T/$1.json" | sort | uniq -c | awk '{print $1}' | sort -u | tr '\n' ' ' |
        sed 's/ $//'
}

dead() { # dead ID: the row is dead-lettered and was published to the dead-letter topic
    [ "$(psql_q "SELECT dead_at IS NOT NULL AND dead_letter_topic IS NOT NULL
                 FROM outbox WHERE id = $1")" = t ]
}

good_sent() { # good_sent TYPE N
    [ "$(psql_q "SELECT count(*) FROM outbox WHERE aggregate_type = '$1'
                 AND sent_at IS NOT NULL")" = "$2" ]
}

# --- A: an error text cut inside a character -----------------------------------------------------
LONG_TYPE="$(printf 'a%.0s' $(seq 1 50))é"
BAD=$(psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
              VALUES ('$LONG_TYPE', 'x-1', 'changed', '{\"seq\": 0}') RETURNING id")
insert_good gooda 10
relay_start "${RELAY_OPTS[@]}"
wait_for "A: the ten good rows are marked sent" 30 good_sent gooda 10
wait_for "A: the poison row is dead-lettered after --max-attempts" 30 dead "$BAD"
check_eq "A: its attempts and rejections" "2|2" \
    "$(psql_q "SELECT attempts, rejections FROM outbox WHERE id = $BAD")"
check "A: its last_error says why (the topic name)" \
    grep -q "has a character outside" <<<"$(psql_q "SELECT last_error FROM outbox WHERE id = $BAD")"
check "A: its last_error is stored with the cut character replaced" \
    grep -q "aaaa�" <<<"$(psql_q "SELECT last_error FROM outbox WHERE id = $BAD")"
check_eq "A: each good event is in Kafka once (no replayed batch)" 1 "$(copies_per_event gooda)"
consume --topic "$DLQ" --to-end --timeout-ms 30000 >"$T/dlq.json"
check_eq "A: the dead-letter topic holds the poison event with its error" 1 \
    "$(jq -r --arg id "$(psql_q "SELECT event_id FROM outbox WHERE id = $BAD")" \
        'select(.headers.id == $id and (.headers["dlq.error"] | test("outside"))) | .headers.id' \
        "$T/dlq.json" | wc -l)"
check "A: no mark failed" lacks "$RELAY_LOG" "recording the batch failed"

# --- B: a row that refuses its sent mark ---------------------------------------------------------
psql_q "CREATE FUNCTION refuse_mark() RETURNS trigger LANGUAGE plpgsql AS \$\$
        BEGIN RAISE EXCEPTION 'row % may not be marked sent', NEW.id; END \$\$"
psql_q "CREATE TRIGGER refuse_mark BEFORE UPDATE ON outbox FOR EACH ROW
        WHEN (OLD.sent_at IS NULL AND NEW.sent_at IS NOT NULL AND NEW.aggregate_id = 'refuses')
        EXECUTE FUNCTION refuse_mark()"
REFUSES=$(psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
                  VALUES ('goodb', 'refuses', 'changed', '{\"seq\": 0}') RETURNING id")
insert_good goodb 20
wait_for "B: the twenty good rows are marked sent" 30 good_sent goodb 20
wait_for "B: the refusing row is dead-lettered after --max-attempts" 30 dead "$REFUSES"
check_eq "B: its rejections, and it is not marked sent" "2|t" \
    "$(psql_q "SELECT rejections, sent_at IS NULL FROM outbox WHERE id = $REFUSES")"
check "B: its last_error says the sent mark failed" \
    grep -q "delivered, but marking it sent failed: .*may not be marked sent" \
    <<<"$(psql_q "SELECT last_error FROM outbox WHERE id = $REFUSES")"
consume --topic outbox.event.goodb --to-end --timeout-ms 30000 >"$T/goodb.json"
check_eq "B: each good event is in Kafka once" 1 \
    "$(jq -r 'select(.key != "refuses") | .headers.id' "$T/goodb.json" | sort | uniq -c |
        awk '{print $1}' | sort -u | tr -d '\n')"
check_eq "B: the refusing event was published once per attempt" 2 \
    "$(jq -r 'select(.key == "refuses") | .headers.id' "$T/goodb.json" | wc -l)"
check_eq "B: the failed recording is logged once at error level" 1 \
    "$(grep -c 'level=error msg="recording the batch failed' "$RELAY_LOG")"
check "B: the row-by-row recording is logged" grep -q 'msg="batch recorded row by row"' "$RELAY_LOG"

relay_stop
check_eq "the relay exits 0" 0 "$?"
