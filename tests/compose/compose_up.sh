#!/bin/bash
# `make compose-test`: the project's docker-compose.yml brought up for real, on a Docker engine
# of the test's own, with tests/compose/override.yml swapping only the two images that cannot be
# pulled here (PostgreSQL from Debian's packages, the project's Kafka-protocol broker for Apache
# Kafka). Proves: `up --build` builds the one image once and every health check passes; an order
# POSTed with an Idempotency-Key and retried gives one order and one shipment; with relay-1
# SIGKILLed, relay-2 takes every lane and ships the next order; after `down` + `up` (volumes
# kept) the retry is still a replay, a new order ships, and the business tables hold each order,
# shipment and processed event exactly once; the relays' logs are not masked into "***"
# (the password is distinct); consumer-demo, stopped with Kafka gone, exits 0 rather than being
# SIGKILLed at docker's 10 s. Prints the times to healthy and to the first shipment (never
# asserted). Root only: it starts dockerd.
#
# The engine is private: its own socket and runtime state (/run/outbox-relay-docker.*), its
# images and build cache under /var/cache/outbox-relay/docker (the debian:bookworm base imported
# from tools/bookworm-base.sh's tarball, and the layers of earlier builds: measured, the test
# takes 2 minutes with them, 6 on a machine's first run). Every container, network, volume and
# test-tagged image is removed, and the engine and its containerd stopped, on every exit path
# (KEEP_TMP=1 keeps the temp dir only). A host without a usable dockerd (no cgroups, no overlayfs
# in a sandbox) skips with the reason, exit 0.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../lib.sh"
t_setup
cd "$ROOT" || fail "cd $ROOT"
[ "$(id -u)" = 0 ] || fail "runs as root (it starts dockerd)"
for c in dockerd docker docker-compose curl jq flock; do
    command -v "$c" >/dev/null || fail "$c is installed (make compose-test installs it)"
done

CACHE=/var/cache/outbox-relay
P=outboxrelaytest$$ # compose project: prefixes every container, network and volume
TAG=$P
APP_IMAGE=outbox-relay-test/app:$TAG
export OUTBOX_RELAY_IMAGE=$APP_IMAGE
export COMPOSE_TEST_POSTGRES_IMAGE=outbox-relay-test/postgres:$TAG
export COMPOSE_TEST_KAFKA_IMAGE=outbox-relay-test/kafka:$TAG
export COMPOSE_TEST_REDIS_IMAGE=outbox-relay-test/redis:$TAG
# The engine's socket and runtime state: outside the temp dir, in a root-only tmpfs, where no
# sweep of stale test dirs can pull them from under a running engine.
RUNDIR=
DOCKERD_PID=

dc() {
    docker-compose -p "$P" -f docker-compose.yml -f tests/compose/override.yml "$@"
}

# ---- cleanup: containers, networks, volumes, test images, then the engine --------------------
_compose_exit() {
    local rc=$?
    trap - EXIT
    if [ -n "$DOCKERD_PID" ] && docker version >/dev/null 2>&1; then
        if [ "$_T_FAIL" -gt 0 ]; then
            echo "# --- last lines of the stack's logs ---"
            timeout 60 docker-compose -p "$P" -f docker-compose.yml -f tests/compose/override.yml \
                logs --no-color --tail 15 2>&1 | sed 's/^/# /'
        fi
        timeout 120 docker-compose -p "$P" -f docker-compose.yml -f tests/compose/override.yml \
            down -v --remove-orphans -t 5 >"$T/down-final.log" 2>&1 ||
            echo "# compose down failed, see $T/down-final.log"
        # Anything of this project compose did not know of any more (an interrupted up).
        docker ps -aq --filter "label=com.docker.compose.project=$P" | xargs -r docker rm -f >/dev/null
        docker volume ls -q --filter "label=com.docker.compose.project=$P" | xargs -r docker volume rm >/dev/null
        docker network ls -q --filter "label=com.docker.compose.project=$P" | xargs -r docker network rm >/dev/null
        # The engine is this test's alone (the lock): any stopped container is ours, e.g. one a
        # failed image build left behind.
        docker container prune -f >/dev/null 2>&1
        docker rmi "$APP_IMAGE" "$COMPOSE_TEST_POSTGRES_IMAGE" "$COMPOSE_TEST_KAFKA_IMAGE" \
            "$COMPOSE_TEST_REDIS_IMAGE" >/dev/null 2>&1
        # The untagged layers left are the build cache of the next run; those made over a day
        # ago go, so it cannot grow without bound (rebuilding them takes about a minute).
        docker image prune -f --filter until=24h >/dev/null 2>&1
    fi
    if [ -n "$DOCKERD_PID" ]; then
        kill -TERM "$DOCKERD_PID" 2>/dev/null
        _poll 30 _t_dead "$DOCKERD_PID" || kill -KILL "$DOCKERD_PID" 2>/dev/null
        wait "$DOCKERD_PID" 2>/dev/null
        [ "$HAD_DOCKER0" = 1 ] || ip link delete docker0 2>/dev/null
        if [ "$_T_FAIL" -gt 0 ]; then
            echo "# --- last lines of dockerd's log ---"
            tail -n 10 "$T/dockerd.log" | sed 's/^/# /'
        fi
    fi
    if [ -n "$RUNDIR" ]; then
        # containerd and its shims outlive a dockerd that died; these are the ones of this
        # engine (their command lines name its runtime directory).
        _rundir_procs() { # (not grep: its own command line would name the directory)
            local f c
            for f in /proc/[0-9]*/cmdline; do
                { c=$(tr '\0' ' ' <"$f"); } 2>/dev/null || continue # gone meanwhile
                [[ $c == *"$RUNDIR/"* ]] || continue
                f=${f#/proc/}
                echo "${f%%/*}"
            done
        }
        _no_rundir_procs() { [ -z "$(_rundir_procs)" ]; }
        for sig in TERM KILL; do
            _rundir_procs | xargs -r kill "-$sig" 2>/dev/null
            _poll 10 _no_rundir_procs && break
        done
        awk -v d="$RUNDIR" 'index($2, d "/") == 1 { print $2 }' /proc/mounts | sort -r |
            xargs -r -n 1 umount -l 2>/dev/null
        rm -rf --one-file-system "$RUNDIR"
    fi
    (exit "$rc")
    _t_exit
}
trap _compose_exit EXIT

# ---- a private Docker engine ---------------------------------------------------------------------
# One engine per state directory at a time: a second run waits for the first.
mkdir -p "$CACHE/docker"
exec 9>"$CACHE/compose-test.lock"
flock -w 900 9 || fail "the compose test's lock ($CACHE/compose-test.lock) within 15 min"
# exec-root in $RUNDIR, removed at the end with every process still using it. The image
# builds' RUN steps reach Debian's archive through its default bridge (docker0), which is
# removed again at the end if this test made it.
ip link show docker0 >/dev/null 2>&1 && HAD_DOCKER0=1 || HAD_DOCKER0=0
RUNDIR=$(mktemp -d /run/outbox-relay-docker.XXXXXX) || fail "mktemp -d /run/outbox-relay-docker.*"
export DOCKER_HOST=unix://$RUNDIR/docker.sock
# 9>&-: the engine, containerd and its shims must not hold the lock (a shim outlives a crash).
dockerd --data-root "$CACHE/docker" --exec-root "$RUNDIR/x" --pidfile "$RUNDIR/dockerd.pid" \
    -H "$DOCKER_HOST" >"$T/dockerd.log" 2>&1 9>&- &
DOCKERD_PID=$!
engine_up_or_gone() { # the engine answers, or its process has ended (it will not answer)
    docker version >/dev/null 2>&1 || _t_dead "$DOCKERD_PID"
}
_poll 60 engine_up_or_gone
if ! docker version >/dev/null 2>&1; then
    reason=$(grep -m1 -E 'level=(fatal|error)' "$T/dockerd.log" | sed 's/.*msg=//')
    echo "# SKIP: dockerd cannot start here: ${reason:-no answer within 60 s}"
    echo "# the compose test ran no check; the last lines of dockerd's log:"
    tail -n 5 "$T/dockerd.log" | sed 's/^/#   /'
    exit 0
fi
echo "# docker engine $(docker version -f '{{.Server.Version}}'), $(docker-compose version --short 2>/dev/null | head -n 1) (docker-compose)"
# The engine's state is this test's alone: whatever a run that was killed before its cleanup
# left (containers restart with the engine) goes first.
docker ps -aq | xargs -r docker rm -f >/dev/null
docker volume ls -q | xargs -r docker volume rm >/dev/null
docker network prune -f >/dev/null

# ---- images: the base, then the stack's --------------------------------------------------------
base_tar=$(bash tools/bookworm-base.sh) || fail "the bookworm minbase tarball (tools/bookworm-base.sh)"
base_id=$(stat -c %Y "$base_tar")
if [ "$(docker image inspect -f '{{index .Config.Labels "org.outbox-relay.base"}}' \
    debian:bookworm-slim 2>/dev/null)" != "$base_id" ]; then
    # What `docker pull debian:bookworm-slim` would give, made from Debian's archive instead.
    docker import -c "LABEL org.outbox-relay.base=$base_id" -c 'CMD ["bash"]' "$base_tar" \
        debian:bookworm-slim >/dev/null || fail "docker import of $base_tar"
fi
docker tag debian:bookworm-slim debian:bookworm || fail "tag debian:bookworm"
ok "base image debian:bookworm(-slim) from a debootstrap minbase"

t_build=$(date +%s)
for target in postgres kafka redis; do
    img=$COMPOSE_TEST_POSTGRES_IMAGE
    [ "$target" = kafka ] && img=$COMPOSE_TEST_KAFKA_IMAGE
    [ "$target" = redis ] && img=$COMPOSE_TEST_REDIS_IMAGE
    check "the test's $target image builds" \
        docker build -q --force-rm -f tests/compose/Dockerfile --target "$target" -t "$img" . ||
        fail "build the $target image"
done
# `up --build` builds what the compose file builds: one image, in the migrate service.
PRODUCER_DEMO_PORT=$(free_port) && KAFKA_HOST_PORT=$(free_port) || fail "free ports"
export PRODUCER_DEMO_PORT KAFKA_HOST_PORT
API=http://127.0.0.1:$PRODUCER_DEMO_PORT
check "docker-compose build" dc build || fail "docker-compose build"
echo "# images built in $(($(date +%s) - t_build)) s"
# `up --build` builds again (from cached layers: seconds), then starts the stack.
t_up=$(date +%s)
dc up --build -d >"$T/up1.log" 2>&1
check_eq "docker-compose up --build -d exits 0" 0 $? || { tail -n 20 "$T/up1.log"; exit 1; }
# docker-compose prints "Building SERVICE" for each service it builds.
built() {
    grep -cE '^Building (postgres|kafka|migrate|relay-1|relay-2|producer-demo|consumer-demo)$' "$1"
}
check_eq "the image is built by one service" 1 "$(built "$T/up1.log")"

# ---- health ------------------------------------------------------------------------------------
LONG_RUNNING="postgres kafka relay-1 relay-2 producer-demo consumer-demo"
cid() {
    dc ps -q "$1" 2>/dev/null
}
health() {
    docker inspect -f '{{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}' "$(cid "$1")" 2>/dev/null
}
all_healthy() {
    local s
    for s in $LONG_RUNNING; do
        [ "$(health "$s")" = healthy ] || return 1
    done
}
migrate_done() {
    [ "$(docker inspect -f '{{.State.Status}} {{.State.ExitCode}}' "$(cid migrate)")" = "exited 0" ]
}
# wait_healthy LABEL START: every long-running service healthy; prints the time since START.
wait_healthy() {
    if wait_for "$1: every service is healthy" 300 all_healthy; then
        echo "# $1: every service healthy $(($(date +%s) - $2)) s after up started"
    else
        for s in $LONG_RUNNING; do echo "#   $s: $(health "$s")"; done
        exit 1
    fi
    check "$1: migrate ran once and exited 0" migrate_done
}
wait_healthy "first up" "$t_up"

# ---- an order, retried ---------------------------------------------------------------------------
psql_c() { # psql_c SQL: one query in the postgres container, tuples only
    dc exec -T postgres psql -U outbox -d outbox -XAtq -v ON_ERROR_STOP=1 -c "$1"
}
sql_is() {
    [ "$(psql_c "$1")" = "$2" ]
}
BODY='{"customer_id": "c-7", "amount_cents": 4200, "currency": "EUR"}'
post() { # post KEY BODY OUT: POST /orders; prints the status
    curl -sS -o "$3" -D "$3.headers" -w '%{http_code}' --max-time 10 -X POST "$API/orders" \
        -H "Idempotency-Key: $1" -H 'Content-Type: application/json' -d "$2"
}
t_post=$(date +%s%N)
check_eq "POST /orders with an Idempotency-Key: 201" 201 "$(post order-1 "$BODY" "$T/o1")"
ORDER1=$(jq -r .id "$T/o1")
check_eq "the retry: 201 again" 201 "$(post order-1 "$BODY" "$T/o1b")"
check "the retry is a replay, byte for byte" cmp "$T/o1" "$T/o1b"
check "the retry says Idempotency-Replayed: true" grep -qi '^Idempotency-Replayed: true' "$T/o1b.headers"
if wait_for "the order is shipped" 60 sql_is "SELECT count(*) FROM shipments WHERE order_id = '$ORDER1'" 1; then
    echo "# first shipment $((($(date +%s%N) - t_post) / 1000000)) ms after the POST"
fi
check_eq "one order, one outbox row, one shipment" "1|1|1" \
    "$(psql_c "SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM outbox),
                      (SELECT count(*) FROM shipments)")"

# The password is also the user, the database and part of the relay's names (`outbox`): the
# scrubber must mask the password in the URL only, not every other word spelt the same.
dc logs --no-color relay-1 relay-2 >"$T/relays.log" 2>&1
check "the relays log their start unmasked" grep -q 'msg="outbox-relay starting"' "$T/relays.log"
check "the password is masked in the relays' logs" grep -qF 'postgresql://outbox:***@postgres:5432/outbox' "$T/relays.log"
check "no masked ***-relay in the relays' logs" lacks "$T/relays.log" '***-relay'
check "no masked ***.event in the relays' logs" lacks "$T/relays.log" '***.event'

# ---- one relay killed ------------------------------------------------------------------------------
relay1=$(cid relay-1)
lanes_lines() {
    dc logs --no-color relay-2 2>&1 | grep 'msg="lanes owned"'
}
lanes_before=$(lanes_lines | wc -l)
check "relay-2 shares the lanes before (owns fewer than 64)" lacks <(lanes_lines | tail -n 1) ' lanes=64 '
dc kill -s SIGKILL relay-1 >"$T/kill.log" 2>&1
check "docker-compose kill -s SIGKILL relay-1" test "$(docker inspect -f '{{.State.Running}}' "$relay1")" = false
relay2_owns_all() { # a "lanes owned" line logged since the kill says all 64
    lanes_lines | tail -n +"$((lanes_before + 1))" | tail -n 1 | grep -q ' lanes=64 '
}
wait_for "relay-2 takes over every lane" 60 relay2_owns_all
check_eq "POST a second order with relay-1 down: 201" 201 \
    "$(post order-2 '{"customer_id": "c-8", "amount_cents": 990, "currency": "EUR"}' "$T/o2")"
ORDER2=$(jq -r .id "$T/o2")
wait_for "relay-2 alone ships it" 60 sql_is "SELECT count(*) FROM shipments WHERE order_id = '$ORDER2'" 1
check_eq "relay-1 is still down meanwhile (the second order went through relay-2)" false \
    "$(docker inspect -f '{{.State.Running}}' "$relay1")"

# ---- consumer-demo stopped with Kafka gone ---------------------------------------------------------
dc stop -t 10 kafka >/dev/null 2>&1
t_stop=$(date +%s%N)
dc stop -t 10 consumer-demo >/dev/null 2>&1
echo "# consumer-demo stopped $((($(date +%s%N) - t_stop) / 1000000)) ms after SIGTERM with Kafka gone"
check_eq "consumer-demo stopped with Kafka gone exits 0 (not SIGKILLed after 10 s: 137)" 0 \
    "$(docker inspect -f '{{.State.ExitCode}}' "$(cid consumer-demo)")"

# ---- down, up ------------------------------------------------------------------------------------
dc down -t 10 >"$T/down.log" 2>&1
check_eq "docker-compose down (volumes kept) exits 0" 0 $?
check_eq "no container of the stack is left" "" "$(docker ps -aq --filter "label=com.docker.compose.project=$P")"
t_up2=$(date +%s)
dc up -d >"$T/up2.log" 2>&1
check_eq "docker-compose up -d again exits 0" 0 $? || { tail -n 20 "$T/up2.log"; exit 1; }
check_eq "nothing is built the second time" 0 "$(built "$T/up2.log")"
wait_healthy "second up" "$t_up2"
check_eq "the first order's retry after down + up: 201" 201 "$(post order-1 "$BODY" "$T/o1c")"
check "it is still the same replay" cmp "$T/o1" "$T/o1c"
check "it says Idempotency-Replayed: true" grep -qi '^Idempotency-Replayed: true' "$T/o1c.headers"
check_eq "POST a third order: 201" 201 \
    "$(post order-3 '{"customer_id": "c-9", "amount_cents": 100, "currency": "USD"}' "$T/o3")"
ORDER3=$(jq -r .id "$T/o3")
wait_for "the third order is shipped" 60 sql_is "SELECT count(*) FROM shipments WHERE order_id = '$ORDER3'" 1
check_eq "every outbox row is sent" 0 "$(psql_c "SELECT count(*) FROM outbox WHERE sent_at IS NULL")"
# Nothing lost or duplicated: each order once, with its one outbox event, applied once.
check_eq "orders, outbox rows, processed events, shipments: 3 each" "3|3|3|3" \
    "$(psql_c "SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM outbox),
                      (SELECT count(*) FROM processed_events), (SELECT count(*) FROM shipments)")"
check_eq "the shipments are exactly the three orders" \
    "$(printf '%s\n' "$ORDER1" "$ORDER2" "$ORDER3" | sort | tr '\n' ' ')" \
    "$(psql_c "SELECT order_id FROM shipments ORDER BY order_id" | tr '\n' ' ')"
check_eq "each processed event is an outbox event" 3 \
    "$(psql_c "SELECT count(*) FROM processed_events p JOIN outbox o ON o.event_id = p.event_id")"
echo "# compose test: $SECONDS s in all"
