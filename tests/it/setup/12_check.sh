#!/bin/bash
# Proves `outbox-relay check`, run as a login role that is a member of outbox_relay
# only, as the least-privileged relay would:
#  1. on a good setup it exits 0 and says ok for the config, PostgreSQL, the table, the
#     privileges, the claim floor and Kafka;
#  2. three broken setups each exit 1 and name the cause with the statement that fixes it: no
#     SELECT on the outbox, no SELECT on the order column's sequence (the claim floor), a table
#     that does not exist (--table); a column the options name but the table lacks is named too;
#  3. bad configuration exits 2 with one line (as run would), and an unreachable PostgreSQL or
#     Kafka exits 1 naming which; no line shows the password, even where a server quotes it;
#  4. a PostgreSQL that stops answering in the middle (a proxy holds back the answer to the
#     column look-up for 10 minutes) is a FAIL line and exit 1 after the 35 s bound, not a wait:
#     the checks after it do not use the connection it left mid-statement.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"
psql_q "CREATE ROLE relay_login LOGIN IN ROLE outbox_relay" || fail "create relay_login"
RELAY_URL=postgresql://relay_login@127.0.0.1:$PGPORT/outbox

# run_check NAME ARGS...: `check` as relay_login; stdout+stderr in $T/NAME.out, exit status kept.
run_check() {
    local name=$1
    shift
    timeout 60 "$RELAY_BIN" check --database-url "$RELAY_URL" --brokers "$BROKERS" "$@" \
        >"$T/$name.out" 2>&1
}

# --- 1. a good setup ---
run_check good
check_eq "1: a good setup: exit 0" 0 $?
for area in config postgresql table privileges "claim floor" kafka; do
    check "1: ok line for $area" grep -q "^ok    $area: " "$T/good.out"
done
check "1: the summary says ok" grep -q '^check: ok' "$T/good.out"

# --- 2. three broken setups ---
psql_q "REVOKE SELECT ON outbox FROM outbox_relay" || fail "revoke SELECT"
run_check noselect
check_eq "2a: no SELECT on the outbox: exit 1" 1 $?
check "2a: names the privilege and the GRANT" grep -q \
    '^FAIL  privileges: this role lacks SELECT on the outbox table: as the owner, GRANT SELECT ON outbox TO outbox_relay' \
    "$T/noselect.out"
check "2a: one problem" grep -q '^check: 1 problem found' "$T/noselect.out"
psql_q "GRANT SELECT ON outbox TO outbox_relay" || fail "grant SELECT back"

psql_q "REVOKE SELECT ON SEQUENCE outbox_id_seq FROM outbox_relay" || fail "revoke the sequence"
run_check noseq
check_eq "2b: no SELECT on the sequence: exit 1" 1 $?
check "2b: names the sequence grant as the cause, not the column" grep -q \
    "^FAIL  claim floor: .*role relay_login may not read the order column's sequence outbox_id_seq: as its owner, GRANT SELECT ON SEQUENCE outbox_id_seq TO outbox_relay" \
    "$T/noseq.out"
run_check noseq_off --claim-floor off
check_eq "2b: ... which --claim-floor off does not need: exit 0" 0 $?
psql_q "GRANT SELECT ON SEQUENCE outbox_id_seq TO outbox_relay" || fail "grant the sequence back"

psql_q "ALTER SEQUENCE outbox_id_seq CACHE 10" || fail "cache the sequence"
run_check cached
check_eq "2b: a cached sequence: exit 1" 1 $?
check "2b: ... named, with the ALTER that fixes it" grep -q \
    "^FAIL  claim floor: .*sequence outbox_id_seq caches 10 values per session.*ALTER SEQUENCE outbox_id_seq CACHE 1" \
    "$T/cached.out"
psql_q "ALTER SEQUENCE outbox_id_seq CACHE 1" || fail "uncache the sequence"

run_check notable --table no_such_outbox
check_eq "2c: a missing table: exit 1" 1 $?
check "2c: says the table does not exist and how to create it" grep -q \
    '^FAIL  table: the outbox table no_such_outbox does not exist.*outbox-relay migrate' \
    "$T/notable.out"

run_check nocolumn --event-type-column kind
check_eq "2d: a column the table lacks: exit 1" 1 $?
check "2d: names the column" grep -q '^FAIL  table: outbox lacks column(s) kind' "$T/nocolumn.out"

run_check good2
check_eq "2: fixed again: exit 0" 0 $?

# --- 3. bad configuration, unreachable servers ---
run_check badcfg --batch-size 0
check_eq "3: bad configuration: exit 2" 2 $?
check_eq "3: ... one line" 1 "$(wc -l <"$T/badcfg.out")"
timeout 60 "$RELAY_BIN" check --database-url "postgresql://relay_login@127.0.0.1:1/outbox" \
    --brokers "$BROKERS" >"$T/nopg.out" 2>&1
check_eq "3: PostgreSQL unreachable: exit 1" 1 $?
check "3: ... named" grep -q '^FAIL  postgresql: cannot connect' "$T/nopg.out"
# check's lines are scrubbed of secrets as every line the program writes: here the password is
# also the database's name, which the server's refusal quotes.
timeout 60 "$RELAY_BIN" check \
    --database-url "postgresql://relay_login:pw-s3cret-9@127.0.0.1:$PGPORT/pw-s3cret-9" \
    --brokers "$BROKERS" >"$T/secret.out" 2>&1
check_eq "3: a database that does not exist: exit 1" 1 $?
check "3: ... named, the password in its name masked" \
    grep -q '^FAIL  postgresql: cannot connect: .*database "\*\*\*" does not exist' "$T/secret.out"
check "3: ... and the password nowhere" lacks "$T/secret.out" pw-s3cret-9
timeout 60 "$RELAY_BIN" check --database-url "$RELAY_URL" --brokers 127.0.0.1:1 \
    --kafka socket.connection.setup.timeout.ms=1000 >"$T/nokafka.out" 2>&1
check_eq "3: Kafka unreachable: exit 1" 1 $?
check "3: ... named" grep -q '^FAIL  kafka: no broker at 127.0.0.1:1 answered' "$T/nokafka.out"

# --- 4. a server that stops answering ---
PROXY_BIN=$BIN/delay-proxy
[ -x "$PROXY_BIN" ] || fail "bin/delay-proxy built (make tools)"
PROXY_PORT=$(free_port) || fail "a free port for the proxy"
# Only the answer to the first statement that names attisdropped (check's column look-up) is held.
"$PROXY_BIN" --listen "$PROXY_PORT" --to "$PGPORT" --delay-us 600000000 \
    --only-after attisdropped --times 1 >"$T/proxy.out" 2>&1 &
_t_track $!
_poll 10 grep -q listening "$T/proxy.out" || fail "delay-proxy listens"
# Before: check waited for the held answer (timeout's 124 here); with only the statement's own
# deadline, grants_check then waited on the connection left mid-statement.
timeout 120 "$RELAY_BIN" check --database-url "postgresql://relay_login@127.0.0.1:$PROXY_PORT/outbox" \
    --brokers "$BROKERS" >"$T/silent.out" 2>&1
check_eq "4: a server that stops answering: exit 1" 1 $?
check "4: ... named" grep -q '^FAIL  table: .*PostgreSQL did not answer within 35 s' "$T/silent.out"
check "4: ... and Kafka still checked" grep -q '^ok    kafka:' "$T/silent.out"
