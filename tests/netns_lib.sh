# shellcheck shell=bash
# tests/netns_lib.sh: real network faults and the fault tests' shared steps. Source it after
# tests/lib.sh and call fault_init after t_setup.
#
# Network namespaces (CI runs as root; a machine that refuses them skips the test with a reason):
#   netns_create        a namespace NS joined to this one by a veth pair on a private /24 of its
#                       own: NS_HOST_ADDR (this side), NS_ADDR (inside); loopback up inside
#   netns_pg_listen     PostgreSQL also listens on NS_HOST_ADDR, and trusts the /24 (restarts it)
#   netns_forward_brokers   the mock brokers reachable from inside NS at the addresses they
#                       advertise (127.0.0.1:PORT): socat inside NS to a socat on NS_HOST_ADDR
#   netns_block / netns_unblock   nft inside NS drops / stops dropping every packet on its veth
#                       (loopback inside NS keeps working, as on a host whose cable is cut)
# Every exit path kills what the test started (continuing stopped processes first), stops the
# extra PostgreSQL servers, deletes the namespace (which deletes the veth pair) and removes the
# nft table with it, before lib.sh's own cleanup runs.
#
# Shared steps of the fault tests: load_for (rows arriving steadily), latency and duplicate
# figures, and timestamps.

_F_CLEANUPS=()
_F_STOPPED=() # pids sent SIGSTOP: continued on exit so that TERM/KILL and pg_ctl stop work
NS=

# fault_init: chains this file's cleanup before lib.sh's (call after t_setup).
fault_init() {
    trap _fault_exit EXIT
}

# on_exit CMD: runs CMD (eval) on every exit path, last registered first.
on_exit() {
    _F_CLEANUPS+=("$1")
}

_fault_exit() {
    local rc=$? i pid
    for pid in "${_F_STOPPED[@]}"; do
        kill -CONT "$pid" 2>/dev/null
    done
    for pid in "${_T_PIDS[@]}"; do
        _t_reap "$pid" 5
    done
    for ((i = ${#_F_CLEANUPS[@]} - 1; i >= 0; i--)); do
        eval "${_F_CLEANUPS[$i]}" >/dev/null 2>&1
    done
    (exit "$rc")
    _t_exit
}

# stop_pid PID / cont_pid PID: SIGSTOP / SIGCONT, remembered for the cleanup.
stop_pid() {
    _F_STOPPED+=("$1")
    kill -STOP "$1"
}

cont_pid() {
    kill -CONT "$1"
}

# skip_test REASON: the whole test is skipped (one TAP skip line), exit 0.
skip_test() {
    ok "# SKIP $1"
    exit 0
}

# now_ms: wall clock in milliseconds.
now_ms() {
    echo $(($(date +%s%N) / 1000000))
}

# secs_since MS: seconds (3 decimals) from MS to now.
secs_since() {
    ms_as_s $(($(now_ms) - $1))
}

# ms_as_s MS: MS milliseconds (not negative) as seconds with 3 decimals.
ms_as_s() {
    printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000))
}

# ---- network namespaces ------------------------------------------------------------------------

# netns_create: see above. Skips the test when the machine refuses namespaces, veths or nft.
netns_create() {
    local x span first
    command -v ip >/dev/null || skip_test "no 'ip' (iproute2) on this machine"
    command -v nft >/dev/null || skip_test "no 'nft' (nftables) on this machine"
    command -v socat >/dev/null || skip_test "no 'socat' on this machine"
    [ "$(id -u)" = 0 ] || skip_test "network namespaces need root"
    NS=outbox-relay-$$
    NS_VETH_HOST=orh$$
    NS_VETH_NS=orn$$
    # A /24 no interface of this machine uses yet: 10.231.X.0/24, X from the pid, within this
    # test's share of 20-219 (slot_share: tests running at once never pick the same one).
    read -r first span <<<"$(slot_share 20 200)"
    x=$((first + $$ % span))
    for _ in $(seq 1 "$span"); do
        ip -o -4 addr show | grep -q " 10\.231\.$x\." || break
        x=$((first + (x - first + 1) % span))
    done
    NS_HOST_ADDR=10.231.$x.1
    NS_ADDR=10.231.$x.2
    if ! ip netns add "$NS" 2>"$T/netns.err"; then
        skip_test "this machine refuses network namespaces: $(head -n 1 "$T/netns.err")"
    fi
    on_exit "ip netns del '$NS'; ip link del '$NS_VETH_HOST'"
    ip link add "$NS_VETH_HOST" type veth peer name "$NS_VETH_NS" 2>"$T/netns.err" ||
        skip_test "this machine refuses veth pairs: $(head -n 1 "$T/netns.err")"
    if ! { ip link set "$NS_VETH_NS" netns "$NS" &&
        ip addr add "$NS_HOST_ADDR/24" dev "$NS_VETH_HOST" &&
        ip link set "$NS_VETH_HOST" up &&
        ip netns exec "$NS" ip addr add "$NS_ADDR/24" dev "$NS_VETH_NS" &&
        ip netns exec "$NS" ip link set "$NS_VETH_NS" up &&
        ip netns exec "$NS" ip link set lo up; }; then
        fail "configure the veth pair"
    fi
    ip netns exec "$NS" nft list tables >/dev/null 2>"$T/netns.err" ||
        skip_test "nftables refused inside a namespace: $(head -n 1 "$T/netns.err")"
    echo "# namespace $NS: $NS_HOST_ADDR (host) <-> $NS_ADDR (inside)"
}

# netns_exec CMD...: runs CMD inside the namespace.
netns_exec() {
    ip netns exec "$NS" "$@"
}

# netns_pg_listen: PostgreSQL listens on loopback and NS_HOST_ADDR, trusting the namespace's /24;
# exports NS_DATABASE_URL (the test database through the veth).
netns_pg_listen() {
    echo "listen_addresses = '127.0.0.1,$NS_HOST_ADDR'" >>"$T/pg/postgresql.conf"
    echo "host all all ${NS_HOST_ADDR%.1}.0/24 trust" >>"$T/pg/pg_hba.conf"
    pg_restart
    NS_DATABASE_URL=postgresql://postgres@$NS_HOST_ADDR:$PGPORT/outbox
    export NS_DATABASE_URL
}

_listening() { # _listening [netns] ADDR:PORT
    if [ "$1" = netns ]; then
        netns_exec ss -ltnH "src $2" | grep -q .
    else
        ss -ltnH "src $1" | grep -q .
    fi
}

# netns_forward_brokers: every broker of $BROKERS reachable from inside the namespace at the
# same 127.0.0.1:PORT (the mock advertises loopback addresses, so clients follow them there).
netns_forward_brokers() {
    local b port
    for b in ${BROKERS//,/ }; do
        port=${b##*:}
        socat "TCP-LISTEN:$port,bind=$NS_HOST_ADDR,fork,reuseaddr" "TCP:127.0.0.1:$port" \
            2>>"$T/socat.log" &
        _t_track $!
        ip netns exec "$NS" socat "TCP-LISTEN:$port,bind=127.0.0.1,fork,reuseaddr" \
            "TCP:$NS_HOST_ADDR:$port" 2>>"$T/socat.log" &
        _t_track $!
        _poll 10 _listening "$NS_HOST_ADDR:$port" || fail "host-side forwarder on $port"
        _poll 10 _listening netns "127.0.0.1:$port" || fail "namespace forwarder on $port"
    done
}

# netns_block: from now on every packet in or out of the namespace's veth is dropped, silently:
# no RST, no ICMP, as when a host loses power or its link.
netns_block() {
    netns_exec nft -f - <<EOF || fail "nft: block the namespace"
table inet outbox_relay_fault {
    chain input { type filter hook input priority 0; policy accept; iifname "$NS_VETH_NS" drop; }
    chain output { type filter hook output priority 0; policy accept; oifname "$NS_VETH_NS" drop; }
}
EOF
}

netns_unblock() {
    netns_exec nft delete table inet outbox_relay_fault || fail "nft: unblock the namespace"
}

# ---- the fault tests' shared steps -------------------------------------------------------------

# load_for TYPE SECONDS [AGGREGATES] [ROWS_PER_TX]: in the background, one client commits a
# transaction of ROWS_PER_TX (default 20) rows every 50 ms for SECONDS, over AGGREGATES (default
# 400) aggregates of type TYPE, payload seq growing with id per aggregate. Sets LOAD_PID.
load_for() {
    local type=$1 secs=$2 aggs=${3:-400} per=${4:-20}
    psql_q "CREATE OR REPLACE PROCEDURE fault_load(t text, secs float8, aggs int, per int)
            LANGUAGE plpgsql AS \$\$
            DECLARE i int := 0; t0 timestamptz := clock_timestamp();
            BEGIN
              WHILE clock_timestamp() < t0 + make_interval(secs => secs) LOOP
                INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
                SELECT t, t || '-' || ((i * per + g) % aggs), 'changed',
                       jsonb_build_object('seq', i * per + g)
                FROM generate_series(0, per - 1) AS g ORDER BY g;
                COMMIT;
                i := i + 1;
                PERFORM pg_sleep(0.05);
              END LOOP;
            END \$\$" || fail "create the load procedure"
    psql_q "CALL fault_load('$type', $secs, $aggs, $per)" >"$T/load.$type.log" 2>&1 &
    LOAD_PID=$!
    _t_track "$LOAD_PID"
}

# load_done_and_sent TYPE: the load has ended and every row of TYPE is acknowledged.
load_done_and_sent() {
    _t_dead "$LOAD_PID" && none_unsent_of "$1"
}

# latency_figures TYPE: "p50 p99 max" of commit -> acknowledgement (sent_at - created_at), in
# seconds, of TYPE's rows.
latency_figures() {
    psql_q "SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY l)::numeric, 3) || ' ' ||
                   round(percentile_cont(0.99) WITHIN GROUP (ORDER BY l)::numeric, 3) || ' ' ||
                   round(max(l)::numeric, 3)
            FROM (SELECT extract(epoch FROM sent_at - created_at) AS l FROM outbox
                  WHERE aggregate_type = '$1' AND sent_at IS NOT NULL) s"
}

# duplicates_in FILE: messages in FILE (consume output) beyond the first copy of each event.
duplicates_in() {
    echo $(($(grep -c . "$1") - $(jq -r .headers.id "$1" | sort -u | grep -c .)))
}

# log_time_ms FILE PATTERN: the time (ms since the epoch) of the last line of FILE matching
# PATTERN (grep -E), from its ISO timestamp; empty when none.
log_time_ms() {
    local ts
    ts=$(grep -E "$2" "$1" | tail -n 1 | cut -d' ' -f1)
    [ -n "$ts" ] && echo $(($(date -d "$ts" +%s%N) / 1000000))
}

# lanes_from ADDR: lanes held by relay sessions connected from ADDR (client_addr).
lanes_from() {
    psql_q "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
            WHERE l.locktype = 'advisory' AND l.classid = $LANE_NS AND l.objsubid = 2
              AND l.granted AND a.client_addr = '$1'"
}

# lanes_of_app NAME: lanes held by relay sessions whose application_name is NAME (set it in the
# relay's URL, ?application_name=NAME, to tell relays on one address apart).
lanes_of_app() {
    psql_q "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
            WHERE l.locktype = 'advisory' AND l.classid = $LANE_NS AND l.objsubid = 2
              AND l.granted AND a.application_name = '$1'"
}

# check_rows_during_fault TYPE WHAT NAME_A T0 FAULT_END: part 1 of a fault test with relays $A_PID
# and $B_PID, the fault (WHAT: "fault", "freeze") struck at T0 and lasting until FAULT_END (ms
# since the epoch), load TYPE arriving meanwhile. Waits until the load has ended and every row of
# TYPE is acknowledged, or FAULT_END at the most, and checks the first came before the second:
# relay A (NAME_A) took the lanes over in time. Prints when the last row was acknowledged and when
# relay A logged that it holds all 64 lanes, and checks that no row waited more than 20 s from
# commit to acknowledgement (its latency figures printed).
check_rows_during_fault() {
    local type=$1 what=$2 name_a=$3 t0=$4 fault_end=$5 took p50 p99 max
    until load_done_and_sent "$type" || [ "$(now_ms)" -ge "$fault_end" ]; do
        sleep 0.2
    done
    if load_done_and_sent "$type"; then
        ok "1: every row ($(rows_of "$type")) acknowledged before the $what ends ($(((fault_end - t0) / 1000))s)"
        echo "# 1: last row acknowledged $(secs_since "$t0")s after the $what began"
    else
        not_ok "1: every row acknowledged before the $what ends" \
            "$(unsent_of "$type") of $(rows_of "$type") unsent"
    fi
    took=$(log_time_ms "$A_LOG" 'msg="lanes owned" lanes=64 ')
    [ -n "$took" ] && echo "# 1: $name_a logged 'lanes owned lanes=64' $(ms_as_s $((took - t0)))s after the $what began"
    read -r p50 p99 max <<<"$(latency_figures "$type")"
    echo "# 1: commit -> acknowledgement during the $what: p50 ${p50}s p99 ${p99}s max ${max}s"
    check "1: no row waited more than 20 s from commit to acknowledgement (max ${max}s)" \
        awk -v m="$max" 'BEGIN { exit !(m + 0 <= 20) }'
}

# sleep_until MS: sleeps until MS (ms since the epoch), at once when it has passed.
sleep_until() {
    local now
    now=$(now_ms)
    [ "$now" -ge "$1" ] || sleep "$(ms_as_s $(($1 - now)))"
}

# check_two_relays_after_fault TYPE WHAT NAME_A NAME_B: the end of a fault test with relays
# $A_PID and $B_PID (NAME_A, NAME_B in the descriptions): every row of TYPE in Kafka, first copies
# in order (WHAT names the fault), the duplicates printed, the rows inserted after the fault
# (type "after") delivered, both relays exit 0 on SIGTERM and none logged 'order broken'.
check_two_relays_after_fault() {
    local type=$1 what=$2 name_a=$3 name_b=$4
    check_delivered "$type" "3: every row of the $what in Kafka (0 lost)"
    echo "# 3: duplicates in Kafka: $(duplicates_in "$T/$type.json") of $(grep -c . "$T/$type.json") messages"
    check_delivered after
    RELAY_PID=$B_PID
    relay_stop
    check_eq "3: $name_b exits 0" 0 $?
    RELAY_PID=$A_PID
    relay_stop
    check_eq "3: $name_a exits 0" 0 $?
    check "3: no relay logged 'order broken'" _no_order_broken
}

_no_order_broken() {
    ! grep -l 'order broken' "$T"/relay.*.log
}
