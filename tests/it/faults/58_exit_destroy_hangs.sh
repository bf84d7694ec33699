#!/bin/bash
# Proves that the relay's exit is bounded when its Kafka producer cannot be destroyed. The fault:
# the broker is named by a host name whose lookup never answers (a nameserver that discards every
# query, through an /etc/resolv.conf of the relay's own in a mount namespace made for it alone, as
# 46_dns_stall does), so a librdkafka broker thread sits in getaddrinfo and rd_kafka_destroy
# waits for it (up to the resolver's 30 s). A stopped broker (SIGSTOP) does not do it: librdkafka
# gives a silent broker's sockets up at once on destroy.
#  1. one database: SIGTERM, and the relay exits 0 within 15 s, saying once that it did not wait
#     for the old producer (the old code waited the lookup out: about 30 s);
#  2. --databases with two entries: the same, both producers left behind (each database's relay
#     freed after the loop hands its producer to a thread of its own; the old code destroyed the
#     second inline while the first's thread ran, and waited on both).
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

# The black hole: a loopback address of this test slot's own (46_dns_stall uses .53).
DNS_ADDR=127.77.${TEST_SLOT:-0}.58
socat -u "UDP-RECV:53,bind=$DNS_ADDR" /dev/null &
_t_track $!
on_exit "kill $! 2>/dev/null"
dns_listens() { ss -unlH "src = $DNS_ADDR" | grep -q .; }
_poll 5 dns_listens || fail "the black-hole nameserver listens"
STALL_NAME=kafka.dns-stall.test
printf 'nameserver %s\noptions timeout:30 attempts:1\n' "$DNS_ADDR" >"$T/resolv.stall"
printf '127.0.0.1\tlocalhost\n' >"$T/hosts"

# in_ns CMD...: CMD with $T/resolv.stall as its /etc/resolv.conf and $T/hosts as its /etc/hosts.
in_ns() {
    # shellcheck disable=SC2016 # $0, $1 and $@ belong to the inner sh
    exec unshare -m --propagation private sh -c 'mount --bind "$0" /etc/resolv.conf &&
        mount --bind "$1" /etc/hosts && shift && exec "$@"' "$T/resolv.stall" "$T/hosts" "$@"
}
# A resolver that bypasses resolv.conf (nscd, systemd-resolved's NSS module) would answer.
timeout 3 bash -c "$(declare -f in_ns); T=$T; in_ns getent hosts $STALL_NAME" >/dev/null 2>&1
[ $? = 124 ] || skip_test "the name's lookup does not go to the relay's own resolv.conf here"
RELAY_WRAP=(in_ns)


# --- 1. one database ---
relay_start --database-url "$DATABASE_URL" --brokers "$STALL_NAME:9092" --sessions 1
wait_for "1: the relay connects to PostgreSQL" 15 grep -q 'msg="postgres connected"' "$RELAY_LOG"
# The broker thread's lookup starts with the producer; give it a moment to be on its way.
sleep 1
relay_stop 15
check_eq "1: SIGTERM stops the relay (exit 0) while the producer's lookup hangs" 0 $?
check_eq "1: ... saying once that it did not wait for the producer" 1 \
    "$(grep -c 'msg="exiting without waiting for' "$RELAY_LOG")"

# --- 2. two databases of a list ---
psql_q "CREATE DATABASE db_b" -d postgres || fail "create db_b"
"$RELAY_BIN" migrate --database-url "postgresql://postgres@127.0.0.1:$PGPORT/db_b" \
    2>>"$T/migrate.log" || fail "migrate db_b"
printf '{"brokers": "%s:9092", "sessions": 1, "databases": [
  {"name": "a", "database-url": "postgresql://postgres@127.0.0.1:%s/outbox"},
  {"name": "b", "database-url": "postgresql://postgres@127.0.0.1:%s/db_b"}]}\n' \
    "$STALL_NAME" "$PGPORT" "$PGPORT" >"$T/relay.json"
SAVED_URL=$DATABASE_URL
unset DATABASE_URL # the list names every URL
relay_start --config "$T/relay.json"
export DATABASE_URL=$SAVED_URL
connected_both() { [ "$(grep -c 'msg="postgres connected"' "$RELAY_LOG")" -ge 2 ]; }
wait_for "2: both databases connected" 15 connected_both
sleep 1
relay_stop 15
check_eq "2: SIGTERM stops the relay (exit 0) while both producers' lookups hang" 0 $?
check_eq "2: ... saying so once" 1 "$(grep -c 'msg="exiting without waiting for' "$RELAY_LOG")"
