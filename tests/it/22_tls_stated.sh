#!/bin/bash
# Proves the relay states how its connections are protected (relay/tls_report.c, README
# "Security"):
#  1. towards loopback PostgreSQL and brokers it logs one "connection security" line
#     (postgres=optional for libpq's default sslmode=prefer, kafka=plaintext) and no warning;
#  2. towards a PostgreSQL host that is not loopback, sslmode prefer or require gets the warning
#     "postgres connection not verified"; verify-full does not, and says postgres=verified;
#  3. towards a broker that is not loopback, plaintext (and ssl without certificate
#     verification) gets "kafka connection not verified"; ssl with verification does not;
#  4. --require-tls turns those cases into exit 2 with one line; loopback, or verify-full and
#     verified ssl, pass it;
#  5. a relay connected to the test PostgreSQL logs tls=off on its "postgres connected" line.
# Cases 1-4 never connect anywhere: an unknown librdkafka property (--kafka no.such.property=1)
# stops the relay at its Kafka configuration, with exit 2, right after the statement (and
# before any connection); the remote names are never resolved.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../lib.sh"
t_setup
STOP=(--kafka no.such.property=1)

# stated NAME ARGS...: runs the relay with ARGS (it stops at the Kafka configuration) and keeps
# what it printed in $T/NAME.out; its exit status in $T/NAME.rc.
stated() {
    local name=$1
    shift
    timeout -s KILL 20 "$RELAY_BIN" run "$@" "${STOP[@]}" >"$T/$name.out" 2>&1
    echo $? >"$T/$name.rc"
}
LOCAL_DB=postgresql://relay@127.0.0.1:1/outbox
REMOTE_DB=postgresql://relay@db.example.com:5432/outbox

stated local --database-url "$LOCAL_DB" --brokers 127.0.0.1:1
check "1: one connection security line" \
    test "$(grep -c 'msg="connection security"' "$T/local.out")" = 1
check "1: postgres=optional (sslmode=prefer), kafka=plaintext, nothing remote" \
    grep -q 'postgres=optional postgres_sslmode="prefer" postgres_remote=no kafka=plaintext kafka_security_protocol="plaintext" kafka_remote=no' "$T/local.out"
check "1: no warning towards loopback" lacks 'not verified' "$T/local.out"
check_eq "1: and then the stop at the Kafka configuration (exit 2)" 2 "$(cat "$T/local.rc")"

stated pg_prefer --database-url "$REMOTE_DB" --brokers 127.0.0.1:1
check "2: sslmode=prefer to db.example.com: warning" \
    grep -q 'level=warn msg="postgres connection not verified" host="db.example.com" sslmode="prefer"' "$T/pg_prefer.out"
stated pg_require --database-url "$REMOTE_DB?sslmode=require" --brokers 127.0.0.1:1
check "2: sslmode=require: warning (encrypted, not verified)" \
    grep -q 'msg="postgres connection not verified".*sslmode="require"' "$T/pg_require.out"
check "2: sslmode=require is stated as unverified" grep -q 'postgres=unverified' "$T/pg_require.out"
stated pg_full --database-url "$REMOTE_DB?sslmode=verify-full" --brokers 127.0.0.1:1
check "2: sslmode=verify-full: no warning" lacks 'not verified' "$T/pg_full.out"
check "2: sslmode=verify-full is stated as verified" grep -q 'postgres=verified' "$T/pg_full.out"
PGSSLMODE=disable stated pg_env --database-url "$REMOTE_DB" --brokers 127.0.0.1:1
check "2: PGSSLMODE=disable from the environment counts: plaintext, warning" \
    grep -q 'msg="postgres connection not verified".*sslmode="disable"' "$T/pg_env.out"

stated k_plain --database-url "$LOCAL_DB" --brokers kafka.example.com:9092
check "3: plaintext to kafka.example.com: warning" \
    grep -q 'msg="kafka connection not verified" broker="kafka.example.com" security_protocol="plaintext"' "$T/k_plain.out"
stated k_noverify --database-url "$LOCAL_DB" --brokers SSL://kafka.example.com:9093 \
    --kafka security.protocol=ssl --kafka enable.ssl.certificate.verification=false
check "3: ssl without certificate verification: warning" \
    grep -q 'msg="kafka connection not verified".*security_protocol="ssl"' "$T/k_noverify.out"
stated k_ssl --database-url "$LOCAL_DB" --brokers kafka.example.com:9093 \
    --kafka security.protocol=SASL_SSL
check "3: sasl_ssl with verification: no warning, kafka=verified" \
    grep -q 'kafka=verified' "$T/k_ssl.out"
check "3: sasl_ssl with verification: no warning" lacks 'not verified' "$T/k_ssl.out"

# --- 4. --require-tls ---
"$RELAY_BIN" run --database-url "$REMOTE_DB?sslmode=require" --brokers 127.0.0.1:1 --require-tls \
    >"$T/req1.out" 2>"$T/req1.err"
check_eq "4: --require-tls with sslmode=require to a remote host: exit 2" 2 $?
check_eq "4: one line" 1 "$(wc -l <"$T/req1.err")"
check "4: the line names --require-tls and the host" \
    grep -q -- '--require-tls: PostgreSQL host db.example.com with sslmode=require is not verified' "$T/req1.err"
"$RELAY_BIN" run --database-url "$LOCAL_DB" --brokers kafka.example.com:9092 --require-tls \
    >"$T/req2.out" 2>"$T/req2.err"
check_eq "4: --require-tls with a plaintext remote broker: exit 2" 2 $?
check "4: the line names the broker" grep -q -- '--require-tls: Kafka broker kafka.example.com' "$T/req2.err"
stated req_ok --database-url "$REMOTE_DB?sslmode=verify-full" --brokers kafka.example.com:9093 \
    --kafka security.protocol=ssl --require-tls
check "4: verify-full and verified ssl pass --require-tls (it reaches the statement)" \
    grep -q 'msg="connection security" postgres=verified' "$T/req_ok.out"
stated req_local --database-url "$LOCAL_DB" --brokers 127.0.0.1:1 --require-tls
check "4: loopback passes --require-tls" grep -q 'msg="connection security"' "$T/req_local.out"

# --- 5. the connection itself ---
pg_start
broker_start 1
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS"
wait_for "5: the relay logs tls=off on its postgres connected line" 20 \
    grep -q 'msg="postgres connected".* tls=off' "$RELAY_LOG"
relay_stop
