# tests/demo_lib.sh: helpers for the demo tests (tests/it/demos/), on top of tests/lib.sh.
# Source it after lib.sh. Provides the sanitizer builds of the demos, producer-demo's HTTP API
# (producer_start, http, hdr) and consumer-demo (consumer_start/consumer_stop).

PRODUCER_BIN=${PRODUCER_BIN:-$BIN/asan/producer-demo}
CONSUMER_BIN=${CONSUMER_BIN:-$BIN/asan/consumer-demo}
[ -x "$PRODUCER_BIN" ] || PRODUCER_BIN=$BIN/producer-demo
[ -x "$CONSUMER_BIN" ] || CONSUMER_BIN=$BIN/consumer-demo
_DEMO_N=0

# demo_logs: the last lines of every demo log, shown when a test failed.
demo_logs() {
    local f
    [ "$_T_FAIL" -gt 0 ] || return 0
    for f in "$T"/producer.*.log "$T"/consumer.*.log; do
        [ -f "$f" ] || continue
        echo "# --- last lines of $(basename "$f") ---"
        tail -n 25 "$f" | sed 's/^/# /'
    done
}

# demo_setup: t_setup, and the demo logs shown on failure along with lib.sh's relay logs.
demo_setup() {
    t_setup
    trap '_demo_rc=$?; demo_logs; (exit $_demo_rc); _t_exit' EXIT
}

_listening() {
    grep -q 'msg="producer-demo listening"' "$PRODUCER_LOG"
}

# producer_start ARGS...: `producer-demo serve` on a free port; sets API, PRODUCER_PID and
# PRODUCER_LOG.
producer_start() {
    _DEMO_N=$((_DEMO_N + 1))
    PRODUCER_LOG=$T/producer.$_DEMO_N.log
    "$PRODUCER_BIN" serve --database-url "$DATABASE_URL" --listen 127.0.0.1:0 "$@" \
        >"$PRODUCER_LOG" 2>&1 &
    PRODUCER_PID=$!
    _t_track "$PRODUCER_PID"
    _poll 30 _listening || fail "producer-demo listens within 30s"
    API=http://127.0.0.1:$(grep -o 'msg="producer-demo listening".* port=[0-9]*' "$PRODUCER_LOG" |
        grep -o '[0-9]*$')
}

# _stop_process PID: SIGTERM, returns the exit status (137 after a kill at the 20 s limit).
_stop_process() {
    kill -TERM "$1" 2>/dev/null
    if ! _poll 20 _t_dead "$1"; then
        kill -KILL "$1" 2>/dev/null
        wait "$1" 2>/dev/null
        return 137
    fi
    wait "$1" 2>/dev/null
}

# producer_stop: SIGTERM, returns the exit status (137 after a kill at the 20 s limit).
producer_stop() {
    _stop_process "$PRODUCER_PID"
}

# http METHOD PATH [CURL ARGS...]: sets STATUS; the body is in $T/body, headers in $T/headers.
http() {
    local method=$1 path=$2
    shift 2
    STATUS=$(curl -sS -o "$T/body" -D "$T/headers" -w '%{http_code}' -X "$method" "$API$path" \
        "$@")
}

# post_order KEY BODY: POST /orders with an Idempotency-Key (KEY may be empty: no header).
post_order() {
    local key=$1 body=$2
    if [ -n "$key" ]; then
        http POST /orders -H "Idempotency-Key: $key" -H 'Content-Type: application/json' -d "$body"
    else
        http POST /orders -H 'Content-Type: application/json' -d "$body"
    fi
}

# hdr NAME: the value of a response header of the last request ('' when absent).
hdr() {
    grep -i "^$1:" "$T/headers" | head -n 1 | cut -d' ' -f2- | tr -d '\r'
}

# counts: "orders outbox keys", for checks that a request wrote nothing.
counts() {
    psql_q "SELECT (SELECT count(*) FROM orders) || ' ' || (SELECT count(*) FROM outbox) || ' ' ||
                   (SELECT count(*) FROM idempotency_keys)"
}

_consumer_running_log() {
    grep -q 'msg="consumer-demo running"' "$CONSUMER_LOG"
}

# consumer_start ARGS...: `consumer-demo run` against the test's broker; sets CONSUMER_PID and
# CONSUMER_LOG.
consumer_start() {
    _DEMO_N=$((_DEMO_N + 1))
    CONSUMER_LOG=$T/consumer.$_DEMO_N.log
    # A short session: the mock broker waits that long for a member that left or crashed
    # before it hands its partitions to the next one.
    "$CONSUMER_BIN" run --database-url "$DATABASE_URL" --brokers "$BROKERS" --stats-interval 1 \
        --kafka session.timeout.ms=6000 --kafka heartbeat.interval.ms=500 "$@" \
        >"$CONSUMER_LOG" 2>&1 &
    CONSUMER_PID=$!
    _t_track "$CONSUMER_PID"
    _poll 30 _consumer_running_log || fail "consumer-demo starts within 30s"
}

consumer_running() {
    kill -0 "$CONSUMER_PID" 2>/dev/null
}

# consumer_stop: SIGTERM, returns the exit status (137 after a kill at the 20 s limit).
consumer_stop() {
    _stop_process "$CONSUMER_PID"
}

# sql_is SQL VALUE: true when the query returns VALUE (for wait_for, which re-runs it).
sql_is() {
    [ "$(psql_q "$1")" = "$2" ]
}

# ---- Redis ------------------------------------------------------------------------------------

# redis_start: Debian's redis-server on a free loopback port, no persistence (a restart starts
# empty, like a flushed cache); the first call picks the port, later calls (after redis_kill)
# reuse it. Sets REDIS_PORT, REDIS_URL, REDIS_PID (not exported: the demos read REDIS_URL from
# the environment, and a test passes --redis-url where it wants Redis); stopped on every exit
# path like the rest.
redis_start() {
    command -v redis-server >/dev/null || fail "redis-server is installed (tools/packages.txt)"
    [ -n "${REDIS_PORT:-}" ] || REDIS_PORT=$(free_port) || fail "find a free port for Redis"
    mkdir -p "$T/redis"
    redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
        --dir "$T/redis" --daemonize no --logfile "$T/redis.log" >/dev/null 2>&1 &
    REDIS_PID=$!
    _t_track "$REDIS_PID"
    _poll 10 redis_q PING || fail "Redis answers within 10s"
    REDIS_URL=redis://127.0.0.1:$REDIS_PORT
}

# redis_q ARGS...: one redis-cli command against the test's Redis (bounded: -t 2 where
# supported, and timeout 5 in any case).
redis_q() {
    timeout 5 redis-cli -h 127.0.0.1 -p "$REDIS_PORT" "$@"
}

# redis_kill: SIGKILL, as a crash would; its data is gone (no persistence).
redis_kill() {
    kill -KILL "$REDIS_PID" 2>/dev/null
    wait "$REDIS_PID" 2>/dev/null
    return 0
}

# redis_keys PATTERN: how many keys match.
redis_keys() {
    redis_q --scan --pattern "$1" | wc -l
}

# ---- another session holding locks -------------------------------------------------------------

declare -gA HOLDER_PIDS
# holder_start NAME SQL...: a session named NAME (its application_name) runs BEGIN and each SQL,
# then keeps its transaction, and what it locked, for 120 s or until holder_stop NAME. Returns at
# once; holder_holds NAME says when it has got that far. Output in $T/NAME.out.
holder_start() {
    local name=$1 sql args=(-c BEGIN)
    shift
    for sql in "$@"; do
        args+=(-c "$sql")
    done
    PGAPPNAME=$name timeout 150 psql -XAtq "${args[@]}" -c "SELECT pg_sleep(120)" \
        >"$T/$name.out" 2>&1 &
    HOLDER_PIDS[$name]=$!
    _t_track "$!"
}
# holder_holds NAME: holder_start NAME's session is in its sleep, its statements done.
holder_holds() {
    [ "$(psql_q "SELECT count(*) FROM pg_stat_activity WHERE application_name = '$1'
                 AND query LIKE '%pg_sleep%'")" = 1 ]
}
# holder_stop NAME: ends holder_start NAME's session (its transaction rolls back).
holder_stop() {
    psql_q "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
            WHERE application_name = '$1'" >/dev/null
    wait "${HOLDER_PIDS[$1]}" 2>/dev/null
    return 0
}
