#!/usr/bin/env bash
# bench/bench.sh (`make bench`): the relay's throughput, latency, cost to producers and memory,
# each figure measured in the same run as its baseline and reported as a ratio. Not a test: it
# prints figures and never fails on them; it exits non-zero only when the harness itself could not
# measure something (a process died, rows went missing, a step timed out).
#
# Starts its own PostgreSQL and mock Kafka cluster with tests/lib.sh, runs the non-sanitizer
# build (bin/outbox-relay), prints one Markdown report (tables, targets, method, machine) and
# writes it to docs/benchmarks.md (BENCH_QUICK runs write bin/bench-quick.md instead).
#
# Settings (environment):
#   BENCH_SIZES="100000 1000000"   drain backlogs (multiples of 1000)
#   BENCH_TUNED_FLAGS="--batch-size 2000 --kafka linger.ms=1"
#                                  extra relay flags of the "tuned" rows; empty: no tuned rows
#   BENCH_ON_SENT_DELETE=1         also drain with --on-sent delete (against the DELETE bound)
#   BENCH_AVRO=0                   skip the drain with --value-format avro (Schema Registry, on by
#                                  default when node is here: the stand-in registry needs it)
#   BENCH_ONE_SESSION=1            also drain with --sessions 1 (the cycle without a second claim
#                                  session), to show what the sessions lever buys; 0: skip
#   BENCH_NAIVE_SIZE=100000        backlog of the naive loop (default: 100000 if among the sizes,
#                                  else the smallest size)
#   BENCH_RATES="1000 5000 10000 5000x10 10000x10"
#                                  latency runs, events/s; RATExN: RATE events/s as RATE/N
#                                  transactions of N events each (bench/insert_events.sql), for
#                                  rates this machine cannot insert one transaction per event
#   BENCH_LATENCY_SECONDS=10       measured part of each latency run (after BENCH_WARMUP_SECONDS=3)
#   BENCH_LATENCY_CLIENTS=4        pgbench clients of the latency load
#   BENCH_PRODUCER_CLIENTS="1 4"   producer-cost runs; BENCH_PRODUCER_SECONDS=10 each
#   BENCH_PRODUCER_ROUNDS=5        paired rounds (without, with) per producer-cost row, the order
#                                  alternating; the ratio is the median of the rounds' ratios
#   BENCH_PRODUCER_MODES="idle relay"
#                                  idle: no relay running (the commit path alone); relay: a relay
#                                  (default settings but --poll-interval 5) draining during the run
#   BENCH_CONSUMER_KAFKA="fetch.wait.max.ms=1 auto.offset.reset=error"  consumer properties of
#                                  the latency runs
#   BENCH_BROKERS=3 BENCH_PARTITIONS=6          mock cluster and topic (runs without a consumer)
#   BENCH_LATENCY_PARTITIONS=1     the topic's partitions in the latency runs (and the
#                                  old-snapshot runs, which are latency runs): see Method
#   BENCH_CONTROL_RATES="1000 5000x10"  latency rates also run on a BENCH_PARTITIONS topic
#                                  (default settings, every round): the control for the above
#   BENCH_PG_DELAY_US=N            the latency runs' relays reach PostgreSQL through bin/delay-proxy,
#                                  N µs each way (a round trip 2N µs longer): PostgreSQL on
#                                  another host, which loopback cannot show (pgbench and the
#                                  consumer stay direct); empty: direct
#   BENCH_SYNC_STANDBY_DELAY_US=N  the latency runs' PostgreSQL waits at each commit for a
#                                  synchronous streaming standby (synchronous_commit on, the
#                                  server's default) that streams through bin/delay-proxy, N µs
#                                  each way: a standby on another host, as high availability
#                                  set-ups run (it runs on this machine); the later parts go
#                                  without it; empty: no standby, and commits wait for nothing
#   BENCH_SHARED_BUFFERS=1GB  BENCH_PG_CONF="..." (extra postgresql.conf lines)
#   BENCH_POLL_MS=50               drain completion polling
#   BENCH_REPEAT=1                 rounds of drains; above 1, each rate is the median of its
#                                  rounds (and its min–max is shown). A size's drains and bounds
#                                  run in one order in odd rounds and the reverse in even ones:
#                                  an even count gives every pair each place equally often
#   BENCH_LATENCY_ROUNDS=REPEAT    rounds of latency runs (a rate's default, baseline, tuned and
#                                  control runs in turn, the order reversed in even rounds); above
#                                  1, each row is its median-p50 round (and the p50s' min–max)
#   BENCH_PARTS="drain replay latency producers payloads"   which measurements to run ("multidb": one
#                                  relay serving many databases, bench/multidb.sh and its
#                                  BENCH_MULTIDB_* settings, a run of its own)
#   BENCH_REPLAY_SIZE=100000       the "replay" part: a backlog of this many rows drained fresh,
#                                  then put back in line by `outbox-relay replay` and drained
#                                  again, then made unsent by hand (UPDATE sent_at = NULL) and
#                                  drained once more; every BENCH_REPEAT round (BENCH_QUICK: 10000)
#   BENCH_REPLAY_VACUUM=1          VACUUM between the replay and its drain: what the replayed
#                                  rows' old versions cost a relay that starts with its floor at 0
#   BENCH_SNAPSHOT_SECONDS=600     the old-snapshot runs ("snapshot" part): latency at
#   BENCH_SNAPSHOT_RATE=3000       this rate for this long, without and then with a REPEATABLE
#                                  READ transaction held open the whole time
#   BENCH_PAYLOADS="1024:100000 10240:20000 512000:3000"   payload drains, BYTES:ROWS each (the
#                                  relay at default settings; events/s, MB/s and peak RSS)
#   BENCH_QUICK=1                  smoke run: small sizes, short durations
#   BENCH_OUT=FILE                 where the report goes
#   BENCH_BASELINE_BIN=PATH        another outbox-relay binary (an older commit, say) drained and
#                                  timed at default settings next to this one in every drain
#                                  round (after it in odd rounds, before it in even ones) and
#                                  right after it in every latency round, so a change is judged
#                                  by a same-run ratio (rows "baseline"); with
#                                  BENCH_ON_SENT_DELETE also with --on-sent delete (rows
#                                  "baselinedel", next to this build's delete drain)
#   BENCH_PERF=1                   also record a CPU profile (perf, cpu-clock) of the relay
#                                  during the largest default drain, into bin/bench-perf.txt
#   BENCH_PERF_KEY=ondelete.100000 the drain to profile instead (a key of the report's rows:
#                                  default, ondelete, replayed, ... dot backlog)
#   BENCH_PERF_ALL=1               profile the whole machine during that drain, reported for this
#                                  run's processes only (relay, PostgreSQL's, broker), by process
#   KEEP_TMP=1                     keep the temp dir with every log
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"

BENCH=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RELAY_BIN=${RELAY_BIN:-$(cd "$BENCH/.." && pwd)/bin/outbox-relay}
BASELINE_BIN=${BENCH_BASELINE_BIN:-}
# shellcheck source=tests/lib.sh
source "$BENCH/../tests/lib.sh"
export LC_ALL=C # decimal points in $EPOCHREALTIME, awk and printf; byte order in sort

# ---- settings ---------------------------------------------------------------------------------

QUICK=${BENCH_QUICK:-0}
if [ "$QUICK" = 1 ]; then
    d_sizes="10000 30000" d_lat=3 d_warm=1 d_prod=3 d_snap=20 d_replay=10000
    d_payloads="1024:10000 512000:300"
else
    d_sizes="100000 1000000" d_lat=10 d_warm=3 d_prod=10 d_snap=600 d_replay=100000
    d_payloads="1024:100000 10240:20000 512000:3000"
fi
SIZES=${BENCH_SIZES:-$d_sizes}
TUNED_FLAGS=${BENCH_TUNED_FLAGS-"--batch-size 2000 --kafka linger.ms=1"}
ONE_SESSION=${BENCH_ONE_SESSION:-1}
ON_SENT_DELETE=${BENCH_ON_SENT_DELETE:-1}
RATES=${BENCH_RATES:-1000 5000 10000 5000x10 10000x10}
# A latency row's SPEC is RATE or RATExN: RATE events/s, N (default 1) per transaction.
spec_per() {
    if [[ $1 == *x* ]]; then echo "${1#*x}"; else echo 1; fi
}
spec_tx_rate() { # transactions/s
    echo $((${1%x*} / $(spec_per "$1")))
}
for spec in $RATES; do
    if ! [[ $spec =~ ^[1-9][0-9]*(x[1-9][0-9]*)?$ ]] || [ $((${spec%x*} % $(spec_per "$spec"))) != 0 ]; then
        echo "bench: BENCH_RATES: '$spec' is not RATE or RATExN (N dividing RATE)" >&2
        exit 2
    fi
done
LAT_S=${BENCH_LATENCY_SECONDS:-$d_lat}
WARM_S=${BENCH_WARMUP_SECONDS:-$d_warm}
LAT_CLIENTS=${BENCH_LATENCY_CLIENTS:-4}
PROD_CLIENTS=${BENCH_PRODUCER_CLIENTS:-1 4}
PROD_S=${BENCH_PRODUCER_SECONDS:-$d_prod}
PROD_MODES=${BENCH_PRODUCER_MODES:-idle relay}
PROD_ROUNDS=${BENCH_PRODUCER_ROUNDS:-5}
[[ $PROD_ROUNDS =~ ^[1-9][0-9]*$ ]] || {
    echo "bench: BENCH_PRODUCER_ROUNDS must be a positive integer" >&2
    exit 2
}
# auto.offset.reset=error: a consumer that fell behind the broker's retention (5 MB a partition)
# reports it, and the run's missing events fail it, instead of jumping silently to the end.
CONSUMER_KAFKA=${BENCH_CONSUMER_KAFKA:-fetch.wait.max.ms=1 auto.offset.reset=error}
PG_DELAY_US=${BENCH_PG_DELAY_US:-}
[[ -z $PG_DELAY_US || $PG_DELAY_US =~ ^[0-9]+$ ]] ||
    { echo "bench: BENCH_PG_DELAY_US must be a number of microseconds" >&2; exit 2; }
RELAY_DB_URL= # the latency runs' relays' database URL (through the delay proxy when one is set)
SYNC_STANDBY_DELAY_US=${BENCH_SYNC_STANDBY_DELAY_US:-}
SYNC_STANDBY_RAN= # set once the latency runs ran with the standby
[[ -z $SYNC_STANDBY_DELAY_US || $SYNC_STANDBY_DELAY_US =~ ^[0-9]+$ ]] ||
    { echo "bench: BENCH_SYNC_STANDBY_DELAY_US must be a number of microseconds" >&2; exit 2; }
BROKERS_N=${BENCH_BROKERS:-3}
PARTITIONS=${BENCH_PARTITIONS:-6}
# One partition in the runs a consumer reads: librdkafka 2.0.2's mock broker finds a fetch's
# offset by walking the partition's whole list of message sets (rdkafka_mock.c, "FIXME: Maintain
# an index"; it keeps up to 5 MB of them per partition), so every fetch costs more as the log
# fills. Measured once (2026-11-24) at 5,000 events/s (500 tx × 10), 30 s: with 6 partitions the
# broker's one thread climbed from 0.05 to 0.6 of a CPU within 10 s, 71 % of its samples in that
# walk (perf), taken from the same two CPUs as PostgreSQL and the relay; with one partition it
# stayed at 0.13 (each batch is one message set, not six small ones, and the one partition's
# 5 MB fill six times sooner). No Kafka broker has that cost. It changes the relay's producing
# too (one leader, one message set a batch, and the idempotent producer's in-flight limit on one
# partition instead of six), so BENCH_CONTROL_RATES also run on a BENCH_PARTITIONS topic in the
# same rounds.
LATENCY_PARTITIONS=${BENCH_LATENCY_PARTITIONS:-1}
CONTROL_RATES=${BENCH_CONTROL_RATES-1000 5000x10}
[ "$LATENCY_PARTITIONS" = "$PARTITIONS" ] && CONTROL_RATES=
SHARED_BUFFERS=${BENCH_SHARED_BUFFERS:-1GB}
POLL_MS=${BENCH_POLL_MS:-50}
REPEAT=${BENCH_REPEAT:-1}
LAT_ROUNDS=${BENCH_LATENCY_ROUNDS:-$REPEAT}
[[ $LAT_ROUNDS =~ ^[1-9][0-9]*$ ]] || {
    echo "bench: BENCH_LATENCY_ROUNDS must be a positive integer" >&2
    exit 2
}
[[ $REPEAT =~ ^[1-9][0-9]*$ ]] || {
    echo "bench: BENCH_REPEAT must be a positive integer" >&2
    exit 2
}
PARTS=" ${BENCH_PARTS:-drain replay latency producers payloads snapshot multidb} "
REPLAY_SIZE=${BENCH_REPLAY_SIZE:-$d_replay}
[[ $REPLAY_SIZE =~ ^[1-9][0-9]*$ ]] || {
    echo "bench: BENCH_REPLAY_SIZE must be a positive integer" >&2
    exit 2
}
AVRO=${BENCH_AVRO:-1}
command -v node >/dev/null || AVRO=0
SNAP_S=${BENCH_SNAPSHOT_SECONDS:-$d_snap}
SNAP_RATE=${BENCH_SNAPSHOT_RATE:-3000}
PAYLOADS=${BENCH_PAYLOADS:-$d_payloads}
TOPIC=outbox.event.order
BOUND_BATCH=1000 # rows per statement of the PostgreSQL-only bound (bench/claim_*.sql)
if [ "$QUICK" = 1 ]; then
    OUT=${BENCH_OUT:-$ROOT/bin/bench-quick.md}
else
    OUT=${BENCH_OUT:-$ROOT/docs/benchmarks.md}
fi
read -r -a SIZE_LIST <<<"$SIZES"
read -r -a TUNED <<<"$TUNED_FLAGS"
MAX_SIZE=0 MIN_SIZE=
for n in "${SIZE_LIST[@]}"; do
    if ! [[ $n =~ ^[1-9][0-9]*$ ]] || [ $((n % BOUND_BATCH)) -ne 0 ]; then
        echo "bench: BENCH_SIZES: $n is not a positive multiple of $BOUND_BATCH" >&2
        exit 2
    fi
    [ "$n" -gt "$MAX_SIZE" ] && MAX_SIZE=$n
    { [ -z "$MIN_SIZE" ] || [ "$n" -lt "$MIN_SIZE" ]; } && MIN_SIZE=$n
done
[ "$MAX_SIZE" -gt 0 ] || {
    echo "bench: BENCH_SIZES is empty" >&2
    exit 2
}
if [ -n "${BENCH_NAIVE_SIZE:-}" ]; then
    NAIVE_SIZE=$BENCH_NAIVE_SIZE
    if ! [[ $NAIVE_SIZE =~ ^[1-9][0-9]*$ ]] || [ $((NAIVE_SIZE % BOUND_BATCH)) -ne 0 ]; then
        echo "bench: BENCH_NAIVE_SIZE: not a positive multiple of $BOUND_BATCH" >&2
        exit 2
    fi
    [ "$NAIVE_SIZE" -gt "$MAX_SIZE" ] && MAX_SIZE=$NAIVE_SIZE
elif [[ " $SIZES " == *" 100000 "* ]]; then
    NAIVE_SIZE=100000
else
    NAIVE_SIZE=$MIN_SIZE
fi
for f in "$RELAY_BIN" ${BASELINE_BIN:+"$BASELINE_BIN"} "$BIN/naive-relay" "$BIN/consume" "$BIN/mock-broker"; do
    [ -x "$f" ] || {
        echo "bench: $f missing; run 'make bench'" >&2
        exit 2
    }
done
command -v pgbench >/dev/null || {
    echo "bench: pgbench missing (Debian: postgresql-client or postgresql)" >&2
    exit 2
}

# ---- small helpers ----------------------------------------------------------------------------

now_us() {
    echo "${EPOCHREALTIME/./}"
}

# Numbers for people: 1234567 -> 1,234,567; "" or "-" stay as they are.
commas() {
    awk -v x="$1" 'BEGIN {
        if (x == "" || x == "-") { print x; exit }
        s = sprintf("%.0f", x); o = ""
        while (length(s) > 3) { o = "," substr(s, length(s) - 2) o; s = substr(s, 1, length(s) - 3) }
        print s o }'
}

# calc EXPR [FORMAT]: awk arithmetic; "-" when an operand is empty or "-".
calc() {
    local v
    v=$(awk "BEGIN { printf \"${2:-%.2f}\", $1 }" 2>/dev/null)
    echo "${v:--}"
}

# ratio A B: A/B with two decimals, "-" when either is missing or B is 0.
ratio() {
    if [ -z "$1" ] || [ -z "$2" ] || [ "$1" = - ] || [ "$2" = - ]; then
        echo -
        return
    fi
    awk -v a="$1" -v b="$2" 'BEGIN { if (b + 0 == 0) print "-"; else printf "%.2f", a / b }'
}

note() {
    NOTES+=("$*")
    echo "# $*"
}

say() {
    echo "# [$(date -u +%H:%M:%S)] $*"
}

# Removes a pid from lib.sh's cleanup list once we reaped it ourselves, so the exit trap never
# signals a recycled pid.
untrack() {
    local keep=() p
    for p in "${_T_PIDS[@]}"; do
        [ "$p" = "$1" ] || keep+=("$p")
    done
    _T_PIDS=("${keep[@]}")
}

# start_bg LOG CMD...: runs CMD in the background (stdout+stderr to LOG); sets BG_PID.
start_bg() {
    local log=$1
    shift
    "$@" >"$log" 2>&1 &
    BG_PID=$!
    _t_track "$BG_PID"
}

# stop_bg PID [LIMIT_S [WHAT LOG]]: SIGTERM, wait, return the exit status (137 if it had to be
# killed; then, given WHAT and LOG, first shows what the database sessions wait on and LOG's end).
stop_bg() {
    local pid=$1 limit=${2:-30} rc
    kill -TERM "$pid" 2>/dev/null
    if ! _poll "$limit" _t_dead "$pid"; then
        if [ -n "${3:-}" ]; then
            note "$3: still running ${limit} s after SIGTERM, killed"
            diagnose "$3" "$4"
        fi
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
        untrack "$pid"
        return 137
    fi
    wait "$pid" 2>/dev/null
    rc=$?
    untrack "$pid"
    return "$rc"
}

# proc_status_kb PID FIELD: a kB figure of /proc/PID/status (VmRSS, VmHWM) into KB, read
# without starting a process (it runs at every completion poll).
proc_status_kb() {
    local k v _
    KB=
    while read -r k v _; do
        if [ "$k" = "$2:" ]; then
            KB=$v
            return 0
        fi
    done <"/proc/$1/status" 2>/dev/null
    return 1
}

# cpu_seconds PID: user + system CPU time so far (all threads), seconds.
cpu_seconds() {
    local stat rest
    read -r stat <"/proc/$1/stat" 2>/dev/null || return 1
    rest=${stat##*) }
    # shellcheck disable=SC2086
    set -- $rest
    awk -v u="${12}" -v s="${13}" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.2f", (u + s) / hz }'
}

# pg_cpu_seconds: CPU time (user + system) PostgreSQL's processes have used so far: the
# postmaster's own, what it reaped of backends that exited (cutime, cstime) and each live child's.
# The difference over a measurement is what it cost PostgreSQL, a figure the machine's other load
# changes far less than the measurement's wall time.
pg_cpu_seconds() {
    local pm p stat rest ticks=0
    read -r pm <"$T/pg/postmaster.pid" 2>/dev/null || return 1
    for p in "$pm" $(pgrep -P "$pm"); do
        read -r stat <"/proc/$p/stat" 2>/dev/null || continue
        rest=${stat##*) }
        # shellcheck disable=SC2086
        set -- $rest
        ticks=$((ticks + ${12} + ${13}))
        [ "$p" = "$pm" ] && ticks=$((ticks + ${14} + ${15}))
    done
    awk -v t="$ticks" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.2f", t / hz }'
}

mb() {
    [ -n "$1" ] && awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }' || echo -
}

# log_problems WHAT LOG: notes warn and error lines of a relay log (none expected in a run).
log_problems() {
    local n
    n=$(grep -cE 'level=(warn|error)' "$2")
    [ "$n" -gt 0 ] && note "$1: the relay logged $n warning/error line(s), first: $(grep -m 1 -E 'level=(warn|error)' "$2" | cut -c 1-200)"
    return 0
}

# diagnose WHAT [LOG]: shows (and keeps in the temp dir) what the database's sessions are doing
# and waiting on, and the end of LOG: for a relay that hangs.
diagnose() {
    local f=$T/diagnose.${1//[^a-zA-Z0-9.]/_}.txt
    {
        echo "== sessions"
        timeout 10 psql -X -c "SELECT pid, application_name, state, wait_event_type, wait_event,
                now() - xact_start AS xact_age, left(query, 100) AS query
            FROM pg_stat_activity WHERE backend_type = 'client backend'
            AND pid <> pg_backend_pid()"
        echo "== locks not granted"
        timeout 10 psql -X -c "SELECT l.pid, l.locktype, l.mode, l.relation::regclass, l.objid
            FROM pg_locks l WHERE NOT l.granted"
        if [ -n "${2:-}" ]; then
            echo "== last lines of $(basename "$2")"
            tail -n 15 "$2"
        fi
    } >"$f" 2>&1
    sed 's/^/#   /' "$f"
}

_ready_or_dead() {
    grep -q 'msg="lanes owned"' "$1" || _t_dead "$2"
}

# wait_ready WHAT LOG PID: waits up to 30 s for the relay's "lanes owned" line (it claims
# next); when it does not come, notes it and shows what the database sessions are waiting on.
wait_ready() {
    _poll 30 _ready_or_dead "$2" "$3"
    grep -q 'msg="lanes owned"' "$2" && return 0
    if _t_dead "$3"; then
        note "$1: the relay exited at start-up: $(tail -n 1 "$2" | cut -c 1-200)"
    else
        note "$1: no 'lanes owned' line from the relay within 30 s"
        diagnose "$1" "$2"
    fi
    return 1
}

# ---- PostgreSQL, the broker and the persistent query session ------------------------------

# A psql session kept open for the completion polls (a new psql per poll would cost a fork, an
# exec and a backend start 20 times a second, on the same two cores the relay runs on).
open_poller() {
    coproc POLLQ { exec psql -XAtq -v ON_ERROR_STOP=0 2>&1; }
    _t_track "$POLLQ_PID"
}

# pq SQL: one row, one column, into REPLY (empty on timeout).
pq() {
    REPLY=
    printf '%s;\n' "$1" >&"${POLLQ[1]}" || return 1
    IFS= read -r -t 30 REPLY <&"${POLLQ[0]}"
}

# fresh_broker [PARTITIONS]: a new mock cluster for every measurement (empty logs, the topic
# pre-created with PARTITIONS partitions, default BENCH_PARTITIONS), so no run sees another run's
# messages.
fresh_broker() {
    if [ -n "${BROKER_PID:-}" ]; then
        stop_bg "$BROKER_PID" 10
        BROKER_PID=
    fi
    # broker_start waits for its output file to fill; the previous broker's must not count.
    rm -f "$T/broker.out"
    broker_start "$BROKERS_N" --topic "$TOPIC" --partitions "${1:-$PARTITIONS}" --tcp-nodelay
}

# reset_outbox N: the outbox as it was before every drain: truncated, the first N seed rows
# copied in id order (ids 1..N), vacuumed and analysed (visibility map and hint bits set, fresh
# statistics), then a checkpoint, so no drain pays for the previous one's dirty pages.
reset_outbox() {
    psql_q "TRUNCATE outbox RESTART IDENTITY" &&
        psql_q "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload,
                                    headers)
                SELECT event_id, aggregate_type, aggregate_id, event_type, payload, headers
                FROM ${SEED_TABLE:-bench_seed} WHERE n <= $1 ORDER BY n" &&
        psql_q "VACUUM (ANALYZE) outbox" && psql_q "CHECKPOINT" ||
        fail "reset the outbox to $1 rows"
}

empty_outbox() {
    psql_q "TRUNCATE outbox RESTART IDENTITY" && psql_q "CHECKPOINT" || fail "empty the outbox"
}

# ---- drains -----------------------------------------------------------------------------------

# wait_drained PID FIRST_ID LAST_ID T0_US LIMIT_S: polls every BENCH_POLL_MS until no unsent row
# remains; the backlog is the rows FIRST_ID..LAST_ID. The cheap poll is the primary-key lookup of
# the last row of each lane (LANE_LASTS, an array literal: claims go in id order within a lane,
# and lanes are claimed side by side by the sessions, so the last row of the backlog alone is
# sent while other lanes still have rows); once they are all sent, one check of the whole
# partial index confirms (if rows are still unsent, that check repeats). That check is not a
# poll: after --on-sent delete it walks every deleted row's index entry (measured: 0.2-0.6 s on
# a loaded machine after 100,000 deletes), so each failed one made the end late. Sets DONE_US (after the poll that saw
# the drain complete), FIRST_US (after the poll that first saw row FIRST_ID sent: the end of the
# first batch) and RSS samples (RSS_AT: "elapsed_us rss_kb" lines). Returns 0 drained, 1 timed
# out, 2 the process died.
wait_drained() {
    local pid=$1 first=$2 last=$3 t0=$4 limit=$5 mode=last now
    local sleep_s
    sleep_s=$(awk -v m="$POLL_MS" 'BEGIN { printf "%.3f", m / 1000 }')
    RSS_AT=()
    FIRST_US=
    while :; do
        if [ -z "$FIRST_US" ]; then
            pq "SELECT NOT EXISTS (SELECT 1 FROM outbox WHERE id = $first AND sent_at IS NULL)"
            if [ "$REPLY" = t ]; then
                FIRST_US=${EPOCHREALTIME/./}
                # Rows already sent at that moment (claims go in id order, so they are among the
                # first ids): the steady rate counts only the rows sent after it.
                # (Rows not unsent: --on-sent delete leaves no sent rows to count.)
                pq "SELECT least($last, $first + 199999) - $first + 1 - count(*) FROM outbox
                    WHERE id BETWEEN $first AND $first + 199999 AND sent_at IS NULL"
                FIRST_SENT=$REPLY
            fi
        fi
        if [ "$mode" = last ]; then
            pq "SELECT NOT EXISTS (SELECT 1 FROM outbox WHERE id = ANY('$LANE_LASTS'::bigint[])
                AND sent_at IS NULL)"
            [ "$REPLY" = t ] && mode=all
        fi
        now=${EPOCHREALTIME/./}
        if [ "$mode" = all ]; then
            pq "SELECT NOT EXISTS (SELECT 1 FROM outbox WHERE sent_at IS NULL)"
            if [ "$REPLY" = t ]; then
                DONE_US=$now
                return 0
            fi
        fi
        proc_status_kb "$pid" VmRSS && RSS_AT+=("$((now - t0)) $KB")
        _t_dead "$pid" && return 2
        [ $((now - t0)) -gt $((limit * 1000000)) ] && return 1
        sleep "$sleep_s"
    done
}

# startup_s LOG T0_US: seconds from start to the relay's first "lanes owned" line (it claims
# right after), or "-".
startup_s() {
    local ts us
    ts=$(grep -m 1 'msg="lanes owned"' "$1" | cut -d ' ' -f 1)
    [ -n "$ts" ] || {
        echo -
        return
    }
    us=$(date -u -d "$ts" +%s%6N 2>/dev/null) || {
        echo -
        return
    }
    calc "($us - $2) / 1000000"
}

# rss_at FRACTION: the RSS sample closest after FRACTION of the drain time, in kB.
rss_at() {
    local at line
    at=$(awk -v d="$1" -v f="$2" 'BEGIN { printf "%d", d * f }')
    for line in "${RSS_AT[@]}"; do
        if [ "${line% *}" -ge "$at" ]; then
            echo "${line#* }"
            return
        fi
    done
    [ ${#RSS_AT[@]} -gt 0 ] && echo "${RSS_AT[-1]#* }"
}

# drain KEY N KIND [FLAGS...]: KIND relay (bin/outbox-relay run FLAGS) or naive
# (bin/naive-relay). Times from process start until no unsent row remains. Results go to
# R_RATE[KEY], R_SECS, R_HWM (kB), R_RSS10 / R_RSS50 / R_RSSEND (kB), R_CPU (s), R_START (s).
drain() {
    local key=$1 n=$2
    say "drain $key: resetting the outbox to $(commas "$n") rows"
    reset_outbox "$n"
    drain_rows "$key" "$n" 1 "${@:3}"
}

# drain_rows KEY N FIRST_ID KIND [FLAGS...]: drain's measurement of a backlog already in the
# outbox, the N unsent rows FIRST_ID..FIRST_ID+N-1 (drain KEY N KIND: a reset outbox's 1..N).
drain_rows() {
    local key=$1 n=$2 first=$3 kind=$4 log pid t0 rc src sent cpu hwm dur limit partial pg0
    shift 4
    fresh_broker
    LANE_LASTS=$(psql_q "SELECT array_agg(m) FROM (SELECT max(id) AS m FROM outbox
                         WHERE id BETWEEN $first AND $((first + n - 1)) GROUP BY lane) l")
    log=$T/drain.$key.log
    pg0=$(pg_cpu_seconds)
    t0=$(now_us)
    if [ "$kind" = naive ]; then
        start_bg "$log" "$BIN/naive-relay" --database-url "$DATABASE_URL" --brokers "$BROKERS" "$@"
        limit=$((60 + n / 200))
    else
        local bin=$RELAY_BIN
        [ "$kind" = baseline ] && bin=$BASELINE_BIN && kind=relay
        start_bg "$log" "$bin" run --database-url "$DATABASE_URL" --brokers "$BROKERS" "$@"
        limit=$((60 + n / 1000))
    fi
    pid=$BG_PID
    say "drain $key: $kind running (pid $pid), polling every ${POLL_MS} ms, at most ${limit} s"
    [ "${BENCH_PERF:-0}" = 1 ] && [ "$key" = "$PERF_KEY" ] && perf_start "$pid"
    DONE_US=
    wait_drained "$pid" "$first" "$((first + n - 1))" "$t0" "$limit"
    rc=$?
    [ -n "${PERF_PID:-}" ] && perf_stop
    if [ "$rc" = 0 ] && [ "$kind" = relay ]; then
        # The polls see the end up to one poll late (25 ms on average, 2 % of a 100,000-row
        # drain); the last row's sent_at is when it was marked (clock_timestamp() in the mark
        # statement, on this machine's clock), its COMMIT following in the same pipeline.
        pq "SELECT (extract(epoch FROM max(sent_at)) * 1000000)::bigint FROM outbox"
        [[ $REPLY =~ ^[0-9]+$ ]] && [ "$REPLY" -gt "$t0" ] && [ "$REPLY" -le "$DONE_US" ] &&
            DONE_US=$REPLY
    fi
    [ "$rc" = 0 ] || DONE_US=$(now_us)
    dur=$((DONE_US - t0))
    R_START[$key]=-
    [ "$kind" = relay ] && R_START[$key]=$(startup_s "$log" "$t0")
    proc_status_kb "$pid" VmHWM
    hwm=$KB
    cpu=$(cpu_seconds "$pid")
    R_PGCPU[$key]=$(calc "$(pg_cpu_seconds) - $pg0")
    R_BCPU[$key]=$(cpu_seconds "$BROKER_PID")
    partial=
    # Every round's CPU in the log (the report shows the last round's): per-round figures.
    say "drain $key: CPU s relay / PostgreSQL / broker: $cpu / ${R_PGCPU[$key]} / ${R_BCPU[$key]}"
    case $rc in
    0) ok "$key: $(commas "$n") rows drained in $(calc "$dur / 1000000") s" ;;
    1)
        partial=$(psql_q "SELECT $n - count(*) FROM outbox WHERE sent_at IS NULL") # or deleted
        not_ok "$key: drained within ${limit} s" "$(commas "$partial") of $(commas "$n") sent"
        diagnose "drain $key" "$log"
        ;;
    2)
        not_ok "$key: $kind stayed up while draining" "exited early"
        tail -n 15 "$log" | sed 's/^/#   /'
        ;;
    esac
    stop_bg "$pid" 30 "drain $key" "$log"
    src=$?
    [ "$src" = 0 ] || not_ok "$key: $kind exits 0 on SIGTERM" "status $src"
    if [ "$kind" = naive ]; then
        sent=$(sed -n 's/^naive-relay: sent \([0-9]*\)$/\1/p' "$log" | tail -n 1)
    else
        sent=$(sed -n 's/.*msg="stopped" sent=\([0-9]*\).*/\1/p' "$log" | tail -n 1)
    fi
    if [ "$rc" = 0 ]; then
        check_eq "$key: the $kind's own count of sent events (log) matches" "$n" "${sent:-?}"
        R_RATE[$key]=$(calc "$n * 1000000 / $dur" %.0f)
        R_STEADY[$key]=-
        [ -n "$FIRST_US" ] && [ "$DONE_US" -gt "$FIRST_US" ] &&
            R_STEADY[$key]=$(calc "($n - $FIRST_SENT) * 1000000 / ($DONE_US - $FIRST_US)" %.0f)
    elif [ "$rc" = 1 ]; then
        R_RATE[$key]=$(calc "$partial * 1000000 / $dur" %.0f)
        R_NOTE[$key]="timed out after $(calc "$dur / 1000000" %.0f) s with $(commas "$partial") rows sent; rate over that part"
    else
        R_RATE[$key]=-
    fi
    R_SECS[$key]=$(calc "$dur / 1000000")
    R_FIRST[$key]=-
    [ -n "$FIRST_US" ] && R_FIRST[$key]=$(calc "($FIRST_US - $t0) / 1000000")
    R_HWM[$key]=$hwm
    R_CPU[$key]=$cpu
    R_RSS10[$key]=$(rss_at "$dur" 0.1)
    R_RSS50[$key]=$(rss_at "$dur" 0.5)
    R_RSSEND[$key]=$(rss_at "$dur" 1)
    log_problems "drain $key" "$log"
    R_ALL[$key]+="${R_RATE[$key]} "
    say "drain $key: $(commas "${R_RATE[$key]}") events/s, ${R_SECS[$key]} s, start-up ${R_START[$key]} s, first row sent at ${R_FIRST[$key]} s, CPU ${cpu} s (PostgreSQL ${R_PGCPU[$key]} s, broker ${R_BCPU[$key]} s), VmHWM $(mb "$hwm") MB"
}

# bound KEY N FILE: the PostgreSQL-only bound, pgbench -c 1 running FILE N/1000 times back to
# back (each statement claims and marks or deletes 1,000 rows); rows/s = pgbench tps x 1000.
bound() {
    local key=$1 n=$2 file=$3 out tps left pg0
    say "bound $key: resetting the outbox to $(commas "$n") rows"
    reset_outbox "$n"
    out=$T/bound.$key.out
    pg0=$(pg_cpu_seconds)
    timeout -k 5 $((60 + n / 1000)) pgbench -n -M prepared -c 1 -t $((n / BOUND_BATCH)) \
        -f "$file" >"$out" 2>&1
    R_PGCPU[$key]=$(calc "$(pg_cpu_seconds) - $pg0")
    tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$out" | head -n 1)
    left=$(psql_q "SELECT count(*) FROM outbox WHERE sent_at IS NULL")
    if [ -n "$tps" ] && [ "$left" = 0 ]; then
        ok "$key: pgbench claimed all $(commas "$n") rows"
        R_RATE[$key]=$(calc "$tps * $BOUND_BATCH" %.0f)
        R_SECS[$key]=$(calc "$n / ($tps * $BOUND_BATCH)")
    else
        not_ok "$key: pgbench claimed all $(commas "$n") rows" "$left left; $(tail -n 3 "$out" | tr '\n' ' ')"
        R_RATE[$key]=- R_SECS[$key]=-
    fi
    say "bound $key: $(commas "${R_RATE[$key]}") rows/s, PostgreSQL CPU ${R_PGCPU[$key]} s"
    R_ALL[$key]+="${R_RATE[$key]} "
}

# median_spread VALUES...: "MEDIAN MIN–MAX" of the numeric values (for an even count the median
# is the mean of the middle two), "- -" when there are none.
median_spread() {
    printf '%s\n' "$@" | grep -E '^[0-9.]+$' | sort -g | awk '{ v[NR] = $1 }
        END { if (NR == 0) { print "- -"; exit }
              m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
              printf "%s %s–%s\n", m, v[1], v[NR] }'
}

# take_medians: with several rounds, each drain rate becomes the median of its rounds (seconds
# follow from it) and R_SPREAD keeps "min–max"; other columns are the last round's.
take_medians() {
    local key n
    [ "$REPEAT" -gt 1 ] || return 0
    for key in "${!R_ALL[@]}"; do
        # shellcheck disable=SC2086 # one value per word
        read -r R_RATE["$key"] R_SPREAD["$key"] < <(median_spread ${R_ALL[$key]})
        R_RATE[$key]=$(calc "${R_RATE[$key]}" %.0f)
        n=${key#*.}
        R_SECS[$key]=$(calc "$n / ${R_RATE[$key]}")
    done
}

# ---- latency ----------------------------------------------------------------------------------

# percentiles COLUMN FILE: "p50 p99 max" in ms of a column of microseconds (nearest rank).
percentiles() {
    awk -v c="$1" '{ print $c }' "$2" | sort -n | awk '{ v[NR] = $1 }
        function rank(p,  r) { r = int(p * NR); if (r < p * NR) r++; if (r < 1) r = 1; return v[r] }
        END { if (NR == 0) { print "- - -"; exit }
              printf "%.2f %.2f %.2f\n", rank(0.50) / 1000, rank(0.99) / 1000, v[NR] / 1000 }'
}

# short_of TPS TX_RATE: true if pgbench's TPS fell short of the TX_RATE it was asked for (under
# 95 %): the machine could not insert faster, so the row's latencies are at the lower rate.
short_of() {
    awk -v a="$1" -v r="$2" 'BEGIN { exit !(a < 0.95 * r) }'
}

# latency KEY SPEC [RELAY FLAGS...]: an empty outbox, a relay, a consumer reading the topic from
# the start; pgbench inserts RATE events a second (SPEC RATE or RATExN: single-event
# transactions, or RATE/N transactions of N events), first BENCH_WARMUP_SECONDS
# of warm-up, then BENCH_LATENCY_SECONDS measured. An event's latency is the consumer's receive
# time minus the committed_us in its payload; measured events are those with committed_us after
# the warm-up ended. Results in L_*[KEY].
latency() {
    local key=$1 rate=${2%x*} relay_pid cons_pid t_meas out cons props=() p
    local per tx_rate script=$BENCH/insert_event.sql
    per=$(spec_per "$2")
    tx_rate=$(spec_tx_rate "$2")
    [ "$per" = 1 ] || script=$BENCH/insert_events.sql
    shift 2
    say "latency $key: $rate events/s ($tx_rate tx/s of $per), ${WARM_S} s warm-up + ${LAT_S} s measured"
    empty_outbox
    if [[ $key == control.* ]]; then
        fresh_broker "$PARTITIONS"
    else
        fresh_broker "$LATENCY_PARTITIONS"
    fi
    local bin=$RELAY_BIN
    [[ $key == baseline.* ]] && bin=$BASELINE_BIN
    start_bg "$T/latency.$key.relay.log" "$bin" run --database-url "${RELAY_DB_URL:-$DATABASE_URL}" \
        --brokers "$BROKERS" "$@"
    relay_pid=$BG_PID
    wait_ready "latency $key" "$T/latency.$key.relay.log" "$relay_pid"
    for p in $CONSUMER_KAFKA; do
        props+=(--kafka "$p")
    done
    # --tsv: the consumer's JSON lines cost it 0.3 of a CPU at 10,000 events/s, taken from the
    # CPUs it shares with what it measures; tab-separated fields cost a fraction of that.
    cons=$T/latency.$key.tsv
    "$BIN/consume" --brokers "$BROKERS" --topic "$TOPIC" "${props[@]}" --idle-ms 5000 --tsv id \
        --timeout-ms $(((WARM_S + LAT_S + 90) * 1000)) >"$cons" 2>"$T/latency.$key.consume.err" &
    cons_pid=$!
    _t_track "$cons_pid"
    local jobs=$((LAT_CLIENTS < 2 ? LAT_CLIENTS : 2))
    timeout -k 5 $((WARM_S + 60)) pgbench -n -M prepared -c "$LAT_CLIENTS" -j "$jobs" -R "$tx_rate" \
        -T "$WARM_S" -D events="$per" -f "$script" >"$T/latency.$key.warmup.out" 2>&1 ||
        not_ok "latency $key: warm-up pgbench" "$(tail -n 2 "$T/latency.$key.warmup.out")"
    [ -s "$cons" ] || note "latency $key: the consumer had received nothing by the end of the warm-up"
    t_meas=$(now_us)
    out=$T/latency.$key.pgbench.out
    timeout -k 5 $((LAT_S + 60)) pgbench -n -M prepared -c "$LAT_CLIENTS" -j "$jobs" -R "$tx_rate" \
        -T "$LAT_S" -D events="$per" -f "$script" >"$out" 2>&1 ||
        not_ok "latency $key: pgbench" "$(tail -n 2 "$out")"
    # The consumer stops 5 s after the last message.
    _poll $((LAT_S + 90)) _t_dead "$cons_pid" || kill -TERM "$cons_pid" 2>/dev/null
    wait "$cons_pid" 2>/dev/null
    untrack "$cons_pid"
    L_CPU[$key]=$(cpu_seconds "$relay_pid")
    L_BCPU[$key]=$(cpu_seconds "$BROKER_PID")
    [ -s "$T/latency.$key.consume.err" ] &&
        note "latency $key: the consumer reported: $(head -c 300 "$T/latency.$key.consume.err" | tr '\n' ' ')"
    stop_bg "$relay_pid" 30 "latency $key" "$T/latency.$key.relay.log" ||
        not_ok "latency $key: relay exits 0 on SIGTERM"

    log_problems "latency $key" "$T/latency.$key.relay.log"
    L_TPS[$key]=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$out" | head -n 1)
    short_of "${L_TPS[$key]:-0}" "$tx_rate" &&
        note "latency $key: pgbench reached only $(calc "${L_TPS[$key]:-0}" %.0f) of $tx_rate tx/s (the machine could not insert faster); latencies are at that rate"
    L_LAG[$key]=$(sed -n 's/^rate limit schedule lag: avg \([0-9.]*\) (max \([0-9.]*\)) ms$/\1\/\2/p' "$out")
    L_INSERTED[$key]=$(psql_q "SELECT count(*) FROM outbox WHERE (payload->>'committed_us')::bigint >= $t_meas")
    # First copies only (by id header; later copies counted as duplicates): total latency, and
    # its split at the message's Kafka timestamp (the relay's produce call, ms precision).
    # The consumer's lines: received_us, timestamp_ms, the id header, the value (the payload's
    # JSON text, committed_us among its keys).
    awk -F '\t' -v t="$t_meas" -v dups="$T/latency.$key.dups" '
        !match($4, /"committed_us": *[0-9]+/) { next }
        { c = substr($4, RSTART, RLENGTH); sub(/.*: */, "", c); c += 0 }
        c < t { next }
        $3 in seen { d++; next }
        { seen[$3] = 1; print $1 - c, $2 * 1000 - c, $1 - $2 * 1000 }
        END { print d + 0 > dups }' "$cons" >"$T/latency.$key.us"
    L_DUPS[$key]=$(cat "$T/latency.$key.dups")
    L_N[$key]=$(grep -c '' "$T/latency.$key.us")
    read -r "L_P50[$key]" "L_P99[$key]" "L_MAX[$key]" < <(percentiles 1 "$T/latency.$key.us")
    read -r "L_RP50[$key]" "L_RP99[$key]" _ < <(percentiles 2 "$T/latency.$key.us")
    read -r "L_KP50[$key]" "L_KP99[$key]" _ < <(percentiles 3 "$T/latency.$key.us")
    L_MISSING[$key]=$((${L_INSERTED[$key]:-0} - L_N[$key]))
    if [ "${L_MISSING[$key]}" = 0 ] && [ "${L_N[$key]}" -gt 0 ]; then
        ok "latency $key: all $(commas "${L_N[$key]}") measured events read back"
    else
        not_ok "latency $key: all measured events read back" \
            "${L_INSERTED[$key]} inserted, ${L_N[$key]} read"
    fi
    say "latency $key: p50 ${L_P50[$key]} ms, p99 ${L_P99[$key]} ms, max ${L_MAX[$key]} ms over $(commas "${L_N[$key]}") events (${L_TPS[$key]} tx/s, pgbench schedule lag avg/max ${L_LAG[$key]:-?} ms)"
}

# latency_medians: for each latency row (KEY without its round), the round with the median p50
# (the lower middle of an even count) gives all its figures; L_SPREAD[KEY] is the p50s' min–max.
latency_medians() {
    local rate key round median f p50s
    for rate in $RATES; do
        for key in default.$rate baseline.$rate tuned.$rate control.$rate; do
            [ -n "${L_N[$key.1]:-}" ] || continue
            median=$(for ((round = 1; round <= LAT_ROUNDS; round++)); do
                echo "${L_P50[$key.$round]:-0} $round"
            done | sort -n | sed -n "$(((LAT_ROUNDS + 1) / 2))p" | cut -d ' ' -f 2)
            for f in L_TPS L_LAG L_INSERTED L_DUPS L_N L_P50 L_P99 L_MAX L_MISSING L_CPU L_BCPU \
                L_RP50 L_RP99 L_KP50 L_KP99; do
                local -n arr=$f
                arr[$key]=${arr[$key.$median]:-}
                unset -n arr
            done
            p50s=
            for ((round = 1; round <= LAT_ROUNDS; round++)); do
                p50s+="${L_P50[$key.$round]:-0} "
            done
            # shellcheck disable=SC2086 # one value per word
            read -r _ "L_SPREAD[$key]" < <(median_spread $p50s)
        done
    done
}

# ---- cost to producers ------------------------------------------------------------------------

TRIGGER_DEF=
trigger_off() {
    psql_q "SET client_min_messages = warning; DROP TRIGGER IF EXISTS outbox_wakeup ON outbox" ||
        fail "drop outbox_wakeup"
}
trigger_on() {
    psql_q "SET client_min_messages = warning; DROP TRIGGER IF EXISTS outbox_wakeup ON outbox;
            $TRIGGER_DEF" ||
        fail "recreate outbox_wakeup"
}

# producers CLIENTS MODE: insert transactions/s over BENCH_PRODUCER_SECONDS, without and then
# with the wakeup trigger; MODE relay runs a relay (--poll-interval 5) during both.
producers() {
    local c=$1 mode=$2 round trig arms key out tps relay_pid jobs=$(($1 < 2 ? $1 : 2))
    local -A all=() cpu=()
    local ratios=
    for ((round = 1; round <= PROD_ROUNDS; round++)); do
        # Alternating the order cancels drift of the machine's load between the two arms.
        arms="without with"
        [ $((round % 2)) = 0 ] && arms="with without"
        for trig in $arms; do
            key=$mode.$c.$trig
            empty_outbox
            if [ "$trig" = without ]; then trigger_off; else trigger_on; fi
            relay_pid=
            if [ "$mode" = relay ]; then
                fresh_broker
                # Both arms poll every 5 ms while asleep: without the trigger the relay would
                # otherwise hear of rows only at its 1 s timer, start late and drain in larger,
                # cheaper batches, and the arms would differ by more than the trigger.
                start_bg "$T/producers.$key.relay.log" "$RELAY_BIN" run \
                    --database-url "$DATABASE_URL" --brokers "$BROKERS" --poll-interval 5
                relay_pid=$BG_PID
                wait_ready "producers $key" "$T/producers.$key.relay.log" "$relay_pid"
            fi
            out=$T/producers.$key.out
            timeout -k 5 $((PROD_S + 60)) pgbench -n -M prepared -c "$c" -j "$jobs" -T "$PROD_S" \
                -f "$BENCH/insert_event.sql" >"$out" 2>&1 ||
                not_ok "producers $key: pgbench" "$(tail -n 2 "$out")"
            tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$out" | head -n 1)
            tps=$(calc "${tps:-0}" %.0f)
            all[$trig]+="$tps "
            if [ -n "$relay_pid" ]; then
                cpu[$trig]+="$(cpu_seconds "$relay_pid") "
                stop_bg "$relay_pid" 30 "producers $key" "$T/producers.$key.relay.log" ||
                    not_ok "producers $key: relay exits 0 on SIGTERM"
                log_problems "producers $key" "$T/producers.$key.relay.log"
            fi
            say "producers $key (round $round): $(commas "$tps") inserts/s"
        done
        ratios+="$(ratio "$(echo ${all[with]} | awk '{ print $NF }')" "$(echo ${all[without]} | awk '{ print $NF }')") "
    done
    trigger_on
    # shellcheck disable=SC2086 # one value per word
    for trig in without with; do
        read -r P_TPS["$mode.$c.$trig"] _ < <(median_spread ${all[$trig]})
        [ -n "${cpu[$trig]:-}" ] && read -r P_CPU["$mode.$c.$trig"] _ < <(median_spread ${cpu[$trig]})
    done
    # shellcheck disable=SC2086
    read -r P_RATIO["$mode.$c"] P_RATIO_SPREAD["$mode.$c"] < <(median_spread $ratios)
}

# ---- profile (optional) -----------------------------------------------------------------------

PERF_PID=
PERF_WHOM=
perf_start() {
    # A flat profile: the build has no frame pointers, so call graphs would be noise.
    local whom=(-p "$1")
    PERF_WHOM=$1
    if [ "${BENCH_PERF_ALL:-0}" = 1 ]; then
        # The machine is shared: record all of it, report this run's processes (perf_stop).
        whom=(-a)
        PERF_WHOM="$1,$BROKER_PID,$(head -n 1 "$T/pg/postmaster.pid")"
    fi
    perf record -e cpu-clock -F 999 "${whom[@]}" -o "$T/perf.data" >"$T/perf.log" 2>&1 &
    PERF_PID=$!
    _t_track "$PERF_PID"
}
perf_stop() {
    kill -INT "$PERF_PID" 2>/dev/null
    _poll 30 _t_dead "$PERF_PID"
    wait "$PERF_PID" 2>/dev/null
    untrack "$PERF_PID"
    PERF_PID=
    local pids=$PERF_WHOM sort=dso what="relay" p
    if [ "${BENCH_PERF_ALL:-0}" = 1 ]; then
        # PostgreSQL's processes: the postmaster's children now (the relay's backends are gone
        # by now only if it exited, and it has not: perf_stop runs before it is stopped).
        for p in $(pgrep -P "${PERF_WHOM##*,}"); do
            pids+=",$p"
        done
        sort=comm,dso what="the relay, PostgreSQL's processes and the broker"
    fi
    {
        echo "# CPU of $what by shared object, then by symbol (perf report; libraries"
        echo "# without debug symbols show addresses)"
        perf report -i "$T/perf.data" --pid "$pids" --sort "$sort" --stdio 2>/dev/null |
            grep -v -e '^#' -e '^$'
        perf report -i "$T/perf.data" --pid "$pids" --sort "$sort,symbol" --stdio 2>/dev/null |
            grep -v -e '^#' -e '^$' | head -n 60
    } >"$BIN/bench-perf.txt"
    note "CPU profile of the relay during the $PERF_KEY drain: bin/bench-perf.txt (perf, cpu-clock)"
}

# ---- replay -----------------------------------------------------------------------------------

# replay_round N: N fresh rows drained at default settings (drain: a reset outbox), then the same
# rows put back in line by `outbox-relay replay` (new ids above the old ones, attempts 0:
# docs/operations.md#replay) and drained again, then made unsent by hand (UPDATE sent_at = NULL,
# which the floor's trigger counts as tried once, so they go the failed rows' way) and drained
# once more. No VACUUM between (unless BENCH_REPLAY_VACUUM=1): the replayed drain meets the old
# versions a replay leaves behind, as it would right after an operator's replay; a CHECKPOINT
# before each drain, as before the fresh one. Keys replay_fresh.N, replayed.N, byhand.N; RP_CMD_S[N]: the replay command's seconds.
replay_round() {
    local n=$1 t0 first count
    drain "replay_fresh.$n" "$n" relay
    say "replay: putting the $(commas "$n") sent rows back in line"
    t0=$(now_us)
    "$RELAY_BIN" replay --database-url "$DATABASE_URL" --aggregate-type order --yes \
        >"$T/replay.$n.out" 2>&1 || fail "outbox-relay replay" "$(tail -n 3 "$T/replay.$n.out")"
    RP_ALL_CMD+="$(calc "($(now_us) - $t0) / 1000000") "
    read -r first count < <(psql_q "SELECT min(id), count(*) FROM outbox WHERE sent_at IS NULL" |
        tr '|' ' ')
    check_eq "replay: every drained row is unsent again" "$n" "$count"
    if [ "${BENCH_REPLAY_VACUUM:-0}" = 1 ]; then
        psql_q "VACUUM outbox" || fail "vacuum"
    fi
    psql_q "CHECKPOINT" || fail "checkpoint"
    drain_rows "replayed.$n" "$n" "$first" relay
    psql_q "UPDATE outbox SET sent_at = NULL WHERE sent_at IS NOT NULL" >/dev/null &&
        psql_q "CHECKPOINT" || fail "make the rows unsent by hand"
    drain_rows "byhand.$n" "$n" "$first" relay
}
RP_ALL_CMD=

# ---- the run ------------------------------------------------------------------------------

declare -A R_PGCPU R_BCPU
declare -A R_RATE R_SECS R_HWM R_CPU R_RSS10 R_RSS50 R_RSSEND R_START R_FIRST R_NOTE R_ALL R_SPREAD R_STEADY
declare -A L_TPS L_LAG L_INSERTED L_DUPS L_N L_P50 L_P99 L_MAX L_MISSING L_CPU L_BCPU P_TPS P_RATIO
declare -A P_RATIO_SPREAD P_CPU
declare -A L_RP50 L_RP99 L_KP50 L_KP99 L_SPREAD P_BYTES P_ROWS S_B2 S_BMAX
NOTES=()
RUN_START=$(now_us)
LOAD_BEFORE=$(cut -d ' ' -f 1-3 /proc/loadavg)
PERF_KEY=${BENCH_PERF_KEY:-default.$MAX_SIZE}

t_setup
say "PostgreSQL"
pg_start
cat >>"$T/pg/postgresql.conf" <<EOF
# bench/bench.sh: everything in memory, no checkpoint in the middle of a drain
shared_buffers = $SHARED_BUFFERS
max_wal_size = 8GB
checkpoint_timeout = 30min
${BENCH_PG_CONF:-}
EOF
pg_restart
relay_migrate >"$T/migrate.log" 2>&1 || fail "migrate" "$(tail -n 3 "$T/migrate.log")"
TRIGGER_DEF=$(psql_q "SELECT pg_get_triggerdef(oid) FROM pg_trigger
                      WHERE tgrelid = 'outbox'::regclass AND tgname = 'outbox_wakeup'")
[ -n "$TRIGGER_DEF" ] || note "no outbox_wakeup trigger on outbox: the producer-cost runs are skipped"
say "generating the seed rows"
seed_rows=$MAX_SIZE
[[ $PARTS == *" drain "* ]] || seed_rows=1000 # only for the payload size in the report
[[ $PARTS == *" replay "* ]] && [ "$REPLAY_SIZE" -gt "$seed_rows" ] && seed_rows=$REPLAY_SIZE
psql -XAtq -v ON_ERROR_STOP=1 -v rows="$seed_rows" -f "$BENCH/seed.sql" >/dev/null ||
    fail "generate the seed rows"
PAYLOAD_BYTES=$(psql_q "SELECT round(avg(length(payload::text))) FROM bench_seed")
open_poller

# Drains. Per size: the PostgreSQL-only bounds, the relay at default and tuned settings (and the
# naive loop on its size), each from the same reset state. With BENCH_REPEAT > 1 the whole round
# repeats, so slow drift of the machine's load hits every row alike, and each rate is the median
# of its rounds; the order of each round is below (drain_step).
if [[ $PARTS == *" drain "* ]]; then
    [[ " $SIZES " == *" $NAIVE_SIZE "* ]] || SIZE_LIST+=("$NAIVE_SIZE")
else
    SIZE_LIST=()
fi
# The Avro drain's registry: the stand-in (tests/tools/schema-registry.js) holding the seed
# payload's schema (bench/seed.sql) for the topic's subject.
if [[ $PARTS == *" drain "* ]] && [ "$AVRO" = 1 ]; then
    jq -n --arg s '{"type": "record", "name": "Order", "namespace": "bench", "fields": [
        {"name": "order_id", "type": "string"}, {"name": "seq", "type": "long"},
        {"name": "status", "type": "string"}, {"name": "customer_id", "type": "string"},
        {"name": "amount_cents", "type": "long"}, {"name": "currency", "type": "string"},
        {"name": "items", "type": {"type": "array", "items": {"type": "record", "name": "Item",
          "fields": [{"name": "sku", "type": "string"}, {"name": "qty", "type": "int"},
                     {"name": "price_cents", "type": "long"}]}}},
        {"name": "note", "type": "string"}]}' '{"outbox.event.order-value": [{schema: $s}]}' \
        >"$T/schemas.json"
    sr_port=$(free_port) || fail "find a free port for the schema registry"
    start_bg "$T/registry.log" node "$ROOT/tests/tools/schema-registry.js" --port "$sr_port" \
        --schemas "$T/schemas.json"
    _poll 10 grep -q listening "$T/registry.log" || fail "the schema registry did not start"
    AVRO_FLAGS=(--value-format avro --schema-registry-url "http://127.0.0.1:$sr_port")
fi
# drain_step STEP N: one drain (or bound) of the round's list, by name.
drain_step() {
    case $1 in
    update) bound "update.$2" "$2" "$BENCH/claim_update.sql" ;;
    delete) bound "delete.$2" "$2" "$BENCH/claim_delete.sql" ;;
    default) drain "default.$2" "$2" relay ;;
    baseline) drain "baseline.$2" "$2" baseline ;;
    avro) drain "avro.$2" "$2" relay "${AVRO_FLAGS[@]}" ;;
    single) drain "single.$2" "$2" relay --sessions 1 ;;
    tuned) drain "tuned.$2" "$2" relay "${TUNED[@]}" ;;
    ondelete) drain "ondelete.$2" "$2" relay --on-sent delete ;;
    baselinedel) drain "baselinedel.$2" "$2" baseline --on-sent delete ;;
    naive) drain "naive.$2" "$2" naive ;;
    esac
}

# The order of a size's drains and bounds goes forward in odd rounds and backward in even ones,
# so every pair the report divides (this build and its bound, this build and the baseline) takes
# each place equally often over an even number of rounds, and whatever a place costs (the load of
# the step before, a tick of autovacuum's) falls on both alike. With the order fixed, A/A runs
# (BENCH_BASELINE_BIN a copy of this binary) gave the first of the two 0.95x the second over 32
# rounds; the cause was not found (the report's Method, "Order").
for ((round = 1; round <= REPEAT; round++)); do
    [ "$REPEAT" -gt 1 ] && [ ${#SIZE_LIST[@]} -gt 0 ] && say "drain round $round of $REPEAT"
    for n in "${SIZE_LIST[@]}"; do
        steps=(update)
        if [[ " $SIZES " == *" $n "* ]]; then
            steps+=(delete default)
            [ -n "$BASELINE_BIN" ] && steps+=(baseline)
            [ "$AVRO" = 1 ] && steps+=(avro)
            [ "$ONE_SESSION" = 1 ] && steps+=(single)
            [ ${#TUNED[@]} -gt 0 ] && steps+=(tuned)
            [ "$ON_SENT_DELETE" = 1 ] && steps+=(ondelete) &&
                [ -n "$BASELINE_BIN" ] && steps+=(baselinedel)
        else
            steps+=(default)
        fi
        [ "$n" = "$NAIVE_SIZE" ] && steps+=(naive)
        [[ " $SIZES " == *" $n "* ]] && DRAIN_ORDER="${steps[*]}"
        if [ $((round % 2)) = 0 ]; then
            for ((i = ${#steps[@]} - 1; i >= 0; i--)); do drain_step "${steps[i]}" "$n"; done
        else
            for step in "${steps[@]}"; do drain_step "$step" "$n"; done
        fi
    done
    [[ $PARTS == *" replay "* ]] && replay_round "$REPLAY_SIZE"
done
take_medians

[[ $PARTS == *" latency "* ]] || RATES=
if [ -n "$RATES" ] && [ -n "$PG_DELAY_US" ]; then
    proxy_port=$(free_port) || fail "find a free port for the delay proxy"
    start_bg "$T/delay-proxy.log" "$BIN/delay-proxy" --listen "$proxy_port" --to "$PGPORT" \
        --delay-us "$PG_DELAY_US"
    _poll 10 grep -q listening "$T/delay-proxy.log" || fail "delay-proxy did not start"
    RELAY_DB_URL=postgresql://postgres@127.0.0.1:$proxy_port/outbox
fi
if [ -n "$RATES" ] && [ -n "$SYNC_STANDBY_DELAY_US" ]; then
    say "a synchronous standby, $SYNC_STANDBY_DELAY_US µs each way"
    standby_proxy_port=$(free_port) || fail "find a free port for the standby's delay proxy"
    start_bg "$T/standby-proxy.log" "$BIN/delay-proxy" --listen "$standby_proxy_port" \
        --to "$PGPORT" --delay-us "$SYNC_STANDBY_DELAY_US"
    _poll 10 grep -q listening "$T/standby-proxy.log" || fail "the standby's delay-proxy did not start"
    standby_start "$standby_proxy_port"
    standby_make_synchronous
    _poll 60 sync_standby || fail "the standby did not become synchronous"
fi
for ((round = 1; round <= LAT_ROUNDS; round++)); do
    [ "$LAT_ROUNDS" -gt 1 ] && [ -n "$RATES" ] && say "latency round $round of $LAT_ROUNDS"
    for rate in $RATES; do
        # As the drains: forward in odd rounds, backward in even ones.
        lsteps=(default)
        [ -n "$BASELINE_BIN" ] && lsteps+=(baseline)
        [ ${#TUNED[@]} -gt 0 ] && lsteps+=(tuned)
        [[ " $CONTROL_RATES " == *" $rate "* ]] && lsteps+=(control)
        [ $((round % 2)) = 0 ] && mapfile -t lsteps < <(printf '%s\n' "${lsteps[@]}" | tac)
        for step in "${lsteps[@]}"; do
            case $step in
            tuned) latency "tuned.$rate.$round" "$rate" "${TUNED[@]}" ;;
            *) latency "$step.$rate.$round" "$rate" ;;
            esac
        done
    done
done
latency_medians
if [ "$_T_STANDBY_STARTED" = 1 ]; then # the parts after the latency runs go without it
    printf '%s\n' "synchronous_commit = off" "synchronous_standby_names = ''" >>"$T/pg/postgresql.conf"
    psql_q "SELECT pg_reload_conf()" >/dev/null
    _as_pg pg_ctl -D "$SB" -m fast -w -t 30 stop >/dev/null 2>&1 || fail "stop the standby"
    _T_STANDBY_STARTED=0
    SYNC_STANDBY_RAN=1
fi

# Old snapshot: the latency run at SNAP_RATE for SNAP_S seconds, once as it is and once while
# another session holds a REPEATABLE READ snapshot the whole time (a forgotten BEGIN, a long
# report, a standby's hot_standby_feedback): vacuum can then remove none of the row versions the
# marks leave behind, which claims would walk without the claim floor (--claim-floor off). The
# unsent backlog is sampled every 10 s: a relay that keeps up has a flat one.
snapshot_run() { # KEY HOLD
    local key=$1 hold=$2 holder= sampler
    if [ "$hold" = 1 ]; then
        # Its snapshot holds vacuum back whatever it reads; it reads no table of the outbox's, so
        # that its lock does not hold up the run's TRUNCATE.
        psql -XAtq -c "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pg_class;
                       SELECT pg_sleep($((SNAP_S + WARM_S + 180)))" >/dev/null 2>&1 &
        holder=$!
        _t_track "$holder"
    fi
    (
        t0=$(date +%s)
        while sleep 10; do
            # Only the newest 100,000 ids: counting every unsent row would walk every dead
            # version the snapshot keeps, a load that grows with the run and is not the relay's.
            echo "$(($(date +%s) - t0)) $(psql -XAtq -c "SELECT count(*) FROM outbox WHERE sent_at IS NULL
                AND id > (SELECT max(id) FROM outbox) - 100000" 2>/dev/null)"
        done
    ) >"$T/snapshot.$key.backlog" &
    sampler=$!
    _t_track "$sampler"
    LAT_S=$SNAP_S latency "$key" "$SNAP_RATE"
    kill "$sampler" 2>/dev/null
    wait "$sampler" 2>/dev/null
    untrack "$sampler"
    if [ -n "$holder" ]; then
        kill "$holder" 2>/dev/null
        wait "$holder" 2>/dev/null
        untrack "$holder"
        psql_q "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                WHERE query LIKE '%pg_sleep%' AND pid <> pg_backend_pid()" >/dev/null
    fi
    # Backlog after the warm-up and the first 2 minutes, and the largest from then on.
    S_B2[$key]=$(awk -v t=$((WARM_S + 120)) '$1 >= t { print $2; exit }' "$T/snapshot.$key.backlog")
    S_BMAX[$key]=$(awk -v t=$((WARM_S + 120)) '$1 >= t && $2 > m { m = $2 } END { print m + 0 }' \
        "$T/snapshot.$key.backlog")
}
if [[ $PARTS == *" snapshot "* ]]; then
    snapshot_run snapshot.without 0
    snapshot_run snapshot.with 1
fi

# Payload sizes: the same drain at default settings over rows of one payload size each, from a
# seed table per size (one random hex blob per size, so TOAST cannot compress it away; a row's
# own prefix keeps the values distinct). What the byte budget (--batch-bytes) bounds shows in the
# peak RSS column.
[[ $PARTS == *" payloads "* ]] || PAYLOADS=
for spec in $PAYLOADS; do
    bytes=${spec%%:*} rows=${spec##*:}
    say "payloads: seeding $(commas "$rows") rows of $(commas "$bytes") bytes"
    psql_q "DROP TABLE IF EXISTS bench_seed_$bytes" &&
        psql_q "CREATE TABLE bench_seed_$bytes AS
                WITH blob AS (SELECT string_agg(md5(random()::text || g::text), '') AS hex
                              FROM generate_series(1, ($bytes + 31) / 32) g)
                SELECT g AS n, gen_random_uuid() AS event_id, 'order'::text AS aggregate_type,
                       'o-' || (g % 1000) AS aggregate_id, 'OrderCreated'::text AS event_type,
                       jsonb_build_object('n', g, 'data', left(blob.hex, $bytes - 30)) AS payload,
                       NULL::jsonb AS headers
                FROM blob, generate_series(1, $rows) g" &&
        psql_q "ALTER TABLE bench_seed_$bytes ADD PRIMARY KEY (n)" ||
        fail "seed the $bytes-byte payloads"
    SEED_TABLE=bench_seed_$bytes drain "payload$bytes.$rows" "$rows" relay
    P_BYTES[$bytes]=$(psql_q "SELECT round(avg(octet_length(payload::text)))
                              FROM bench_seed_$bytes WHERE n <= 100")
    P_ROWS[$bytes]=$rows
    psql_q "DROP TABLE bench_seed_$bytes" >/dev/null
done

[[ $PARTS == *" producers "* ]] || PROD_MODES=
if [ -n "$TRIGGER_DEF" ]; then
    for mode in $PROD_MODES; do
        for c in $PROD_CLIENTS; do
            producers "$c" "$mode"
        done
    done
fi
RUN_SECONDS=$(calc "($(now_us) - $RUN_START) / 1000000" %.0f)
LOAD_AFTER=$(cut -d ' ' -f 1-3 /proc/loadavg)

# ---- the report -------------------------------------------------------------------------------

verdict() { # VALUE TARGET FLOOR higher|lower
    awk -v v="$1" -v t="$2" -v f="$3" -v d="$4" 'BEGIN {
        if (v == "" || v == "-") { print "not measured"; exit }
        if (d == "higher") { if (v >= t) print "meets the target"; else if (t == f) print "**misses the target**"; else if (v >= f) print "**below the target**, above the floor"; else print "**below the floor**" }
        else { if (v <= t) print "meets the target"; else if (t == f) print "**misses the target**"; else if (v <= f) print "**above the target**, within the floor"; else print "**beyond the floor**" } }'
}

PGVER=$(psql_q "SHOW server_version")
RDKVER=$("$RELAY_BIN" --version 2>&1 | tr '\n' ' ' | sed 's/ *$//')
CPU_MODEL=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1)
MEM=$(awk '/^MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)
CMD="make bench"
for v in $(compgen -e | grep '^BENCH_' | sort); do
    CMD="$v=\"${!v}\" $CMD"
done
TUNED_LABEL=${TUNED_FLAGS:-none}
BASELINE_LABEL=
[ -n "$BASELINE_BIN" ] && BASELINE_LABEL="$("$BASELINE_BIN" --version 2>&1 | head -n 1), ${BENCH_BASELINE_NAME:-$BASELINE_BIN}"

report_header() {
    echo "# Benchmarks"
    echo
    if [ "$QUICK" = 1 ]; then
        echo "**BENCH_QUICK smoke run**: small sizes and short durations, for checking the harness only."
        echo
    fi
    echo "Latest run of \`$CMD\` ($(date -u +%Y-%m-%d), ${RUN_SECONDS} s). Every ratio compares"
    echo "figures measured in this same run."
    echo
    # Runs measured apart keep documents of their own, which this report links and never rewrites.
    if [ "$OUT" = "$ROOT/docs/benchmarks.md" ]; then
        echo "Measured apart, in documents a \`make bench\` leaves as they are: the latency part with"
        echo "PostgreSQL 1 ms away ([benchmarks-remote-pg.md](benchmarks-remote-pg.md)), replay and"
        echo "\`--on-sent delete\` taken apart ([benchmarks-delete-replay.md](benchmarks-delete-replay.md)),"
        echo "rounds of \`make bench-multidb\` ([benchmarks-multidb.md](benchmarks-multidb.md))."
        echo
    fi
    echo "| machine | |"
    echo "|---|---|"
    echo "| CPUs (nproc) | $(nproc) |"
    echo "| CPU model | ${CPU_MODEL:-unknown} |"
    echo "| memory | $MEM |"
    echo "| kernel | $(uname -r) |"
    echo "| PostgreSQL | $PGVER (fsync, synchronous_commit, full_page_writes off; shared_buffers $SHARED_BUFFERS)${SYNC_STANDBY_RAN:+; latency runs: synchronous_commit on, a synchronous standby $SYNC_STANDBY_DELAY_US µs away} |"
    echo "| relay, librdkafka, libpq | $RDKVER |"
    echo "| load average before / after | $LOAD_BEFORE / $LOAD_AFTER |"
    echo
}

# x_ratio RATIO: "1.23×", or "-" when there is no ratio.
x_ratio() {
    [ "$1" = - ] && echo - || echo "$1×"
}

report_drain() {
    local n key d bound naive rate
    echo "## Drain: a backlog of N events, events/s"
    echo
    if [ "$REPEAT" -gt 1 ]; then
        echo "Median of $REPEAT rounds (min–max); the other columns are from the last round."
        echo
    fi
    echo "CPU s: the relay's (all threads), PostgreSQL's (all its processes) and the mock broker's, over"
    echo "the drain; what a drain costs in CPU changes much less with the machine's other load than"
    echo "its wall time does (the bounds: PostgreSQL's alone)."
    echo
    echo "| backlog | what | events/s | seconds | × PG bound (UPDATE) | × naive | steady events/s | steady × bound | start-up s | first row sent s | CPU s: relay / PostgreSQL / broker | peak RSS (VmHWM) |"
    echo "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for n in "${SIZE_LIST[@]}"; do
        bound=${R_RATE[update.$n]:-}
        naive=${R_RATE[naive.$n]:-}
        for key in update delete default avro baseline single tuned ondelete baselinedel naive; do
            [ -n "${R_RATE[$key.$n]:-}" ] || continue
            case $key in
            update) d="PostgreSQL-only bound: claim + UPDATE, 1,000 rows a statement" ;;
            delete) d="PostgreSQL-only bound: claim + DELETE, 1,000 rows a statement" ;;
            default) d="relay, default settings" ;;
            baseline)
                d="baseline binary, default settings ($BASELINE_LABEL; this build: $(x_ratio \
                    "$(ratio "${R_RATE[default.$n]}" "${R_RATE[$key.$n]}")") of it)"
                ;;
            avro)
                d="relay, Avro values: \`--value-format avro\` (Schema Registry stand-in; $(x_ratio \
                    "$(ratio "${R_RATE[$key.$n]}" "${R_RATE[default.$n]}")") the JSON drain)"
                ;;
            single) d="relay, one claim session: \`--sessions 1\`" ;;
            tuned) d="relay, tuned: \`$TUNED_LABEL\`" ;;
            ondelete)
                d="relay, deleting sent rows: \`--on-sent delete\` ($(x_ratio "$(ratio \
                    "${R_RATE[$key.$n]}" "${R_RATE[delete.$n]:--}")") the DELETE bound)"
                ;;
            baselinedel)
                d="baseline binary, \`--on-sent delete\` ($BASELINE_LABEL; $(x_ratio "$(ratio \
                    "${R_RATE[$key.$n]}" "${R_RATE[delete.$n]:--}")") the DELETE bound;"
                d+=" this build: $(x_ratio "$(ratio "${R_RATE[ondelete.$n]:--}" "${R_RATE[$key.$n]}")") of it)"
                ;;
            naive) d="naive loop (100-row batches, one UPDATE per row)" ;;
            esac
            rate=$(commas "${R_RATE[$key.$n]}")
            [ -n "${R_SPREAD[$key.$n]:-}" ] && rate="$rate (${R_SPREAD[$key.$n]})"
            printf '| %s | %s | %s | %s | %s |' "$(commas "$n")" "$d" "$rate" "${R_SECS[$key.$n]}" \
                "$(x_ratio "$(ratio "${R_RATE[$key.$n]}" "$bound")")"
            if [ "$key" = update ] || [ "$key" = delete ]; then
                echo " | | | | | - / ${R_PGCPU[$key.$n]:--} / - | |"
            else
                printf ' %s | %s | %s | %s | %s | %s | %s MB |\n' \
                    "$(x_ratio "$(ratio "${R_RATE[$key.$n]}" "$naive")")" \
                    "$(commas "${R_STEADY[$key.$n]:--}")" \
                    "$(x_ratio "$(ratio "${R_STEADY[$key.$n]:--}" "$bound")")" "${R_START[$key.$n]:--}" \
                    "${R_FIRST[$key.$n]:--}" \
                    "${R_CPU[$key.$n]:--} / ${R_PGCPU[$key.$n]:--} / ${R_BCPU[$key.$n]:--}" \
                    "$(mb "${R_HWM[$key.$n]}")"
            fi
        done
    done
    echo
}

# lag_cell AVG/MAX: pgbench's schedule lag as "avg / max", rounded to 0.1 ms; "-" if unknown.
lag_cell() {
    [ -n "$1" ] || {
        echo -
        return
    }
    awk -F / '{ printf "%.1f / %.1f\n", $1, $2 }' <<<"$1"
}

# rate_label SPEC [UNIT]: a latency row's events/s as the report shows it ("10,000", or
# "10,000 (1,000 tx × 10)" for RATExN; UNIT, if given, follows the events/s figure).
rate_label() {
    local per
    per=$(spec_per "$1")
    echo -n "$(commas "${1%x*}")${2:-}"
    [ "$per" = 1 ] || echo -n " ($(commas "$(spec_tx_rate "$1")") tx × $per)"
    echo
}

report_latency() {
    local rate key d
    echo "## Latency: commit to consumer, ms"
    echo
    if [ "$LAT_ROUNDS" -gt 1 ]; then
        echo "$LAT_ROUNDS rounds, default and tuned interleaved; each row is its round with the median p50"
        echo "(the p50s' min–max in brackets)."
        echo
    fi
    if [ -n "$PG_DELAY_US" ]; then
        echo "**PostgreSQL at a distance:** every relay of these runs reached PostgreSQL through"
        echo "bin/delay-proxy, $PG_DELAY_US µs each way ($(calc "$PG_DELAY_US * 2 / 1000" %.2f) ms more per round trip), as from"
        echo "another host; pgbench and the consumer connected directly."
        echo
    fi
    if [ -n "$SYNC_STANDBY_RAN" ]; then
        echo "**A synchronous standby:** PostgreSQL ran with \`synchronous_commit = on\` (its default) and"
        echo "\`synchronous_standby_names = '*'\`, its one streaming standby reaching it through"
        echo "bin/delay-proxy, $SYNC_STANDBY_DELAY_US µs each way (the standby itself ran on this machine): a commit that writes waits for the standby's"
        echo "acknowledgement, at least $(calc "$SYNC_STANDBY_DELAY_US * 2 / 1000" %.2f) ms, unless its session turned synchronous_commit off."
        echo
    fi
    echo "pgbench lag is how late pgbench itself started its transactions (avg / max ms): a machine"
    echo "stalling under the load shows there first, and every latency of that run with it."
    echo
    echo "The topic has $LATENCY_PARTITIONS partition(s) (Method says why); the control rows ran on a"
    echo "$PARTITIONS-partition topic in the same rounds. broker CPU s is the mock broker's over the run."
    echo
    echo "| events/s | relay | inserted tx/s | events measured | p50 | p99 | max | commit→produce p50 / p99 | produce→consumer p50 / p99 | missing | duplicates | relay CPU s | broker CPU s | pgbench lag |"
    echo "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for rate in $RATES; do
        for key in default.$rate baseline.$rate tuned.$rate control.$rate; do
            [ -n "${L_N[$key]:-}" ] || continue
            d="default settings"
            [[ $key == tuned.* ]] && d="tuned: \`$TUNED_LABEL\`"
            [[ $key == baseline.* ]] && d="baseline binary ($BASELINE_LABEL), default settings"
            [[ $key == control.* ]] && d="control: default settings, $PARTITIONS-partition topic"
            echo "| $(rate_label "$rate") | $d | $(calc "${L_TPS[$key]:-0}" %.0f) | $(commas "${L_N[$key]}") | **${L_P50[$key]}**$([ "$LAT_ROUNDS" -gt 1 ] && echo " (${L_SPREAD[$key]})") | **${L_P99[$key]}** | ${L_MAX[$key]} | ${L_RP50[$key]} / ${L_RP99[$key]} | ${L_KP50[$key]} / ${L_KP99[$key]} | ${L_MISSING[$key]} | ${L_DUPS[$key]} | ${L_CPU[$key]:--} | ${L_BCPU[$key]:--} | $(lag_cell "${L_LAG[$key]:-}") |"
        done
    done
    echo
}

report_producers() {
    local mode c d cpu_cell
    echo "## Cost to producers: single-event insert transactions/s, with and without the wakeup trigger"
    echo
    if [ -z "$TRIGGER_DEF" ]; then
        echo "Not measured: no \`outbox_wakeup\` trigger on \`outbox\`."
        echo
        return
    fi
    echo "Each row: $PROD_ROUNDS paired rounds of ${PROD_S} s (without, with; the order alternating),"
    echo "inserts/s as medians; with ÷ without is the median of the rounds' ratios (min–max). The relay"
    echo "runs with default settings but \`--poll-interval 5\` in both arms, so that without the trigger"
    echo "it still hears of rows at once rather than at its 1 s timer (it would start late and drain in"
    echo "larger, cheaper batches: the arms would differ by more than the trigger). Relay CPU is its"
    echo "user + system time over the run (median), without / with; it shares the 2 CPUs with the"
    echo "producers."
    echo
    echo "| clients | during the run | without trigger | with trigger | with ÷ without | relay CPU s |"
    echo "|---:|---|---:|---:|---:|---:|"
    for mode in $PROD_MODES; do
        for c in $PROD_CLIENTS; do
            d="no relay (commit path only)"
            [ "$mode" = relay ] && d="a relay draining (\`--poll-interval 5\`)"
            cpu_cell=-
            [ "$mode" = relay ] && cpu_cell="${P_CPU[$mode.$c.without]:--} / ${P_CPU[$mode.$c.with]:--}"
            echo "| $c | $d | $(commas "$(calc "${P_TPS[$mode.$c.without]:-0}" %.0f)") | $(commas "$(calc "${P_TPS[$mode.$c.with]:-0}" %.0f)") | $(x_ratio "${P_RATIO[$mode.$c]:--}") (${P_RATIO_SPREAD[$mode.$c]:--}) | $cpu_cell |"
        done
    done
    echo
}

report_memory() {
    local n key d
    echo "## Memory: the relay's RSS while draining, MB"
    echo
    echo "| backlog | relay | RSS at 10 % of the drain | at 50 % | at the end | peak (VmHWM) |"
    echo "|---:|---|---:|---:|---:|---:|"
    for n in "${SIZE_LIST[@]}"; do
        for key in default tuned; do
            [ -n "${R_HWM[$key.$n]:-}" ] || continue
            d="default settings"
            [ "$key" = tuned ] && d="tuned"
            echo "| $(commas "$n") | $d | $(mb "${R_RSS10[$key.$n]}") | $(mb "${R_RSS50[$key.$n]}") | $(mb "${R_RSSEND[$key.$n]}") | $(mb "${R_HWM[$key.$n]}") |"
        done
    done
    echo
}

report_replay() {
    local n=$REPLAY_SIZE key d rate fresh=${R_RATE[replay_fresh.$REPLAY_SIZE]:-}
    [ -n "$fresh" ] || return 0
    echo "## Replay: events put back in line, against fresh events, events/s"
    echo
    echo "Each round: $(commas "$n") fresh rows drained at default settings from a reset outbox; the"
    echo "same rows put back in line by \`outbox-relay replay --aggregate-type order --yes\` (new ids,"
    if [ "${BENCH_REPLAY_VACUUM:-0}" = 1 ]; then
        echo "attempts 0) and drained again after a VACUUM (BENCH_REPLAY_VACUUM=1: their old versions"
        echo "removed); then made unsent by hand (\`UPDATE outbox SET sent_at = NULL\`: the floor's"
    else
        echo "attempts 0) and drained again, with no VACUUM between (their old versions still in the table"
        echo "and its indexes); then made unsent by hand (\`UPDATE outbox SET sent_at = NULL\`: the floor's"
    fi
    echo "trigger counts them as tried once) and drained once more. Each drain is timed as the drains"
    echo "above. The replay command took $(calc "$(median_spread $RP_ALL_CMD | cut -d ' ' -f 1)" %.1f) s (median)."
    echo
    if [ "$REPEAT" -gt 1 ]; then
        echo "Median of $REPEAT rounds (min–max); the other columns are from the last round."
        echo
    fi
    echo "| backlog | what | events/s | seconds | × fresh | steady events/s | start-up s | first row sent s | CPU s: relay / PostgreSQL / broker |"
    echo "|---:|---|---:|---:|---:|---:|---:|---:|---:|"
    for key in replay_fresh replayed byhand; do
        [ -n "${R_RATE[$key.$n]:-}" ] || continue
        case $key in
        replay_fresh) d="fresh rows (inserted, never sent)" ;;
        replayed) d="replayed: \`outbox-relay replay\`" ;;
        byhand) d="made unsent by hand: \`UPDATE … SET sent_at = NULL\`" ;;
        esac
        rate=$(commas "${R_RATE[$key.$n]}")
        [ -n "${R_SPREAD[$key.$n]:-}" ] && rate="$rate (${R_SPREAD[$key.$n]})"
        echo "| $(commas "$n") | $d | $rate | ${R_SECS[$key.$n]} | $(x_ratio "$(ratio "${R_RATE[$key.$n]}" "$fresh")") | $(commas "${R_STEADY[$key.$n]:--}") | ${R_START[$key.$n]:--} | ${R_FIRST[$key.$n]:--} | ${R_CPU[$key.$n]:--} / ${R_PGCPU[$key.$n]:--} / ${R_BCPU[$key.$n]:--} |"
    done
    echo
}

report_snapshot() {
    local key d
    echo "## An old snapshot held: latency at $(commas "$SNAP_RATE") events/s for $SNAP_S s"
    echo
    echo "The same run twice, default settings: as it is, then while another session holds a"
    echo "REPEATABLE READ snapshot open the whole time. Backlog: unsent rows sampled every 10 s, after"
    echo "the warm-up and the first 2 minutes, and the largest sample from then on."
    echo
    echo "| run | events measured | p50 ms | p99 ms | max ms | p99 × without | backlog at 2 min | largest backlog after | relay CPU s |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    for key in snapshot.without snapshot.with; do
        [ -n "${L_N[$key]:-}" ] || continue
        d="without an old snapshot"
        [ "$key" = snapshot.with ] && d="**with** an old snapshot"
        echo "| $d | $(commas "${L_N[$key]}") | ${L_P50[$key]} | **${L_P99[$key]}** | ${L_MAX[$key]} | $(x_ratio "$(ratio "${L_P99[$key]}" "${L_P99[snapshot.without]:-}")") | $(commas "${S_B2[$key]:--}") | $(commas "${S_BMAX[$key]:--}") | ${L_CPU[$key]:--} |"
    done
    echo
}

report_payloads() {
    local spec bytes rows key mbs
    echo "## Payload sizes: drains at default settings"
    echo
    echo "Each row: a backlog of events whose payloads are all of one size (random hex, so TOAST"
    echo "cannot compress them away), drained at default settings (\`--batch-bytes\` 8 MiB)."
    echo
    echo "| payload | events | events/s | MB/s (payload) | seconds | CPU s | peak RSS (VmHWM) |"
    echo "|---:|---:|---:|---:|---:|---:|---:|"
    for spec in $PAYLOADS; do
        bytes=${spec%%:*} rows=${spec##*:}
        key=payload$bytes.$rows
        [ -n "${R_RATE[$key]:-}" ] || continue
        mbs=$(calc "${R_RATE[$key]} * ${P_BYTES[$bytes]} / 1000000" %.1f)
        echo "| $(commas "${P_BYTES[$bytes]}") B | $(commas "$rows") | $(commas "${R_RATE[$key]}") | $mbs | ${R_SECS[$key]} | ${R_CPU[$key]:--} | $(mb "${R_HWM[$key]}") MB |"
    done
    echo
}

# target_p99 SPEC MS: the targets' line for the default relay's p99 at latency row SPEC (RATE or
# RATExN), if that row ran; says so when pgbench could not insert at the row's rate.
target_p99() {
    local key=default.$1
    [ -n "${L_P99[$key]:-}" ] || return 0
    echo -n "- p99 commit-to-consumer at $(rate_label "$1" " events/s") ≤ $2 ms: **${L_P99[$key]} ms** — $(verdict "${L_P99[$key]}" "$2" "$2" lower)"
    short_of "${L_TPS[$key]:-0}" "$(spec_tx_rate "$1")" &&
        echo -n " (pgbench reached only $(calc "${L_TPS[$key]:-0}" %.0f) tx/s: the saturated machine's figure)"
    echo "."
}

report_targets() {
    local n r mode cost d peak grow
    echo "## Targets (from the issue), this run"
    echo
    for n in "${SIZE_LIST[@]}"; do
        [ -n "${R_RATE[default.$n]:-}" ] || continue
        r=$(ratio "${R_RATE[default.$n]}" "${R_RATE[update.$n]:-}")
        echo "- Drain of $(commas "$n") at default settings ≥ 0.9× the PostgreSQL-only bound (floor 0.75×), from process start: **${r}×** — $(verdict "$r" 0.9 0.75 higher)."
        r=$(ratio "${R_STEADY[default.$n]:--}" "${R_RATE[update.$n]:-}")
        echo "  - steady (after the first batch; the bound has no start-up either): **${r}×** — $(verdict "$r" 0.9 0.75 higher)."
    done
    for n in "${SIZE_LIST[@]}"; do
        [ -n "${R_RATE[avro.$n]:-}" ] || continue
        r=$(ratio "${R_RATE[avro.$n]}" "${R_RATE[default.$n]:-}")
        echo "- Drain of $(commas "$n") with Avro values ≥ 0.7× the JSON drain: **${r}×** — $(verdict "$r" 0.7 0.7 higher); peak RSS $(mb "${R_HWM[avro.$n]}") MB against $(mb "${R_HWM[default.$n]:-0}") MB."
    done
    if [ -n "${R_RATE[replayed.$REPLAY_SIZE]:-}" ]; then
        r=$(ratio "${R_RATE[replayed.$REPLAY_SIZE]}" "${R_RATE[replay_fresh.$REPLAY_SIZE]:-}")
        echo "- $(commas "$REPLAY_SIZE") replayed events drain at ≥ 0.8× the rate of $(commas "$REPLAY_SIZE") fresh ones: **${r}×** — $(verdict "$r" 0.8 0.8 higher)."
    fi
    for n in "${SIZE_LIST[@]}"; do
        [ -n "${R_RATE[ondelete.$n]:-}" ] || continue
        r=$(ratio "${R_RATE[ondelete.$n]}" "${R_RATE[delete.$n]:-}")
        echo "- Drain of $(commas "$n") with \`--on-sent delete\` ≥ 0.85× the claim + DELETE bound: **${r}×** — $(verdict "$r" 0.85 0.85 higher)."
    done
    if [ -n "${R_RATE[naive.$NAIVE_SIZE]:-}" ]; then
        r=$(ratio "${R_RATE[default.$NAIVE_SIZE]:-}" "${R_RATE[naive.$NAIVE_SIZE]}")
        echo "- Drain of $(commas "$NAIVE_SIZE") at default settings ≥ 5× the naive loop: **${r}×** — $(verdict "$r" 5 5 higher)."
    fi
    if [ -n "${L_P99[default.1000]:-}" ]; then
        echo "- p99 commit-to-consumer at 1,000 events/s ≤ 10 ms (floor 25 ms): **${L_P99[default.1000]} ms** — $(verdict "${L_P99[default.1000]}" 10 25 lower)."
        echo "- p50 at 1,000 events/s ≤ 3 ms: **${L_P50[default.1000]} ms** — $(verdict "${L_P50[default.1000]}" 3 3 lower)."
    fi
    target_p99 5000 15
    target_p99 5000x10 15
    target_p99 10000 25
    target_p99 10000x10 25
    for mode in $PROD_MODES; do
        [ -n "${P_RATIO[$mode.4]:-}" ] || continue
        r=${P_RATIO[$mode.4]}
        cost=$(awk -v r="$r" 'BEGIN { if (r == "-") print "-"; else printf "%.1f", (1 - r) * 100 }')
        d="no relay running"
        [ "$mode" = relay ] && d="a relay running"
        echo "- The wakeup costs producers ≤ 5 % of insert throughput at 4 clients ($d): **${cost} %** — $(verdict "$cost" 5 5 lower)."
    done
    if [ -n "${R_HWM[default.$MAX_SIZE]:-}" ]; then
        peak=$(mb "${R_HWM[default.$MAX_SIZE]}")
        grow=$(calc "(${R_RSSEND[default.$MAX_SIZE]:-0} - ${R_RSS10[default.$MAX_SIZE]:-0}) / 1024" %.1f)
        echo "- Peak RSS ≤ 15 MB while draining $(commas "$MAX_SIZE") (floor 40 MB), flat: **$peak MB**, ${grow} MB more at the end than at 10 % of the drain — $(verdict "$peak" 15 40 lower)."
    fi
    report_targets_bounds
    echo
}

# report_targets_bounds: the targets' lines for big payloads and for an old snapshot, where those
# parts ran at their full size (a smoke run's are too small to judge).
report_targets_bounds() {
    local spec bytes rows key peak r grow
    for spec in $PAYLOADS; do
        bytes=${spec%%:*} rows=${spec##*:}
        key=payload$bytes.$rows
        [ "$bytes" -ge 500000 ] && [ -n "${R_HWM[$key]:-}" ] || continue
        peak=$(mb "${R_HWM[$key]}")
        echo "- $(commas "$rows") events of $(commas "${P_BYTES[$bytes]}") B drained at default settings, peak RSS ≤ 64 MB: **$peak MB** — $(verdict "$peak" 64 64 lower)."
    done
    [ -n "${L_P99[snapshot.with]:-}" ] && [ -n "${L_P99[snapshot.without]:-}" ] || return 0
    r=$(ratio "${L_P99[snapshot.with]}" "${L_P99[snapshot.without]}")
    echo "- p99 at $(commas "$SNAP_RATE") events/s for $SNAP_S s with an old snapshot held ≤ 2× the same run without it: **${r}×** — $(verdict "$r" 2 2 lower)."
    [ -n "${S_B2[snapshot.with]:-}" ] || return 0
    grow=$((${S_BMAX[snapshot.with]:-0} - ${S_B2[snapshot.with]}))
    echo "- Backlog flat with the snapshot held: the largest sample after minute 2 no more than one second of arrivals ($(commas "$SNAP_RATE") rows) above the sample at minute 2: **$(commas "$grow") rows** above — $(verdict "$grow" "$SNAP_RATE" "$SNAP_RATE" lower)."
}

report() {
    report_header
    [[ $PARTS == *" drain "* ]] && report_drain
    [[ $PARTS == *" latency "* ]] && report_latency
    [[ $PARTS == *" producers "* ]] && report_producers
    [[ $PARTS == *" drain "* ]] && report_memory
    [[ $PARTS == *" replay "* ]] && report_replay
    [ -n "$PAYLOADS" ] && report_payloads
    [[ $PARTS == *" snapshot "* ]] && report_snapshot
    [ -s "$T/multidb.md" ] && { echo; sed -n '/^## Many databases/,$p' "$T/multidb.md"; }
    report_targets
    report_method
    report_notes
}

report_method() {
    echo "## Method"
    echo
    cat <<EOF
- **Set-up.** One throwaway PostgreSQL $PGVER (tests/lib.sh: initdb in a temp dir, \`fsync\`,
  \`synchronous_commit\` and \`full_page_writes\` off, plus shared_buffers $SHARED_BUFFERS,
  max_wal_size 8GB, checkpoint_timeout 30min${BENCH_PG_CONF:+, \`$BENCH_PG_CONF\`}; autovacuum on), migrated with
  \`outbox-relay migrate\`. A fresh mock Kafka cluster (bin/mock-broker: librdkafka's mock
  cluster, $BROKERS_N brokers, topic \`$TOPIC\` with $PARTITIONS partitions, $LATENCY_PARTITIONS in the runs a
  consumer reads (below), acks from memory) for every measurement, run with --tcp-nodelay as real brokers are (without it, delayed ACKs add
  about 40 ms to every produce round with several requests in flight). Everything shares this
  machine's $(nproc) CPUs: PostgreSQL, the broker, the relay, pgbench and the consumer.
- **Rows.** bench/seed.sql generates $(commas "$seed_rows") deterministic rows once: 1,000 aggregates
  round robin, a ${PAYLOAD_BYTES}-byte JSON payload and a traceparent header each. Before every drain
  the outbox is reset to the same state: TRUNCATE … RESTART IDENTITY, the first N seed rows
  copied in id order (ids 1..N), VACUUM ANALYZE, CHECKPOINT. So every drain of a size works on
  identical rows in an identically laid-out table, not on the bloat of the run before.
- **PostgreSQL-only bound.** \`pgbench -n -M prepared -c 1 -t N/1000\` running
  bench/claim_update.sql (or claim_delete.sql): one statement that claims 1,000 unsent rows with
  the relay's partial index (\`WHERE sent_at IS NULL ORDER BY id LIMIT 1000 FOR UPDATE SKIP
  LOCKED\`), marks them sent (or deletes them) and returns the columns the relay needs; no Kafka.
  events/s = pgbench's tps (without connection time) × 1,000; all rows checked claimed after.
- **Relay drains.** bin/outbox-relay (the non-sanitizer build) started with only
  --database-url and --brokers (default settings: up to two claim sessions, the second joining
  after ten full claims in a row), with \`--sessions 1\` (one claim session, the cycle before sessions), with \`$TUNED_LABEL\` (tuned) or with
  \`--on-sent delete\` (delivered rows deleted instead of marked; its ratio to the DELETE bound
  is in its row, its end is the poll's: no \`sent_at\` to read); timed from
  process start until no unsent row remains, so start-up is included (shown separately: start
  to the relay's "lanes owned" log line). Completion is polled every ${POLL_MS} ms over one open
  psql session: a primary-key lookup of row N, then one check of the whole partial index; the
  end is then the latest \`sent_at\` (the relay sets it with clock_timestamp() in the mark
  statement, its COMMIT next in the same pipeline), not the poll that saw it, which is up to
  ${POLL_MS} ms late. The relay's own "stopped sent=N" log line is checked against N. "First row sent" is when the
  same polls first saw row 1 marked (the end of the first batch, ± one poll); it shows
  start-up stalls, such as librdkafka 2.0.2 asking for a topic's metadata only at its 1-second
  topic scan when a producer first sends to it. CPU s = user + system time of the relay
  process (all threads) from /proc/PID/stat at the end.
- **CPU.** Each drain also reports the CPU time PostgreSQL's processes used over it (the
  postmaster's children, live and reaped: every backend, autovacuum, the checkpointer; the
  completion polls are a small part) and the mock broker's; the bounds, PostgreSQL's. The
  relay, PostgreSQL and the broker share the machine's CPUs, so these say where a drain's CPU
  goes, and they change much less with other load on the machine than its wall time does.
- **Replay.** $(commas "$REPLAY_SIZE") rows drained fresh (as above, from a reset outbox), then put
  back in line by \`outbox-relay replay --aggregate-type order --yes\` (new ids from the sequence,
  attempts 0) and drained by a new relay, then made unsent by hand (\`UPDATE … SET sent_at =
  NULL\`: the floor's trigger counts each as tried once, so they are claimed as failed rows) and
  drained again; $([ "${BENCH_REPLAY_VACUUM:-0}" = 1 ] && echo "a VACUUM after the replay" || echo "no VACUUM between"), a CHECKPOINT before each drain. A relay starts with its
  claim floor at 0, so its first claims walk the old versions' entries in the unsent index (the
  fresh drain's table was vacuumed): that shows in "first row sent".
- **Naive loop.** bin/naive-relay (bench/naive_relay.c), the seed's loop written plainly with
  blocking libpq and librdkafka: BEGIN; SELECT 100 unsent rows FOR UPDATE SKIP LOCKED; per row
  produce (same key, value and headers as the relay) and \`UPDATE … WHERE id = \$1\`; flush (wait
  for every ack); COMMIT; sleep 1 s when empty. Prepared statements, idempotent producer (as the
  relay). Timed like the relay, on $(commas "$NAIVE_SIZE") rows, but to the poll that saw it done
  (it marks with now(), its transaction's start; a poll is 0.5 % of its run).
- **Latency.** Empty outbox, fresh broker, relay started and ready, then bin/consume (a real
  librdkafka consumer, \`$CONSUMER_KAFKA\`: the mock broker answers an empty fetch only after
  fetch.wait.max.ms, it does not wake on new data) reading the topic from the start. The topic has
  $LATENCY_PARTITIONS partition(s) here (\`BENCH_LATENCY_PARTITIONS\`): the mock broker finds each fetch's offset
  by walking the partition's whole list of message sets (librdkafka 2.0.2's rdkafka_mock.c, up to
  5 MB of them per partition), a cost that grows as the log fills and that no Kafka broker has.
  Measured once (2026-11-24, 5,000 events/s, 6 partitions): its one thread climbed from 0.05 to
  0.6 of a CPU within 10 s (71 % of its perf samples in that walk), taken from the CPUs the relay
  and PostgreSQL share; with one partition it stayed near 0.13. One partition changes the relay's
  producing too (one leader, one message set a batch, and the idempotent producer's in-flight
  limit on one partition instead of six), so the control rows run default settings on a $PARTITIONS-partition topic in the same rounds, and
  each row gives the broker's CPU. The consumer prints tab-separated lines (\`--tsv id\`), not
  JSON: building JSON cost it 0.3 of a CPU at 10,000 messages/s, and since it takes a message's
  receive time after formatting the messages before it in the same fetch, that cost also added
  to the measured latency of batched arrivals (about 30 µs a message with JSON, 15 with tabs).
  pgbench
  \`-M prepared -c $LAT_CLIENTS -R RATE\` runs bench/insert_event.sql (one event per transaction; rows
  "RATE (TX tx × N)": bench/insert_events.sql, N events per transaction at RATE/N tx/s, the rates
  this machine cannot insert one transaction per event) for ${WARM_S} s of warm-up, then ${LAT_S} s measured. Latency = consumer receive time (CLOCK_REALTIME,
  \`received_us\`) − \`committed_us\` in the payload (clock_timestamp() during the INSERT, just
  before its commit). Every event whose committed_us falls in the measured window counts: the
  inserted count is taken from the database and compared with what the consumer read (missing),
  later copies of an event id are counted as duplicates and left out. p50/p99 are nearest-rank.
  The split uses the message's Kafka timestamp (CreateTime: set by librdkafka when the relay
  produces, millisecond precision): commit→produce is the relay's wakeup, claim and hand-over;
  produce→consumer is linger, waiting for the idempotent producer's in-flight limit, the broker
  round trip and the consumer's fetch (the mock returns one message set per partition a fetch).
- **Cost to producers.** pgbench \`-M prepared -c 1\` and \`-c 4\` \`-T ${PROD_S}\` with the same insert
  script into an emptied outbox, without the \`outbox_wakeup\` trigger (dropped) and with it
  (recreated from its own pg_get_triggerdef), $PROD_ROUNDS paired rounds with the order
  alternating (one 10 s run per arm proved too noisy here: ±10 % between identical runs). "no relay": nothing listens, so this is the
  commit path alone (NOTIFY queues and serialises commits whether or not anyone listens).
  "relay": a relay at default settings listens and drains during both runs, sharing the CPUs.
- **Memory.** VmRSS sampled at every completion poll and VmHWM read from /proc/PID/status just
  before the relay is stopped.
- **Order.** Each round drains a size's rows in this order${DRAIN_ORDER:+ (${DRAIN_ORDER// /, }; update and delete: the bounds)},
  each from a reset outbox, in odd rounds, and in the reverse order in even ones: over an even
  number of rounds every pair the report divides (a drain and its bound, this build and the baseline)
  has gone first as often as second. The order was fixed until 2026-11-29; A/A runs then (the
  baseline a copy of this binary) had this build at 0.95× of it, median of 32 rounds, and at
  1.02× over 28 rounds with the order reversed every other round: within this machine's
  noise, the cause not found (docs/benchmarks-delete-replay.md, "The order of the drains").
  A rate's latency runs (default, baseline, tuned, control) take turns the same way, round by round.
- **Noise.** $([ "$REPEAT" -gt 1 ] && echo "Drains: $REPEAT interleaved rounds, medians; producer rows: $PROD_ROUNDS paired rounds; latency: $LAT_ROUNDS rounds, the median-p50 round." || echo "One round of drains (BENCH_REPEAT=4 gives medians over both orders); producer rows: $PROD_ROUNDS paired rounds; latency: $LAT_ROUNDS round(s).") Compare
  ratios, not absolute figures, and only between runs on a quiet machine (see the load average
  above).
EOF
}

report_notes() {
    local key n
    if [ ${#NOTES[@]} -gt 0 ] || [ ${#R_NOTE[@]} -gt 0 ]; then
        echo
        echo "## Notes from this run"
        echo
        for key in "${!R_NOTE[@]}"; do
            echo "- $key: ${R_NOTE[$key]}"
        done
        for n in "${NOTES[@]}"; do
            echo "- $n"
        done
    fi
    if [ "$_T_FAIL" -gt 0 ]; then
        echo
        echo "**The harness reported $_T_FAIL failed check(s) in this run; see its output.**"
    fi
}

# One relay, many databases: its own PostgreSQL and brokers (bench/multidb.sh).
if [[ $PARTS == *" multidb "* ]]; then
    RELAY_BIN=$RELAY_BIN bash "$BENCH/multidb.sh" >"$T/multidb.md" 2>"$T/multidb.log" ||
        NOTES+=("multidb: bench/multidb.sh failed (exit $?): $(tail -n 1 "$T/multidb.log")")
fi
mkdir -p "$(dirname "$OUT")"
report >"$T/report.md"
# The demos' Redis section (bench/redis_bench.sh, `make bench-redis`) is its own run: keep it.
if [ -f "$OUT" ] && grep -q '^<!-- redis-bench:start -->' "$OUT"; then
    sed -n '/^<!-- redis-bench:start -->/,/^<!-- redis-bench:end -->/p' "$OUT" >"$T/redis.md"
    { echo; cat "$T/redis.md"; } >>"$T/report.md"
fi
echo
cat "$T/report.md"
cp "$T/report.md" "$OUT" && echo && echo "# report written to $OUT (${RUN_SECONDS} s)"
