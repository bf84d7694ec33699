#!/bin/bash
# Proves the metrics and health endpoints (--metrics-listen), served from the relay's own loop:
#  1. after relaying 3,000 events: outbox_events_published_total for their topic >= 3,000, the
#     latency histogram counted them, batches counted, the backlog gauges present (and 0), the
#     state gauges say PostgreSQL and Kafka up, 64 lanes owned, 2 relay sessions, 2 claiming
#     (--min-sessions 2); every sample line is well-formed Prometheus text with HELP and TYPE;
#     /healthz and /readyz answer 200;
#  2. unknown paths answer 404, POST 405 (with Allow), HEAD 200, a POST whose 1 MiB body is sent
#     before the answer is read gets its 405 and the end (not a reset); a second relay asking for the
#     same address exits 1 with one line;
#  3. the backlog gauges follow the table: with Kafka down, 40 new rows show as a backlog of 40
#     with a positive age, and Kafka down makes /readyz 503 and outbox_kafka_up 0 while /healthz
#     stays 200; with Kafka back, the backlog drains to 0 and /readyz is 200 again;
#  4. with PostgreSQL stopped, /readyz answers 503 and outbox_postgres_up 0 while /healthz stays
#     200 and the relay keeps running; once PostgreSQL is back, /readyz is 200 again;
#  5. the relay exits 0 on SIGTERM with the endpoint on, and the port is closed afterwards.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 3
relay_migrate 2>"$T/migrate.log" || fail "migrate"

insert() { # insert N: N rows over 30 aggregates of type "order"
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            SELECT 'order', 'order-' || (g % 30), 'changed', jsonb_build_object('seq', g)
            FROM generate_series(1, $1) AS g ORDER BY g"
}

answers() { # answers PATH CODE: the endpoint answers PATH with status CODE (for wait_for)
    [ "$(http_code "$1")" = "$2" ]
}

insert 3000
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --metrics-listen 127.0.0.1:0 \
    --kafka reconnect.backoff.max.ms=500 --min-sessions 2
metrics_wait
echo "# metrics at $METRICS"
wait_for "1: all 3,000 rows sent" 60 no_unsent_rows

# --- 1. after 3,000 events ---
check "1: published counter for outbox.event.order >= 3000" \
    metric_at_least 'outbox_events_published_total{topic="outbox.event.order"}' 3000
check "1: latency histogram observed >= 3000 events" \
    metric_at_least outbox_created_to_ack_seconds_count 3000
# inf_equals_count NAME: in one scrape (the relay goes on claiming between two), NAME's +Inf
# bucket equals its count.
inf_equals_count() {
    http_get /metrics | awk -v b="$1_bucket{le=\"+Inf\"}" -v c="$1_count" '
        $1 == b { inf = $2 } $1 == c { count = $2 }
        END { if (inf == "" || inf != count) { print "+Inf " inf ", count " count; exit 1 } }'
}
check "1: latency +Inf bucket equals the count" inf_equals_count outbox_created_to_ack_seconds
check "1: latency sum is positive" metric_at_least outbox_created_to_ack_seconds_sum 0.000001
check "1: batches counted" metric_at_least outbox_batches_total 1
check "1: claim durations observed, at least one per batch" metric_at_least \
    outbox_claim_duration_seconds_count "$(metric outbox_batches_total)"
check "1: claim duration +Inf bucket equals the count" inf_equals_count \
    outbox_claim_duration_seconds
check "1: failure counter exported: transient, 0 after a clean run" \
    metric_is 'outbox_failures_total{class="transient"}' 0
check "1: failure counter exported: permanent, 0 after a clean run" \
    metric_is 'outbox_failures_total{class="permanent"}' 0
wait_for "1: backlog gauge present and 0 (refreshed within 5 s)" 15 metric_is outbox_backlog_rows 0
check "1: oldest-unsent-age gauge present (0 with no backlog)" \
    metric_is outbox_oldest_unsent_age_seconds 0
check "1: outbox_postgres_up 1" metric_is outbox_postgres_up 1
check "1: outbox_kafka_up 1" metric_is outbox_kafka_up 1
check "1: outbox_lanes_owned 64" metric_is outbox_lanes_owned 64
check "1: outbox_relay_sessions 2 (one relay, --sessions default)" \
    metric_is outbox_relay_sessions 2
check "1: outbox_claim_sessions 2 (--min-sessions 2)" metric_is outbox_claim_sessions 2

http_get /metrics >"$T/metrics.txt"
well_formed() {
    awk '
        /^# HELP / { help[$3] = 1; next }
        /^# TYPE / { type[$3] = $4; next }
        /^#/ { print "stray comment: " $0; bad++; next }
        !/^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="[^"]*"(,[a-zA-Z_][a-zA-Z0-9_]*="[^"]*")*\})? -?[0-9.eE+]+$/ {
            print "bad sample: " $0; bad++; next }
        {
            name = $1; sub(/\{.*/, "", name); base = name
            sub(/_(bucket|sum|count)$/, "", base)
            if (!(name in type) && !(base in type && type[base] == "histogram")) {
                print "no TYPE for " name; bad++ }
            if (!(name in help) && !(base in help)) { print "no HELP for " name; bad++ }
            if (name ~ /_total$/ && type[name] != "counter") { print name " not a counter"; bad++ }
        }
        END { exit bad > 0 }' "$1"
}
check "1: every line of /metrics is well-formed, with HELP and TYPE" well_formed "$T/metrics.txt"
check "1: all names prefixed outbox_" bash -c "! grep -v '^#' '$T/metrics.txt' | grep -v '^outbox_'"
check_eq "1: /healthz 200" 200 "$(http_code /healthz)"
check_eq "1: /readyz 200" 200 "$(http_code /readyz)"
check_eq "1: /metrics content type is Prometheus text 0.0.4" \
    "text/plain; version=0.0.4; charset=utf-8" \
    "$(curl -s -o /dev/null -w '%{content_type}' --max-time 5 "http://$METRICS/metrics")"

# --- 2. paths and methods ---
check_eq "2: unknown path 404" 404 "$(http_code /nope)"
check_eq "2: /metrics/ (not exact) 404" 404 "$(http_code /metrics/)"
check_eq "2: POST /metrics 405" 405 "$(http_code /metrics -X POST -d x=1)"
check_eq "2: DELETE /healthz 405" 405 "$(http_code /healthz -X DELETE)"
check "2: 405 says Allow: GET, HEAD" \
    grep -qi '^allow: GET, HEAD' <(curl -s -D - -o /dev/null -X POST --max-time 5 \
    "http://$METRICS/readyz")
check_eq "2: HEAD /metrics 200" 200 "$(http_code /metrics -I)"
# A client that sends its whole body before reading (1 MiB to POST /metrics) reads the 405: the
# answer comes before the body, and a close with the body unread would send a reset, which drops
# the answer from the client's receive queue (or fails the client's send: a broken pipe). Prints
# "STATUS eof" or what went wrong instead.
big_post() {
    python3 - "$METRICS" <<'PY'
import socket, sys
host, port = sys.argv[1].rsplit(":", 1)
s = socket.create_connection((host, int(port)), timeout=10)
body = b"x" * (1 << 20)
head = b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
head += b"Content-Length: %d\r\n\r\n" % len(body)
out = "?"
try:
    s.sendall(head)  # the headers first: the answer is on its way while the body is sent
    s.sendall(body)
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    out = data.split(b" ", 2)[1].decode() + " eof" if data.startswith(b"HTTP/") else "no answer"
except ConnectionResetError:
    out = "reset"
except BrokenPipeError:
    out = "broken pipe"
except socket.timeout:
    out = "timeout"
print(out)
PY
}
check_eq "2: POST /metrics with a 1 MiB body sent first reads its 405, then the end" \
    "405 eof" "$(big_post)"
check_eq "2: still serving after those" 200 "$(http_code /healthz)"
timeout 20 "$RELAY_BIN" run --database-url "$DATABASE_URL" --brokers "$BROKERS" \
    --metrics-listen "$METRICS" >"$T/second.out" 2>&1
check_eq "2: a second relay on the same address exits 1" 1 $?
check "2: with one line saying why" \
    bash -c "[ \"\$(grep -c '' '$T/second.out')\" = 1 ] && grep -q 'cannot listen' '$T/second.out'"

# --- 3. backlog gauges and Kafka readiness ---
broker_down
insert 40
wait_for "3: backlog gauge shows the 40 unsent rows" 20 metric_is outbox_backlog_rows 40
check "3: oldest unsent age > 0" metric_at_least outbox_oldest_unsent_age_seconds 0.001
wait_for "3: /readyz 503 while Kafka is down" 20 answers /readyz 503
check "3: /readyz body names Kafka" grep -q kafka <(curl -s --max-time 5 "http://$METRICS/readyz")
check "3: outbox_kafka_up 0" metric_is outbox_kafka_up 0
check_eq "3: /healthz stays 200" 200 "$(http_code /healthz)"
broker_up
wait_for "3: rows sent once Kafka is back" 45 no_unsent_rows
wait_for "3: backlog gauge back to 0" 20 metric_is outbox_backlog_rows 0
wait_for "3: /readyz 200 again" 20 answers /readyz 200

# --- 4. PostgreSQL stopped ---
pg_stop
wait_for "4: /readyz 503 while PostgreSQL is stopped" 20 answers /readyz 503
check "4: /readyz body names PostgreSQL" \
    grep -q postgres <(curl -s --max-time 5 "http://$METRICS/readyz")
check "4: outbox_postgres_up 0" metric_is outbox_postgres_up 0
sleep 2
check_eq "4: /healthz stays 200" 200 "$(http_code /healthz)"
check "4: relay keeps running" relay_running
pg_start
wait_for "4: /readyz 200 once PostgreSQL is back" 30 answers /readyz 200
insert 10
wait_for "4: new rows sent after the outage" 30 no_unsent_rows

# --- 5. shutdown ---
relay_stop
check_eq "5: relay exits 0 on SIGTERM" 0 $?
check_eq "5: endpoint gone after exit" 000 "$(http_code /healthz)"
