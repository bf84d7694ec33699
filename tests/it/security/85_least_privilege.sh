#!/bin/bash
# Proves the least-privilege roles of migrations/0006_relay_role.sql:
#  1. migrate creates outbox_relay and outbox_producer, both NOLOGIN; the file applies again with
#     plain psql (idempotent), and a non-superuser owner without CREATEROLE applies 0001-0006 to
#     its own database with psql, with a role missing too (a warning, not an error);
#  2. a LOGIN user that is a member of outbox_producer only inserts 500 events (some while the
#     relay sleeps, so through the wakeup trigger); the relay, run as a LOGIN user that is a member
#     of outbox_relay only, delivers all of them, dead-letters a poison event, and with
#     --retention 2s deletes the sent rows; no "permission denied" in its log;
#  3. as that user `dead`, `requeue --all`, `purge-dead --all` and `status` exit 0;
#  4. that user cannot do DDL (CREATE TABLE, DROP/ALTER/TRUNCATE outbox) nor insert rows or
#     rewrite payloads; the producer cannot read or update the outbox.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"

# --- 1. the roles ---
check_eq "1: both roles exist, NOLOGIN, not superuser" "outbox_producer|false|false outbox_relay|false|false" \
    "$(psql_q "SELECT string_agg(rolname || '|' || rolcanlogin || '|' || rolsuper, ' '
                                 ORDER BY rolname)
               FROM pg_roles WHERE rolname IN ('outbox_relay', 'outbox_producer')")"
check "1: the file applies again with plain psql" \
    psql -XAtq -v ON_ERROR_STOP=1 -f "$ROOT/migrations/0006_relay_role.sql"
check "1: and again (idempotent)" \
    psql -XAtq -v ON_ERROR_STOP=1 -f "$ROOT/migrations/0006_relay_role.sql"

psql_q "CREATE ROLE app_owner LOGIN" && psql_q "CREATE DATABASE owned OWNER app_owner" ||
    fail "create app_owner and its database"
own_apply() { # own_apply LOG: every migration file, as app_owner in its database
    local f
    for f in "$ROOT"/migrations/*.sql; do
        psql -XAtq -v ON_ERROR_STOP=1 -U app_owner -d owned -f "$f" || return 1
    done >>"$1" 2>&1
}
check "1: a non-superuser owner applies 0001-0006 with psql" own_apply "$T/own1.log"
psql_q "ALTER ROLE outbox_producer RENAME TO outbox_producer_x" || fail "rename"
check "1: ... with a role missing it may not create: no error" own_apply "$T/own2.log"
check "1: ... but a warning" grep -q 'outbox_producer is missing' "$T/own2.log"
psql_q "ALTER ROLE outbox_producer_x RENAME TO outbox_producer" || fail "rename back"

psql_q "CREATE ROLE relay_login LOGIN IN ROLE outbox_relay;
        CREATE ROLE producer_login LOGIN IN ROLE outbox_producer" || fail "create login roles"
check_eq "1: relay_login is a member of outbox_relay only" "outbox_relay" \
    "$(psql_q "SELECT string_agg(roleid::regrole::text, ',') FROM pg_auth_members
               WHERE member = 'relay_login'::regrole")"
RELAY_URL=postgresql://relay_login@127.0.0.1:$PGPORT/outbox

as_producer() { psql_q "$1" -U producer_login; }
insert() { # insert FROM TO (as the producer)
    as_producer "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
                 SELECT 'order', 'o-' || (g % 50), 'changed', jsonb_build_object('seq', g)
                 FROM generate_series($1, $2) AS g ORDER BY g"
}
count() { psql_q "SELECT count(*) FROM outbox WHERE $1"; }
none_where() { [ "$(count "$1")" = 0 ]; }
some_where() { [ "$(count "$1")" -gt 0 ]; }

# --- 2. delivery, dead-lettering and retention as relay_login ---
check "2: the producer inserts" insert 1 300
as_producer "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
             VALUES ('bad topic!', 'p-1', 'changed', '{}')" || not_ok "2: insert the poison event"
relay_start --database-url "$RELAY_URL" --brokers "$BROKERS" --retention 2s --max-attempts 1 \
    --poll-interval 60000
wait_for "2: the relay delivers the first 300" 30 \
    none_where "aggregate_type = 'order' AND sent_at IS NULL"
wait_for "2: the poison event is dead-lettered" 20 \
    some_where "aggregate_type = 'bad topic!' AND dead_at IS NOT NULL"
wait_for "2: the relay goes to sleep (guarding the wakeup lock)" 20 guard_held
check "2: the producer inserts while it sleeps" insert 301 500
wait_for "2: the wakeup trigger wakes it, the other 200 are delivered" 20 \
    none_where "aggregate_type = 'order' AND sent_at IS NULL"
consume --topic outbox.event.order --to-end --timeout-ms 30000 >"$T/order.json"
check_eq "2: 500 distinct events in Kafka" 500 \
    "$(jq -r '.value | fromjson | .seq' "$T/order.json" | sort -u | grep -c .)"
wait_for "2: --retention 2s deletes the sent rows" 20 none_where "sent_at IS NOT NULL"
check "2: relay still running" relay_running
relay_stop
check_eq "2: relay exits 0" 0 $?
check "2: no permission error in the relay's log" lacks "$RELAY_LOG" "permission denied"
check "2: the claim floor works with the role's grants (0008)" lacks "$RELAY_LOG" \
    "claims read the unsent index from its start"

# --- 3. admin commands as relay_login ---
admin() { # admin NAME ARGS...: runs a command as relay_login, output in $T/NAME.out
    local name=$1
    shift
    timeout 10 "$RELAY_BIN" "$@" --database-url "$RELAY_URL" >"$T/$name.out" 2>&1
}
check "3: dead exits 0" admin dead dead
check "3: dead lists the poison event" grep -q 'bad topic!' "$T/dead.out"
check "3: requeue --all exits 0" admin requeue requeue --all
check_eq "3: the event is requeued" 0 "$(count "dead_at IS NOT NULL")"
psql_q "UPDATE outbox SET dead_at = now() WHERE aggregate_type = 'bad topic!'"
check "3: purge-dead --all exits 0" admin purge purge-dead --all
check_eq "3: the dead event is gone" 0 "$(count "true")"
check "3: status exits 0" admin status status
check "3: status --json exits 0" admin status_json status --json

# --- 4. no DDL, nothing beyond the grants ---
# denied WHO SQL: the statement fails for WHO with a privilege error.
denied() {
    local out
    out=$(psql -XAtq -v ON_ERROR_STOP=1 -U "$1" -c "$2" 2>&1) && return 1
    grep -qE 'permission denied|must be owner' <<<"$out"
}
for sql in "CREATE TABLE relay_table (a int)" "DROP TABLE outbox" \
    "ALTER TABLE outbox ADD COLUMN extra int" "TRUNCATE outbox" \
    "CREATE INDEX relay_idx ON outbox (created_at)" \
    "INSERT INTO outbox (aggregate_type, aggregate_id, event_type) VALUES ('a', 'b', 'c')" \
    "UPDATE outbox SET payload = '{}'" "DROP FUNCTION outbox_relay_sleep()"; do
    check "4: relay_login may not: $sql" denied relay_login "$sql"
done
for sql in "SELECT payload FROM outbox" "UPDATE outbox SET sent_at = now()" \
    "DELETE FROM outbox" "CREATE TABLE producer_table (a int)"; do
    check "4: producer_login may not: $sql" denied producer_login "$sql"
done
check_eq "4: the outbox is still there" 0 "$(count "true")"
