#!/usr/bin/env bash
# bench/multidb.sh (`make bench-multidb`, and the "multidb" part of `make bench`): one relay
# process serving many databases (--databases, docs/operations.md#many-databases) against one
# relay of one database at the same total rate, in the same run:
#   single  one database, RATE events/s (pgbench -c 4), the relay at default settings;
#   many    N databases on the same PostgreSQL, RATE events/s spread over them (one pgbench a
#           database at RATE/N), one relay serving all N, "sessions": 1 each
#           (docs/operations.md#many-databases: what an idle database costs);
#   faulted the same, with FAULTED of the databases made unreachable to the relay (REVOKE
#           CONNECT, its sessions terminated) after the warm-up while their load goes on: the
#           p99 of the healthy ones, and how long the faulted ones take to catch up once allowed.
# Latency is commit -> sent_at per event: the payload's committed_us (clock_timestamp() as the
# INSERT runs, just before its commit) to the mark of the relay's transaction that recorded the
# acknowledgement (sent_at = now() of that transaction, which starts after the ack): an upper
# bound of commit -> ack. Relay CPU is its utime + stime over the measured seconds; RSS the
# process's VmRSS idle (all connected, no load) and VmHWM after the load; connections those of
# pg_stat_activity named outbox-relay. Prints a Markdown report; never fails on the figures.
#
# Settings: BENCH_MULTIDB_N=50 BENCH_MULTIDB_RATE=1000 BENCH_MULTIDB_SECONDS=30
#           BENCH_MULTIDB_WARMUP=5 BENCH_MULTIDB_FAULTED=5; BENCH_MULTIDB_CONFIG='"sleep-after": 500'
#           (more keys of the many-database config file, JSON); BENCH_MULTIDB_RUNS="single many
#           faulted"; KEEP_TMP=1 keeps the logs.
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"

BENCH=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RELAY_BIN=${RELAY_BIN:-$(cd "$BENCH/.." && pwd)/bin/outbox-relay}
# shellcheck source=tests/lib.sh
source "$BENCH/../tests/lib.sh"
export LC_ALL=C

N=${BENCH_MULTIDB_N:-50}
RATE=${BENCH_MULTIDB_RATE:-1000}
SECS=${BENCH_MULTIDB_SECONDS:-30}
WARM=${BENCH_MULTIDB_WARMUP:-5}
FAULTED=${BENCH_MULTIDB_FAULTED:-5}
for v in N RATE SECS WARM FAULTED; do
    [[ ${!v} =~ ^[0-9]+$ ]] || { echo "bench/multidb: $v must be a number" >&2; exit 2; }
done
[ "$N" -ge 2 ] && [ "$N" -le 100 ] && [ "$FAULTED" -lt "$N" ] ||
    { echo "bench/multidb: need 2 <= N <= 100 and FAULTED < N" >&2; exit 2; }
PER_DB_RATE=$((RATE / N))
[ "$PER_DB_RATE" -ge 1 ] || { echo "bench/multidb: RATE below N" >&2; exit 2; }
HZ=$(getconf CLK_TCK)

t_setup
pg_start
psql_q "ALTER SYSTEM SET max_connections = 400" -d postgres >/dev/null
pg_restart
broker_start 3
psql_q "CREATE DATABASE tpl" -d postgres || fail "create tpl"
"$RELAY_BIN" migrate --database-url "postgresql://postgres@127.0.0.1:$PGPORT/tpl" \
    2>"$T/migrate.log" || fail "migrate"
psql_q "CREATE ROLE relay_login LOGIN IN ROLE outbox_relay" -d postgres || fail "role"
psql_q "CREATE DATABASE single TEMPLATE tpl" -d postgres || fail "create single"
for i in $(seq 1 "$N"); do
    psql_q "CREATE DATABASE d$i TEMPLATE tpl" -d postgres || fail "create d$i"
done
unset DATABASE_URL
url() { echo "postgresql://relay_login@127.0.0.1:$PGPORT/$1"; }
list=""
for i in $(seq 1 "$N"); do
    list="$list${list:+,}{\"name\":\"d$i\",\"database-url\":\"$(url "d$i")\"}"
done
EXTRA=${BENCH_MULTIDB_CONFIG:-}
printf '{"brokers": "%s", "metrics-listen": "127.0.0.1:0", "sessions": 1, %s"databases": [%s]}\n' \
    "$BROKERS" "${EXTRA:+$EXTRA, }" "$list" >"$T/many.json"

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$RELAY_PID/stat"; }
kb() { awk -v k="$1" '$1 == k ":" { print $2 }' "/proc/$RELAY_PID/status"; }
conns() {
    psql_q "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'outbox-relay%'" \
        -d postgres
}
drained() { # drained DB...: no unsent row in any
    local db
    for db in "$@"; do
        [ "$(psql_q "SELECT count(*) FROM outbox WHERE sent_at IS NULL" -d "$db")" = 0 ] || return 1
    done
}
# latencies FROM_US TO_US DB...: commit -> sent_at in ms of the events committed in the window
latencies() {
    local from=$1 to=$2 db
    shift 2
    for db in "$@"; do
        psql_q "SELECT (extract(epoch FROM sent_at) * 1e6 - (payload->>'committed_us')::bigint) / 1e3
                FROM outbox WHERE (payload->>'committed_us')::bigint BETWEEN $from AND $to" -d "$db"
    done
}
pct() { # pct P: the P-th percentile of the numbers on stdin
    sort -g | awk -v p="$1" '{ v[NR] = $1 } END { i = int(NR * p / 100 + 0.999); if (i < 1) i = 1; printf "%.2f", v[i] }'
}
now_us() { echo "${EPOCHREALTIME/./}"; }

# run KIND: one measured run; sets R_* for the report.
run() {
    local kind=$1 dbs=() i pids=() t0 c0 t1 c1 from to healthy=() faulted=()
    if [ "$kind" = single ]; then
        dbs=(single)
        relay_start --database-url "$(url single)" --brokers "$BROKERS"
    else
        for i in $(seq 1 "$N"); do dbs+=("d$i"); done
        relay_start --config "$T/many.json"
    fi
    sleep 10 # every session connected, idle
    R_IDLE_RSS=$(kb VmRSS) R_IDLE_CONNS=$(conns) R_THREADS=$(awk '/^Threads/ { print $2 }' "/proc/$RELAY_PID/status")
    if [ "$kind" = single ]; then
        pgbench -n -M prepared -c 4 -j 2 -R "$RATE" -T $((WARM + SECS)) -f "$BENCH/insert_event.sql" \
            single >"$T/pgbench.$kind.log" 2>&1 &
        pids+=($!)
    else
        for db in "${dbs[@]}"; do
            pgbench -n -M prepared -c 1 -R "$PER_DB_RATE" -T $((WARM + SECS)) \
                -f "$BENCH/insert_event.sql" "$db" >>"$T/pgbench.$kind.log" 2>&1 &
            pids+=($!)
        done
    fi
    sleep "$WARM"
    if [ "$kind" = faulted ]; then
        for i in $(seq 1 "$FAULTED"); do
            faulted+=("d$i")
            psql_q "REVOKE CONNECT ON DATABASE d$i FROM PUBLIC" -d postgres
        done
        psql_q "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                WHERE usename = 'relay_login' AND datname IN ($(printf "'%s'," "${faulted[@]}" | sed 's/,$//'))" \
            -d postgres >/dev/null
    fi
    from=$(now_us) t0=$EPOCHREALTIME c0=$(cpu_ticks)
    sleep $((SECS / 2))
    R_LOAD_CONNS=$(conns)
    wait "${pids[@]}"
    to=$(now_us) t1=$EPOCHREALTIME c1=$(cpu_ticks)
    R_CPU=$(awk -v a="$c0" -v b="$c1" -v t0="$t0" -v t1="$t1" -v hz="$HZ" \
        'BEGIN { printf "%.1f", 100 * (b - a) / hz / (t1 - t0) }')
    for db in "${dbs[@]:${#faulted[@]}}"; do healthy+=("$db"); done
    _poll 120 drained "${healthy[@]}" || echo "bench/multidb: $kind: healthy databases not drained in 120 s" >&2
    R_HWM=$(kb VmHWM)
    # What the producers achieved (pgbench falls behind its -R schedule on a busy machine).
    R_TPS=$(awk '/^tps = / { s += $3 } END { printf "%.0f", s }' "$T/pgbench.$kind.log")
    latencies "$from" "$to" "${healthy[@]}" >"$T/lat.$kind"
    R_EVENTS=$(grep -c . "$T/lat.$kind")
    R_P50=$(pct 50 <"$T/lat.$kind") R_P99=$(pct 99 <"$T/lat.$kind")
    R_CATCHUP=
    if [ "$kind" = faulted ]; then
        local t_allow=$EPOCHREALTIME
        for db in "${faulted[@]}"; do psql_q "GRANT CONNECT ON DATABASE $db TO PUBLIC" -d postgres; done
        if _poll 300 drained "${faulted[@]}"; then
            R_CATCHUP=$(awk -v a="$t_allow" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
        else
            R_CATCHUP="not within 300"
        fi
        R_FAULTED_ROWS=$(for db in "${faulted[@]}"; do psql_q "SELECT count(*) FROM outbox" -d "$db"; done |
            awk '{ s += $1 } END { print s }')
    fi
    relay_stop 60 || echo "bench/multidb: $kind: relay exit status $?" >&2
    ROWS+=("| $kind | ${#healthy[@]} | $R_TPS | $R_EVENTS | $R_P50 | $R_P99 | $R_CPU | $((R_IDLE_RSS / 1024)) | $((R_HWM / 1024)) | $R_THREADS | $R_IDLE_CONNS | $R_LOAD_CONNS |")
    [ -n "$R_CATCHUP" ] && NOTES+=("faulted: $FAULTED databases unreachable for $SECS s under load ($R_FAULTED_ROWS rows in them in all) caught up in $R_CATCHUP s once allowed again")
}

EXTRA_NOTE=${EXTRA:+ (and $EXTRA)}
ROWS=() NOTES=()
for kind in ${BENCH_MULTIDB_RUNS:-single many faulted}; do run "$kind"; done

cat <<EOF
## Many databases in one relay (bench/multidb.sh)

$RATE events/s for $SECS s (after $WARM s of warm-up), single-event transactions: \`single\` is one
database and a relay at default settings; \`many\` spreads the same rate over $N databases
($PER_DB_RATE/s each, one pgbench client a database) served by one relay with \`"sessions": 1\` per
database$EXTRA_NOTE; \`faulted\` is \`many\` with $FAULTED databases made unreachable to the relay after the
warm-up (their load goes on). Latency: commit -> sent_at (ms) of the events committed in the
measured seconds, of the healthy databases; CPU: the relay's user + system time over them.

| run | databases measured | producer tx/s achieved | events measured | p50 ms | p99 ms | relay CPU % | RSS idle MB | peak RSS MB | threads | connections idle | connections under load |
|---|---|---|---|---|---|---|---|---|---|---|---|
$(printf '%s\n' "${ROWS[@]}")

$([ ${#NOTES[@]} -eq 0 ] || printf -- '- %s\n' "${NOTES[@]}")

Machine: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg) at the end, $(awk '/MemTotal/ { printf "%.1f GB", $2 / 1048576 }' /proc/meminfo); PostgreSQL $(psql_q "SHOW server_version" -d postgres), mock Kafka cluster of 3 brokers, all on this machine; $(date -u +%Y-%m-%d).
EOF
