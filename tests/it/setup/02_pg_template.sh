#!/bin/bash
# Proves tests/lib.sh's cluster template (_pg_template: made once per tests/run.sh run, under a
# lock, and copied by every test's first pg_start) survives a maker killed outright:
#  1. a maker SIGKILLed while its template server runs (its trap not run: the server, which
#     leaves pg_ctl's session, goes on) leaves the lock free, so that the next test does not wait
#     out flock's 120 s before falling back to initdb;
#  2. the next caller makes the template, and pg_start copies it (the `outbox` database there).
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup

export OUTBOX_TEST_PG_TEMPLATE=$T/tpl
mkdir -m 755 "$T/tpl" "$T/fakebin" || fail "make the template's directory"
# A psql that never answers stands in at CREATE DATABASE, with the template's server up.
cat >"$T/fakebin/psql" <<FAKE
#!/bin/bash
touch "$T/psql-waiting"
exec sleep 120 # bounded: a test killed before it kills the maker leaves this behind
FAKE
chmod 755 "$T/fakebin/psql"

# --- 1. ---
set -m # the maker in a process group of its own, to kill it whole (the server is not in it)
(PATH=$T/fakebin:$PATH _pg_template) &
maker=$!
set +m
wait_for "1: the maker's server is up, its CREATE DATABASE waiting" 60 test -e "$T/psql-waiting"
kill -KILL -- "-$maker"
wait "$maker" 2>/dev/null
leaked=$(find "$T/tpl" -maxdepth 2 -name postmaster.pid -printf '%h\n' | head -n 1)
check "1: the killed maker's server still runs (what this part is about)" test -n "$leaked"
check "1: the lock is free once its maker is gone" flock -n "$T/tpl/lock" true
# The leaked server is this test's to stop, and its files to remove: the maker, a subshell of
# this test, named them by this test's $$, which the next caller below shares.
[ -n "$leaked" ] && _as_pg pg_ctl -D "$leaked" -m immediate -w -t 20 stop >/dev/null 2>&1
rm -rf "$T/tpl/pg.$$" "$T/tpl/sock.$$"

# --- 2. ---
check "2: the next caller makes the template" _pg_template
pg_start
check_eq "2: pg_start copied it: the outbox database is there" outbox \
    "$(psql -XAtq -c 'SELECT current_database()')"
