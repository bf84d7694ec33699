#!/bin/bash
# Proves `outbox-relay verify` does not wait for ever on a server that stops answering (stopped,
# paused, or a proxy that lost it: the network still acknowledges every packet, so keepalives
# cannot tell it from a long statement):
#  1. the answer to the read of the window's rows withheld (a proxy holds it for 10 minutes),
#     verify gives up after its bound (--statement-timeout, 30 s by default, plus a millisecond a
#     row of --max-rows: 3 s with --statement-timeout 2s --max-rows 1000), exit 1, one line
#     saying PostgreSQL did not answer, and no verdict;
#  2. run directly (no proxy), the same check is ok;
#  3. a Kafka that stops answering (the mock broker stopped: connections accepted, nothing
#     answered): verify gives up on its first request after --statement-timeout (2 s here; it was
#     a fixed 10 s a request and 30 s for the messages), exit 1, one line naming the bound, and no
#     verdict;
#  4. a Kafka that stops answering once verify reads the messages (each answer slowed to 2 s,
#     so that the broker is stopped after verify positioned every partition and before the first
#     fetch came back): verify gives up after --statement-timeout without a message (8 s here; it
#     was a fixed 30 s), exit 1, one line naming the bound, and no verdict.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"

psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'order', 'o-' || (g % 3), 'Updated', '{}' FROM generate_series(1, 30) g"
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS"
wait_for "every row sent" 60 no_unsent_rows
relay_stop

# --- 1. ---
# Only the answer to the first statement naming "make_interval" (the read of the window's rows).
holding_proxy proxy "make_interval"
# Before: verify waited for the held answer (ten minutes here, for ever on a stopped server):
# killed here.
timeout -k 10 150 "$RELAY_BIN" verify \
    --database-url "postgresql://postgres@127.0.0.1:$PROXY_PORT/outbox" --brokers "$BROKERS" \
    --since 1h --from-beginning --max-rows 1000 --statement-timeout 2s >"$T/held.out" 2>"$T/held.err"
check_eq "1: a server that stops answering: exit 1" 1 $?
check "1: ... named in one line" grep -q 'PostgreSQL did not answer within 3 s' "$T/held.err"
check_eq "1: ... and no verdict on stdout" "" "$(cat "$T/held.out")"
kill "$PROXY_PID" 2>/dev/null
wait "$PROXY_PID" 2>/dev/null

# --- 2. ---
"$RELAY_BIN" verify --database-url "$DATABASE_URL" --brokers "$BROKERS" --since 1h \
    --from-beginning --max-rows 1000 >"$T/direct.out" 2>"$T/direct.err"
check_eq "2: directly: exit 0" 0 $?
check "2: ... every row found" grep -q '^verify: ok: window=3600s rows=30 messages=30 missing=0' \
    "$T/direct.out"

# --- 3. ---
# Stopped, the mock's sockets still accept connections (the kernel does) and answer nothing.
kill -STOP "$BROKER_PID"
timeout -k 10 150 "$RELAY_BIN" verify --database-url "$DATABASE_URL" --brokers "$BROKERS" \
    --since 1h --from-beginning --max-rows 1000 --statement-timeout 2s >"$T/silentkafka.out" \
    2>"$T/silentkafka.err"
silentkafka_rc=$?
kill -CONT "$BROKER_PID"
check_eq "3: a broker that stops answering: exit 1" 1 "$silentkafka_rc"
check "3: ... named in one line, with the bound set" \
    grep -q "cannot read the topic's metadata.* bound=\"2 s\"" \
    "$T/silentkafka.err"
check_eq "3: ... and no verdict on stdout" "" "$(cat "$T/silentkafka.out")"

# --- 4. ---
# partitions_positioned: verify has logged where it reads each of the topic's partitions (the
# mock creates 4), the last thing before it assigns them and waits for messages.
partitions_positioned() {
    [ "$(grep -c 'msg="partition to read"' "$T/idle.err")" -ge 4 ]
}
broker_cmd "rtt all 2000"
timeout -k 10 150 "$RELAY_BIN" verify --database-url "$DATABASE_URL" --brokers "$BROKERS" \
    --since 1h --from-beginning --max-rows 1000 --statement-timeout 8s --log-level debug \
    >"$T/idle.out" 2>"$T/idle.err" &
idle_pid=$!
_t_track "$idle_pid"
_poll 60 partitions_positioned || not_ok "4: verify positions the partitions" "$(tail -n 3 "$T/idle.err")"
kill -STOP "$BROKER_PID"
wait "$idle_pid"
idle_rc=$?
kill -CONT "$BROKER_PID"
broker_cmd "rtt all 0"
check_eq "4: a broker that stops answering while verify reads: exit 1" 1 "$idle_rc"
check "4: ... named in one line, with the bound set" \
    grep -q 'Kafka sent nothing within --statement-timeout; giving up.* bound="8 s"' "$T/idle.err"
check_eq "4: ... and no verdict on stdout" "" "$(cat "$T/idle.out")"
