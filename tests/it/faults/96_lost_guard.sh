#!/bin/bash
# Proves that a wakeup guard whose connection is lost while its server process lives on (the
# server has not noticed the cut yet) does not leave the sessions asleep unguarded once that
# process ends (docs/operations.md#wakeup-after-a-lost-connection). One relay, two claim sessions,
# in a network namespace; --poll-interval 600000 and --rebalance-interval 60000 (its maximum),
# so that only a notification wakes a session within the test. Both sessions fall asleep: one
# guards (holds the wakeup lock), the other follows. Then every packet of the guard's connection
# is dropped, the relay's own next packet on it answered by a local reset only (nft inside the
# namespace): the relay loses the connection and reconnects, while the server keeps the guard's
# process and its lock.
#  1. the reconnected session ends exactly that process (logged), and it is gone;
#  2. rows committed after it ended, into lanes held then, are all delivered within 20 s (on the
#     code before the fix the process ended later on its own, without a notification, and the
#     rows waited for a poll timer: 0 of them were delivered);
#  3. the relay exits 0.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
# shellcheck source=tests/netns_lib.sh
source "$(dirname "$0")/../../netns_lib.sh"
t_setup
fault_init
netns_create
fault_setup 1
netns_pg_listen
netns_forward_brokers

RELAY_WRAP=(ip netns exec "$NS")
relay_start --database-url "$NS_DATABASE_URL" "${FAULT_RELAY_OPTS[@]}" --sessions 2 \
    --min-sessions 2 --poll-interval 600000 --rebalance-interval 60000 --log-level debug
RELAY_WRAP=()

all_lanes_held() {
    [ "$(psql_q "SELECT count(*) FROM pg_locks l WHERE $LANE_LOCK")" = 64 ]
}
# both_asleep: the guard is a session of the relay and the other session follows it.
both_asleep() {
    guard_held && grep -q 'msg="asleep" as=follow' "$RELAY_LOG" &&
        [ "$(psql_q "SELECT count(DISTINCT l.pid) FROM pg_locks l WHERE $LANE_LOCK")" = 2 ]
}
wait_for "the relay's two sessions hold the 64 lanes" 30 all_lanes_held || fail "lanes held"
wait_for "both sessions asleep: one guards, the other follows" 30 both_asleep ||
    fail "both asleep"
GUARD=$(guard_pid)
PORT=$(psql_q "SELECT client_port FROM pg_stat_activity WHERE pid = $GUARD")
echo "# guard: server process $GUARD, the relay's port $PORT"

# --- the cut: the guard's connection only ---
mark=$(log_lines)
netns_exec nft -f - <<EOF || fail "nft: cut the guard's connection"
table inet outbox_relay_guard_cut {
    chain input { type filter hook input priority 0; policy accept; iifname "$NS_VETH_NS" tcp dport $PORT drop; }
    chain output { type filter hook output priority 0; policy accept; tcp sport $PORT reject with tcp reset; }
}
EOF
lost() {
    tail -n +$((mark + 1)) "$RELAY_LOG" | grep -q 'msg="postgres connection lost"'
}
wait_for "the relay lost the guard's connection (its heartbeat met the reset)" 30 lost ||
    fail "connection lost"
# The relay reconnects within a fraction of a second and may have ended the process already (a
# loaded machine polls slower than that): its "ended" line is logged only for a process it found
# alive, so either says the process outlived the connection.
outlived() {
    [ -n "$(psql_q "SELECT 1 FROM pg_stat_activity WHERE pid = $GUARD")" ] ||
        tail -n +$((mark + 1)) "$RELAY_LOG" |
        grep -q "msg=\"ended the server process of the lost wakeup guard; sessions asleep woken\" pid=$GUARD "
}
check "the guard's server process outlived the connection" outlived

# --- 1. ---
ended() {
    tail -n +$((mark + 1)) "$RELAY_LOG" |
        grep -q "msg=\"ended the server process of the lost wakeup guard; sessions asleep woken\" pid=$GUARD "
}
wait_for "1: the reconnected session ended the lost guard's process" 30 ended
gone() {
    [ -z "$(psql_q "SELECT 1 FROM pg_stat_activity WHERE pid = $GUARD")" ]
}
# Before the fix it ended on its own: TCP keepalives or idle_session_timeout (15 s).
wait_for "1: the lost guard's process is gone" 40 gone || fail "the guard's process gone"

# --- 2. ---
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'after', 'after-' || g, 'changed', jsonb_build_object('seq', g)
        FROM generate_series(1, 200) AS g
        WHERE outbox_lane('after', 'after-' || g)::bigint IN
              (SELECT l.objid::bigint FROM pg_locks l WHERE $LANE_LOCK)" >/dev/null ||
    fail "insert rows"
n=$(rows_of after)
check "2: rows committed into lanes held ($n)" test "$n" -gt 0
_poll 20 none_unsent_of after
check_eq "2: rows delivered within 20 s, poll timers 600 s away" "$n" "$(sent_of after)"

relay_stop
check_eq "3: relay exits 0" 0 $?
