#!/bin/bash
# Proves --message-format cloudevents with a real CloudEvents SDK (the `cloudevents` package from
# npm, its Kafka protocol binding, binary content mode): 50 rows relayed, read back with a real
# consumer and turned into events by the SDK, whose id, type, source, subject, time and data
# match their rows; a row's own ce_ headers cannot change them; the default format adds no ce_
# header. Needs node and npm (tools/packages.txt: Debian 12's node 18 runs the SDK).
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
TOOLS=$ROOT/tests/tools
SDK=$(npm_client cloudevents) || fail "the npm client cloudevents: $(tail -n 3 "$T/npm.log")"
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"

psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
        SELECT 'order', 'o-' || (g % 5), 'OrderPlaced', jsonb_build_object('n', g),
               CASE WHEN g = 7
                   THEN '{\"ce_id\": \"forged\", \"ce_type\": \"Forged\", \"CE_Source\": \"forged\",
                          \"x\": \"1\"}'::jsonb
               END
        FROM generate_series(1, 50) g ORDER BY g"
check_eq "50 rows waiting" 50 "$(unsent_rows)"
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --message-format cloudevents \
    --ce-source /orders/service
wait_for "every row sent" 60 no_unsent_rows
relay_stop

consume --topic outbox.event.order --to-end --timeout-ms 30000 >"$T/msgs.json"
check_eq "50 messages" 50 "$(grep -c '' "$T/msgs.json")"
node "$(dirname "$0")/../../tools/cloudevents_read.js" "$SDK" <"$T/msgs.json" >"$T/events.json" \
    2>"$T/sdk.err"
check_eq "the SDK reads every message as an event" "0 50" "$? $(grep -c '' "$T/events.json")"

# The rows as the events should say them: id, type, source, subject, time, data.
psql_q "SELECT json_build_object('id', event_id, 'type', event_type, 'source', '/orders/service',
               'subject', aggregate_id, 'specversion', '1.0',
               'datacontenttype', 'application/json',
               'time', to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),
               'n', (payload->>'n')::int) FROM outbox" | jq -c -S . | sort >"$T/want.json"
jq -c -S '{id, type, source, subject, specversion, datacontenttype, n: .data.n,
           time: (.time | sub("\\.[0-9]+Z$"; "") )}' "$T/events.json" | sort >"$T/got.json"
jq -c -S '.time |= sub("\\.[0-9]+Z$"; "")' "$T/want.json" | sort >"$T/want_s.json"
check "every event's id, type, source, subject, time and data match its row" \
    diff -u "$T/want_s.json" "$T/got.json"
check_eq "ce_time is RFC 3339 in UTC with the row's microseconds (the SDK keeps milliseconds)" 50 \
    "$(jq -r '.header_list[] | select(.[0] == "ce_time") | .[1]' "$T/msgs.json" |
        grep -cE '^[0-9-]{10}T[0-9:]{8}\.[0-9]{6}Z$')"
check "a row's own ce_id/ce_type headers did not change its event" lacks "$T/events.json" 'forged'
check_eq "... nor reached the message in another letter case (CE_Source)" "" \
    "$(jq -r '.header_list[] | select(.[0] | ascii_downcase | startswith("ce_")) | .[1]' \
        "$T/msgs.json" | grep -i forged)"
check "... its other headers went through" grep -q '"x":"1"' "$T/msgs.json"
check_eq "a JSON payload's content-type is application/json" application/json \
    "$(jq -r '.headers["content-type"]' "$T/msgs.json" | sort -u)"

# The default format adds no CloudEvents attribute.
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        VALUES ('plain', 'p-1', 'Plain', '{}')"
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS"
wait_for "the plain row sent" 30 no_unsent_rows
relay_stop
consume --topic outbox.event.plain --to-end --timeout-ms 30000 >"$T/plain.json"
check_eq "default format: no ce_ header" 0 \
    "$(jq -r '.header_list[][0]' "$T/plain.json" | grep -c '^ce_')"
