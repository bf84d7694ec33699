#!/bin/bash
# Proves that a Schema Registry whose host name cannot be looked up (its nameserver black-holed)
# never stops the event loop, and that its name is looked up by the relay's own resolver
# (relay/io/resolve.h), one lookup thread for the name however many requests wait for it. curl's
# own lookup thread was joined by a request that ended (its --schema-registry-timeout) while the
# lookup still waited: the loop stood still until getaddrinfo gave up (30 s here, resolv.conf's
# timeout), at start-up and at every retry; detached instead (CURLOPT_QUICK_EXIT), one thread ran
# on per request, in a detach that races with the thread's end in curl 7.88. The fault: as
# 46_dns_stall.sh, a nameserver that never answers, in an /etc/resolv.conf of the relay's own (a
# mount namespace of its own):
#  1. the start-up probe gives up at its bound (--schema-registry-timeout 1000, plus 1 s), with
#     its warning, not when the lookup does;
#  2. rows of an Avro subject: the lookup's failure is logged as the registry unavailable when the
#     request's timeout is up; /healthz keeps answering while the retries' lookups hang; the rows
#     wait (no attempt counted); one lookup thread runs for the name, not one per request (curl's
#     own resolver left 4 after 10 s);
#  3. SIGTERM stops the relay while lookups hang;
#  4. a registry name that does resolve (the namespace's /etc/hosts), over https with a
#     certificate naming it alone (no IP address): rows delivered, so curl connects to the
#     addresses the relay found and verifies the certificate against the URL's name.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
# shellcheck source=tests/netns_lib.sh
source "$(dirname "$0")/../../netns_lib.sh"
t_setup
fault_init

[ -f /etc/resolv.conf ] && [ -f /etc/hosts ] ||
    skip_test "no /etc/resolv.conf and /etc/hosts to stand a relay's own in for"
unshare -m --propagation private true 2>/dev/null ||
    skip_test "cannot make a mount namespace here (unshare -m)"

pg_start
relay_migrate 2>>"$T/migrate.log" || fail "migrate"
broker_start 1

# The black hole: a loopback address of this test slot's own, so nothing else is touched.
DNS_ADDR=127.77.${TEST_SLOT:-0}.63
socat -u "UDP-RECV:53,bind=$DNS_ADDR" /dev/null &
_t_track $!
on_exit "kill $! 2>/dev/null"
dns_listens() { ss -unlH "src = $DNS_ADDR" | grep -q .; }
_poll 5 dns_listens || fail "the black-hole nameserver listens"
STALL_NAME=registry.dns-stall.test
printf 'nameserver %s\noptions timeout:30 attempts:1\n' "$DNS_ADDR" >"$T/resolv.stall"
GOOD_NAME=registry.good.test
printf '127.0.0.1\tlocalhost\n127.0.0.1\t%s\n' "$GOOD_NAME" >"$T/hosts"

# in_ns CMD...: CMD with $T/resolv.stall as its /etc/resolv.conf and $T/hosts as its /etc/hosts.
in_ns() {
    # shellcheck disable=SC2016 # $0, $1 and $@ belong to the inner sh
    exec unshare -m --propagation private sh -c 'mount --bind "$0" /etc/resolv.conf &&
        mount --bind "$1" /etc/hosts && shift && exec "$@"' "$T/resolv.stall" "$T/hosts" "$@"
}
# A resolver that bypasses resolv.conf (nscd, systemd-resolved's NSS module) would answer.
timeout 3 bash -c "$(declare -f in_ns); T=$T; in_ns getent hosts $STALL_NAME" >/dev/null 2>&1
[ $? = 124 ] || skip_test "the name's lookup does not go to the relay's own resolv.conf here"

# --- 1. the start-up probe ---
insert_rows reg 1 20 5
RELAY_WRAP=(in_ns)
relay_start --brokers "$BROKERS" --sessions 1 --metrics-listen 127.0.0.1:0 \
    --value-format avro --schema-registry-url "http://$STALL_NAME:8081" \
    --schema-registry-timeout 1000
RELAY_WRAP=()
wait_for "1: the start-up probe gives up at its bound, the lookup still hanging" 8 \
    grep -q 'msg="schema registry not reachable at start-up"' "$RELAY_LOG"
metrics_wait

# --- 2. lookups that hang ---
wait_for "2: the lookup's failure is logged when the request's timeout is up" 8 \
    grep -q 'msg="schema registry unavailable: rows wait for it' "$RELAY_LOG"
# The subject is asked again after 1, 2, 4, 8 s: each retry's request ends in 1 s, its lookup
# hanging, and each ending stood the loop still until the lookup gave up.
for i in 1 2 3 4 5 6; do
    check_eq "2: /healthz answers while the retries' lookups hang ($i)" 200 "$(http_code /healthz)"
    sleep 1
done
check_eq "2: the rows wait (none sent)" 20 "$(unsent_of reg)"
check_eq "2: ... no attempt counted" 0 \
    "$(psql_q "SELECT coalesce(sum(attempts), 0) FROM outbox WHERE aggregate_type = 'reg'")"
# Lookup threads carry the relay's own name (librdkafka names its threads rdk:...): the start-up
# probe's lookup, given up, is taken over by the first request's, and every retry waits for that
# one; curl's own resolver left one running on for each request of the last 30 s.
name=$(cat "/proc/$RELAY_PID/comm")
threads=$(($(grep -lxF "$name" "/proc/$RELAY_PID"/task/*/comm | wc -l) - 1))
check "2: one lookup thread for the name, however many requests ($threads)" test "$threads" -le 1

# --- 3. ---
relay_stop 5
check_eq "3: SIGTERM stops the relay (exit 0) while lookups hang" 0 $?

# --- 4. a name that resolves, over https ---
{
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
        -subj /CN=outbox-relay-test-ca -keyout "$T/ca.key" -out "$T/ca.pem" &&
        openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
            -subj "/CN=$GOOD_NAME" -keyout "$T/srv.key" -out "$T/srv.csr" &&
        openssl x509 -req -in "$T/srv.csr" -CA "$T/ca.pem" -CAkey "$T/ca.key" -CAcreateserial \
            -days 2 -extfile <(printf 'subjectAltName = DNS:%s\n' "$GOOD_NAME") -out "$T/srv.pem"
} >"$T/openssl.log" 2>&1 || fail "openssl makes a CA and a certificate: $(tail -n 2 "$T/openssl.log")"
jq -n '{"outbox.event.good-value": [{schema: "{\"type\": \"record\", \"name\": \"Good\",
    \"fields\": [{\"name\": \"seq\", \"type\": \"long\"}]}"}]}' >"$T/schemas.json"
SR_PORT=$(free_port) || fail "a port for the registry"
node "$ROOT/tests/tools/schema-registry.js" --port "$SR_PORT" --schemas "$T/schemas.json" \
    --tls "$T/srv.pem" "$T/srv.key" >"$T/registry.out" 2>&1 &
_t_track $!
_poll 10 grep -q '^listening' "$T/registry.out" || fail "the registry listens"
# Part 2's rows would ask this registry for a subject it lacks.
psql_q "DELETE FROM outbox WHERE aggregate_type = 'reg'" >/dev/null
insert_rows good 1 20 5
RELAY_WRAP=(in_ns)
relay_start --brokers "$BROKERS" --sessions 1 --value-format avro \
    --schema-registry-url "https://$GOOD_NAME:$SR_PORT" --schema-registry-ca-file "$T/ca.pem" \
    --schema-registry-timeout 5000
RELAY_WRAP=()
wait_for "4: a name that resolves, its certificate naming it alone: rows delivered" 30 \
    none_unsent_of good
check_eq "4: ... the start-up probe reached it (no warning)" 0 \
    "$(grep -c 'schema registry not reachable' "$RELAY_LOG")"
relay_stop 5
check_eq "4: the relay exits 0" 0 $?
