#!/bin/bash
# Proves that a run refused at start-up after its producer exists (the Schema Registry refuses
# the credentials: exit 1) lets that producer finish being destroyed before the process exits,
# with one database and with a --databases list. relay_free hands a producer with every report in
# to kafka_producer_retire's thread; the process used to exit on this path without waiting for
# it (kafka_retired_wait), so librdkafka was torn down under the thread mid-destroy (its last
# lines never written, exit handlers racing its threads). librdkafka's own debug line for the end
# of a destroy ("Termination done") must be there once per producer.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"
psql_q "CREATE DATABASE exit_b" >/dev/null || fail "create database exit_b"
relay_migrate --database-url "postgresql://postgres@127.0.0.1:$PGPORT/exit_b" 2>>"$T/migrate.log" ||
    fail "migrate exit_b"

SR_PORT=$(free_port) || fail "a free port for the registry"
node "$ROOT/tests/tools/schema-registry.js" --port "$SR_PORT" --auth relay:s3cret \
    >"$T/registry.out" 2>&1 &
_t_track $!
wait_for "the registry listens" 10 grep -q '^listening' "$T/registry.out"
printf 'relay:wrong\n' >"$T/sr-bad"
chmod 600 "$T/sr-bad"
SR_URL=http://127.0.0.1:$SR_PORT

# Three runs each: the old exit raced the thread, and sometimes lost only narrowly.
for i in 1 2 3; do
    "$RELAY_BIN" run --database-url "$DATABASE_URL" --brokers "$BROKERS" --value-format avro \
        --schema-registry-url "$SR_URL" --schema-registry-auth-file "$T/sr-bad" \
        --log-level debug --kafka debug=generic >"$T/one-$i.out" 2>&1
    check_eq "one database, run $i: exit 1" 1 $?
    check "one database, run $i: the registry's refusal" \
        grep -q "refuses the credentials (HTTP 401)" "$T/one-$i.out"
    check_eq "one database, run $i: the producer's destroy ended before the exit" 1 \
        "$(grep -c 'facility=TERMINATE text="\[thrd:app\]: Termination done' "$T/one-$i.out")"
done

printf '{"brokers": "%s", "schema-registry-url": "%s", "schema-registry-auth-file": "%s",
"log-level": "debug", "kafka": {"debug": "generic"},
"databases": [{"name": "a", "database-url": "%s"},
{"name": "b", "database-url": "%s", "value-format": "avro"}]}\n' \
    "$BROKERS" "$SR_URL" "$T/sr-bad" "$DATABASE_URL" \
    "postgresql://postgres@127.0.0.1:$PGPORT/exit_b" >"$T/dbs.json"
for i in 1 2 3; do
    timeout -k 5 60 env -u DATABASE_URL "$RELAY_BIN" run --config "$T/dbs.json" >"$T/dbs-$i.out" 2>&1
    check_eq "--databases, run $i: exit 1" 1 $?
    check "--databases, run $i: the registry's refusal" \
        grep -q "refuses the credentials (HTTP 401)" "$T/dbs-$i.out"
    check_eq "--databases, run $i: both producers' destroys ended before the exit" 2 \
        "$(grep -c 'facility=TERMINATE text="\[thrd:app\]: Termination done' "$T/dbs-$i.out")"
done
