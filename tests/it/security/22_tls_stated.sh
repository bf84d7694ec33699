#!/bin/bash
# Proves the relay states how its connections are protected (relay/tls_report.c,
# docs/security.md#secure-by-default), end to end; how each setting is judged and the warnings
# towards hosts that are not loopback are covered by tests/unit/test_tls_report.c (which needs no
# connection to them):
#  1. --require-tls with sslmode=require towards a PostgreSQL host that is not loopback exits 2
#     with one line naming the host, before anything connects (the name is never resolved);
#  2. --require-tls with a plaintext broker that is not loopback exits 2 with one line too;
#  3. towards the test's loopback PostgreSQL and broker the relay logs one "connection security"
#     line (postgres=optional for libpq's default sslmode=prefer, kafka=plaintext), no warning,
#     and tls=off on each "postgres connected" line; --require-tls lets it run (loopback).
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup

# --- 1./2. refused before connecting ---
timeout -s KILL 20 "$RELAY_BIN" run --database-url "postgresql://relay@db.example.com/x?sslmode=require" \
    --brokers 127.0.0.1:1 --require-tls >"$T/req1.out" 2>"$T/req1.err"
check_eq "1: --require-tls, sslmode=require to a remote host: exit 2" 2 $?
check_eq "1: one line" 1 "$(wc -l <"$T/req1.err")"
check "1: naming --require-tls and the host" \
    grep -q -- '--require-tls: PostgreSQL host db.example.com with sslmode=require is not verified' \
    "$T/req1.err"
check "1: nothing else was said (no statement, no connection attempt)" \
    test ! -s "$T/req1.out"
timeout -s KILL 20 "$RELAY_BIN" run --database-url "postgresql://relay@127.0.0.1:1/x" \
    --brokers kafka.example.com:9092 --require-tls >"$T/req2.out" 2>"$T/req2.err"
check_eq "2: --require-tls, plaintext to a remote broker: exit 2" 2 $?
check_eq "2: one line" 1 "$(wc -l <"$T/req2.err")"
check "2: naming the broker" \
    grep -q -- '--require-tls: Kafka broker kafka.example.com with security.protocol=plaintext' \
    "$T/req2.err"

# --- 3. the statement, and the connections themselves ---
pg_start
broker_start 1
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --require-tls
wait_for "3: the relay runs with --require-tls towards loopback and connects" 20 \
    grep -q 'msg="postgres connected"' "$RELAY_LOG"
check "3: one connection security line" \
    test "$(grep -c 'msg="connection security"' "$RELAY_LOG")" = 1
check "3: postgres=optional (sslmode=prefer), kafka=plaintext, nothing remote" \
    grep -q 'postgres=optional postgres_sslmode="prefer" postgres_remote=no kafka=plaintext kafka_security_protocol="plaintext" kafka_remote=no' "$RELAY_LOG"
check "3: no warning towards loopback" lacks 'not verified' "$RELAY_LOG"
check "3: postgres connected says tls=off" grep -q 'msg="postgres connected".* tls=off' "$RELAY_LOG"
relay_stop
check_eq "3: the relay exits 0" 0 $?
