#!/bin/bash
# bench/replay.sh: how fast the relay drains events put back in line (docs/operations.md#replay),
# against fresh events of the same run. Not a test: it prints figures and never fails on them.
#
# Per round: N fresh rows (1,000 aggregates) are inserted with no relay running, then one relay
# (default settings) is started and timed until nothing is unsent; the same N rows are then put
# back in line by `outbox-relay replay` and drained the same way; then once more by hand
# (`UPDATE outbox SET sent_at = NULL`, which 0008's trigger counts as one attempt, sending the
# rows through the claims' path for failed rows). Each drain starts the relay afresh, so the
# three include the same start-up. Also prints how long the replay command itself took.
#
#   BENCH_REPLAY_ROWS=100000  BENCH_REPLAY_ROUNDS=2  BENCH_REPLAY_VACUUM=0  bench/replay.sh
# (BENCH_REPLAY_VACUUM=1 vacuums between the replay and its drain.)
# shellcheck source=tests/lib.sh
RELAY_BIN=${RELAY_BIN:-$(cd "$(dirname "$0")/.." && pwd)/bin/outbox-relay}
source "$(dirname "$0")/../tests/lib.sh"
N=${BENCH_REPLAY_ROWS:-100000}
ROUNDS=${BENCH_REPLAY_ROUNDS:-2}
t_setup
pg_start
broker_start 3
relay_migrate 2>"$T/migrate.log" || fail "migrate"

now() { date +%s.%N; }
# drain LABEL: starts a relay, waits until nothing is unsent, stops it; sets RATE (rows/s).
drain() {
    local t0 t1
    t0=$(now)
    relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS"
    _poll 900 no_unsent_rows || fail "$1: drained within 900 s"
    t1=$(now)
    relay_stop || fail "$1: the relay exits 0"
    RATE=$(echo "$N / ($t1 - $t0)" | bc)
    echo "# $1: $N rows in $(echo "scale=2; ($t1 - $t0) / 1" | bc) s = $RATE rows/s"
}
for ((round = 1; round <= ROUNDS; round++)); do
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            SELECT 'order', 'o-' || (g % 1000), 'Updated', jsonb_build_object('seq', g)
            FROM generate_series(1, $N) g ORDER BY g" >/dev/null || fail "insert"
    drain "round $round: fresh"
    fresh=$RATE
    t0=$(now)
    "$RELAY_BIN" replay --database-url "$DATABASE_URL" --aggregate-type order --yes \
        >"$T/replay.out" || fail "replay"
    echo "# round $round: the replay command: $(echo "scale=2; ($(now) - $t0) / 1" | bc) s"
    # BENCH_REPLAY_VACUUM=1: without the replayed rows' old versions (what they cost the drain).
    [ "${BENCH_REPLAY_VACUUM:-0}" = 1 ] && { psql_q "VACUUM outbox" >/dev/null || fail "vacuum"; }
    drain "round $round: replayed"
    replayed=$RATE
    psql_q "UPDATE outbox SET sent_at = NULL WHERE aggregate_type = 'order'" >/dev/null ||
        fail "update"
    drain "round $round: by hand (UPDATE sent_at = NULL)"
    echo "round $round: fresh $fresh rows/s, replayed $replayed rows/s" \
        "($(echo "scale=2; $replayed / $fresh" | bc)x), by hand $RATE rows/s" \
        "($(echo "scale=2; $RATE / $fresh" | bc)x)"
    psql_q "DELETE FROM outbox" >/dev/null || fail "empty the outbox"
    psql_q "VACUUM outbox" >/dev/null || fail "vacuum the outbox"
done
