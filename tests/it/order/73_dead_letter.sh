#!/bin/bash
# Proves dead-lettering and the dead/requeue commands. With --max-attempts 2 --retry-backoff 200
# --dead-letter-topic dlq, two poison events (an illegal topic name, a 2 MB payload) amid good ones:
#  - each becomes dead after exactly 2 rejections (dead_at set, sent_at null, last_error kept)
#    while every good event is delivered;
#  - each is published once to dlq: key, id header and the row's own headers kept, dlq.error =
#    last_error, dlq.attempts = 2, dlq.original_topic present; the 2 MB one without its payload
#    (dlq.payload_omitted), the other with it; the row records dead_letter_topic = dlq;
#  - `outbox-relay dead` lists both (table and --json);
#  - `requeue` with an unknown id exits 1, without --id/--all (or with both) exits 2;
#  - `requeue --id` puts exactly that event back (dead_at, rejections, next_attempt_at and
#    dead_letter_topic cleared, attempts kept as history), `requeue --all` the rest;
#  - back in line, a fixed event is delivered and a still-broken one dies again after another
#    2 rejections and is published to dlq again; requeued after its fix, it is delivered too;
#  - 25,000 dead events: dead lists them all, requeue --all and purge-dead --all take them, each
#    a batch of at most 10,000 rows at a time (requeue's rows carry three transaction ids).
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 3
relay_migrate 2>"$T/migrate.log" || fail "migrate"

OPTS=(--database-url "$DATABASE_URL" --brokers "$BROKERS" --max-attempts 2 --retry-backoff 200
    --dead-letter-topic dlq --kafka reconnect.backoff.max.ms=500)

insert_good() { # insert_good FROM TO
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            SELECT 'dl', 'dl-' || (g % 20), 'changed', jsonb_build_object('seq', g)
            FROM generate_series($1, $2) AS g ORDER BY g"
}

insert_good 0 99
BAD=$(psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
              VALUES ('bad topic!', 'p-1', 'changed', '{\"seq\": 0, \"why\": \"topic\"}',
                      '{\"trace\": \"t-1\"}') RETURNING id")
HUGE=$(psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
               VALUES ('dl', 'huge-1', 'changed',
                       jsonb_build_object('seq', 0, 'blob', repeat('x', 2 * 1024 * 1024)))
               RETURNING id")
insert_good 100 199
BAD_EID=$(psql_q "SELECT event_id FROM outbox WHERE id = $BAD")
HUGE_EID=$(psql_q "SELECT event_id FROM outbox WHERE id = $HUGE")

state() { # state ID: attempts|rejections|sent_at null|dead_at null|next_attempt_at null|dl topic
    psql_q "SELECT attempts, rejections, sent_at IS NULL, dead_at IS NULL,
                   next_attempt_at IS NULL, coalesce(dead_letter_topic, '-')
            FROM outbox WHERE id = $1"
}
is_dead() {
    [ "$(psql_q "SELECT dead_at IS NOT NULL FROM outbox WHERE id = $1")" = t ]
}
dead_lettered() { # dead_lettered ID: dead and published to the dead-letter topic
    [ "$(psql_q "SELECT dead_at IS NOT NULL AND dead_letter_topic = 'dlq'
                 FROM outbox WHERE id = $1")" = t ]
}
is_sent() {
    [ "$(psql_q "SELECT sent_at IS NOT NULL FROM outbox WHERE id = $1")" = t ]
}
good_all_sent() {
    [ "$(psql_q "SELECT count(*) FROM outbox WHERE aggregate_id LIKE 'dl-%' AND sent_at IS NULL")" = 0 ]
}
last_error() {
    psql_q "SELECT last_error FROM outbox WHERE id = $1"
}
relay_cmd() { # relay_cmd OUT_FILE ARGS...: runs an admin command, returns its exit status
    local out=$1
    shift
    timeout 10 "$RELAY_BIN" "$@" --database-url "$DATABASE_URL" >"$out" 2>"$out.err"
}

# --- dead-lettering ---
relay_start "${OPTS[@]}"
wait_for "illegal-topic event becomes dead" 20 is_dead "$BAD"
wait_for "2 MB event becomes dead" 20 is_dead "$HUGE"
wait_for "good events all delivered meanwhile" 20 good_all_sent
wait_for "illegal-topic event published to the dead-letter topic" 20 dead_lettered "$BAD"
wait_for "2 MB event published to the dead-letter topic" 20 dead_lettered "$HUGE"
check_eq "illegal-topic event: 2 attempts, 2 rejections, unsent, dead, dlq recorded" \
    "2|2|t|f|t|dlq" "$(state "$BAD")"
check_eq "2 MB event: 2 attempts, 2 rejections, unsent, dead, dlq recorded" \
    "2|2|t|f|t|dlq" "$(state "$HUGE")"
check "illegal-topic event keeps last_error" grep -qF 'outside [a-zA-Z0-9._-]' <<<"$(last_error "$BAD")"
check "2 MB event keeps last_error" grep -qiE 'too large|size' <<<"$(last_error "$HUGE")"
check "relay logs the dead-lettering" grep -q 'msg="event dead-lettered' "$RELAY_LOG"

consume --topic dlq --to-end --timeout-ms 20000 >"$T/dlq.json"
check_eq "dlq holds one message per dead event" 2 "$(grep -c '' "$T/dlq.json")"
bad_msg=$(jq -c --arg e "$BAD_EID" 'select(.headers.id == $e)' "$T/dlq.json" | head -n 1)
huge_msg=$(jq -c --arg e "$HUGE_EID" 'select(.headers.id == $e)' "$T/dlq.json" | head -n 1)
echo "# dlq headers of the illegal-topic event: $(jq -c .headers <<<"${bad_msg:-null}")"
check_eq "dlq: illegal-topic event keyed by aggregate_id, payload kept" \
    "p-1|$(psql_q "SELECT payload::text FROM outbox WHERE id = $BAD")" \
    "$(jq -r '"\(.key)|\(.value)"' <<<"${bad_msg:-null}")"
check_eq "dlq: illegal-topic event headers dlq.error = last_error, dlq.attempts = 2, row header kept" \
    "$(last_error "$BAD")|2|t-1" \
    "$(jq -r '.headers | "\(.["dlq.error"])|\(.["dlq.attempts"])|\(.trace)"' <<<"${bad_msg:-null}")"
check_eq "dlq: illegal-topic event has a dlq.original_topic header" 1 \
    "$(jq '[.header_list[] | select(.[0] == "dlq.original_topic")] | length' <<<"${bad_msg:-null}")"
check_eq "dlq: 2 MB event keyed by aggregate_id, payload omitted (null value, dlq.payload_omitted)" \
    "huge-1|null|true" \
    "$(jq -r '"\(.key)|\(.value)|\(.headers["dlq.payload_omitted"])"' <<<"${huge_msg:-null}")"
check_eq "dlq: 2 MB event headers dlq.error, dlq.attempts = 2, dlq.original_topic = outbox.event.dl" \
    "$(last_error "$HUGE")|2|outbox.event.dl" \
    "$(jq -r '.headers | "\(.["dlq.error"])|\(.["dlq.attempts"])|\(.["dlq.original_topic"])"' \
        <<<"${huge_msg:-null}")"

# --- dead ---
relay_cmd "$T/dead.txt" dead
check_eq "dead exits 0" 0 $?
check "dead lists the illegal-topic event (id, event id)" \
    grep -qE "^$BAD +$BAD_EID " "$T/dead.txt"
check "dead lists the 2 MB event (id, event id)" grep -qE "^$HUGE +$HUGE_EID " "$T/dead.txt"
check "dead counts 2 events" grep -qx '2 dead-lettered events' "$T/dead.txt"
relay_cmd "$T/dead.json" dead --json
check_eq "dead --json exits 0" 0 $?
check_eq "dead --json: one JSON line per dead event, with attempts, rejections, topic and error" \
    "$BAD $BAD_EID bad topic!/p-1 2 2 dlq true
$HUGE $HUGE_EID dl/huge-1 2 2 dlq true" \
    "$(jq -r '"\(.id) \(.event_id) \(.aggregate_type)/\(.aggregate_id) \(.attempts) \(.rejections) \(.dead_letter_topic) \(.last_error | length > 0)"' "$T/dead.json")"

relay_stop
check_eq "relay exits 0 on SIGTERM" 0 $?

# --- requeue: bad input ---
relay_cmd "$T/rq.out" requeue --id 999999
check_eq "requeue --id of an unknown id exits 1" 1 $?
relay_cmd "$T/rq.out" requeue --id "$(psql_q "SELECT min(id) FROM outbox WHERE sent_at IS NOT NULL")"
check_eq "requeue --id of a sent (not dead) event exits 1" 1 $?
relay_cmd "$T/rq.out" requeue
check_eq "requeue without --id or --all exits 2" 2 $?
check_eq "... with one line on stderr" 1 "$(grep -c '' "$T/rq.out.err")"
relay_cmd "$T/rq.out" requeue --id "$BAD" --all
check_eq "requeue with both --id and --all exits 2" 2 $?
check_eq "bad requeue calls changed nothing" "2|2|t|f|t|dlq 2|2|t|f|t|dlq" \
    "$(state "$BAD") $(state "$HUGE")"

# --- requeue --id, --all ---
relay_cmd "$T/rq.out" requeue --id "$BAD"
check_eq "requeue --id exits 0" 0 $?
check_eq "requeue --id: that event back in line (dead_at, rejections, retry time, dlq cleared; attempts kept)" \
    "2|0|t|t|t|-" "$(state "$BAD")"
check_eq "requeue --id: the other dead event untouched" "2|2|t|f|t|dlq" "$(state "$HUGE")"
relay_cmd "$T/dead.json" dead --json
check_eq "dead --json now lists only the other event" "$HUGE" "$(jq -r .id "$T/dead.json")"
relay_cmd "$T/rq.out" requeue --all
check_eq "requeue --all exits 0" 0 $?
check_eq "requeue --all: the other event back in line too" "2|0|t|t|t|-" "$(state "$HUGE")"
relay_cmd "$T/dead.txt" dead
check "dead now lists nothing" grep -qx '0 dead-lettered events' "$T/dead.txt"
relay_cmd "$T/rq.out" requeue --all
check_eq "requeue --all with nothing dead exits 0" 0 $?

# --- back in line: a fixed event is delivered, a broken one dies again ---
psql_q "UPDATE outbox SET payload = '{\"seq\": 0, \"fixed\": true}' WHERE id = $HUGE"
relay_start "${OPTS[@]}"
wait_for "requeued and fixed 2 MB event is delivered" 20 is_sent "$HUGE"
wait_for "requeued but still broken event dies again" 20 dead_lettered "$BAD"
check_eq "it died after 2 more rejections (attempts 4, rejections 2)" "4|2|t|f|t|dlq" "$(state "$BAD")"
psql_q "UPDATE outbox SET aggregate_type = 'fixed' WHERE id = $BAD"
relay_cmd "$T/rq.out" requeue --id "$BAD"
check_eq "requeue --id while a relay runs exits 0" 0 $?
wait_for "requeued and fixed illegal-topic event is delivered" 20 is_sent "$BAD"
relay_stop
check_eq "relay exits 0 on SIGTERM" 0 $?

consume --topic outbox.event.fixed --to-end --timeout-ms 20000 >"$T/fixed.json"
check_eq "fixed event on its topic once, with its event id" "$BAD_EID" \
    "$(jq -r .headers.id "$T/fixed.json")"
consume --topic outbox.event.dl --to-end --timeout-ms 20000 >"$T/dl.json"
check_eq "fixed 2 MB event on its topic once, with the fixed payload" '{"seq": 0, "fixed": true}' \
    "$(jq -r --arg e "$HUGE_EID" 'select(.headers.id == $e) | .value' "$T/dl.json")"
check_eq "every good event delivered once" 200 \
    "$(jq -r 'select(.key | startswith("dl-")) | .headers.id' "$T/dl.json" | sort -u | grep -c .)"
consume --topic dlq --to-end --timeout-ms 20000 >"$T/dlq2.json"
check_eq "dlq got the re-dead event a second time (3 messages in all)" \
    "$(printf '%s\n' "$BAD_EID" "$BAD_EID" "$HUGE_EID" | sort | paste -sd ' ')" \
    "$(jq -r .headers.id "$T/dlq2.json" | sort | paste -sd ' ')"

# --- a dead event whose dead-letter record the row refuses ---------------------------------------
# A trigger refuses to record dead_letter_topic on one row: its dead-letter message is published,
# the record fails, and the row waits to be published again. On main it waited 30 s every time,
# for ever; now the wait grows: 30 s the first time, then as long as the event has been dead (up
# to an hour), so with its death moved 10 minutes back the second wait is at least a minute. A
# failure counts no attempt: attempts stays the event's 2 (each failure counted one on the code
# before 2026-11-29: 3, then 4).
psql_q "CREATE FUNCTION refuse_dlq() RETURNS trigger LANGUAGE plpgsql AS \$\$
        BEGIN RAISE EXCEPTION 'no dead letters for %', NEW.aggregate_id; END \$\$;
        CREATE TRIGGER refuse_dlq BEFORE UPDATE OF dead_letter_topic ON outbox FOR EACH ROW
        WHEN (NEW.dead_letter_topic IS NOT NULL AND NEW.aggregate_id = 'stuck-1')
        EXECUTE FUNCTION refuse_dlq()" || fail "DL: the refusing trigger"
STUCK=$(psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
                VALUES ('bad topic!', 'stuck-1', 'changed', '{\"seq\": 0}') RETURNING id")
relay_start "${OPTS[@]}"
dl_failure_waits() { # dl_failure_waits: a dead-letter failure recorded, its retry time ahead
    [ "$(psql_q "SELECT dead_at IS NOT NULL AND next_attempt_at > now()
                 FROM outbox WHERE id = $STUCK")" = t ]
}
wait_for "DL: the refused record is a dead-letter failure" 30 dl_failure_waits
check_eq "DL: no attempt counted for it (the event's 2)" 2 \
    "$(psql_q "SELECT attempts FROM outbox WHERE id = $STUCK")"
# Skip the first wait; dead for 10 minutes, the next wait is that long.
psql_q "UPDATE outbox SET next_attempt_at = now() - interval '1 s',
        dead_at = dead_at - interval '10 min' WHERE id = $STUCK" >/dev/null
wait_for "DL: and again after its wait" 30 dl_failure_waits
check "DL: the next wait is at least a minute (main: 30 s each time)" test "$(psql_q "SELECT
    next_attempt_at - clock_timestamp() > interval '55 seconds' FROM outbox WHERE id = $STUCK")" = t
check_eq "DL: still no attempt counted" 2 "$(psql_q "SELECT attempts FROM outbox WHERE id = $STUCK")"
check "DL: last_error is still why it died, not the refused record" test "$(psql_q "SELECT
    last_error LIKE 'topic name %' FROM outbox WHERE id = $STUCK")" = t
check_eq "DL: status counts it as a dead event whose copy went unrecorded" 1 \
    "$("$RELAY_BIN" status --json --database-url "$DATABASE_URL" | jq -r .dead_letter_failed)"
relay_stop
check_eq "DL: the relay exits 0" 0 "$?"

# --- many dead events: dead, requeue --all and purge-dead --all go 10,000 rows at a time ---------
# Each batch is a statement and a transaction of its own, well within the commands' 30 s bound
# (one UPDATE or DELETE of every dead row could outlast it, and held every row's lock to the end);
# dead holds one batch in memory, not the whole list.
psql_q "DROP TRIGGER refuse_dlq ON outbox; DELETE FROM outbox;
        INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, attempts, dead_at,
                            last_error)
        SELECT 'many', 'm-' || g, 'changed', '{}', 2, now(), 'poison'
        FROM generate_series(1, 25000) g" >/dev/null || fail "MANY: 25,000 dead rows"
relay_cmd "$T/many.dead" dead
check_eq "MANY: dead lists all 25,000 (three batches)" "0 25000 dead-lettered events" \
    "$? $(tail -n 1 "$T/many.dead")"
sed '1d;$d' "$T/many.dead" | awk '{ print $1 }' >"$T/many.ids"
check_eq "MANY: ... each once, in id order" "25000 25000" \
    "$(grep -c . "$T/many.ids") $(sort -nu "$T/many.ids" | cmp -s - "$T/many.ids" && grep -c . "$T/many.ids")"
relay_cmd "$T/many.rq" requeue --all
check_eq "MANY: requeue --all: 25,000, exit 0" "0 requeued 25000 events" "$? $(cat "$T/many.rq")"
check_eq "MANY: ... in three transactions of at most 10,000 rows" "3 10000 0" \
    "$(psql_q "SELECT count(DISTINCT xmin::text), max(n), count(*) FILTER (WHERE dead)
               FROM (SELECT xmin, count(*) OVER (PARTITION BY xmin::text) AS n,
                            dead_at IS NOT NULL AS dead FROM outbox) r" | tr '|' ' ')"
psql_q "UPDATE outbox SET dead_at = now()" >/dev/null
relay_cmd "$T/many.pd" purge-dead --all
check_eq "MANY: purge-dead --all: 25,000, exit 0, none left" "0 purged 25000 events 0" \
    "$? $(cat "$T/many.pd") $(psql_q "SELECT count(*) FROM outbox")"

