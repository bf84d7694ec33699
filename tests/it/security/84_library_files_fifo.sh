#!/bin/bash
# Proves the files libpq opens itself (the TLS files of a database URL) are never waited on by the
# running relay: libpq opens them on the event loop at every connection, and a FIFO's open waits
# for a writer, freezing /healthz and every database. The server speaks TLS (a self-signed
# certificate, which is also the clients' sslrootcert: sslmode=require verifies it then):
#  1. a SIGHUP adding a database whose URL's sslrootcert is a FIFO is refused in one line naming
#     the setting and the path (the running configuration kept), within 10 s; /healthz still
#     answers and the running database still delivers;
#  2. the running database's sslrootcert swapped for a FIFO and its connections terminated: each
#     reconnection attempt fails with a line naming it ("not a regular file", at warn level once,
#     then at debug level) and is retried;
#     /healthz answers meanwhile; the file put back, the relay reconnects and delivers the rows
#     inserted meanwhile, and exits 0 on SIGTERM;
#  3. the same for librdkafka's TLS files, which it opens in rd_kafka_new (each database has its
#     producer): with --kafka security.protocol=ssl and ssl.ca.location swapped for a FIFO, a
#     SIGHUP adding a database is refused in one line naming the property and the path, and
#     /healthz still answers. (The mock broker speaks no TLS: nothing is delivered in this part;
#     a producer's recreation is covered by test_engine, start-up by test_kafka.)
#  4. the window after that check closed for librdkafka's files: the producer a reload makes on
#     the loop (with ssl.ca.location a regular file) is handed a /proc/self/fd alias of the file
#     the relay opened without waiting, so the path itself is opened only by the relay, each time
#     with O_NONBLOCK, never by librdkafka (traced: strace -f attached to the running relay). A
#     file swapped for a FIFO after the check can then not be what librdkafka opens (test_kafka
#     stages that swap itself).
#  5. the same for libpq's: after its connections are terminated, each reconnection of the
#     running relay hands libpq /proc/self/fd aliases of the TLS files the relay opened without
#     waiting: sslrootcert, sslcert and sslkey (a client certificate the server does not ask
#     for, which libpq loads all the same, its key's mode checked through the alias) are opened
#     only by the relay, with O_NONBLOCK, never by libpq (traced as in 4), and the rows inserted
#     meanwhile are delivered over TLS.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
# TLS on the server: its certificate is self-signed, so it is its own CA.
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=127.0.0.1" \
    -keyout "$T/pg/server.key" -out "$T/pg/server.crt" >"$T/openssl.log" 2>&1 || fail "openssl"
chmod 600 "$T/pg/server.key"
[ "$(id -u)" = 0 ] && chown postgres: "$T/pg/server.key" "$T/pg/server.crt"
echo "ssl = on" >>"$T/pg/postgresql.conf"
pg_restart
broker_start 1
psql_q "CREATE DATABASE outbox_b" -d postgres || fail "create outbox_b"
relay_migrate 2>"$T/migrate.log" || fail "migrate"
"$RELAY_BIN" migrate --database-url "postgresql://postgres@127.0.0.1:$PGPORT/outbox_b" \
    2>>"$T/migrate.log" || fail "migrate outbox_b"

ROOT_CRT=$T/root.crt FIFO=$T/fifo.crt
cp "$T/pg/server.crt" "$ROOT_CRT"
mkfifo -m 600 "$FIFO"
url() { # url DB ROOTCERT
    echo "postgresql://postgres@127.0.0.1:$PGPORT/$1?sslmode=require&sslrootcert=$2"
}
unset DATABASE_URL # the list names every database's URL
CONF=$T/relay.json
KAFKA_PROPS="" # extra "kafka" members of the config file (part 3)
write_conf() { # write_conf ENTRY...: the config file, atomically
    local list="" e
    for e in "$@"; do list="$list${list:+, }$e"; done
    # log-level debug: a session's failures after the first of an outage are logged at debug.
    printf '{"brokers": "%s", "metrics-listen": "127.0.0.1:0", "log-level": "debug",
"kafka": {%s}, "databases": [%s]}\n' "$BROKERS" "$KAFKA_PROPS" "$list" >"$CONF.tmp" &&
        mv "$CONF.tmp" "$CONF"
}
ENTRY_A="{\"name\": \"a\", \"database-url\": \"$(url outbox "$ROOT_CRT")\"}"
write_conf "$ENTRY_A"
insert() { # insert TYPE N
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            SELECT '$1', '$1-' || g, 'changed', '{}' FROM generate_series(1, $2) AS g"
}
lines() { grep -c '' "$RELAY_LOG"; }
since() { tail -n +"$(($1 + 1))" "$RELAY_LOG"; } # since LINE: log lines after LINE

relay_start --config "$CONF"
metrics_wait
insert a 10
wait_for "the relay delivers over TLS" 30 none_unsent_of a
check "its connections use TLS" grep -q 'msg="postgres connected".*tls=on' "$RELAY_LOG"

# --- 1. ---
mark=$(lines)
write_conf "$ENTRY_A" "{\"name\": \"b\", \"database-url\": \"$(url outbox_b "$FIFO")\"}"
kill -HUP "$RELAY_PID"
# shellcheck disable=SC2016
wait_for "1: the reload adding a database whose sslrootcert is a FIFO is refused" 10 \
    bash -c 'tail -n +"$(($2 + 1))" "$1" | grep -qF -- "$3"' _ "$RELAY_LOG" "$mark" \
    "reload failed; keeping the running configuration\" error=\"database b: database URL: sslrootcert $FIFO: not a regular file"
check_eq "1: /healthz still answers" 200 "$(http_code /healthz)"
insert b1 10
wait_for "1: the running database still delivers" 30 none_unsent_of b1
check_eq "1: database b never started" 0 "$(since "$mark" | grep -c 'database=b')"
write_conf "$ENTRY_A"

# --- 2. ---
# The mark first: an on-demand connection (the upkeep's) may try, and log, before the terminate.
mark=$(lines)
# Swapped in one rename, a FIFO made beside it: with a move and then a mkfifo, an attempt whose
# check found no file (absent is libpq's own error, not refused) could then have libpq open the
# FIFO made a moment later, and the loop froze (1 run in 21). A connection attempt whose check
# ran just before the rename still can (the window configuration.md names), but only that.
cp "$ROOT_CRT" "$ROOT_CRT.saved" && mkfifo -m 600 "$ROOT_CRT.fifo" && mv -f "$ROOT_CRT.fifo" "$ROOT_CRT"
psql_q "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
        WHERE datname = 'outbox' AND pid <> pg_backend_pid()" >/dev/null
# shellcheck disable=SC2016
wait_for "2: a reconnection attempt fails naming the FIFO" 20 \
    bash -c 'tail -n +"$(($2 + 1))" "$1" | grep -qF -- "$3"' _ "$RELAY_LOG" "$mark" \
    "sslrootcert $ROOT_CRT: not a regular file"
code=$(http_code /healthz)
check "2: /healthz still answers (got $code)" test "$code" != 000
insert c 10
rm -f "$ROOT_CRT" && mv "$ROOT_CRT.saved" "$ROOT_CRT"
wait_for "2: the file back, the relay reconnects and delivers" 60 none_unsent_of c
relay_stop
check_eq "2: exit 0 on SIGTERM" 0 "$?"

# --- 3. ---
KAFKA_CA=$T/kafka-ca.pem
cp "$T/pg/server.crt" "$KAFKA_CA"
KAFKA_PROPS="\"security.protocol\": \"ssl\", \"ssl.ca.location\": \"$KAFKA_CA\""
write_conf "$ENTRY_A"
relay_start --config "$CONF"
metrics_wait
wait_for "3: database a connects (its producer made from the TLS properties)" 30 \
    grep -q 'msg="postgres connected" database=a conn=session-0' "$RELAY_LOG"
mv "$KAFKA_CA" "$KAFKA_CA.saved" && mkfifo -m 600 "$KAFKA_CA"
mark=$(lines)
write_conf "$ENTRY_A" "{\"name\": \"b\", \"database-url\": \"$(url outbox_b "$ROOT_CRT")\"}"
kill -HUP "$RELAY_PID"
# shellcheck disable=SC2016
wait_for "3: the reload adding a database while ssl.ca.location is a FIFO is refused" 10 \
    bash -c 'tail -n +"$(($2 + 1))" "$1" | grep -qF -- "$3"' _ "$RELAY_LOG" "$mark" \
    "reload failed; keeping the running configuration\" error=\"database b: kafka ssl.ca.location $KAFKA_CA: not a regular file"
check_eq "3: /healthz still answers" 200 "$(http_code /healthz)"
check_eq "3: database b never started" 0 "$(since "$mark" | grep -c 'database=b')"
rm -f "$KAFKA_CA" && mv "$KAFKA_CA.saved" "$KAFKA_CA"
relay_stop
check_eq "3: exit 0 on SIGTERM" 0 "$?"

# --- 4. ---
cp "$T/pg/server.crt" "$KAFKA_CA"
write_conf "$ENTRY_A"
relay_start --config "$CONF"
metrics_wait
wait_for "4: database a connects" 30 \
    grep -q 'msg="postgres connected" database=a conn=session-0' "$RELAY_LOG"
TRACE=$T/strace.log
strace -f -qq -e trace=openat -o "$TRACE" -p "$RELAY_PID" &
STRACE_PID=$!
_t_track "$STRACE_PID"
traced() { grep -q "^TracerPid:[[:space:]]*$STRACE_PID\$" "/proc/$RELAY_PID/status"; }
wait_for "4: strace attached to the relay" 20 traced
mark=$(lines)
write_conf "$ENTRY_A" "{\"name\": \"b\", \"database-url\": \"$(url outbox_b "$ROOT_CRT")\"}"
kill -HUP "$RELAY_PID"
# shellcheck disable=SC2016
wait_for "4: the reload adds database b (its producer made on the loop)" 30 \
    bash -c 'tail -n +"$(($2 + 1))" "$1" | grep -q "msg=\"postgres connected\" database=b"' _ \
    "$RELAY_LOG" "$mark"
kill -INT "$STRACE_PID" 2>/dev/null
wait "$STRACE_PID" 2>/dev/null
opens=$(grep -cF "openat(AT_FDCWD, \"$KAFKA_CA\"" "$TRACE")
waiting=$(grep -F "openat(AT_FDCWD, \"$KAFKA_CA\"" "$TRACE" | grep -vc O_NONBLOCK)
check "4: the relay opened ssl.ca.location for b's producer (opens: $opens)" test "$opens" -ge 1
check_eq "4: opens of ssl.ca.location that could wait (without O_NONBLOCK: librdkafka's)" 0 \
    "$waiting"
check "4: librdkafka opened the file through its /proc/self/fd alias" \
    grep -qE 'openat\(AT_FDCWD, "/proc/self/fd/[0-9]+", O_RDONLY' "$TRACE"
check_eq "4: /healthz still answers" 200 "$(http_code /healthz)"
relay_stop
check_eq "4: exit 0 on SIGTERM" 0 "$?"

# --- 5. ---
CLIENT_CRT=$T/client.crt CLIENT_KEY=$T/client.key
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=postgres" \
    -keyout "$CLIENT_KEY" -out "$CLIENT_CRT" >>"$T/openssl.log" 2>&1 || fail "openssl client"
chmod 600 "$CLIENT_KEY"
KAFKA_PROPS=""
write_conf "{\"name\": \"a\", \"database-url\": \"$(url outbox "$ROOT_CRT")&sslcert=$CLIENT_CRT&sslkey=$CLIENT_KEY\"}"
relay_start --config "$CONF"
metrics_wait
wait_for "5: database a connects" 30 \
    grep -q 'msg="postgres connected" database=a conn=session-0' "$RELAY_LOG"
TRACE=$T/strace5.log
strace -f -qq -e trace=openat -o "$TRACE" -p "$RELAY_PID" &
STRACE_PID=$!
_t_track "$STRACE_PID"
wait_for "5: strace attached to the relay" 20 traced
psql_q "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
        WHERE datname = 'outbox' AND pid <> pg_backend_pid()" >/dev/null
insert e 10
wait_for "5: the relay reconnects and delivers" 60 none_unsent_of e
kill -INT "$STRACE_PID" 2>/dev/null
wait "$STRACE_PID" 2>/dev/null
for f in "$ROOT_CRT" "$CLIENT_CRT" "$CLIENT_KEY"; do
    opens=$(grep -cF "openat(AT_FDCWD, \"$f\"" "$TRACE")
    waiting=$(grep -F "openat(AT_FDCWD, \"$f\"" "$TRACE" | grep -vc O_NONBLOCK)
    check "5: the relay opened ${f##*/} for its reconnections (opens: $opens)" test "$opens" -ge 1
    check_eq "5: opens of ${f##*/} that could wait (without O_NONBLOCK: libpq's)" 0 "$waiting"
done
check "5: libpq opened the file through its /proc/self/fd alias" \
    grep -qE 'openat\(AT_FDCWD, "/proc/self/fd/[0-9]+", O_RDONLY' "$TRACE"
check "5: it reconnected over TLS" grep -q 'msg="postgres reconnected".*tls=on' "$RELAY_LOG"
relay_stop
check_eq "5: exit 0 on SIGTERM" 0 "$?"
