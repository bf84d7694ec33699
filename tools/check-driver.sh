#!/bin/sh
# Checks that the session cycle has one driver (relay/engine/session.c, docs/session-cycle.md):
# no other file of the engine changes a session's phase, sends or resets its connection, asks the
# lane group to move, or ends the loop; and only session.c and relay.c (which hands the driver
# delivery reports, stops and nudges) call the driver's entry points. Comments are stripped
# first (cc -fpreprocessed), so a comment that names a function is no call. Prints one line per
# violation and exits 1 if there is any; run by `make test`.
#
#   tools/check-driver.sh [DIR]    DIR defaults to relay/engine (the tests point it elsewhere)
set -eu
cd "$(dirname "$0")/.."
DIR=${1:-relay/engine}

# The functions that move a session. lanes.c sends the lane group's own queries, on the driver's
# behalf (lanes_rebalance, lanes_leave): pg_conn_send is allowed there, and in waiter.c for the
# waiter's own connection, and nowhere else.
MOVERS="session_set_phase pg_conn_send pg_conn_reset lanes_rebalance lanes_leave ev_break"
ENTRIES="session_step session_event"

bad=0
for f in "$DIR"/*.c; do
    name=$(basename "$f")
    [ "$name" = session.c ] && continue
    code=$(cc -fpreprocessed -dD -E -P "$f" 2>/dev/null) || {
        echo "check-driver: cannot read $f" >&2
        exit 2
    }
    for fn in $MOVERS; do
        case "$name:$fn" in # lanes.c defines the lane requests and sends their queries; the
        # waiter (waiter.c) sends on a connection of its own, which is no session's
        lanes.c:pg_conn_send | lanes.c:lanes_rebalance | lanes.c:lanes_leave) continue ;;
        waiter.c:pg_conn_send) continue ;;
        esac
        if printf '%s\n' "$code" | grep -Eq "(^|[^A-Za-z0-9_])$fn[[:space:]]*\("; then
            echo "$f: calls $fn, which moves a session: only the driver (session.c) may" >&2
            bad=1
        fi
    done
    [ "$name" = relay.c ] && continue
    for fn in $ENTRIES; do
        if printf '%s\n' "$code" | grep -Eq "(^|[^A-Za-z0-9_])$fn[[:space:]]*\("; then
            echo "$f: calls the driver ($fn): engine modules return outcomes, session.c and" \
                "relay.c hand it events" >&2
            bad=1
        fi
    done
done
[ "$bad" = 0 ] && echo "check-driver: only the driver moves a session"
exit "$bad"
