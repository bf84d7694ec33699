#!/bin/bash
# The crash tests seed 002 asks for ("kill the process mid-operation -> no duplicates on retry"),
# on real processes, with the sanitizer builds:
#  A. producer-demo SIGKILLed while 50 POST /orders with distinct keys are in flight (held inside
#     their transactions by locks: 25 are then let through to commit, 25 die in their
#     transactions), restarted, and all 50 retried with the same keys and bodies: exactly 50
#     orders, 50 outbox rows and 50 keys; the retries of committed requests replay, the others
#     run once. No key stays "in progress" longer than the documented bound: PostgreSQL ends the
#     dead process's transactions when it sees the connections close, and with Redis a guard
#     left behind expires after --redis-guard-ms. Run without Redis, then with Redis.
#  B. consumer-demo SIGKILLed in the middle of a 400-event stream (inside a transaction, with no
#     offset committed), restarted: every shipment applied once; every event committed before the
#     kill comes again and is recognised, by processed_events without Redis and by Redis alone
#     (no transaction) with it.
source "$(dirname "$0")/../../lib.sh"
source "$(dirname "$0")/../../demo_lib.sh"
demo_setup
pg_start
broker_start 1
redis_start
relay_migrate 2>"$T/migrate.log" || fail "outbox-relay migrate"
"$PRODUCER_BIN" migrate --database-url "$DATABASE_URL" 2>>"$T/migrate.log" ||
    fail "producer-demo migrate"
GUARD_MS=2000
N=50

# hold NAME SQL: runs SQL in a transaction of its own (application_name NAME) and keeps it open
# until unlock NAME: whatever conflicts with SQL's locks waits behind it.
hold() {
    PGAPPNAME=$1 psql -XAtq -c "BEGIN; $2; SELECT pg_sleep(120)" >/dev/null 2>&1 &
    _t_track $!
    _poll 10 sql_is "SELECT count(*) FROM pg_stat_activity WHERE application_name = '$1'
                     AND query LIKE '%pg_sleep%' AND wait_event = 'PgSleep'" 1 ||
        fail "session $1 holds its locks"
}

lock_table() {
    hold locker "LOCK TABLE $1 IN SHARE MODE"
}

# unlock [NAME]: ends session NAME (default locker); its transaction rolls back.
unlock() {
    psql_q "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
            WHERE application_name = '${1:-locker}'" >/dev/null
}

# waiting APP N: true when N sessions of APP wait for a lock.
waiting() {
    sql_is "SELECT count(*) FROM pg_stat_activity WHERE application_name = '$1'
            AND wait_event_type = 'Lock'" "$2"
}

body_of() {
    echo "{\"customer_id\": \"crash-$1\", \"amount_cents\": $((100 + $2)), \"currency\": \"EUR\"}"
}

# retry_until_done ROUND I DEADLINE: retries request I of ROUND while it gets 409 (in progress)
# or 503, until DEADLINE (epoch seconds); writes "STATUS REPLAYED" to $T/final.ROUND.I.
retry_until_done() {
    local round=$1 i=$2 deadline=$3 code replayed
    while :; do
        code=$(curl -sS -m 10 -o /dev/null -D "$T/h.$round.$i" -w '%{http_code}' -X POST \
            "$API/orders" -H "Idempotency-Key: crash-$round-$i" -d "$(body_of "$round" "$i")")
        [ "$code" = 409 ] || [ "$code" = 503 ] || [ "$code" = 000 ] || break
        [ "$(date +%s)" -lt "$deadline" ] || break
        sleep 0.2
    done
    replayed=$(grep -i '^Idempotency-Replayed:' "$T/h.$round.$i" | tr -d '\r' | cut -d' ' -f2)
    echo "$code ${replayed:-false}" >"$T/final.$round.$i"
}

# producer_round ROUND [SERVE ARGS...]
producer_round() {
    local round=$1 i pids=() committed deadline
    shift
    # Long bounds on waits: the requests stay inside their transactions, waiting for locks,
    # until the kill (up to a minute on a loaded machine), not until --lock-timeout's default.
    producer_start --db-connections $((N + 5)) --lock-timeout 120000 --statement-timeout 120000 "$@"
    # Requests 1..N/2 will wait on the orders table, N/2+1..N on their idempotency key, which an
    # open transaction has inserted (and will roll back): the first half can be let through to
    # commit while the second half stays inside its transactions for the kill.
    lock_table orders
    hold keys "INSERT INTO idempotency_keys (endpoint, key, request_hash, expires_at)
               SELECT 'POST /orders', 'crash-$round-' || i, '\\x00', now()
               FROM generate_series($((N / 2 + 1)), $N) i"
    for i in $(seq 1 $N); do
        curl -sS -m 60 -o /dev/null -X POST "$API/orders" -H "Idempotency-Key: crash-$round-$i" \
            -d "$(body_of "$round" "$i")" 2>/dev/null &
        pids+=($!)
    done
    wait_for "$round: $N requests in flight, each inside its transaction" 60 \
        waiting producer-demo $N
    unlock locker
    wait_for "$round: the first $((N / 2)) committed" 30 \
        sql_is "SELECT count(*) FROM orders WHERE customer_id = 'crash-$round'" $((N / 2))
    # The crash: $((N / 2)) requests die inside their transactions; then their key rows free up
    # and the dead process's backends run on until they find the client gone, and roll back.
    kill -KILL "$PRODUCER_PID"
    wait "$PRODUCER_PID" 2>/dev/null
    unlock keys
    wait "${pids[@]}" 2>/dev/null
    # Bound 1: PostgreSQL ends every transaction of the dead process (it sees the sockets close).
    wait_for "$round: no session of the killed producer left within 10s" 10 \
        sql_is "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'producer-demo'" 0
    committed=$(psql_q "SELECT count(*) FROM orders WHERE customer_id = 'crash-$round'")
    check_eq "$round: only the first half committed (the rest died with the producer)" \
        $((N / 2)) "$committed"
    check_eq "$round: no half-done key (every stored key has its response)" 0 \
        "$(psql_q "SELECT count(*) FROM idempotency_keys WHERE response_status IS NULL")"

    producer_start --db-connections 10 "$@"
    # Bound 2 (with Redis): a guard outlives the crash by at most GUARD_MS; 10 s of slack for a
    # loaded machine, never a timing assertion on the happy path.
    deadline=$(($(date +%s) + GUARD_MS / 1000 + 10))
    pids=()
    for i in $(seq 1 $N); do
        retry_until_done "$round" "$i" "$deadline" &
        pids+=($!)
    done
    wait "${pids[@]}"
    check_eq "$round: every retry ends in 201 (none stuck in progress past the bound)" "$N" \
        "$(cat "$T"/final."$round".* | grep -c '^201 ')"
    check_eq "$round: the retries of committed requests replayed, the rest ran once" \
        "$committed" "$(cat "$T"/final."$round".* | grep -c '^201 true$')"
    check_eq "$round: exactly $N orders" "$N" \
        "$(psql_q "SELECT count(*) FROM orders WHERE customer_id = 'crash-$round'")"
    check_eq "$round: exactly $N outbox rows, one per order" "$N" \
        "$(psql_q "SELECT count(DISTINCT x.aggregate_id) || '/' || count(*) FROM outbox x
                   JOIN orders o ON o.id::text = x.aggregate_id
                   WHERE o.customer_id = 'crash-$round'" | cut -d/ -f2)"
    check_eq "$round: exactly $N keys, each naming its own order with its own amount" "$N" \
        "$(psql_q "SELECT count(*) FROM idempotency_keys k
                   JOIN orders o ON o.id::text = k.response_body::jsonb->>'id'
                   WHERE k.key LIKE 'crash-$round-%' AND k.response_status = 201
                     AND o.amount_cents = 100 + split_part(k.key, '-', 3)::int")"
    producer_stop
}

# --- A. producer-demo ------------------------------------------------------------------------------
producer_round p1
producer_round p2 --redis-url "$REDIS_URL" --redis-guard-ms "$GUARD_MS"
check "p2: the second producer served retries from Redis or PostgreSQL, never wrongly" \
    grep -q 'msg="redis totals"' "$PRODUCER_LOG"

# --- B. consumer-demo ------------------------------------------------------------------------------
EVENTS=400
"$CONSUMER_BIN" migrate --database-url "$DATABASE_URL" 2>>"$T/migrate.log" ||
    fail "consumer-demo migrate"

# events ROUND: EVENTS OrderCreated messages with fixed ids (order ROUND-n, event id from n).
events() {
    jq -cn --arg r "$1" --argjson n "$EVENTS" 'range(1; $n + 1) as $i | {
        key: ($r + "-" + ($i | tostring)),
        value: ({id: ($r + "-" + ($i | tostring)), customer_id: "c", amount_cents: $i,
                 currency: "EUR"} | tojson),
        headers: [["id", ("00000000-0000-4000-8000-" + ("000000000000" + ($i | tostring))[-12:])
                   | sub("^00000000"; (if $r == "c1" then "00000001" else "00000002" end))],
                  ["event_type", "OrderCreated"]]}'
}

last_line() {
    grep -E 'msg="consumer (progress|stopped)"' "$CONSUMER_LOG" | tail -n 1
}

counter() {
    last_line | grep -o " $1=[0-9]*" | cut -d= -f2
}

seen_all() {
    [ $(($(counter applied) + $(counter duplicates))) -eq "$EVENTS" ]
}

# consumer_round ROUND [RUN ARGS...]
consumer_round() {
    local round=$1 before
    shift
    events "$round" >"$T/events.$round"
    # The first MID events are applied before shipments is locked and the rest are produced
    # after it, so the kill finds the consumer mid-stream however fast it is (given all at once,
    # a fast machine applied every event before the lock was taken).
    local MID=50
    head -n "$MID" "$T/events.$round" | "$BIN/produce" --brokers "$BROKERS" \
        --topic "orders.$round" >/dev/null 2>>"$T/produce.log" ||
        fail "$round: produce the first $MID events"
    # No offset is committed before the kill: everything applied so far comes again.
    local args=(--topic "orders.$round" --group "ship-$round"
        --kafka auto.commit.interval.ms=600000 "$@")
    consumer_start "${args[@]}"
    wait_for "$round: the consumer is mid-stream ($MID shipments)" 60 \
        sql_is "SELECT count(*) FROM shipments WHERE order_id LIKE '$round-%'" "$MID"
    lock_table shipments
    tail -n +$((MID + 1)) "$T/events.$round" | "$BIN/produce" --brokers "$BROKERS" \
        --topic "orders.$round" >/dev/null 2>>"$T/produce.log" ||
        fail "$round: produce the other $((EVENTS - MID)) events"
    wait_for "$round: the consumer waits inside a transaction" 30 waiting consumer-demo 1
    kill -KILL "$CONSUMER_PID"
    wait "$CONSUMER_PID" 2>/dev/null
    unlock locker
    before=$(psql_q "SELECT count(*) FROM shipments WHERE order_id LIKE '$round-%'")
    echo "# $round: $before of $EVENTS shipments when the consumer died"
    check_eq "$round: nothing half-applied (shipments = processed events)" "$before" \
        "$(psql_q "SELECT count(*) FROM processed_events WHERE topic = 'orders.$round'")"
    consumer_start "${args[@]}"
    wait_for "$round: all $EVENTS shipments after the restart" 90 \
        sql_is "SELECT count(*) FROM shipments WHERE order_id LIKE '$round-%'" "$EVENTS"
    wait_for "$round: the new consumer has seen every message again" 30 seen_all
    check_eq "$round: exactly one shipment per event" "$EVENTS $EVENTS" \
        "$(psql_q "SELECT count(*) || ' ' || count(DISTINCT s.event_id) FROM shipments s
                   JOIN processed_events p USING (event_id) WHERE s.order_id LIKE '$round-%'")"
    check_eq "$round: the new consumer applied exactly the rest" $((EVENTS - before)) \
        "$(counter applied)"
    check_eq "$round: and recognised every event committed before the kill" "$before" \
        "$(counter duplicates)"
    consumer_stop
}

consumer_round c1
check_eq "c1: without Redis, every duplicate went through processed_events" 0 \
    "$(counter redis_hits)"
consumer_round c2 --redis-url "$REDIS_URL"
check_eq "c2: with Redis, every duplicate was skipped on Redis's word (ids written after commit)" \
    "$(counter duplicates)" "$(counter redis_hits)"
check "no sanitizer report in the demo logs" \
    bash -c "! grep -l 'ERROR: AddressSanitizer\|ERROR: LeakSanitizer\|runtime error:' \
        '$T'/producer.*.log '$T'/consumer.*.log"
