#!/usr/bin/env bash
# bench/redis_bench.sh (`make bench-redis`): what the demos' Redis fast path buys, each figure
# next to its baseline measured in the same run. Not a test: it prints figures and never fails on
# them; it exits non-zero only when the harness could not measure (a process died, an answer was
# wrong, a step timed out).
#
#  1. Replays: producer-demo without Redis and producer-demo with Redis (both running, same
#     PostgreSQL), REDIS_KEYS keys created once through each, then REDIS_REPLAYS retried requests
#     (bench/http_replay.c, REDIS_THREADS keep-alive connections) against each, in alternating
#     rounds (REDIS_ROUNDS); median per_second and its round's p50/p99.
#  2. Consumer: REDIS_EVENTS distinct OrderCreated events, each delivered twice (50 % duplicates:
#     blocks of 100 events, then the same 100 again), one partition, consumed by consumer-demo
#     without and with Redis (own topic, group and event ids each). Time = between a parked
#     marker message before the stream and one after it (the consumer logs both, in order).
#
# Writes a Markdown section between <!-- redis-bench:start/end --> markers into
# docs/benchmarks.md (replacing the previous one; bench/bench.sh keeps it) or REDIS_BENCH_OUT.
# Uses the non-sanitizer builds.

ROOT=$(cd "$(dirname "$0")/.." && pwd)
export PRODUCER_BIN=$ROOT/bin/producer-demo CONSUMER_BIN=$ROOT/bin/consumer-demo
export RELAY_BIN=$ROOT/bin/outbox-relay
source "$ROOT/tests/lib.sh"
source "$ROOT/tests/demo_lib.sh"
KEYS=${REDIS_KEYS:-1000}
REPLAYS=${REDIS_REPLAYS:-20000}
THREADS=${REDIS_THREADS:-4}
ROUNDS=${REDIS_ROUNDS:-3}
EVENTS=${REDIS_EVENTS:-10000}
OUT=${REDIS_BENCH_OUT:-$ROOT/docs/benchmarks.md}
demo_setup
pg_start
broker_start 1
redis_start
relay_migrate 2>"$T/migrate.log" || fail "outbox-relay migrate"
LOAD_BEFORE=$(cut -d ' ' -f 1-3 /proc/loadavg)
START=$SECONDS

# --- 1. replays ------------------------------------------------------------------------------------
producer_start --db-connections 8
API_PG=$API PORT_PG=${API##*:}
producer_start --db-connections 8 --redis-url "$REDIS_URL"
PORT_RD=${API##*:}
replay() { # PORT PREFIX N: prints http-replay's JSON line
    "$BIN/http-replay" --port "$1" --prefix "$2" --keys "$KEYS" --requests "$3" \
        --threads "$THREADS" || { fail "http-replay $*" >&2; }
}
replay "$PORT_PG" pg "$KEYS" >/dev/null
replay "$PORT_RD" rd "$KEYS" >/dev/null
for r in $(seq 1 "$ROUNDS"); do
    replay "$PORT_PG" pg "$REPLAYS" >"$T/replay.pg.$r"
    replay "$PORT_RD" rd "$REPLAYS" >"$T/replay.rd.$r"
    echo "# round $r: without $(cat "$T/replay.pg.$r")"
    echo "# round $r: with    $(cat "$T/replay.rd.$r")"
done
for arm in pg rd; do
    replayed=$(cat "$T"/replay.$arm.* | jq -s 'map(.replayed) | add')
    [ "$replayed" = $((REPLAYS * ROUNDS)) ] || fail "$arm: every retry replayed ($replayed)"
done
# median round by per_second
median_round() {
    for r in $(seq 1 "$ROUNDS"); do echo "$(jq .per_second "$T/replay.$1.$r") $r"; done |
        sort -n | sed -n "$(((ROUNDS + 1) / 2))p" | cut -d' ' -f2
}
MP=$(median_round pg)
MR=$(median_round rd)
hits=$(curl -sS "$API/healthz" | jq .redis.hits)
check "the Redis arm answered from Redis ($hits hits)" test "$hits" -ge $((REPLAYS * ROUNDS))
check_eq "the replays wrote nothing (orders = keys created)" $((2 * KEYS)) \
    "$(psql_q "SELECT count(*) FROM orders")"

# --- 2. consumer on 50 % duplicates ------------------------------------------------------------------
"$CONSUMER_BIN" migrate --database-url "$DATABASE_URL" 2>>"$T/migrate.log" ||
    fail "consumer-demo migrate"
stream() { # ARM: marker, EVENTS events each twice in blocks of 100, marker (one partition)
    jq -cn --arg a "$1" --argjson n "$EVENTS" '
        def ev($i): {partition: 0, key: ($a + "-" + ($i | tostring)),
            value: ({id: ($a + "-" + ($i | tostring)), customer_id: "c", amount_cents: ($i + 1),
                     currency: "EUR"} | tojson),
            headers: [["id", ((if $a == "pg" then "00000001" else "00000002" end) +
                              "-0000-4000-8000-" + ("000000000000" + ($i | tostring))[-12:])],
                      ["event_type", "OrderCreated"]]};
        def marker: {partition: 0, key: "marker", value: "{}",
                     headers: [["event_type", "OrderCreated"]]};
        marker,
        (range(0; $n; 100) as $b | (range($b; [$b + 100, $n] | min) | ev(.)),
                                   (range($b; [$b + 100, $n] | min) | ev(.))),
        marker'
}
parked_twice() {
    [ "$(grep -c 'msg="message parked"' "$CONSUMER_LOG")" -ge 2 ]
}

# consume_arm ARM [RUN ARGS...]: writes the seconds between the two markers to $T/secs.ARM (not
# run in $(...): the consumer it starts must stay tracked by this shell, to be stopped on exit).
consume_arm() {
    local arm=$1
    shift
    stream "$arm" | "$BIN/produce" --brokers "$BROKERS" --topic "bench.$arm" >/dev/null \
        2>>"$T/produce.log" || fail "produce the $arm stream"
    consumer_start --topic "bench.$arm" --group "bench-$arm" "$@"
    _poll 300 parked_twice ||
        fail "$arm: the consumer reaches the end marker within 300s"
    consumer_stop
    grep 'msg="message parked"' "$CONSUMER_LOG" | head -n 2 | cut -d' ' -f1 |
        python3 -c 'import sys, datetime
t = [datetime.datetime.fromisoformat(l.strip().rstrip("Z")) for l in sys.stdin]
print("%.3f" % (t[1] - t[0]).total_seconds())' >"$T/secs.$arm"
}
consume_arm pg
consume_arm rd --redis-url "$REDIS_URL"
C_PG=$(cat "$T/secs.pg")
C_RD=$(cat "$T/secs.rd")
check_eq "every event applied once in each arm" $((2 * EVENTS)) \
    "$(psql_q "SELECT count(*) FROM shipments WHERE order_id LIKE 'pg-%' OR order_id LIKE 'rd-%'")"
RD_HITS=$(grep 'msg="consumer stopped"' "$CONSUMER_LOG" | grep -o 'redis_hits=[0-9]*' | cut -d= -f2)
check "the Redis arm skipped duplicates on Redis's word ($RD_HITS)" test "${RD_HITS:-0}" -gt 0
LOAD_AFTER=$(cut -d ' ' -f 1-3 /proc/loadavg)

# --- report ------------------------------------------------------------------------------------------
j() { jq -r ".$2" "$T/replay.$1"; }
ratio() { python3 -c "print('%.2f' % ($1 / $2))"; }
eps_pg=$(python3 -c "print('%.0f' % (2 * $EVENTS / $C_PG))")
eps_rd=$(python3 -c "print('%.0f' % (2 * $EVENTS / $C_RD))")
{
    echo '<!-- redis-bench:start -->'
    echo '## The demos with and without Redis (`make bench-redis`)'
    echo
    echo "Latest run: $(date -u +%Y-%m-%d), $((SECONDS - START)) s, $(nproc) CPUs, load average" \
        "before / after $LOAD_BEFORE / $LOAD_AFTER; Redis $(redis-server --version | grep -o 'v=[0-9.]*' | cut -d= -f2)," \
        "PostgreSQL $(psql_q 'SHOW server_version' | cut -d' ' -f1) (fsync off); non-sanitizer builds; both arms in this run."
    echo
    echo "| what | without Redis | with Redis | with / without |"
    echo "|---|---|---|---|"
    echo "| replayed POST /orders per second ($THREADS keep-alive connections, $REPLAYS retries of $KEYS keys; median of $ROUNDS rounds) | $(j pg."$MP" per_second) | $(j rd."$MR" per_second) | $(ratio "$(j rd."$MR" per_second)" "$(j pg."$MP" per_second)") |"
    echo "| replay latency p50, ms (that round) | $(j pg."$MP" p50_ms) | $(j rd."$MR" p50_ms) | $(ratio "$(j rd."$MR" p50_ms)" "$(j pg."$MP" p50_ms)") |"
    echo "| replay latency p99, ms (that round) | $(j pg."$MP" p99_ms) | $(j rd."$MR" p99_ms) | $(ratio "$(j rd."$MR" p99_ms)" "$(j pg."$MP" p99_ms)") |"
    echo "| consumer-demo, $((2 * EVENTS)) messages with 50 % duplicates, messages/s | $eps_pg | $eps_rd | $(ratio "$eps_rd" "$eps_pg") |"
    echo "| consumer-demo, seconds for the stream | $C_PG | $C_RD | $(ratio "$C_RD" "$C_PG") |"
    echo
    echo "Method: replays are answered from idempotency_keys (one pooled connection, BEGIN, advisory"
    echo "lock, SELECT, ROLLBACK) without Redis, and from one Redis GET plus a local SHA-256 of the"
    echo "request with it. The consumer's duplicates cost one transaction each (INSERT … ON CONFLICT"
    echo "into processed_events, rolled back) without Redis, one EXISTS with it ($RD_HITS of the"
    echo "$EVENTS duplicates were answered by Redis); every original costs its transaction plus, with"
    echo "Redis, an EXISTS before and a SET after. Everything runs on this machine's $(nproc) CPUs;"
    echo "compare the ratios, not the absolute figures. Per-round figures are in the run's output."
    echo
    echo "Reading: a replay without Redis is a pooled PostgreSQL round trip for each of BEGIN, the"
    echo "advisory lock, the SELECT and the ROLLBACK; with Redis it is one GET, hence the gain. The"
    echo "consumer's Redis check costs two Redis round trips per original (EXISTS, then SET) to save"
    echo "three PostgreSQL round trips per duplicate (BEGIN, INSERT … ON CONFLICT, ROLLBACK); with"
    echo "PostgreSQL on the same machine, fsync off and nothing else running, those are nearly as"
    echo "cheap as Redis's, so at 50 % duplicates the two about cancel out. The consumer's Redis pays"
    echo "off when the database is remote or loaded, or duplicates dominate (a replayed topic)."
    echo '<!-- redis-bench:end -->'
} >"$T/section.md"
cat "$T/section.md"
if [ -f "$OUT" ] && grep -q '^<!-- redis-bench:start -->' "$OUT"; then
    sed '/^<!-- redis-bench:start -->/,/^<!-- redis-bench:end -->/d' "$OUT" >"$T/out.md"
else
    cp "$OUT" "$T/out.md" 2>/dev/null || : >"$T/out.md"
fi
{ cat "$T/out.md"; [ -s "$T/out.md" ] && echo; cat "$T/section.md"; } >"$OUT"
echo "# section written to $OUT"
