#!/bin/bash
# Proves that two entries of a --databases list whose URLs look different but reach one database
# are caught once connected: a reaches outbox at 127.0.0.1, b the same database through a host
# name only the relay's own /etc/hosts gives (a mount namespace made for the relay alone, as in
# 46_dns_stall), each with a table of its own. The start-up check compares the URLs as written
# and cannot see it; both entries joined the database's one lane group and each left the rows
# of its table in the other's lanes unclaimed. Now each entry asks its server which database it
# reached (the cluster's system identifier, database oid and name), and the later entry of the
# two stops (drained, as if a SIGHUP had dropped it), saying so once and naming both: every row
# of a's table is delivered.
#  2. The same when the server restarts between the two entries' probes: a relay runs a alone,
#     a's probe answers and closes, PostgreSQL restarts, and a SIGHUP adds b. The probe compared
#     the postmaster's start time, which the restart changed: b ran beside a, unnoticed. (b's
#     server started after a's answer: a is asked again.)
#  3. b, stopped as a's twin, stays stopped at a SIGHUP whose list has it as it was: it was added
#     again and stopped again, the error line once more, at every reload. Spelt otherwise (its
#     URL changed) it is added and probed again; with a gone from the list it runs.
#  4. A copy of the cluster (pg_basebackup, then promoted) has its system identifier and oids
#     but is another database: an entry on it and one on the original both run, each delivering.
#  5. A server that revoked pg_control_system from PUBLIC, the relay's login no superuser: a and
#     b (as in 1) are still caught; the identifier is left out, not the whole identity.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
# shellcheck source=tests/netns_lib.sh
source "$(dirname "$0")/../../netns_lib.sh"
t_setup
fault_init

[ -f /etc/hosts ] || skip_test "no /etc/hosts to stand a relay's own in for"
unshare -m --propagation private true 2>/dev/null ||
    skip_test "cannot make a mount namespace here (unshare -m)"

fault_setup 1
psql_q "CREATE TABLE other_outbox (id uuid NOT NULL PRIMARY KEY DEFAULT gen_random_uuid(),
            aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL,
            payload jsonb)" || fail "create other_outbox"
relay_migrate --layout debezium --table other_outbox 2>>"$T/migrate.log" ||
    fail "migrate adopts other_outbox"
ALIAS=pg-alias.test
printf '127.0.0.1\tlocalhost\n127.0.0.1\t%s\n' "$ALIAS" >"$T/hosts"

# in_ns CMD...: CMD with $T/hosts as its /etc/hosts.
in_ns() {
    # shellcheck disable=SC2016 # $0 and $@ belong to the inner sh
    exec unshare -m --propagation private sh -c 'mount --bind "$0" /etc/hosts && exec "$@"' \
        "$T/hosts" "$@"
}
resolves() {
    timeout 5 bash -c "$(declare -f in_ns); T=$T; in_ns getent hosts $ALIAS" 2>/dev/null |
        grep -q '^127\.0\.0\.1 '
}
resolves || skip_test "a name of the relay's own /etc/hosts does not resolve here"
RELAY_WRAP=(in_ns)

printf '{"brokers": "%s", "kafka": {"reconnect.backoff.max.ms": "500"}, "databases": [
  {"name": "a", "database-url": "postgresql://postgres@127.0.0.1:%s/outbox"},
  {"name": "b", "database-url": "postgresql://postgres@%s:%s/outbox", "layout": "debezium",
   "table": "other_outbox"}]}\n' \
    "$BROKERS" "$PGPORT" "$ALIAS" "$PGPORT" >"$T/relay.json"
insert_rows a 1 400 64
SAVED_URL=$DATABASE_URL
unset DATABASE_URL # the list names every URL
relay_start --config "$T/relay.json"
export DATABASE_URL=$SAVED_URL
wait_for "every row of a's table delivered" 30 none_unsent_of a
check_eq "said once, naming both" 1 \
    "$(grep -c 'msg="two databases of the list reach the same database.* database=a stopping=b' "$RELAY_LOG")"
wait_for "b drained and gone" 15 grep -q 'msg="database removed" database=b' "$RELAY_LOG"
check "a keeps running" relay_running
insert_rows a2 1 100 20
wait_for "a's later rows delivered" 30 none_unsent_of a2
check_delivered a
relay_stop
check_eq "the relay exits 0" 0 "$?"

# --- 2: the server restarts between a's probe and b's --------------------------------------------
# write_list [B_URL]: the list a alone, or a and b at B_URL.
write_list() {
    {
        printf '{"brokers": "%s", "kafka": {"reconnect.backoff.max.ms": "500"}, "databases": [\n' \
            "$BROKERS"
        printf '  {"name": "a", "database-url": "postgresql://postgres@127.0.0.1:%s/outbox"}' \
            "$PGPORT"
        [ -z "${1:-}" ] ||
            printf ',\n  {"name": "b", "database-url": "%s", "layout": "debezium", "table": "other_outbox"}' "$1"
        printf ']}\n'
    } >"$T/relay.json.new" && mv "$T/relay.json.new" "$T/relay.json"
}
no_identity_probe() {
    [ "$(psql_q "SELECT count(*) FROM pg_stat_activity
                 WHERE application_name = 'outbox-relay identity'")" = 0 ]
}
# said_twins: how many times the relay said two entries reach one database; said_twins_once.
said_twins() {
    grep -c 'msg="two databases of the list reach the same database.* database=a stopping=b' \
        "$RELAY_LOG"
}
said_twins_once() {
    [ "$(said_twins)" = 1 ]
}
B_URL="postgresql://postgres@$ALIAS:$PGPORT/outbox"
write_list
unset DATABASE_URL
relay_start --config "$T/relay.json"
export DATABASE_URL=$SAVED_URL
insert_rows p2a 1 100 20
wait_for "part 2: a alone delivers" 30 none_unsent_of p2a
wait_for "part 2: a's identity probe answered and closed" 15 no_identity_probe
pg_restart
insert_rows p2b 1 100 20
wait_for "part 2: a delivers after the restart" 60 none_unsent_of p2b
write_list "$B_URL"
kill -HUP "$RELAY_PID"
wait_for "part 2: b added by SIGHUP" 15 grep -q 'msg="database added" database=b' "$RELAY_LOG"
wait_for "part 2: b, probed after the restart, is caught" 30 said_twins_once
wait_for "part 2: b drained and gone" 15 grep -q 'msg="database removed" database=b' "$RELAY_LOG"
check "part 2: a keeps running" relay_running

# --- 3: the stopped twin at later reloads --------------------------------------------------------
reloads() {
    grep -c 'msg="databases reloaded"' "$RELAY_LOG"
}
reloaded_twice() {
    [ "$(reloads)" = 2 ]
}
said_twins_twice() {
    [ "$(said_twins)" = 2 ]
}
b_removed_twice() {
    [ "$(grep -c 'msg="database removed" database=b' "$RELAY_LOG")" = 2 ]
}
b_added() {
    grep -c 'msg="database added" database=b' "$RELAY_LOG"
}
kill -HUP "$RELAY_PID"
wait_for "part 3: a second SIGHUP, the list unchanged, is taken" 15 reloaded_twice
check_eq "part 3: b is not added again" 1 "$(b_added)"
check_eq "part 3: nor said again" 1 "$(said_twins)"
write_list "$B_URL?connect_timeout=10"
kill -HUP "$RELAY_PID"
wait_for "part 3: b spelt otherwise is added, probed and said once more" 30 said_twins_twice
wait_for "part 3: that b drained and gone" 15 b_removed_twice
b_owns_every_lane() {
    grep -q 'msg="lanes owned" database=b lanes=64 of=64' "$RELAY_LOG"
}
{
    printf '{"brokers": "%s", "kafka": {"reconnect.backoff.max.ms": "500"}, "databases": [\n' \
        "$BROKERS"
    printf '  {"name": "b", "database-url": "%s", "layout": "debezium", "table": "other_outbox"}]}\n' \
        "$B_URL?connect_timeout=10"
} >"$T/relay.json"
kill -HUP "$RELAY_PID"
wait_for "part 3: with a gone from the list, b runs and holds every lane" 30 b_owns_every_lane
check_eq "part 3: and is not stopped as a twin" 2 "$(said_twins)"
relay_stop
check_eq "part 3: the relay exits 0" 0 "$?"

# --- 4: a copy of the cluster is another database ------------------------------------------------
standby_start
_as_pg pg_ctl -D "$SB" -w -t 30 promote >/dev/null 2>&1 || fail "promote the copy"
copy_writable() {
    [ "$(psql_q "SELECT pg_catalog.pg_is_in_recovery()" -p "$SB_PORT")" = f ]
}
wait_for "part 4: the copy is promoted" 30 copy_writable
check_eq "part 4: the copy has the cluster's system identifier" \
    "$(psql_q "SELECT system_identifier FROM pg_control_system()")" \
    "$(psql_q "SELECT system_identifier FROM pg_control_system()" -p "$SB_PORT")"
printf '{"brokers": "%s", "kafka": {"reconnect.backoff.max.ms": "500"}, "databases": [
  {"name": "a", "database-url": "postgresql://postgres@127.0.0.1:%s/outbox"},
  {"name": "c", "database-url": "postgresql://postgres@127.0.0.1:%s/outbox"}]}\n' \
    "$BROKERS" "$PGPORT" "$SB_PORT" >"$T/relay.json"
copy_none_unsent_of() {
    PGPORT=$SB_PORT none_unsent_of "$1"
}
unset DATABASE_URL
relay_start --config "$T/relay.json"
export DATABASE_URL=$SAVED_URL
insert_rows p4 1 200 20
PGPORT=$SB_PORT insert_rows c4 1 200 20
wait_for "part 4: the original's rows delivered" 30 none_unsent_of p4
wait_for "part 4: the copy's rows delivered" 30 copy_none_unsent_of c4
check_eq "part 4: neither is taken for the other" 0 \
    "$(grep -c 'msg="two databases of the list' "$RELAY_LOG")"
check "part 4: both run" lacks "$RELAY_LOG" 'msg="database removed"'
relay_stop
check_eq "part 4: the relay exits 0" 0 "$?"

# --- 5: pg_control_system revoked --------------------------------------------------------------
psql_q "REVOKE EXECUTE ON FUNCTION pg_catalog.pg_control_system() FROM PUBLIC" >/dev/null &&
    psql_q "CREATE ROLE relay_login LOGIN IN ROLE outbox_relay" >/dev/null ||
    fail "revoke pg_control_system, create the relay's login"
login_lacks_system_id() {
    ! psql_q "SELECT system_identifier FROM pg_control_system()" -U relay_login 2>/dev/null
}
check "part 5: the relay's login may not read the system identifier" login_lacks_system_id
printf '{"brokers": "%s", "kafka": {"reconnect.backoff.max.ms": "500"}, "databases": [
  {"name": "a", "database-url": "postgresql://relay_login@127.0.0.1:%s/outbox"},
  {"name": "b", "database-url": "postgresql://relay_login@%s:%s/outbox", "layout": "debezium",
   "table": "other_outbox"}]}\n' \
    "$BROKERS" "$PGPORT" "$ALIAS" "$PGPORT" >"$T/relay.json"
unset DATABASE_URL
relay_start --config "$T/relay.json"
export DATABASE_URL=$SAVED_URL
insert_rows p5 1 200 20
wait_for "part 5: b is caught" 30 said_twins_once
wait_for "part 5: every row of a's table delivered" 30 none_unsent_of p5
check "part 5: nothing said of the identifier" lacks "$RELAY_LOG" "cannot tell which server"
relay_stop
check_eq "part 5: the relay exits 0" 0 "$?"
