#!/bin/bash
# Proves that the host names of a connection string are looked up off the event loop. The fault:
# a nameserver that never answers (socat holding a loopback UDP port 53 and discarding every
# query), which the relay's resolver uses through an /etc/resolv.conf of its own (bind-mounted
# in a mount namespace made for the relay alone; the machine's own file is left as it is):
#  1. one database whose host name's lookup hangs: /healthz answers while the lookup waits;
#     the host's failure is logged, naming the name that could not be looked up, once the
#     URL's connect_timeout (3 s) is up; SIGTERM stops the relay within 5 s;
#  2. --databases with a (127.0.0.1) and b (the hanging name): a's rows are delivered, in order,
#     while b's lookups hang, and more of a's rows are delivered while they go on hanging;
#  3. a name that resolves (localhost, from /etc/hosts, to an address list the relay hands
#     libpq) connects and delivers, and the server sees the relay's connection;
#  4. a nameserver that refuses at once (nothing listens: the lookup fails fast): the failure is
#     logged naming the host, and the relay keeps retrying without a hot loop.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
# shellcheck source=tests/netns_lib.sh
source "$(dirname "$0")/../../netns_lib.sh"
t_setup
fault_init

[ -f /etc/resolv.conf ] || skip_test "no /etc/resolv.conf to stand a relay's own in for"
unshare -m --propagation private true 2>/dev/null ||
    skip_test "cannot make a mount namespace here (unshare -m)"

pg_start
relay_migrate 2>>"$T/migrate.log" || fail "migrate"
broker_start 3

# The black hole: a loopback address of its own, so nothing else on the machine is touched.
DNS_ADDR=127.77.0.53
socat -u "UDP-RECV:53,bind=$DNS_ADDR" /dev/null &
_t_track $!
on_exit "kill $! 2>/dev/null"
dns_listens() { ss -unlH "src = $DNS_ADDR" | grep -q .; }
_poll 5 dns_listens || fail "the black-hole nameserver listens"
STALL_NAME=pg.dns-stall.test
printf 'nameserver %s\noptions timeout:30 attempts:1\n' "$DNS_ADDR" >"$T/resolv.stall"
# Nothing listens on this one: the query is refused at once (ICMP port unreachable).
printf 'nameserver 127.77.0.54\noptions timeout:30 attempts:1\n' >"$T/resolv.refuse"

# with_resolv FILE: relay_start's prefix running the relay with FILE as its /etc/resolv.conf.
with_resolv() {
    # shellcheck disable=SC2016 # $0 and $@ belong to the inner sh
    RELAY_WRAP=(unshare -m --propagation private
        sh -c 'mount --bind "$0" /etc/resolv.conf && exec "$@"' "$1")
}

# --- 1. one database, its host name's lookup hangs ---
with_resolv "$T/resolv.stall"
relay_start --brokers "$BROKERS" --database-url "postgresql://postgres@$STALL_NAME:$PGPORT/outbox?connect_timeout=3" \
    --metrics-listen 127.0.0.1:0 --sessions 1
metrics_wait
# A lookup that waits for 30 s has started by now; with it on the loop nothing would answer.
sleep 1
check_eq "1: /healthz answers while the lookup hangs" 200 "$(http_code /healthz)"
wait_for "1: the host's failure is logged, naming the name" 10 \
    grep -qE "msg=\"postgres unreachable\".*could not translate host name \\\\\"$STALL_NAME\\\\\"" \
    "$RELAY_LOG"
check "1: ... and says the lookup timed out" grep -q 'no address within 3 s' "$RELAY_LOG"
check_eq "1: /healthz still answers" 200 "$(http_code /healthz)"
relay_stop 5
check_eq "1: SIGTERM stops the relay (exit 0) while a lookup hangs" 0 $?

# --- 2. two databases, one of them behind the hanging name ---
for db in a b; do
    psql_q "CREATE DATABASE db_$db" -d postgres || fail "create db_$db"
    "$RELAY_BIN" migrate --database-url "postgresql://postgres@127.0.0.1:$PGPORT/db_$db" \
        2>>"$T/migrate.log" || fail "migrate db_$db"
done
unset DATABASE_URL
printf '{"brokers": "%s", "databases": [
  {"name": "a", "database-url": "postgresql://postgres@127.0.0.1:%s/db_a"},
  {"name": "b", "database-url": "postgresql://postgres@%s:%s/db_b?connect_timeout=3"}]}\n' \
    "$BROKERS" "$PGPORT" "$STALL_NAME" "$PGPORT" >"$T/relay.json"
insert_a() { # insert_a FROM TO: rows of aggregate type a in db_a
    PGDATABASE=db_a insert_rows a "$1" "$2" 20
}
drained_a() { [ "$(PGDATABASE=db_a unsent_of a)" = 0 ]; }
insert_a 1 300
relay_start --config "$T/relay.json"
wait_for "2: a's rows delivered while b's lookups hang" 15 drained_a
insert_a 301 600
wait_for "2: and more of a's rows, as b's lookups go on hanging" 15 drained_a
PGDATABASE=db_a check_delivered a
wait_for "2: b's failure is logged for b" 10 \
    grep -qE 'msg="postgres unreachable" database=b .*could not translate host name' "$RELAY_LOG"
relay_stop 5
check_eq "2: the relay exits 0" 0 $?

# --- 3. a name that resolves ---
RELAY_WRAP=()
insert_rows local 1 200 10
relay_start --brokers "$BROKERS" --database-url "postgresql://postgres@localhost:$PGPORT/outbox" \
    --sessions 1 --log-level debug
wait_for "3: localhost: rows delivered" 15 none_unsent_of local
check_delivered local
check "3: the name was looked up by the relay" \
    grep -qE 'msg="postgres host resolved".* host="localhost:[0-9]+" addresses="[^"]*127\.0\.0\.1' \
    "$RELAY_LOG"
relay_stop 5
check_eq "3: the relay exits 0" 0 $?

# --- 4. a nameserver that refuses ---
with_resolv "$T/resolv.refuse"
relay_start --brokers "$BROKERS" --database-url "postgresql://postgres@$STALL_NAME:$PGPORT/outbox" --sessions 1 \
    --log-level debug
sleep 4
check "4: the failure names the host" \
    grep -qE "could not translate host name \\\\\"$STALL_NAME\\\\\"" "$RELAY_LOG"
tries=$(grep -c 'msg="postgres still unreachable"' "$RELAY_LOG")
# Backoff from 0.2 s doubling (capped): a handful of tries in 4 s, not a hot loop.
check "4: retried with backoff ($tries retries in 4 s)" test "$tries" -ge 1 -a "$tries" -le 10
check "4: the relay keeps running" relay_running
relay_stop 5
check_eq "4: the relay exits 0" 0 $?
RELAY_WRAP=()
