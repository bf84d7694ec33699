#!/bin/bash
# Proves `outbox-relay status` read from a standby (dead, status and verify may read one) does not
# report the relays as gone: their sessions and lane locks are on the primary, which a standby's
# pg_locks does not show. The relay sessions are "-" there (null in --json), while the backlog and
# the dead-lettered count, replicated, are read as on the primary.
# A host name whose first address is the standby, target_session_attrs=read-write: every command
# connects to the primary at its second address, as run does; a name whose one address is the
# standby: exit 1 with one line.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"
standby_start

psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'order', 'o-' || g, 'Updated', '{}' FROM generate_series(1, 7) g"
psql_q "UPDATE outbox SET attempts = 2, rejections = 2, dead_at = now() WHERE id <= 2"
# Kafka down: the relay's session holds its lanes and the five rows stay unsent.
broker_down
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --delivery-timeout 600000 \
    --kafka reconnect.backoff.max.ms=500
SB_URL="postgresql://postgres@127.0.0.1:$SB_PORT/outbox"
status() { "$RELAY_BIN" status "$@"; }
active() { status --json --database-url "$DATABASE_URL" | jq -e '.sessions | length > 0' >/dev/null; }
wait_for "the relay's sessions show on the primary" 30 active
replicated() { [ "$(psql -XAtq -h 127.0.0.1 -p "$SB_PORT" -U postgres -d outbox \
    -c "SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL" 2>/dev/null)" = 2 ]; }
wait_for "the standby has the rows" 30 replicated

status --database-url "$SB_URL" >"$T/sb.txt" 2>&1
check_eq "status on the standby exits 0" 0 $?
check "... reads the backlog" grep -qE '^backlog: +5 unsent events' "$T/sb.txt"
check "... and the dead-lettered count" grep -qE '^dead-lettered: +2$' "$T/sb.txt"
check "... but does not call the relays gone" lacks "$T/sb.txt" "0 active"
check "... it says the sessions are on the primary" \
    grep -q "^relay sessions: - (a standby: the relays' sessions and their locks are on the primary)" \
    "$T/sb.txt"
status --json --database-url "$SB_URL" >"$T/sb.json" 2>&1
check_eq "status --json on the standby exits 0" 0 $?
check_eq "... backlog 5, dead 2, sessions null" "5 2 null" \
    "$(jq -r '"\(.backlog) \(.dead_lettered) \(.sessions)"' "$T/sb.json")"
relay_stop

# --- A host name whose first address is the standby, target_session_attrs=read-write ---
# pg-cluster.test, from a hosts file of the commands' own (bind-mounted in a mount namespace made
# for each command alone), has two addresses of this slot's own on one port: socat forwards the
# first to the standby, the second to the primary (a name for the whole cluster, as a DNS record
# with every node's address is). libpq 15, given the name, moves to its next address when one
# refuses or times out, but after a server that is not read-write it moves to the next host:
# every command stopped at the standby ("session is read-only", exit 1), where run tries each
# address alone and moves on.
if unshare -m --propagation private true 2>/dev/null && command -v socat >/dev/null; then
    NPORT=$(free_port) || fail "a free port"
    FIRST=127.77.${TEST_SLOT:-0}.18 SECOND=127.77.${TEST_SLOT:-0}.19
    socat "TCP-LISTEN:$NPORT,bind=$FIRST,fork,reuseaddr" "TCP:127.0.0.1:$SB_PORT" \
        2>>"$T/socat.log" &
    _t_track $!
    socat "TCP-LISTEN:$NPORT,bind=$SECOND,fork,reuseaddr" "TCP:127.0.0.1:$PGPORT" \
        2>>"$T/socat.log" &
    _t_track $!
    listens() { ss -tlnH "src = $1" | grep -q .; }
    _poll 5 listens "$FIRST" && _poll 5 listens "$SECOND" || fail "socat listens on both"
    printf '127.0.0.1\tlocalhost\n%s\tpg-cluster.test\n%s\tpg-cluster.test\n%s\tpg-standby.test\n' \
        "$FIRST" "$SECOND" "$FIRST" >"$T/hosts"
    # in_hosts CMD...: CMD with $T/hosts as its /etc/hosts.
    in_hosts() {
        # shellcheck disable=SC2016 # $0 and $@ belong to the inner sh
        unshare -m --propagation private sh -c 'mount --bind "$0" /etc/hosts && exec "$@"' \
            "$T/hosts" "$@"
    }
    # Both are as far from 127.0.0.1, so getaddrinfo keeps the hosts file's order.
    check_eq "name: the first address is the standby's" "$FIRST" \
        "$(in_hosts getent ahosts pg-cluster.test | awk 'NR == 1 {print $1}')"
    RW_URL="postgresql://postgres@pg-cluster.test:$NPORT/outbox?target_session_attrs=read-write"
    # on_primary NAME ARGS...: `outbox-relay ARGS` given the name exits 0.
    on_primary() {
        local name=$1 rc
        shift
        in_hosts timeout 30 "$RELAY_BIN" "$@" --database-url "$RW_URL" >"$T/name-$name.out" 2>&1
        rc=$?
        check_eq "name: $name, read-write asked, exits 0" 0 "$rc" ||
            sed -n '1,5s/^/#   /p' "$T/name-$name.out"
    }
    on_primary migrate migrate
    on_primary status status
    on_primary dead dead
    on_primary requeue requeue --all
    check_eq "name: ... requeue reached the primary (no dead-lettered row left)" 0 \
        "$(psql_q "SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL")"
    on_primary purge-dead purge-dead --all
    on_primary replay replay --from-id 1
    # A name whose one address is the standby: exit 1, one line saying why.
    in_hosts timeout 30 "$RELAY_BIN" status --database-url \
        "postgresql://postgres@pg-standby.test:$NPORT/outbox?target_session_attrs=read-write" \
        >"$T/name-standby.out" 2>&1
    check_eq "name: its one address a standby: exit 1" 1 "$?"
    check "name: ... one line saying the session is read-only" \
        grep -qE '^.*level=error msg="cannot connect to PostgreSQL" error=".*\(127\.77\.[0-9]+\.18\).*read-only"$' \
        "$T/name-standby.out"
else
    echo "# name: skipped: no mount namespace (unshare -m) or no socat here"
fi
