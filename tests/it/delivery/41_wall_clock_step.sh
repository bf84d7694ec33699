#!/bin/bash
# Proves the relay measures durations on the monotonic clock, not the wall clock:
# libev's ev_now() is wall-clock time, and a session that decided "rows came recently, stay
# awake" from ev_now() differences polled every --busy-poll-interval (2 ms) for as long as the
# wall clock had been stepped back (an NTP step, a resumed VM). On main: ~35 claims in 5 s idle,
# ~1,500-2,000 after a step back of one hour.
# The relay runs under libfaketime (Debian's faketime) with the monotonic clock left alone; its
# wall clock steps back 3600 s while it is idle. The claims it makes in 5 s (its own counter,
# outbox_claim_duration_seconds_count) are counted before and after the step: after may not be
# more than twice before plus 10 (a poll every second and the odd wakeup; a busy session makes
# hundreds a second). Delivery is then checked to go on at the stepped-back time.
# 2. A database of a --databases list with a retention of 2 s: its sent rows are deleted before
# the wall clock steps back an hour, and rows sent after the step are deleted too (its upkeep
# times its sweeps on the monotonic clock).
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"

FAKETIME_LIB=$(ls /usr/lib/*/faketime/libfaketimeMT.so.1 2>/dev/null | head -n 1)
[ -n "$FAKETIME_LIB" ] || fail "libfaketime is installed (Debian package faketime)"
# The sanitizer runtime must come first among the libraries, and LD_PRELOAD would put
# libfaketime before it: this test runs the normal build.
RELAY_BIN=$BIN/outbox-relay
echo "+0" >"$T/faketime"
RELAY_WRAP=(env LD_PRELOAD="$FAKETIME_LIB" FAKETIME_TIMESTAMP_FILE="$T/faketime"
    FAKETIME_CACHE_DURATION=1 FAKETIME_DONT_FAKE_MONOTONIC=1)
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --sessions 2 --min-sessions 2 \
    --metrics-listen 127.0.0.1:0 --kafka reconnect.backoff.max.ms=500
metrics_wait


claims() {
    metric outbox_claim_duration_seconds_count
}
# claims_in_5s: the claims the relay makes in five seconds.
claims_in_5s() {
    local a b
    a=$(claims) || return 1
    sleep 5
    b=$(claims) || return 1
    echo $((b - a))
}
# flow FIRST: a steady trickle of 100 events, one every 20 ms (less than --sleep-after apart), in
# one psql session: the relay stays awake and polls while it lasts, and falls asleep once the
# flow has stopped for --sleep-after. FIRST numbers the events' seq.
flow() {
    local i
    for ((i = $1; i < $1 + 100; i++)); do
        echo "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
              VALUES ('clock', 'c-$((i % 3))', 'ticked', '{\"seq\": $i}');"
        echo "SELECT pg_sleep(0.02);"
    done | psql -XAtq -v ON_ERROR_STOP=1 >/dev/null
}
flow 1000 || fail "the first flow is inserted"
sleep 2 # past --sleep-after: the session sleeps, polling once a --poll-interval
before=$(claims_in_5s) || fail "the relay's claim counter is readable"
echo "# claims in 5 s after a flow ended, no clock step: $before"

# The wall clock steps back an hour while the relay is idle. Two sessions take part
# (--min-sessions 2): one guards the wakeup lock and sleeps, the other follows and wakes once a
# --poll-interval to ask again; on main that follower found its last rows "in the future" of the
# clock it then read, stayed awake and polled every 2 ms.
echo "-3600" >"$T/faketime"
sleep 2 # libfaketime reads the file again within FAKETIME_CACHE_DURATION
# stepped: the wall clock the relay sees is at least 50 minutes behind the real one (compared as
# epoch seconds, so the answer does not depend on the time of day).
stepped() {
    local faked real
    faked=$("${RELAY_WRAP[@]}" date -u +%s) || return 1
    real=$(date -u +%s)
    [ $((real - faked)) -ge 3000 ]
}
check "the wall clock under libfaketime is an hour back" stepped
after=$(claims_in_5s) || fail "the relay's claim counter is readable after the step"
echo "# claims in 5 s after the clock stepped back: $after"
limit=$((2 * before + 10))
check "after the step the relay polls no more than before (at most $limit claims in 5 s)" \
    test "$after" -le "$limit"

psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'clock', 'c-' || (g % 3), 'ticked', jsonb_build_object('seq', g)
        FROM generate_series(3000, 3019) AS g ORDER BY g"
wait_for "events inserted after the step are delivered" 30 no_unsent_rows
check_delivered clock
relay_stop
check_eq "the relay exits 0" 0 "$?"

# --- 2. retention of a database of a list, across the same step back ---
# A database of a --databases list sweeps on its upkeep's 15 s tick once upkeep_retention_interval
# has passed since its last sweep; on main that was measured with ev_now(), so after the step
# back "since the last sweep" was an hour short and nothing was deleted for that hour.
echo "+0" >"$T/faketime"
sleep 2
unset DATABASE_URL
printf '{"brokers": "%s", "log-level": "debug", "kafka": {"reconnect.backoff.max.ms": "500"},
"databases": [{"name": "a", "database-url": "postgresql://postgres@127.0.0.1:%s/outbox", "retention": "2s"}]}\n' \
    "$BROKERS" "$PGPORT" >"$T/list.json"
relay_start --config "$T/list.json"
emptied() { [ "$(psql_q "SELECT count(*) FROM outbox")" = 0 ]; }
wait_for "2: the list's relay deletes the sent rows (retention 2s)" 45 emptied
echo "-3600" >"$T/faketime"
sleep 2
check "2: the wall clock under libfaketime is an hour back" stepped
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'clock', 'c-' || (g % 3), 'ticked', jsonb_build_object('seq', g)
        FROM generate_series(4000, 4019) AS g ORDER BY g"
wait_for "2: rows sent after the step are delivered" 30 no_unsent_rows
# Two ticks of 15 s and the rows' 2 s: a sweep comes within about 35 s.
wait_for "2: ... and deleted by retention, the clock stepped back or not" 45 emptied
relay_stop
check_eq "2: the relay exits 0" 0 "$?"
