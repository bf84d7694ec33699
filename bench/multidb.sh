#!/usr/bin/env bash
# bench/multidb.sh (`make bench-multidb`, and the "multidb" part of `make bench`): one relay
# process serving many databases (--databases, docs/operations.md#many-databases) against one
# relay of one database at the same total rate, in the same run:
#   single  one database, RATE events/s, the relay at default settings;
#   many    N databases on the same PostgreSQL, RATE events/s spread over them, one relay serving
#           all N, "sessions": 1 each (docs/operations.md#many-databases: what an idle database
#           costs);
#   faulted the same, with FAULTED of the databases made unreachable to the relay (REVOKE
#           CONNECT, its sessions terminated) after the warm-up while their load goes on: the
#           p99 of the healthy ones, and how long the faulted ones take to catch up once allowed.
# The load is bin/outbox-load (bench/outbox_load.c): one process pacing single-event INSERT
# transactions at RATE in all, Poisson arrivals, each event to a database picked at random, one
# connection a database (4 for single). It replaced one pgbench process and backend a database,
# whose 50 processes and ~150 backends loaded the 2 cores of the machine this was written on to
# ~26, so the faulted/no-fault ratio measured the load generator (0.97x, 1.37x, 3.3x in three runs).
# Latency is commit -> sent_at per event: the payload's committed_us (clock_timestamp() as the
# INSERT runs, just before its commit) to the mark of the relay's transaction that recorded the
# acknowledgement (sent_at = now() of that transaction, which starts after the ack): an upper
# bound of commit -> ack. "Events" are those committed into the measured (healthy) databases
# with committed_us in the measured seconds, counted in the tables themselves; "unsent" those of
# them without sent_at once the healthy databases drained (or 120 s passed): left out of the
# percentiles, so a non-zero count is a finding, not noise. Relay CPU is its utime + stime over
# the measured seconds, the load generator's likewise; RSS the relay's VmRSS idle (all
# connected, no load) and VmHWM after the load; connections those of pg_stat_activity named
# outbox-relay. Prints a Markdown report; never fails on the figures.
#
# Settings: BENCH_MULTIDB_N=50 BENCH_MULTIDB_RATE=1000 BENCH_MULTIDB_SECONDS=30
#           BENCH_MULTIDB_WARMUP=5 BENCH_MULTIDB_FAULTED=5 BENCH_MULTIDB_ROUNDS=1 (each round runs
#           every kind; with "many" and "faulted" in it, each round's p99 ratio is reported);
#           BENCH_MULTIDB_CONFIG='"sleep-after": 500' (more keys of the many-database config file,
#           JSON); BENCH_MULTIDB_RUNS="single many faulted"; KEEP_TMP=1 keeps the logs;
#           RELAY_BIN, LOAD_BIN (default bin/outbox-load).
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
ROUNDS=${BENCH_MULTIDB_ROUNDS:-1}
GRACE=5
LOAD_BIN=${LOAD_BIN:-$BIN/outbox-load}
for v in N RATE SECS WARM FAULTED ROUNDS; do
    [[ ${!v} =~ ^[0-9]+$ ]] || { echo "bench/multidb: $v must be a number" >&2; exit 2; }
done
[ "$N" -ge 2 ] && [ "$N" -le 100 ] && [ "$FAULTED" -lt "$N" ] ||
    { echo "bench/multidb: need 2 <= N <= 100 and FAULTED < N" >&2; exit 2; }
PER_DB_RATE=$((RATE / N))
[ "$PER_DB_RATE" -ge 1 ] || { echo "bench/multidb: RATE below N" >&2; exit 2; }
[ -x "$LOAD_BIN" ] || { echo "bench/multidb: no $LOAD_BIN (make bin/outbox-load)" >&2; exit 2; }
HZ=$(getconf CLK_TCK)

t_setup
pg_start
psql_q "ALTER SYSTEM SET max_connections = 400" -d postgres >/dev/null
pg_restart
# --tcp-nodelay as real brokers and bench/bench.sh: without it delayed ACKs add ~40 ms to rounds
# with several requests in flight on a connection (tests/tools/mock-broker.c).
broker_start 3 --tcp-nodelay
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

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/${1:-$RELAY_PID}/stat"; }
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
# latencies FROM_US TO_US DB...: commit -> sent_at in ms of the events committed in the window,
# "unsent" for those not sent (yet)
latencies() {
    local from=$1 to=$2 db
    shift 2
    for db in "$@"; do
        psql_q "SELECT coalesce(((extract(epoch FROM sent_at) * 1e6
                                  - (payload->>'committed_us')::bigint) / 1e3)::text, 'unsent')
                FROM outbox WHERE (payload->>'committed_us')::bigint BETWEEN $from AND $to" -d "$db"
    done
}
pct() { # pct P: the P-th percentile of the numbers on stdin
    sort -g | awk -v p="$1" '{ v[NR] = $1 } END { if (NR == 0) { printf "-"; exit } i = int(NR * p / 100 + 0.999); if (i < 1) i = 1; printf "%.2f", v[i] }'
}
now_us() { echo "${EPOCHREALTIME/./}"; }

# run KIND ROUND: one measured run; appends its row to ROWS (and P99[KIND.ROUND]).
run() {
    local kind=$1 round=$2 dbs=() i t0 c0 g0 t1 c1 g1 from to healthy=() faulted=() load_pid
    # The generator runs GRACE s past the window's planned end, so however long the fault takes
    # to apply, it produces through the whole window.
    local load_args=(--conninfo "host=127.0.0.1 port=$PGPORT user=postgres" --rate "$RATE"
        --seconds $((WARM + SECS + GRACE)))
    if [ "$kind" = single ]; then
        dbs=(single)
        relay_start --database-url "$(url single)" --brokers "$BROKERS"
        load_args+=(--database single --conns 4)
    else
        for i in $(seq 1 "$N"); do dbs+=("d$i"); done
        relay_start --config "$T/many.json"
        load_args+=(--database "$(printf '%s,' "${dbs[@]}" | sed 's/,$//')" --conns 1)
    fi
    sleep 10 # every session connected, idle
    R_IDLE_RSS=$(kb VmRSS) R_IDLE_CONNS=$(conns) R_THREADS=$(awk '/^Threads/ { print $2 }' "/proc/$RELAY_PID/status")
    # The generator connects as postgres (not the relay's role), so the fault below leaves its
    # sessions alone: the faulted databases' load goes on.
    "$LOAD_BIN" "${load_args[@]}" >"$T/load.$kind.$round.out" 2>"$T/load.$kind.$round.err" &
    load_pid=$!
    _t_track "$load_pid"
    sleep "$WARM"
    if [ "$kind" = faulted ]; then
        # One psql for the whole fault: on a saturated machine each psql start took seconds, and
        # the window starts only once the fault is in place.
        local revokes=()
        for i in $(seq 1 "$FAULTED"); do
            faulted+=("d$i") revokes+=(-c "REVOKE CONNECT ON DATABASE d$i FROM PUBLIC")
        done
        psql -XAtq -v ON_ERROR_STOP=1 -d postgres "${revokes[@]}" \
            -c "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                WHERE usename = 'relay_login' AND datname IN ($(printf "'%s'," "${faulted[@]}" | sed 's/,$//'))" \
            >/dev/null || fail "apply the fault"
    fi
    from=$(now_us) t0=$EPOCHREALTIME c0=$(cpu_ticks) g0=$(cpu_ticks "$load_pid")
    sleep $((SECS / 2))
    R_LOAD_CONNS=$(conns) R_LOADAVG=$(cut -d' ' -f1 /proc/loadavg)
    sleep $((SECS - SECS / 2))
    to=$(now_us) t1=$EPOCHREALTIME c1=$(cpu_ticks) g1=$(cpu_ticks "$load_pid")
    kill -0 "$load_pid" 2>/dev/null ||
        NOTES+=("round $round $kind: the generator ended before the window did (fault applied late): fewer events")
    wait "$load_pid"
    R_CPU=$(awk -v a="$c0" -v b="$c1" -v t0="$t0" -v t1="$t1" -v hz="$HZ" \
        'BEGIN { printf "%.1f", 100 * (b - a) / hz / (t1 - t0) }')
    R_GEN_CPU=$(awk -v a="$g0" -v b="$g1" -v t0="$t0" -v t1="$t1" -v hz="$HZ" \
        'BEGIN { printf "%.1f", 100 * (b - a) / hz / (t1 - t0) }')
    for db in "${dbs[@]:${#faulted[@]}}"; do healthy+=("$db"); done
    _poll 120 drained "${healthy[@]}" || echo "bench/multidb: $kind: healthy databases not drained in 120 s" >&2
    R_HWM=$(kb VmHWM)
    # What the producer achieved: events/s over its run, and its lag behind the schedule (p99).
    R_TPS=$(awk '/^outbox-load:/ { for (i = 2; i < NF; i++) v[$i] = $(i + 1)
                  if (v["seconds"] > 0) printf "%.0f", v["committed"] / v["seconds"] }' "$T/load.$kind.$round.out")
    R_LAG=$(awk '/^outbox-load:/ { for (i = 2; i < NF; i++) v[$i] = $(i + 1); print v["lag_p99_ms"] }' "$T/load.$kind.$round.out")
    [ -s "$T/load.$kind.$round.err" ] && NOTES+=("round $round $kind: outbox-load said: $(head -c 300 "$T/load.$kind.$round.err" | tr '\n' ' ')")
    latencies "$from" "$to" "${healthy[@]}" >"$T/lat.$kind.$round"
    R_EVENTS=$(grep -c . "$T/lat.$kind.$round")
    # What the generator's rate implies: the healthy databases' share of RATE over the window.
    R_EXPECT=$(awk -v r="$RATE" -v h="${#healthy[@]}" -v n="${#dbs[@]}" -v t0="$t0" -v t1="$t1" \
        'BEGIN { printf "%.0f", r * h / n * (t1 - t0) }')
    R_UNSENT=$(grep -c unsent "$T/lat.$kind.$round")
    R_P50=$(grep -v unsent "$T/lat.$kind.$round" | pct 50) R_P99=$(grep -v unsent "$T/lat.$kind.$round" | pct 99)
    P99[$kind.$round]=$R_P99
    if [ "$kind" = faulted ]; then
        local t_allow=$EPOCHREALTIME catchup faulted_rows
        for db in "${faulted[@]}"; do psql_q "GRANT CONNECT ON DATABASE $db TO PUBLIC" -d postgres; done
        if _poll 300 drained "${faulted[@]}"; then
            catchup=$(awk -v a="$t_allow" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
        else
            catchup="not within 300"
        fi
        faulted_rows=$(for db in "${faulted[@]}"; do
            psql_q "SELECT count(*) FROM outbox WHERE (payload->>'committed_us')::bigint >= $from" -d "$db"
        done | awk '{ s += $1 } END { print s }')
        NOTES+=("round $round faulted: $FAULTED databases unreachable for $SECS s under load ($faulted_rows rows written to them meanwhile) caught up in $catchup s once allowed again")
    fi
    relay_stop 60 || echo "bench/multidb: $kind: relay exit status $?" >&2
    ROWS+=("| $round | $kind | ${#healthy[@]} | $R_TPS | $R_LAG | $R_EVENTS of ~$R_EXPECT | $R_UNSENT | $R_P50 | $R_P99 | $R_CPU | $R_GEN_CPU | $R_LOADAVG | $((R_IDLE_RSS / 1024)) | $((R_HWM / 1024)) | $R_THREADS | $R_IDLE_CONNS | $R_LOAD_CONNS |")
}

EXTRA_NOTE=${EXTRA:+ (and $EXTRA)}
ROWS=() NOTES=() RATIOS=()
declare -A P99=()
for round in $(seq 1 "$ROUNDS"); do
    for kind in ${BENCH_MULTIDB_RUNS:-single many faulted}; do run "$kind" "$round"; done
    if [ -n "${P99[many.$round]:-}" ] && [ -n "${P99[faulted.$round]:-}" ]; then
        RATIOS+=("$(awk -v f="${P99[faulted.$round]}" -v m="${P99[many.$round]}" \
            'BEGIN { printf "%.2f", (m > 0 ? f / m : 0) }')")
    fi
done
RATIO_LINE=
if [ ${#RATIOS[@]} -gt 0 ]; then
    RATIO_LINE="p99 of the healthy databases, faulted / many (the issue's bound: 1.5), by round: $(printf '%s, ' "${RATIOS[@]}" | sed 's/, $//')$(
        printf '%s\n' "${RATIOS[@]}" | sort -g | awk '{ v[NR] = $1 } END { if (NR > 1) printf "; min %s, median %s, max %s", v[1], v[int((NR + 1) / 2)], v[NR] }')."
fi

cat <<EOF
## Many databases in one relay (bench/multidb.sh)

$RATE events/s for $SECS s (after $WARM s of warm-up), single-event transactions from one load
generator (bin/outbox-load: Poisson arrivals, each event to a database picked at random), $ROUNDS
round(s): \`single\` is one database (4 generator connections) and a relay at default settings;
\`many\` spreads the same rate over $N databases (~$PER_DB_RATE/s each, one generator connection a
database) served by one relay with \`"sessions": 1\` per database$EXTRA_NOTE; \`faulted\` is \`many\`
with $FAULTED databases made unreachable to the relay after the warm-up (their load goes on).
Events: those committed into the measured (healthy) databases in the measured seconds, counted in
the tables, beside what the rate implies (their share of $RATE/s over the window); unsent: those of
them without sent_at after the drain (left out of the percentiles).
Latency: commit -> sent_at (ms). CPU: user + system time over the measured seconds, the relay's
and the generator's; generator lag: p99 of how late it sent an event behind its schedule.

| round | run | databases measured | events/s produced | generator lag p99 ms | events (of the rate's) | unsent | p50 ms | p99 ms | relay CPU % | generator CPU % | load avg (mid-run) | RSS idle MB | peak RSS MB | threads | connections idle | connections under load |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
$(printf '%s\n' "${ROWS[@]}")

$([ -z "$RATIO_LINE" ] || printf -- '- %s\n' "$RATIO_LINE")
$([ ${#NOTES[@]} -eq 0 ] || printf -- '- %s\n' "${NOTES[@]}")

Machine: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg) at the end, $(awk '/MemTotal/ { printf "%.1f GB", $2 / 1048576 }' /proc/meminfo); PostgreSQL $(psql_q "SHOW server_version" -d postgres), mock Kafka cluster of 3 brokers (TCP_NODELAY), all on this machine; $(date -u +%Y-%m-%d).
EOF
