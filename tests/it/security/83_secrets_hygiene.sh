#!/bin/bash
# Proves the relay's secret handling and TLS policy (docs/security.md#secrets,
# docs/security.md#secure-by-default):
#  0. the shipped unit runs the relay with --require-tls and loads the Kafka properties as a
#     credential (LoadCredential=kafka.properties, --kafka-file %d/kafka.properties);
#  1. (with --require-tls, on loopback plaintext) a running relay's /proc/PID/cmdline no longer holds the --database-url (password included)
#     or a --kafka sasl.password, the relay still delivers, and a SIGHUP reload (which re-reads
#     the command line) still works; core dumps are off (RLIMIT_CORE 0);
#  2. --database-url-file pointed at a file that is not a connection string (a token) exits 2
#     without echoing the file's content;
#  3. a secret file readable by group or others (--database-url-file, --kafka-file, a config file
#     holding a sasl.password) gets a warning naming the file and its mode; a 0600 one does not;
#  4. --require-tls refuses, before connecting, each bypass of the report: a remote
#     metadata.broker.list after a local bootstrap.servers, enable.ssl.certificate.verification=F,
#     and hosts whose names merely start with "127.";
#  5. a topic template that can produce the dead-letter topic's name is refused (exit 2).
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"
K_SECRET=kafka-Secret-Pw-99

# --- 0. ---
UNIT_IN=$(dirname "$0")/../../../systemd/outbox-relay.service.in
check "0: the unit passes --require-tls" grep -q '^ExecStart=.* --require-tls' "$UNIT_IN"
check "0: the unit passes the Kafka properties credential" \
    grep -q '^ExecStart=.* --kafka-file %d/kafka.properties' "$UNIT_IN"
check "0: the unit loads it" \
    grep -qx 'LoadCredential=kafka.properties:@SYSCONFDIR@/outbox-relay/kafka.properties' "$UNIT_IN"
check "0: the installed kafka.properties sets nothing" \
    bash -c "! grep -qv '^#' $(dirname "$0")/../../../systemd/kafka.properties"

# --- 1. ---
# --require-tls as the shipped unit runs it: loopback plaintext is still allowed.
relay_start --database-url "$DATABASE_URL_PW" --brokers "$BROKERS" --require-tls \
    --kafka "sasl.password=$K_SECRET" --kafka reconnect.backoff.max.ms=500
wait_for "1: the relay starts" 30 grep -q "outbox-relay starting" "$RELAY_LOG"
tr '\0' ' ' <"/proc/$RELAY_PID/cmdline" >"$T/cmdline"
check "1: cmdline lacks the database password" lacks "$T/cmdline" "$PG_PASSWORD"
check "1: cmdline lacks the Kafka password" lacks "$T/cmdline" "$K_SECRET"
check "1: cmdline still shows the options" grep -q -- "--database-url .* --kafka sasl.password=" "$T/cmdline"
check_eq "1: core dumps are off" "0 0" \
    "$(awk '/^Max core file size/ {print $5, $6}' "/proc/$RELAY_PID/limits")"
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'hy', 'hy-' || g, 'changed', '{}' FROM generate_series(1, 20) AS g" || fail "insert"
wait_for "1: rows are delivered" 30 no_unsent_rows
kill -HUP "$RELAY_PID"
wait_for "1: a SIGHUP reload still works" 20 grep -q "configuration reloaded" "$RELAY_LOG"
check "1: and changed nothing (the kept command line is the original)" \
    grep -q 'configuration reloaded" changed=none' "$RELAY_LOG"
relay_stop
check_eq "1: the relay stops cleanly" 0 $?

# --- 2. ---
TOKEN=ghp_16C7e42F292c6912E7710c838347Ae178B4a
echo "$TOKEN" >"$T/token"
chmod 600 "$T/token"
timeout 20 "$RELAY_BIN" run --database-url-file "$T/token" --brokers "$BROKERS" >"$T/token.out" 2>&1
check_eq "2: a token as --database-url-file: exit 2" 2 $?
check "2: its content is not echoed" lacks "$T/token.out" "16C7e42F"
check "2: the error names the file" grep -qF "$T/token" "$T/token.out"

# --- 3. ---
echo "$DATABASE_URL_PW" >"$T/db-url-open"
chmod 644 "$T/db-url-open"
echo "$DATABASE_URL_PW" >"$T/db-url-closed"
chmod 600 "$T/db-url-closed"
printf 'sasl.password=%s\n' "$K_SECRET" >"$T/kafka-group.properties"
chmod 640 "$T/kafka-group.properties"
printf '{"kafka": {"sasl.password": "%s"}}\n' "$K_SECRET" >"$T/relay-open.json"
chmod 644 "$T/relay-open.json"
"$RELAY_BIN" status --database-url-file "$T/db-url-open" >/dev/null 2>"$T/open.err"
check_eq "3: status with a 0644 URL file still runs" 0 $?
check "3: a 0644 --database-url-file is warned about" \
    grep -q "level=warn msg=\"secret file readable by other users\" file=\"$T/db-url-open\" mode=0644" "$T/open.err"
"$RELAY_BIN" status --database-url-file "$T/db-url-closed" >/dev/null 2>"$T/closed.err"
check "3: a 0600 one is not" lacks "$T/closed.err" "readable by other users"
timeout 20 "$RELAY_BIN" run --database-url-file "$T/db-url-closed" --brokers "$BROKERS" \
    --kafka-file "$T/kafka-group.properties" --config "$T/relay-open.json" --require-tls \
    --kafka "bootstrap.servers=kafka.example.com:9092" >"$T/group.err" 2>&1
check "3: a 0640 --kafka-file is warned about" \
    grep -q "secret file readable by other users\" file=\"$T/kafka-group.properties\" mode=0640" "$T/group.err"
check "3: a 0644 config file holding a sasl.password is warned about" \
    grep -q "secret file readable by other users\" file=\"$T/relay-open.json\" mode=0644" "$T/group.err"
check "3: no warning shows the secret" lacks "$T/group.err" "$K_SECRET"

# --- 4. ---
# refused DESCRIPTION HOST ARGS...: `run --require-tls ARGS` exits 2 naming HOST, before it
# connects anywhere (a relay that got past the check would run until the timeout).
refused() {
    local desc=$1 host=$2 rc
    shift 2
    timeout 20 "$RELAY_BIN" run --require-tls --database-url "$DATABASE_URL" "$@" >"$T/tls.out" 2>&1
    rc=$?
    check_eq "4: $desc: exit 2" 2 "$rc"
    check "4: $desc: the error names $host" grep -qF -- "--require-tls: " "$T/tls.out"
    check "4: $desc: ... and $host" grep -qF "$host" "$T/tls.out"
}
refused "metadata.broker.list after bootstrap.servers" kafka.example.com --brokers "$BROKERS" \
    --kafka "bootstrap.servers=$BROKERS" --kafka metadata.broker.list=kafka.example.com:9092
refused "enable.ssl.certificate.verification=F" kafka.example.com \
    --brokers kafka.example.com:9093 --kafka security.protocol=ssl \
    --kafka enable.ssl.certificate.verification=F
refused "a broker named 127.attacker.example" 127.attacker.example \
    --brokers 127.attacker.example:9092
timeout 20 "$RELAY_BIN" run --require-tls --brokers "$BROKERS" \
    --database-url "postgresql://postgres@127.attacker.example:$PGPORT/outbox" >"$T/tls.out" 2>&1
check_eq "4: a PostgreSQL host named 127.attacker.example: exit 2" 2 $?
check "4: ... named in the error" grep -qF "PostgreSQL host 127.attacker.example" "$T/tls.out"

# --- 5. ---
timeout 20 "$RELAY_BIN" run --database-url "$DATABASE_URL" --brokers "$BROKERS" \
    --topic-template '{aggregate_type}' --dead-letter-topic dlq >"$T/dlq.out" 2>&1
check_eq "5: --topic-template {aggregate_type} with a dead-letter topic: exit 2" 2 $?
check "5: the error says why" grep -q "dead-letter topic" "$T/dlq.out"
timeout 20 "$RELAY_BIN" run --database-url "$DATABASE_URL" --brokers "$BROKERS" \
    --topic-template 'events.{aggregate_type}' --dead-letter-topic events.dead >"$T/dlq.out" 2>&1
check_eq "5: events.{aggregate_type} with events.dead: exit 2" 2 $?
