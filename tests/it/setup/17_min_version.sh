#!/bin/bash
# Proves the minimum PostgreSQL version (13: gen_random_uuid() built in, pg_current_snapshot()),
# against a server made to look like 12.19 by a proxy that rewrites its server_version
# (tests/tools/pg-version-proxy.c; there is no PostgreSQL 12 here). Before, nothing checked it:
# migrate failed half-way on gen_random_uuid() and run's every claim failed on
# pg_current_snapshot().
#  1. every command that connects (migrate, even with --connect-wait; check, status, dead,
#     requeue, purge-dead, replay, verify) exits 2 with one line naming both versions, and
#     migrate creates nothing;
#  1b. the same commands given two hosts, the old server first, connect to the second and work
#     (before, libpq stopped at the first host that answered: exit 2); prefer-standby too; with
#     two old hosts, exit 2 and one line naming each one's version; an old host and one that
#     refuses, exit 1 naming both;
#  1c. the same commands given a host name whose first address is the old server and second the
#     real one (a hosts file of their own): they connect to the second and work (before, exit 2:
#     libpq stops at the first address that answers); a name whose one address is old: exit 2;
#     a name whose first address is old and second down: exit 1 naming both, and migrate
#     --connect-wait waits (before, exit 2 at once: "every host is an old server");
#  2. run with --databases: the old server's entry (b) is refused with the same line, never
#     "connected", is not ready (/readyz names it and the versions, its rows stay unsent), while
#     the other entry (a) delivers all its rows: one old server does not stop the others;
#  2b. b's old server goes away: /readyz names b unreachable, no longer the versions (before, it
#     named them until a connection succeeded);
#  3. run with two hosts, the old server first ("host=A,B"): the old one is refused as a host
#     that fails ("postgres host failed" with the line) and the relay goes on to the second,
#     which delivers b's rows. Before, the refusal skipped the rest of the list and started over
#     at the old host: the relay never connected.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1
for db in a b; do
    psql_q "CREATE DATABASE db_$db" -d postgres || fail "create db_$db"
done
"$RELAY_BIN" migrate --database-url "postgresql://postgres@127.0.0.1:$PGPORT/db_a" \
    2>"$T/migrate.log" || fail "migrate db_a"
[ -x "$BIN/pg-version-proxy" ] || fail "bin/pg-version-proxy built (make tools)"
OLD_PORT=$(free_port) || fail "a free port for pg-version-proxy"
# proxy_start: the old server's stand-in on OLD_PORT (PROXY_PID).
proxy_start() {
    "$BIN/pg-version-proxy" --listen "$OLD_PORT" --to "$PGPORT" --version 12.19 \
        >"$T/proxy.out" 2>&1 &
    PROXY_PID=$!
    _t_track "$PROXY_PID"
    _poll 10 grep -q listening "$T/proxy.out" || fail "pg-version-proxy listens"
}
proxy_start
OLD_URL="postgresql://postgres@127.0.0.1:$OLD_PORT/db_b?sslmode=disable&gssencmode=disable"
LINE='PostgreSQL 13 or later is required; the server is 12.19'
unset DATABASE_URL

# --- 1. the commands ---
# refused NAME ARGS...: `outbox-relay ARGS` against the old server exits 2 and says LINE.
refused() {
    local name=$1 rc
    shift
    timeout 30 "$RELAY_BIN" "$@" --database-url "$OLD_URL" >"$T/$name.out" 2>&1
    rc=$?
    check_eq "1: $name exits 2" 2 "$rc"
    check "1: $name says both versions" grep -qF "$LINE" "$T/$name.out"
}
# --connect-wait 1h: the old server is not waited for (timeout 30 would end it: exit 124).
refused migrate migrate --connect-wait 1h
check_eq "1: migrate created nothing" 0 \
    "$(psql_q "SELECT count(*) FROM pg_tables WHERE tablename = 'outbox'" -d db_b)"
refused check check --brokers "$BROKERS"
refused status status
refused dead dead
refused requeue requeue --all
refused purge-dead purge-dead --all
refused replay replay --from-id 1
refused verify verify --brokers "$BROKERS"

# --- 1b. the commands given two hosts, the old server first ---
# Before, libpq stopped at the first host that answered and the command refused its version:
# exit 2 though the second host is a supported server.
OPTS="sslmode=disable&gssencmode=disable"
OLD_NEW="postgresql://postgres@127.0.0.1:$OLD_PORT,127.0.0.1:$PGPORT/db_a?$OPTS"
# works NAME ARGS...: `outbox-relay ARGS --database-url URL` exits 0 (URL: $URL, else OLD_NEW).
works() {
    local name=$1 rc
    shift
    timeout 30 "$RELAY_BIN" "$@" --database-url "${URL:-$OLD_NEW}" >"$T/$name.out" 2>&1
    rc=$?
    check_eq "1b: $name with the old host first exits 0" 0 "$rc" ||
        sed -n '1,5s/^/#   /p' "$T/$name.out"
}
works migrate migrate
works status status
works dead dead
works check check --brokers "$BROKERS"
# prefer-standby (no standby here): libpq's second round, any server, passes the old one over.
URL="$OLD_NEW&target_session_attrs=prefer-standby" works status-prefer-standby status
# fails_with WHAT URL RC PATTERN: `outbox-relay status` given URL (hosts WHAT) exits RC and
# says PATTERN (grep -E).
fails_with() {
    timeout 30 "$RELAY_BIN" status --database-url "$2" >"$T/$1.out" 2>&1
    check_eq "1b: status with $1 hosts exits $3" "$3" "$?"
    check "1b: ... saying '$4'" grep -qE "$4" "$T/$1.out"
}
# Both hosts old: exit 2, one line naming each server's version. Addresses, not a name such as
# localhost: a Debian host's /etc/hosts gives localhost ::1 too, where nothing listens here, and a
# host whose other address refuses is a failure a retry may cure (exit 1, old-down below).
fails_with old-old "postgresql://postgres@127.0.0.1:$OLD_PORT,127.0.0.1:$OLD_PORT/db_a?$OPTS" 2 \
    "13 or later is required; the server at 127.0.0.1:$OLD_PORT is 12.19, at 127.0.0.1:$OLD_PORT is 12.19\"$"
# An old host and one that refuses: a failure a retry may cure (exit 1), both said.
DOWN_PORT=$(free_port) || fail "a free port"
fails_with old-down "postgresql://postgres@127.0.0.1:$OLD_PORT,127.0.0.1:$DOWN_PORT/db_a?$OPTS" 1 \
    "server at 127.0.0.1:$OLD_PORT is 12.19; connection to server at .*port $DOWN_PORT failed"

# --- 1c. the commands given a host name whose first address is the old server ---
# pg-old-first.test, from a hosts file of the commands' own (bind-mounted in a mount namespace
# made for each command alone), has two addresses on OLD_PORT: 127.0.0.1, the old server (the
# proxy), then an address of this slot's own where socat forwards to the real server. libpq,
# given the name, tries its addresses in order but stops at the first that answers, and only
# the version check refuses an old one: before, every command exited 2 there, though run (which
# looks names up itself) went on to the second address.
if unshare -m --propagation private true 2>/dev/null && command -v socat >/dev/null; then
    SECOND=127.77.${TEST_SLOT:-0}.17
    socat "TCP-LISTEN:$OLD_PORT,bind=$SECOND,fork,reuseaddr" "TCP:127.0.0.1:$PGPORT" \
        2>>"$T/socat.log" &
    _t_track $!
    second_listens() { ss -tlnH "src = $SECOND" | grep -q .; }
    _poll 5 second_listens || fail "1c: socat listens on $SECOND:$OLD_PORT"
    printf '127.0.0.1\tlocalhost\n127.0.0.1\tpg-old-first.test\n%s\tpg-old-first.test\n' \
        "$SECOND" >"$T/hosts"
    # in_hosts CMD...: CMD with $T/hosts as its /etc/hosts.
    in_hosts() {
        # shellcheck disable=SC2016 # $0 and $@ belong to the inner sh
        unshare -m --propagation private sh -c 'mount --bind "$0" /etc/hosts && exec "$@"' \
            "$T/hosts" "$@"
    }
    check_eq "1c: the name's first address is the old server's (127.0.0.1)" 127.0.0.1 \
        "$(in_hosts getent ahosts pg-old-first.test | awk 'NR == 1 {print $1}')"
    NAMED="postgresql://postgres@pg-old-first.test:$OLD_PORT/db_a?$OPTS"
    # works_named NAME ARGS...: `outbox-relay ARGS --database-url URL` (URL: $URL, else NAMED),
    # its /etc/hosts ours, exits 0.
    works_named() {
        local name=$1 rc
        shift
        in_hosts timeout 30 "$RELAY_BIN" "$@" --database-url "${URL:-$NAMED}" \
            >"$T/1c-$name.out" 2>&1
        rc=$?
        check_eq "1c: $name given the name exits 0" 0 "$rc" ||
            sed -n '1,5s/^/#   /p' "$T/1c-$name.out"
    }
    works_named migrate migrate
    works_named status status
    works_named check check --brokers "$BROKERS"
    works_named dead dead
    works_named requeue requeue --all
    works_named purge-dead purge-dead --all
    works_named replay replay --from-id 1 --brokers "$BROKERS"
    works_named verify verify --brokers "$BROKERS"
    URL="$NAMED&target_session_attrs=prefer-standby" works_named status-prefer-standby status
    URL="$NAMED&target_session_attrs=read-write" works_named status-read-write status
    # The name's only address the old server: exit 2 and the line as before (no second try).
    printf '127.0.0.1\tpg-old-only.test\n' >>"$T/hosts"
    in_hosts timeout 30 "$RELAY_BIN" status \
        --database-url "postgresql://postgres@pg-old-only.test:$OLD_PORT/db_a?$OPTS" \
        >"$T/1c-old-only.out" 2>&1
    check_eq "1c: a name whose one address is old: exit 2" 2 "$?"
    check "1c: ... saying both versions" grep -qF "$LINE" "$T/1c-old-only.out"
    # The name's first address old, its second down (nothing listens there): a failure a retry
    # may cure, exit 1 with both addresses' lines, as for a host list (1b, old-down), and
    # migrate --connect-wait waits for it. Before, exit 2 with the old server's line alone:
    # "every host is an old server", and migrate gave up at once.
    DOWN_ADDR=127.77.${TEST_SLOT:-0}.18
    printf '127.0.0.1\tpg-old-down.test\n%s\tpg-old-down.test\n' "$DOWN_ADDR" >>"$T/hosts"
    OLD_DOWN="postgresql://postgres@pg-old-down.test:$OLD_PORT/db_a?$OPTS"
    in_hosts timeout 30 "$RELAY_BIN" status --database-url "$OLD_DOWN" >"$T/1c-old-down.out" 2>&1
    check_eq "1c: a name whose first address is old and second down: exit 1" 1 "$?" ||
        sed -n '1,5s/^/#   /p' "$T/1c-old-down.out"
    check "1c: ... saying the old server's version" grep -qF "$LINE" "$T/1c-old-down.out"
    check "1c: ... and the second address's failure" \
        grep -qF "$DOWN_ADDR\\\", port $OLD_PORT failed" "$T/1c-old-down.out"
    in_hosts timeout 30 "$RELAY_BIN" migrate --connect-wait 2s --database-url "$OLD_DOWN" \
        >"$T/1c-old-down-migrate.out" 2>&1
    check_eq "1c: migrate --connect-wait, the same name: exit 1" 1 "$?" ||
        sed -n '1,5s/^/#   /p' "$T/1c-old-down-migrate.out"
    check "1c: ... after waiting for it (retrying)" \
        grep -qF "cannot connect to PostgreSQL yet, retrying" "$T/1c-old-down-migrate.out"
else
    echo "# 1c skipped: no mount namespace (unshare -m) or no socat here"
fi

# --- 2. run with --databases: a on the real server, b behind the proxy ---
"$RELAY_BIN" migrate --database-url "postgresql://postgres@127.0.0.1:$PGPORT/db_b" \
    2>>"$T/migrate.log" || fail "migrate db_b"
for db in a b; do
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            SELECT '$db', '$db-' || (g % 10), 'changed', jsonb_build_object('seq', g)
            FROM generate_series(1, 100) AS g ORDER BY g" -d "db_$db" || fail "insert into db_$db"
done
printf '{"brokers": "%s", "metrics-listen": "127.0.0.1:0",
"kafka": {"reconnect.backoff.max.ms": "500"}, "databases": [
  {"name": "a", "database-url": "postgresql://postgres@127.0.0.1:%s/db_a"},
  {"name": "b", "database-url": "%s"}]}\n' "$BROKERS" "$PGPORT" "$OLD_URL" >"$T/relay.json"
relay_start --config "$T/relay.json"
metrics_wait
drained_a() {
    [ "$(psql_q "SELECT count(*) FROM outbox WHERE sent_at IS NULL" -d db_a)" = 0 ]
}
wait_for "2: a delivers all its rows" 30 drained_a
PGDATABASE=db_a check_delivered a
wait_for "2: b refused with both versions" 15 grep -qF "$LINE" "$RELAY_LOG"
check "2: ... as b's, on one line" \
    grep -qE "msg=\"postgres unreachable\" database=b conn=session-0 error=\"$LINE\"" "$RELAY_LOG"
check_eq "2: b never connected" 0 "$(grep -c 'msg="postgres connected".* database=b' "$RELAY_LOG")"
check_eq "2: b's rows stay unsent" 100 \
    "$(psql_q "SELECT count(*) FROM outbox WHERE sent_at IS NULL" -d db_b)"
check "2: /readyz: 1 of 2 ready" \
    sh -c "curl -s --max-time 5 'http://$METRICS/readyz' | grep -q '^ready: 1 of 2 databases ready'"
check "2: /readyz names b's old server" \
    sh -c "curl -s --max-time 5 'http://$METRICS/readyz' | grep -F 'b' | grep -qF '$LINE'"
check "2: the relay still runs" relay_running
# 2b. b's old server goes away: /readyz says what is true now (unreachable), not the version.
# Before, the version stayed its reason until a connection succeeded.
_t_reap "$PROXY_PID"
b_unreachable_now() {
    local r
    r=$(curl -s --max-time 5 "http://$METRICS/readyz") || return 1
    ! printf '%s\n' "$r" | grep -qF "$LINE" &&
        printf '%s\n' "$r" | grep -q '^b not ready: postgres unreachable;'
}
wait_for "2b: /readyz: b unreachable, its old version no longer named" 30 b_unreachable_now ||
    curl -s --max-time 5 "http://$METRICS/readyz" | sed 's/^/#   /'
relay_stop
check_eq "2: the relay exits 0" 0 "$?"
: >"$T/proxy.out"
proxy_start

# --- 3. two hosts, the old server first: the second one is used ---
MULTI_URL="postgresql://postgres@127.0.0.1:$OLD_PORT,127.0.0.1:$PGPORT/db_b"
MULTI_URL+="?sslmode=disable&gssencmode=disable"
relay_start --brokers "$BROKERS" --database-url "$MULTI_URL" --metrics-listen 127.0.0.1:0
metrics_wait
drained_b() {
    [ "$(psql_q "SELECT count(*) FROM outbox WHERE sent_at IS NULL" -d db_b)" = 0 ]
}
wait_for "3: the second host delivers b's rows" 30 drained_b
check "3: the old host failed with both versions" \
    grep -qE "msg=\"postgres host failed\".* error=\"$LINE\"" "$RELAY_LOG"
check "3: session-0 connected to the second host" \
    grep -qE "msg=\"postgres connected\" conn=session-0 .* port=\"$PGPORT\"" "$RELAY_LOG"
check_eq "3: nothing connected to the old host" 0 \
    "$(grep -c "msg=\"postgres connected\".* port=\"$OLD_PORT\"" "$RELAY_LOG")"
relay_stop
check_eq "3: the relay exits 0" 0 "$?"
