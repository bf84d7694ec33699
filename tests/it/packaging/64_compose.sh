#!/bin/bash
# Proves docker-compose.yml is valid for Debian's docker-compose (`config -q`, as CI runs it) and
# holds what docs/demos.md#docker-compose-the-chain-on-real-kafka describes: PostgreSQL, Apache
# Kafka in KRaft mode (official image, one node), a one-shot migrate service, two relay replicas,
# producer-demo and consumer-demo, each long-running service with a health check, the programs
# started only after the migration; and that the Dockerfile is a multi-stage Debian bookworm build
# of the three binaries. Also: one service builds the image (the others only name it and never pull
# it), PostgreSQL's health check goes over TCP, migrate waits a bounded time for the database, the
# password is not a word the logs are full of, Kafka keeps its data on a volume, and the published
# ports are on loopback; each relay's health check is its own /readyz. tests/compose/compose_up.sh (make compose-test) runs the file.
source "$(dirname "$0")/../../lib.sh"
t_setup
cd "$ROOT" || fail "cd $ROOT"
command -v docker-compose >/dev/null || fail "docker-compose is installed (make deps)"

check "docker-compose config -q accepts the file" docker-compose config -q
docker-compose config >"$T/config.yml" 2>"$T/config.err" || fail "docker-compose config"
check_eq "the services" "consumer-demo kafka migrate postgres producer-demo redis relay-1 relay-2 schema-registry" \
    "$(docker-compose config --services | sort | tr '\n' ' ' | sed 's/ $//')"

# The checks below read the resolved file with the YAML parser docker-compose itself uses.
yq() {
    /usr/bin/python3 -c 'import os, sys, yaml
c = yaml.safe_load(open(sys.argv[1]))
print(eval(sys.argv[2], {"c": c, "s": c["services"], "os": os}))' "$T/config.yml" "$1"
}
check_eq "Confluent's Schema Registry, only with its profile" \
    "confluentinc/cp-schema-registry ['schema-registry']" \
    "$(yq 's["schema-registry"]["image"].split(":")[0] + " " + str(s["schema-registry"]["profiles"])')"
check_eq "Kafka is the official image" apache/kafka "$(yq 's["kafka"]["image"].split(":")[0]')"
check_eq "Kafka runs KRaft as broker and controller, one voter" "broker,controller 1@kafka:9093" \
    "$(yq '(s["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] + " " +
           s["kafka"]["environment"]["KAFKA_CONTROLLER_QUORUM_VOTERS"])')"
check_eq "no ZooKeeper anywhere" False "$(yq '"zookeeper" in str(c).lower()')"
for svc in postgres kafka relay-1 relay-2 producer-demo consumer-demo; do
    check_eq "$svc has a health check" True "$(yq "'test' in s['$svc'].get('healthcheck', {})")"
done
# Each relay's own readiness, not the table's: a dead relay is unhealthy though its replica
# drains the outbox, and a dead-lettered row leaves both healthy.
for svc in relay-1 relay-2; do
    listen=$(yq "(lambda c: c[c.index('--metrics-listen') + 1] if '--metrics-listen' in c else '')(s['$svc']['command'])")
    check "$svc serves /readyz on the container's loopback (--metrics-listen 127.0.0.1:PORT)" \
        grep -qE '^127\.0\.0\.1:[0-9]+$' <<<"$listen"
    check_eq "$svc's health check asks its /readyz" \
        "['CMD', 'curl', '-fsS', '-o', '/dev/null', 'http://$listen/readyz']" \
        "$(yq "s['$svc']['healthcheck']['test']")"
done
check_eq "migrate runs once" no "$(yq 's["migrate"]["restart"]')"
migrate_cmd=$(yq 's["migrate"]["command"][-1]')
check "migrate applies the relay's and both demos' schemas" grep -q \
    'outbox-relay migrate[^&]* && producer-demo migrate && consumer-demo migrate' <<<"$migrate_cmd"
for svc in relay-1 relay-2 producer-demo consumer-demo; do
    check_eq "$svc starts after a successful migration" service_completed_successfully \
        "$(yq "s['$svc']['depends_on']['migrate']['condition']")"
done
check_eq "the relays run outbox-relay" "outbox-relay run|outbox-relay run" \
    "$(yq '" ".join(s["relay-1"]["command"][:2]) + "|" + " ".join(s["relay-2"]["command"][:2])')"
check_eq "one service builds the image: migrate" migrate \
    "$(yq '" ".join(sorted(n for n in s if "build" in s[n]))')"
check_eq "the image is built from the Dockerfile at the root" Dockerfile \
    "$(yq 'os.path.relpath(os.path.join(s["migrate"]["build"]["context"], s["migrate"]["build"].get("dockerfile", "Dockerfile")), os.getcwd())')"
for svc in relay-1 relay-2 producer-demo consumer-demo; do
    check_eq "$svc runs migrate's image and never pulls it" "True never" \
        "$(yq "s['$svc']['image'] == s['migrate']['image'], s['$svc'].get('pull_policy')" | tr -d "(),'")"
done
check "PostgreSQL's health check connects over TCP (pg_isready -h)" grep -q \
    'pg_isready -h 127.0.0.1 ' <<<"$(yq 's["postgres"]["healthcheck"]["test"]')"
check "migrate waits a bounded time for PostgreSQL" grep -q \
    'outbox-relay migrate --connect-wait [0-9]*s &&' <<<"$migrate_cmd"
pw=$(yq 's["postgres"]["environment"]["POSTGRES_PASSWORD"]')
check_eq "the password is not the user, database or table name" False \
    "$(yq "'$pw' in ('outbox', s['postgres']['environment']['POSTGRES_USER'], s['postgres']['environment']['POSTGRES_DB'])")"
check_eq "the password is not part of any word the relay logs (outbox, relay, event...)" "" \
    "$(grep -oiF "$pw" <<<"outbox-relay outbox.event relay starting postgres kafka order")"
check_eq "the programs' DATABASE_URL carries that password" True \
    "$(yq "all(':$pw@postgres' in s[n]['environment']['DATABASE_URL'] for n in ('migrate', 'relay-1', 'relay-2', 'producer-demo', 'consumer-demo'))")"
check_eq "Kafka's log dir is on a named volume, like PostgreSQL's data" "True True" \
    "$(yq 'any(v.split(":")[1] == s["kafka"]["environment"]["KAFKA_LOG_DIRS"] and v.split(":")[0] in c["volumes"] for v in s["kafka"]["volumes"]), "pgdata" in c["volumes"]' | tr -d '(),')"
check_eq "published ports are on loopback only" "127.0.0.1 127.0.0.1" \
    "$(yq '" ".join(p.split(":")[0] for n in ("kafka", "producer-demo") for p in s[n]["ports"])')"

check_eq "the Dockerfile has a build and a runtime stage, both bookworm" 2 \
    "$(grep -c '^FROM debian:bookworm' Dockerfile)"
check "the build stage makes the three binaries" grep -q \
    'make .*bin/outbox-relay bin/producer-demo bin/consumer-demo' Dockerfile
check "the runtime stage copies them from the build stage" grep -q \
    'COPY --from=build /src/bin/outbox-relay /src/bin/producer-demo /src/bin/consumer-demo' \
    Dockerfile
