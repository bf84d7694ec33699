#!/bin/bash
# Proves that the host names of a connection string are looked up off the event loop. The fault:
# a nameserver that never answers (socat holding a loopback UDP port 53 and discarding every
# query), which the relay's resolver uses through an /etc/resolv.conf of its own, with an
# /etc/hosts of its own beside it (both bind-mounted in a mount namespace made for the relay
# alone; the machine's own files are left as they are):
#  1. one database whose host name's lookup hangs (the URL's hostaddr empty, which libpq
#     ignores): /healthz answers while the lookup waits; the host's failure is logged, naming the
#     name that could not be looked up, once the URL's connect_timeout (3 s) is up; SIGTERM stops
#     the relay within 5 s;
#  2. --databases with a (localhost, from the hosts file) and b and c (two hanging names, 8
#     sessions each, connect_timeout 2 s, so that their sessions retry many times): a's rows are
#     delivered while the lookups hang; a's connections, ended by the server, come back and
#     deliver more; one lookup thread runs per hanging name, however many sessions wait on it,
#     and none is refused for want of room (a thread per attempt filled the process's 64 and
#     refused a's); the loss of a's connections names the server's reason (administrator
#     command, SQLSTATE 57P01), not only "server closed the connection";
#  3. a name with two addresses, the first refusing: the relay hands libpq both, connects to the
#     second and delivers; a name whose one address refuses: the error names the host as libpq
#     names it when it looks the name up itself ("NAME" (ADDRESS)); a name whose every address
#     fails, each for its own reason: every reason is reported, not the first alone;
#  4. a nameserver that refuses at once (nothing listens: the lookup fails fast): the failure is
#     logged naming the host, and the relay keeps retrying without a hot loop;
#  5. a nameserver that answers in 3 s (tests/tools/slow-dns.py) with connect_timeout=2: the
#     first attempt gives the lookup up, the next one takes its answer and connects (a fresh
#     lookup at every attempt never would);
#  6. sslmode=verify-full with a name from the hosts file: the server's certificate names it, and
#     the relay, which hands libpq the name beside the addresses, connects over TLS;
#  7. a name with two addresses, the first silent (it takes the connection and never answers, as
#     a host that died does): connect_timeout bounds each address, so the relay connects to the
#     second and delivers (one timeout for the whole list retried the silent one for ever).
#  8. the hanging name given only by a service file (pg_service.conf, the URL naming the service):
#     looked up off the loop like a URL's, so /healthz answers while it hangs and the failure
#     comes at the service's connect_timeout (libpq, left to fill the host in, looked it up
#     inside PQconnectPoll, on the loop); and with PGHOST and PGPORT set (as here), the service's
#     host and port still win, as in libpq (the relay took the variables' and connected there).
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
broker_start 3

# The black hole: a loopback address of this test slot's own, so nothing else is touched.
DNS_ADDR=127.77.${TEST_SLOT:-0}.53
socat -u "UDP-RECV:53,bind=$DNS_ADDR" /dev/null &
_t_track $!
on_exit "kill $! 2>/dev/null"
dns_listens() { ss -unlH "src = $DNS_ADDR" | grep -q .; }
_poll 5 dns_listens || fail "the black-hole nameserver listens"
STALL_NAME=pg.dns-stall.test
printf 'nameserver %s\noptions timeout:30 attempts:1\n' "$DNS_ADDR" >"$T/resolv.stall"
# Nothing listens on this one: the query is refused at once (ICMP port unreachable).
printf 'nameserver 127.77.%s.54\noptions timeout:30 attempts:1\n' "${TEST_SLOT:-0}" \
    >"$T/resolv.refuse"
# Nothing listens on 127.0.0.3 (PostgreSQL listens on 127.0.0.1 alone): connections refused.
printf '127.0.0.1\tlocalhost\n127.0.0.3\tpg-two.test\n127.0.0.1\tpg-two.test
127.0.0.3\tpg-refused.test\n' >"$T/hosts"

# in_ns RESOLV CMD...: CMD with RESOLV as its /etc/resolv.conf and $T/hosts as its /etc/hosts.
in_ns() {
    # shellcheck disable=SC2016 # $0, $1 and $@ belong to the inner sh
    exec unshare -m --propagation private sh -c 'mount --bind "$0" /etc/resolv.conf &&
        mount --bind "$1" /etc/hosts && shift && exec "$@"' "$1" "$T/hosts" "${@:2}"
}
# with_resolv FILE: relay_start's prefix running the relay in_ns FILE.
with_resolv() {
    RELAY_WRAP=(in_ns "$1")
}
# A resolver that bypasses resolv.conf (nscd, systemd-resolved's NSS module) would answer.
timeout 3 bash -c "$(declare -f in_ns); T=$T; in_ns $T/resolv.stall getent hosts $STALL_NAME" \
    >/dev/null 2>&1
[ $? = 124 ] || skip_test "the name's lookup does not go to the relay's own resolv.conf here"

# --- 1. one database, its host name's lookup hangs ---
with_resolv "$T/resolv.stall"
relay_start --brokers "$BROKERS" \
    --database-url "postgresql://postgres@$STALL_NAME:$PGPORT/outbox?connect_timeout=3&hostaddr=" \
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

# --- 2. a database beside three whose names hang ---
psql_q "CREATE DATABASE db_a" -d postgres || fail "create db_a"
"$RELAY_BIN" migrate --database-url "postgresql://postgres@127.0.0.1:$PGPORT/db_a" \
    2>>"$T/migrate.log" || fail "migrate db_a"
SAVED_URL=$DATABASE_URL
unset DATABASE_URL # the list names every URL
hung() { # hung NAME: a list entry whose host name's lookup hangs, its 8 sessions retrying
    printf ', {"name": "%s", "database-url": "postgresql://postgres@pg-%s.dns-stall.test:%s/db_%s?connect_timeout=2", "sessions": 8, "min-sessions": 8}' \
        "$1" "$1" "$PGPORT" "$1"
}
printf '{"brokers": "%s", "databases": [
  {"name": "a", "database-url": "postgresql://postgres@localhost:%s/db_a"}%s%s%s]}\n' \
    "$BROKERS" "$PGPORT" "$(hung b)" "$(hung c)" "$(hung d)" >"$T/relay.json"
insert_a() { # insert_a FROM TO: rows of aggregate type a in db_a
    PGDATABASE=db_a insert_rows a "$1" "$2" 20
}
drained_a() { [ "$(PGDATABASE=db_a unsent_of a)" = 0 ]; }
insert_a 1 300
with_resolv "$T/resolv.stall"
relay_start --config "$T/relay.json"
export DATABASE_URL=$SAVED_URL
wait_for "2: a's rows delivered while the others' lookups hang" 15 drained_a
wait_for "2: b's failure is logged for b" 10 \
    grep -qE 'msg="postgres unreachable" database=b .*could not translate host name' "$RELAY_LOG"
# 24 sessions retrying every 2-7 s: a lookup per attempt, each waiting 30 s, would pile up.
sleep 12
# Lookup threads carry the relay's own name (librdkafka names its threads rdk:...).
lookup_threads() {
    local name
    name=$(cat "/proc/$RELAY_PID/comm") &&
        echo $(($(grep -lxF "$name" "/proc/$RELAY_PID"/task/*/comm | wc -l) - 1))
}
n=$(lookup_threads)
check "2: one lookup thread per hanging name, however many sessions retry ($n for 3)" \
    test "$n" -le 3
psql_q "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
        WHERE datname = 'db_a' AND application_name LIKE 'outbox-relay%'" -d postgres >/dev/null
insert_a 301 600
wait_for "2: a's connections, ended by the server, come back and deliver" 20 drained_a
# The server says why before it closes (libpq hands that to the notice receiver, then says only
# "server closed the connection unexpectedly"): the loss names the reason.
check "2: ... and their loss names the server's reason" grep -qE \
    'msg="postgres connection lost" database=a .*error="terminating connection due to administrator command \(SQLSTATE 57P01\)' \
    "$RELAY_LOG"
PGDATABASE=db_a check_delivered a
check "2: no lookup refused for want of room (one per name, not per attempt)" \
    lacks "$RELAY_LOG" "waiting for a nameserver"
relay_stop 5
check_eq "2: the relay exits 0" 0 $?

# --- 3. names from the hosts file: two addresses, one refusing ---
with_resolv "$T/resolv.refuse"
insert_rows two 1 200 10
relay_start --brokers "$BROKERS" --database-url "postgresql://postgres@pg-two.test:$PGPORT/outbox" \
    --sessions 1 --log-level debug
wait_for "3: two addresses: rows delivered" 15 none_unsent_of two
check_delivered two
check "3: both addresses were handed to libpq" grep -qE \
    'msg="postgres host resolved".* host="pg-two.test:[0-9]+" addresses="(127\.0\.0\.3,127\.0\.0\.1|127\.0\.0\.1,127\.0\.0\.3)"' \
    "$RELAY_LOG"
relay_stop 5
check_eq "3: the relay exits 0" 0 $?
relay_start --brokers "$BROKERS" \
    --database-url "postgresql://postgres@pg-refused.test:$PGPORT/outbox" --sessions 1
wait_for "3: a refusing address: the error names the host and the address" 10 grep -qF \
    "error=\"connection to server at \\\"pg-refused.test\\\" (127.0.0.3), port $PGPORT failed" \
    "$RELAY_LOG"
relay_stop 5
check_eq "3: the relay exits 0" 0 $?
# Every address fails, the second (PostgreSQL's) for a reason of its own: each is reported, not
# the first alone (that said "Connection refused" and hid the real cause).
relay_start --brokers "$BROKERS" --sessions 1 \
    --database-url "postgresql://postgres@pg-two.test:$PGPORT/no_such_db"
unreachable() { grep -F 'msg="postgres unreachable"' "$RELAY_LOG" | grep -F "$1" | grep -qF "$2"; }
wait_for "3: every address fails: the refusal and the server's reason both reported" 10 \
    unreachable "(127.0.0.3), port $PGPORT failed: Connection refused" \
    'database \"no_such_db\" does not exist'
relay_stop 5
check_eq "3: the relay exits 0" 0 $?

# --- 4. a nameserver that refuses ---
with_resolv "$T/resolv.refuse"
relay_start --brokers "$BROKERS" --database-url "postgresql://postgres@$STALL_NAME:$PGPORT/outbox" \
    --sessions 1 --log-level debug
sleep 4
check "4: the failure names the host" \
    grep -qE "could not translate host name \\\\\"$STALL_NAME\\\\\"" "$RELAY_LOG"
tries=$(grep -c 'msg="postgres still unreachable"' "$RELAY_LOG")
# Backoff from 0.2 s doubling (capped): a handful of tries in 4 s, not a hot loop.
check "4: retried with backoff ($tries retries in 4 s)" test "$tries" -ge 1 -a "$tries" -le 10
check "4: the relay keeps running" relay_running
relay_stop 5
check_eq "4: the relay exits 0" 0 $?

# --- 5. a nameserver slower than connect_timeout ---
SLOW_ADDR=127.77.${TEST_SLOT:-0}.55
python3 "$ROOT/tests/tools/slow-dns.py" "$SLOW_ADDR" 3 127.0.0.1 >"$T/slow-dns.out" 2>&1 &
_t_track $!
on_exit "kill $! 2>/dev/null"
_poll 5 grep -q listening "$T/slow-dns.out" || fail "the slow nameserver listens"
printf 'nameserver %s\noptions timeout:30 attempts:1\n' "$SLOW_ADDR" >"$T/resolv.slow"
with_resolv "$T/resolv.slow"
insert_rows slow 1 100 10
relay_start --brokers "$BROKERS" --sessions 1 \
    --database-url "postgresql://postgres@pg-slow.test:$PGPORT/outbox?connect_timeout=2"
wait_for "5: answers in 3 s, connect_timeout 2 s: the next attempt takes the answer, rows delivered" \
    20 none_unsent_of slow
check "5: ... after the first attempt gave the lookup up" grep -q 'no address within 2 s' \
    "$RELAY_LOG"
check_delivered slow
relay_stop 5
check_eq "5: the relay exits 0" 0 $?

# --- 6. TLS verify-full against a looked-up name ---
{
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
        -subj /CN=outbox-relay-test-ca -keyout "$T/ca.key" -out "$T/ca.pem" &&
        openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=pg-two.test \
            -keyout "$T/pg/server.key" -out "$T/srv.csr" &&
        openssl x509 -req -in "$T/srv.csr" -CA "$T/ca.pem" -CAkey "$T/ca.key" -CAcreateserial \
            -days 2 -extfile <(printf 'subjectAltName = DNS:pg-two.test\n') -out "$T/pg/server.crt"
} >"$T/openssl.log" 2>&1 || fail "openssl makes a CA and a certificate: $(tail -n 2 "$T/openssl.log")"
chmod 600 "$T/pg/server.key"
[ "$(id -u)" = 0 ] && chown postgres: "$T/pg/server.key" "$T/pg/server.crt"
psql_q "ALTER SYSTEM SET ssl = on" -d postgres && psql_q "SELECT pg_reload_conf()" -d postgres >/dev/null ||
    fail "PostgreSQL turns TLS on"
tls_on() { [ "$(psql_q "SHOW ssl" -d postgres)" = on ]; }
_poll 10 tls_on || fail "PostgreSQL turns TLS on"
insert_rows tls 1 100 10
with_resolv "$T/resolv.refuse"
relay_start --brokers "$BROKERS" --sessions 1 --database-url \
    "postgresql://postgres@pg-two.test:$PGPORT/outbox?sslmode=verify-full&sslrootcert=$T/ca.pem"
wait_for "6: verify-full against the looked-up name's certificate: rows delivered" 15 \
    none_unsent_of tls
check "6: ... over TLS" grep -qE 'msg="postgres connected".* tls=on' "$RELAY_LOG"
check_delivered tls
relay_stop 5
check_eq "6: the relay exits 0" 0 $?

# --- 7. a name with two addresses, the first silent ---
# 127.0.0.4 accepts and discards (socat -u: never a byte back); 127.0.0.5 forwards to PostgreSQL.
# Both are as far from 127.0.0.1, so getaddrinfo keeps the hosts file's order (checked below).
printf '127.0.0.4\tpg-silent.test\n127.0.0.5\tpg-silent.test\n' >>"$T/hosts"
socat -u "TCP-LISTEN:$PGPORT,bind=127.0.0.4,fork,reuseaddr" /dev/null &
_t_track $!
on_exit "kill $! 2>/dev/null"
socat "TCP-LISTEN:$PGPORT,bind=127.0.0.5,fork,reuseaddr" "TCP:127.0.0.1:$PGPORT" &
_t_track $!
on_exit "kill $! 2>/dev/null"
listens() { ss -tlnH "src = $1" | grep -q .; }
_poll 5 listens 127.0.0.4 && _poll 5 listens 127.0.0.5 || fail "the silent and the forwarding address listen"
insert_rows silent 1 100 10
with_resolv "$T/resolv.refuse"
relay_start --brokers "$BROKERS" --sessions 1 --log-level debug \
    --database-url "postgresql://postgres@pg-silent.test:$PGPORT/outbox?connect_timeout=2"
wait_for "7: the first address silent: the second connects, rows delivered" 20 \
    none_unsent_of silent
check "7: ... the silent address was tried first" grep -qE \
    'msg="postgres host resolved".* addresses="127\.0\.0\.4,127\.0\.0\.5"' "$RELAY_LOG"
check "7: ... and its timeout names the host and the address" grep -qF \
    "connection to server at \\\"pg-silent.test\\\" (127.0.0.4), port $PGPORT failed: no answer within 2 s" \
    "$RELAY_LOG"
check_delivered silent
relay_stop 5
check_eq "7: the relay exits 0" 0 $?

# --- 8. the hanging name from a service file ---
printf '[stall]\nhost=%s\nport=%s\ndbname=outbox\nuser=postgres\nconnect_timeout=3\n' \
    "$STALL_NAME" "$PGPORT" >"$T/pg_service.conf"
with_resolv "$T/resolv.stall"
SAVED_HOST=$PGHOST
unset PGHOST # the service's host alone
PGSERVICEFILE=$T/pg_service.conf relay_start --brokers "$BROKERS" --database-url "service=stall" \
    --metrics-listen 127.0.0.1:0 --sessions 1
export PGHOST=$SAVED_HOST
metrics_wait
sleep 1 # the lookup has started; on the loop, it would hold /healthz for 30 s
check_eq "8: a service file's host: /healthz answers while its lookup hangs" 200 \
    "$(http_code /healthz)"
stalled() { # stalled: the failure names the hanging name, at the service's connect_timeout
    grep -qE "could not translate host name \\\\\"$STALL_NAME\\\\\" to address: no address within 3 s" \
        "$RELAY_LOG"
}
wait_for "8: ... and the failure names the name, at the service's connect_timeout" 10 stalled
relay_stop 5
check_eq "8: the relay exits 0" 0 $?
# PGHOST and PGPORT name the test's PostgreSQL: libpq takes the service's host over them.
PGSERVICEFILE=$T/pg_service.conf relay_start --brokers "$BROKERS" --database-url "service=stall" \
    --sessions 1
wait_for "8: with PGHOST set, the service's host is still the one tried" 10 stalled
check "8: ... and nothing connected to PGHOST's server" lacks "$RELAY_LOG" "postgres connected"
relay_stop 5
check_eq "8: the relay exits 0" 0 $?
RELAY_WRAP=()
