#!/bin/bash
# Proves that a multi-host --database-url follows libpq's host list in the non-blocking relay:
#  1. the first host refuses connections (a closed loopback port): the relay delivers from the
#     second host within 5 s of starting (time printed), and logs the refusing host once;
#  2. every host down: each host's failure is logged once per connection, not at every retry,
#     and "postgres unreachable" once, while the relay keeps retrying;
#  3. the server turns read-only under a running relay (default_transaction_read_only, which
#     makes its claim fail with SQLSTATE 25006, as on a demoted primary): the relay gives that
#     session up and reconnects (with target_session_attrs=read-write it accepts no read-only
#     server) instead of retrying the claim on it, and delivers again once the server is
#     writable;
#  5. (run before 4) a read-only server with no target_session_attrs: connections that are given
#     up at once make one outage, logged once (and once after the first reconnection), with a
#     growing backoff, not a reconnect every 0.2 s with two lines each; its end is logged once
#     a connection lasts;
#  6. (run before 4) an empty entry of the port list is libpq's default port, as in libpq's own
#     reading of the string, not PGPORT's: with PGPORT naming a closed port, "port=,PORT" tries
#     its first host on 5432 (skipped where something listens there) and delivers from the second;
#  4. the first host black-holes connections (an address inside a network namespace whose
#     packets nft drops: no answer at all): the relay delivers from the second host within
#     connect_timeout (3 s here) + 5 s of starting (time printed).
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
# shellcheck source=tests/netns_lib.sh
source "$(dirname "$0")/../../netns_lib.sh"
t_setup
fault_init
fault_setup 1
insert() { # insert TYPE N: N rows over 20 aggregates, seq grows with id
    insert_rows "$1" 1 "$2" 20
}
# delivered_within TYPE LIMIT_S T0_MS DESCRIPTION: every row of TYPE acknowledged by T0 + LIMIT.
delivered_within() {
    if _poll "$2" none_unsent_of "$1"; then
        echo "# $4: delivered $(secs_since "$3")s after the relay started"
        ok "$4 within ${2}s"
    else
        not_ok "$4 within ${2}s" "$(unsent_of "$1") of $(rows_of "$1") unsent"
    fi
}

# --- 1. the first host refuses ---
CLOSED=$(free_port)
URL="postgresql://postgres@127.0.0.1:$CLOSED,127.0.0.1:$PGPORT/outbox?target_session_attrs=read-write"
insert ref 100
t0=$(now_ms)
relay_start --database-url "$URL" "${FAULT_RELAY_OPTS[@]}"
delivered_within ref 5 "$t0" "1: first host refusing: rows delivered from the second host"
check "1: the refusing host is logged" \
    grep -qE "msg=\"postgres host failed\".* host=\"127.0.0.1:$CLOSED\"" "$RELAY_LOG"
check_delivered ref

# --- 3 (while this relay runs). the server turns read-only ---
export PGOPTIONS="-c default_transaction_read_only=off" # this test's own sessions stay writable
psql_q "ALTER SYSTEM SET default_transaction_read_only = on" && psql_q "SELECT pg_reload_conf()" >/dev/null
wait_for "3: a read-only claim makes the relay give the session up (SQLSTATE 25006)" 15 \
    grep -qE 'msg="postgres connection lost".*25006' "$RELAY_LOG"
sleep 3 # some reconnect rounds against the read-only server
check_eq "3: no claim retried on the read-only session" 0 \
    "$(grep -c 'msg="claiming rows failed' "$RELAY_LOG")"
check "3: the read-only server is refused by target_session_attrs" \
    grep -qE 'msg="postgres host failed".*read-only' "$RELAY_LOG"
insert ro 100
t0=$(now_ms)
psql_q "ALTER SYSTEM RESET default_transaction_read_only" && psql_q "SELECT pg_reload_conf()" >/dev/null
unset PGOPTIONS
if _poll 15 none_unsent_of ro; then
    ok "3: writable again: rows delivered within 15 s"
    echo "# 3: delivered $(secs_since "$t0")s after the server became writable"
else
    not_ok "3: writable again: rows delivered within 15 s" "$(unsent_of ro) unsent"
fi
check_delivered ro
relay_stop
check_eq "1, 3: relay exits 0" 0 $?

# --- 2. every host down ---
CLOSED2=$(free_port)
relay_start --database-url "postgresql://postgres@127.0.0.1:$CLOSED,127.0.0.1:$CLOSED2/outbox" \
    "${FAULT_RELAY_OPTS[@]}" --sessions 1
sleep 6 # several rounds: 0.2 s doubling, with jitter
check_eq "2: each host's refusal logged once" 2 \
    "$(grep -c 'msg="postgres host failed"' "$RELAY_LOG")"
check_eq "2: 'postgres unreachable' logged once" 1 \
    "$(grep -c 'msg="postgres unreachable"' "$RELAY_LOG")"
check "2: the relay keeps running" relay_running
relay_stop
check_eq "2: relay exits 0" 0 $?

# --- 5. a read-only server, and no target_session_attrs to refuse it ---
# Every connection succeeds and is given up at its first claim (SQLSTATE 25006), as against a
# standby whose first LISTEN fails. Such short-lived connections belong to one outage: the
# backoff keeps growing (reset only by a connection that lasts) and the loss is logged once, and
# once more after the first reconnection; the connect-time reset retried five times a second
# with a warning and an info line each (40 of each in 6 s).
export PGOPTIONS="-c default_transaction_read_only=off"
psql_q "ALTER SYSTEM SET default_transaction_read_only = on" && psql_q "SELECT pg_reload_conf()" >/dev/null
insert ro5 100
PGOPTIONS="" relay_start --database-url "postgresql://postgres@127.0.0.1:$PGPORT/outbox" \
    "${FAULT_RELAY_OPTS[@]}" --sessions 1 # (the relay's sessions read-only, unlike this test's)
wait_for "5: the read-only claim gives the session up (SQLSTATE 25006)" 15 \
    grep -qE 'msg="postgres connection lost".*25006' "$RELAY_LOG"
sleep 6 # several rounds of connecting and giving up
lost=$(grep -c 'msg="postgres connection lost"' "$RELAY_LOG")
back=$(grep -c 'msg="postgres reconnected"' "$RELAY_LOG")
echo "# 5: in about 6 s: $lost 'connection lost' and $back 'reconnected' lines"
check "5: the loss logged at most twice, not at every retry" [ "$lost" -le 2 ]
check "5: 'reconnected' logged at most once" [ "$back" -le 1 ]
psql_q "ALTER SYSTEM RESET default_transaction_read_only" && psql_q "SELECT pg_reload_conf()" >/dev/null
unset PGOPTIONS
wait_for "5: writable again: rows delivered (the backoff is capped at 5 s)" 20 none_unsent_of ro5
check_delivered ro5
# The outage ends once a connection lasts 5 s, and the log says so: its last word on PostgreSQL
# was the loss (the earlier 'reconnected' went with a connection lost at once).
wait_for "5: the end of the outage is logged" 15 sh -c \
    "grep -E 'msg=\"postgres (connection lost|reconnected)\"' '$RELAY_LOG' | tail -n 1 |
     grep -q 'msg=\"postgres reconnected\"'"
relay_stop
check_eq "5: relay exits 0" 0 $?

# --- 6. an empty port of the list is libpq's default, not PGPORT's ---
# libpq takes the environment's PGPORT only for a string that sets no port; an empty entry is its
# default, 5432. The relay passed each host's entries to libpq as parameters, where an empty
# value is none: its first host went to PGPORT's port (another server, in the report).
if [ -n "$(ss -ltnH 'sport = :5432')" ]; then
    ok "6: an empty port entry is libpq's default # SKIP port 5432 is in use on this machine"
else
    CLOSED6=$(free_port)
    URL="host=127.0.0.1,127.0.0.1 port=,$PGPORT dbname=outbox user=postgres"
    insert ep 100
    PGPORT=$CLOSED6 relay_start --database-url "$URL" "${FAULT_RELAY_OPTS[@]}" --sessions 1
    wait_for "6: rows delivered from the second host" 15 none_unsent_of ep
    check "6: the first host (port '') is tried on libpq's default port, 5432" \
        grep -qE 'msg="postgres host failed".*port 5432 failed' "$RELAY_LOG"
    check_eq "6: PGPORT's port is never tried" 0 "$(grep -c "port $CLOSED6" "$RELAY_LOG")"
    check_delivered ep
    relay_stop
    check_eq "6: relay exits 0" 0 $?
fi

# --- 4. the first host black-holes ---
netns_create # skips the rest where namespaces are refused
netns_block
URL="postgresql://postgres@$NS_ADDR:$PGPORT,127.0.0.1:$PGPORT/outbox?target_session_attrs=read-write&connect_timeout=3"
insert bh 100
t0=$(now_ms)
relay_start --database-url "$URL" "${FAULT_RELAY_OPTS[@]}"
delivered_within bh 8 "$t0" "4: first host black-holed, connect_timeout=3: rows delivered from the second host"
check "4: the black-holed host is logged with the timeout" \
    grep -qE "msg=\"postgres host failed\".* host=\"$NS_ADDR:$PGPORT\".*connect_timeout" \
    "$RELAY_LOG"
check_delivered bh
relay_stop
check_eq "4: relay exits 0" 0 $?
