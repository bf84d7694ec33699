#!/bin/bash
# Proves the demos keep their secrets off the command line every local user can read
# (docs/security.md#secrets), as the relay does (83_secrets_hygiene part 1):
#  1. a running producer-demo serve's /proc/PID/cmdline holds neither the database password
#     (--database-url) nor, in a value pasted into another option, a registered secret; its
#     options still show, and it still serves (an order is written); core dumps are off
#     (RLIMIT_CORE 0), as for the relay;
#  2. a running consumer-demo's /proc/PID/cmdline holds neither the database password nor a
#     --kafka sasl.password (either spelling); its options still show, and it still runs; core
#     dumps are off;
#  3. consumer-demo refuses a --brokers entry holding user info (exit 2) without showing the
#     password: it ran, resolving "USER:PASSWORD@HOST" for ever, and logged the password;
#  4. a password too short to scrub is warned of at start-up, by each demo, as the relay does;
#     a longer one is not.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
# shellcheck source=tests/demo_lib.sh
source "$(dirname "$0")/../../demo_lib.sh"
demo_setup
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "outbox-relay migrate"
K_SECRET=kafka-Secret-Pw-99
# Core dumps allowed to the demos' shell (where the hard limit lets it), so the check that they
# turn them off can fail.
ulimit -c unlimited 2>/dev/null || ulimit -c "$(ulimit -Hc)" 2>/dev/null || true

# --- 1. ---
# The last --database-url wins: the one with the password.
producer_start --database-url "$DATABASE_URL_PW"
tr '\0' ' ' <"/proc/$PRODUCER_PID/cmdline" >"$T/producer.cmdline"
check "1: producer-demo's cmdline lacks the database password" \
    lacks "$T/producer.cmdline" "$PG_PASSWORD"
check "1: ... and still shows its options" \
    grep -q -- "serve --database-url .* --listen 127.0.0.1:0 --database-url " "$T/producer.cmdline"
check_eq "1: producer-demo's core dumps are off (RLIMIT_CORE 0)" "0 0" \
    "$(awk '/^Max core file size/ {print $5, $6}' "/proc/$PRODUCER_PID/limits")"
post_order k-1 '{"customer_id": "c-1", "amount_cents": 4200, "currency": "EUR"}'
check_eq "1: producer-demo still serves: 201" 201 "$STATUS"
producer_stop
check "1: no log line shows the password" lacks "$PRODUCER_LOG" "$PG_PASSWORD"

# --- 2. ---
"$CONSUMER_BIN" migrate --database-url "$DATABASE_URL_PW" 2>"$T/consumer.migrate.log" ||
    fail "consumer-demo migrate"
consumer_start --topic orders.secrets --group secrets --database-url "$DATABASE_URL_PW" \
    --kafka "sasl.password=$K_SECRET" --kafka=ssl.key.password="$K_SECRET-2"
tr '\0' ' ' <"/proc/$CONSUMER_PID/cmdline" >"$T/consumer.cmdline"
check "2: consumer-demo's cmdline lacks the database password" \
    lacks "$T/consumer.cmdline" "$PG_PASSWORD"
check "2: ... and the Kafka passwords" lacks "$T/consumer.cmdline" "$K_SECRET"
check "2: ... and still shows its options" \
    grep -q -- "--database-url .* --kafka sasl.password=.* --kafka=ssl.key.password=" \
    "$T/consumer.cmdline"
check_eq "2: consumer-demo's core dumps are off (RLIMIT_CORE 0)" "0 0" \
    "$(awk '/^Max core file size/ {print $5, $6}' "/proc/$CONSUMER_PID/limits")"
check "2: consumer-demo still runs" consumer_running
consumer_stop
check "2: no log line shows a password" \
    bash -c "! grep -qF -e '$PG_PASSWORD' -e '$K_SECRET' '$CONSUMER_LOG'"

# --- 3. ---
# The whole password, and one a ',' cuts over two entries.
for b in "u:hunter22@$BROKERS" "$BROKERS,u:hun,ter22@h:1"; do
    timeout 20 "$CONSUMER_BIN" run --database-url "$DATABASE_URL" --brokers "$b" --topic t \
        --group g >"$T/userinfo.out" 2>&1
    check_eq "3: --brokers with user info: exit 2" 2 $?
    check "3: ... the error says why" grep -qF -- "--brokers: an entry holds user info" \
        "$T/userinfo.out"
    check "3: ... and shows no password" bash -c "! grep -qE 'hunter|hun,|ter22' '$T/userinfo.out'"
done

# --- 4. ---
SHORT_URL=postgresql://postgres:ab@127.0.0.1:$PGPORT/outbox
"$PRODUCER_BIN" migrate --database-url "$SHORT_URL" >/dev/null 2>"$T/short.producer"
"$CONSUMER_BIN" migrate --database-url "$SHORT_URL" >/dev/null 2>"$T/short.consumer"
"$CONSUMER_BIN" migrate --database-url "$DATABASE_URL_PW" >/dev/null 2>"$T/long.consumer"
for demo in producer consumer; do
    check "4: $demo-demo warns of a 2-character password" \
        grep -qF 'msg="secret too short to scrub" count=1 min_length=4' "$T/short.$demo"
done
check "4: ... and not of a long one" lacks "$T/long.consumer" "too short"
