#!/bin/bash
# Proves secrets stay secret: PostgreSQL requires the password here (scram-sha-256), and
#  1. --database-url-file (the URL with the password, trailing newline) and --kafka-file (SASL
#     credentials, comments, spaces, debug=conf) work: rows are delivered; the file beats
#     DATABASE_URL from the environment; neither the database password nor the Kafka secret
#     appears in the log (at debug level, with librdkafka printing its configuration) or in
#     /metrics, /healthz and /readyz;
#  2. a wrong password — from the file, from --database-url, for status, dead and migrate — fails
#     with "password authentication failed" and neither the wrong nor the right password shows;
#  3. --help given secret values prints neither;
#  4. bad input that carries a secret exits 2 with one line that does not show it: a --kafka
#     sasl.password that librdkafka rejects (rd_kafka_new), an OAuth client secret this build
#     rejects (rd_kafka_conf_set), a --kafka entry without '=', a --kafka-file line without '=',
#     a config file whose JSON breaks inside the password, a URL whose password has a bad %-escape;
#  5. --database-url and --database-url-file together, an unreadable file, an empty file: exit 2.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"

# From here on PostgreSQL asks TCP clients for the password. psql (the test's own helper) gets it
# from PGPASSWORD; the relay must not: it runs without it, so only the URL can authenticate it.
sed -i '1i host all all 127.0.0.1/32 scram-sha-256' "$T/pg/pg_hba.conf"
_as_pg pg_ctl -D "$T/pg" reload >/dev/null || fail "reload pg_hba.conf"
export PGPASSWORD=$PG_PASSWORD
RELAY_WRAP=(env -u PGPASSWORD)
check "PostgreSQL now refuses a TCP login without the password" \
    bash -c "! env -u PGPASSWORD psql -XAtq -w -c 'SELECT 1' >/dev/null 2>&1"

K_SECRET='kafka-Secret-9x7'
WRONG_PW='wrong-Pw-77'
WRONG_URL=postgresql://postgres:$WRONG_PW@127.0.0.1:$PGPORT/outbox

printf '%s\n' "$DATABASE_URL_PW" >"$T/db-url"
cat >"$T/kafka.properties" <<EOF
# SASL credentials (the mock broker's plaintext listener ignores them)
  sasl.username = relay
sasl.password=$K_SECRET

linger.ms=5
debug=conf
EOF
chmod 600 "$T/db-url" "$T/kafka.properties"

# no_secret DESCRIPTION FILE: neither password nor the Kafka secret is in FILE.
no_secret() {
    check "$1" bash -c "! grep -qF -e '$PG_PASSWORD' -e '$K_SECRET' -e '$WRONG_PW' '$2'"
}

# --- 1. secrets from files ---
RELAY_WRAP=(env -u PGPASSWORD DATABASE_URL=postgresql://nobody@127.0.0.1:1/nothing)
relay_start --database-url-file "$T/db-url" --kafka-file "$T/kafka.properties" \
    --brokers "$BROKERS" --metrics-listen 127.0.0.1:0 --log-level debug
RELAY_WRAP=(env -u PGPASSWORD)
metrics_wait
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'order', 'o-' || g, 'changed', '{}' FROM generate_series(1, 50) AS g"
wait_for "1: rows delivered with the URL from --database-url-file (beats DATABASE_URL)" 30 \
    no_unsent_rows
check "1: librdkafka printed its configuration from --kafka-file (debug=conf)" \
    grep -q 'sasl.username' "$RELAY_LOG"
check "1: the start-up line shows the database URL masked" \
    grep -q 'database="postgresql://postgres:\*\*\*@' "$RELAY_LOG"
for path in /metrics /healthz /readyz; do
    curl -s --max-time 5 "http://$METRICS$path" >"$T/http$(tr / _ <<<"$path")"
    no_secret "1: $path shows no secret" "$T/http$(tr / _ <<<"$path")"
done
check "1: /metrics was served" grep -q '^outbox_postgres_up 1' "$T/http_metrics"
relay_stop
check_eq "1: relay exits 0" 0 $?
no_secret "1: the log (debug level) shows no secret" "$RELAY_LOG"

# --- 2. wrong password ---
printf '%s\n' "$WRONG_URL" >"$T/db-url-wrong"
for how in file flag; do
    if [ "$how" = file ]; then
        relay_start --database-url-file "$T/db-url-wrong" --brokers "$BROKERS" --log-level debug
    else
        relay_start --database-url "$WRONG_URL" --brokers "$BROKERS" --log-level debug
    fi
    wait_for "2 ($how): the relay reports the failed login" 20 \
        grep -q 'password authentication failed' "$RELAY_LOG"
    sleep 1 # a few retries
    check "2 ($how): it keeps running and retrying" relay_running
    relay_stop
    no_secret "2 ($how): the log shows neither password" "$RELAY_LOG"
done
for cmd in status dead migrate; do
    "$RELAY_BIN" "$cmd" --database-url "$WRONG_URL" >"$T/$cmd.out" 2>&1
    check_eq "2: $cmd with the wrong password exits 1" 1 $?
    check "2: $cmd says why" grep -q 'password authentication failed' "$T/$cmd.out"
    no_secret "2: $cmd's error shows no password" "$T/$cmd.out"
done

# --- 3. --help ---
"$RELAY_BIN" run --database-url "$DATABASE_URL_PW" --kafka "sasl.password=$K_SECRET" \
    --kafka-file "$T/kafka.properties" --help >"$T/help.out" 2>&1
check_eq "3: --help exits 0" 0 $?
no_secret "3: --help shows no secret" "$T/help.out"

# --- 4. bad input carrying a secret ---
# rejects DESCRIPTION ARGS...: `outbox-relay ARGS` exits 2 with one line and no secret.
rejects() {
    local desc=$1 rc
    shift
    timeout 5 "${RELAY_WRAP[@]}" "$RELAY_BIN" "$@" >"$T/bad.out" 2>&1
    rc=$?
    check_eq "4: $desc: exit 2" 2 "$rc"
    check_eq "4: $desc: one line" 1 "$(grep -c '' "$T/bad.out")"
    no_secret "4: $desc: no secret in it" "$T/bad.out"
}
rejects "sasl.password rejected by librdkafka (no username)" run --database-url "$DATABASE_URL" \
    --brokers "$BROKERS" --kafka "sasl.password=$K_SECRET" --kafka security.protocol=sasl_plaintext \
    --kafka sasl.mechanisms=PLAIN
check "4: and librdkafka's reason is kept" grep -q 'sasl.username and sasl.password' "$T/bad.out"
rejects "an OAuth client secret rejected by this build" run --database-url "$DATABASE_URL" \
    --brokers "$BROKERS" --kafka "sasl.oauthbearer.client.secret=$K_SECRET"
rejects "--kafka without '='" run --database-url "$DATABASE_URL" --brokers "$BROKERS" \
    --kafka "$K_SECRET"
printf 'linger.ms=5\nsasl.password: %s\n' "$K_SECRET" >"$T/kafka-bad.properties"
rejects "a --kafka-file line without '='" run --database-url "$DATABASE_URL" \
    --brokers "$BROKERS" --kafka-file "$T/kafka-bad.properties"
check "4: the error names the file's line" grep -q 'kafka-bad.properties line 2' "$T/bad.out"
printf '{"database-url": "postgresql://postgres:%s\\q@127.0.0.1/outbox"}\n' "$PG_PASSWORD" \
    >"$T/bad.json"
rejects "a config file whose JSON breaks inside the password" run --config "$T/bad.json" \
    --brokers "$BROKERS"
check "4: the error still gives the position" grep -q 'line 1 column' "$T/bad.out"
rejects "a URL whose password has a bad %-escape" run \
    --database-url "postgresql://postgres:${PG_PASSWORD}%zz@127.0.0.1:$PGPORT/outbox" \
    --brokers "$BROKERS"

# --- 5. the file options' own errors ---
rejects "--database-url with --database-url-file" run --database-url "$DATABASE_URL_PW" \
    --database-url-file "$T/db-url" --brokers "$BROKERS"
rejects "an unreadable --database-url-file" run --database-url-file "$T/nope" \
    --brokers "$BROKERS"
: >"$T/empty"
rejects "an empty --database-url-file" run --database-url-file "$T/empty" --brokers "$BROKERS"
rejects "an unreadable --kafka-file" run --database-url-file "$T/db-url" --brokers "$BROKERS" \
    --kafka-file "$T/nope"
