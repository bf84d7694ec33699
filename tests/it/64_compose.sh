#!/bin/bash
# Proves docker-compose.yml is valid for Debian's docker-compose (`config -q`, as CI runs it) and
# holds what the README promises: PostgreSQL, Apache Kafka in KRaft mode (official image, one
# node), a one-shot migrate service, two relay replicas, producer-demo and consumer-demo, each
# long-running service with a health check, the programs started only after the migration; and
# that the Dockerfile is a multi-stage Debian bookworm build of the three binaries.
source "$(dirname "$0")/../lib.sh"
t_setup
cd "$ROOT" || fail "cd $ROOT"
command -v docker-compose >/dev/null || fail "docker-compose is installed (make deps)"

check "docker-compose config -q accepts the file" docker-compose config -q
docker-compose config >"$T/config.yml" 2>"$T/config.err" || fail "docker-compose config"
check_eq "the services" "consumer-demo kafka migrate postgres producer-demo redis relay-1 relay-2" \
    "$(docker-compose config --services | sort | tr '\n' ' ' | sed 's/ $//')"

# The checks below read the resolved file with the YAML parser docker-compose itself uses.
yq() {
    /usr/bin/python3 -c 'import sys, yaml
c = yaml.safe_load(open(sys.argv[1]))
print(eval(sys.argv[2], {"c": c, "s": c["services"]}))' "$T/config.yml" "$1"
}
check_eq "Kafka is the official image" apache/kafka "$(yq 's["kafka"]["image"].split(":")[0]')"
check_eq "Kafka runs KRaft as broker and controller, one voter" "broker,controller 1@kafka:9093" \
    "$(yq '(s["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] + " " +
           s["kafka"]["environment"]["KAFKA_CONTROLLER_QUORUM_VOTERS"])')"
check_eq "no ZooKeeper anywhere" False "$(yq '"zookeeper" in str(c).lower()')"
for svc in postgres kafka relay-1 relay-2 producer-demo consumer-demo; do
    check_eq "$svc has a health check" True "$(yq "'test' in s['$svc'].get('healthcheck', {})")"
done
check_eq "migrate runs once" no "$(yq 's["migrate"]["restart"]')"
check "migrate applies the relay's and both demos' schemas" grep -q \
    'outbox-relay migrate && producer-demo migrate && consumer-demo migrate' "$T/config.yml"
for svc in relay-1 relay-2 producer-demo consumer-demo; do
    check_eq "$svc starts after a successful migration" service_completed_successfully \
        "$(yq "s['$svc']['depends_on']['migrate']['condition']")"
done
check_eq "the relays run outbox-relay" "outbox-relay run|outbox-relay run" \
    "$(yq '" ".join(s["relay-1"]["command"][:2]) + "|" + " ".join(s["relay-2"]["command"][:2])')"
check_eq "the programs are built from the Dockerfile" "True True" \
    "$(yq '"build" in s["relay-1"], "build" in s["producer-demo"]' | tr -d '(),')"

check_eq "the Dockerfile has a build and a runtime stage, both bookworm" 2 \
    "$(grep -c '^FROM debian:bookworm' Dockerfile)"
check "the build stage makes the three binaries" grep -q \
    'make .*bin/outbox-relay bin/producer-demo bin/consumer-demo' Dockerfile
check "the runtime stage copies them from the build stage" grep -q \
    'COPY --from=build /src/bin/outbox-relay /src/bin/producer-demo /src/bin/consumer-demo' \
    Dockerfile
