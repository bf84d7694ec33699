#!/bin/bash
# Proves `outbox-relay status` (and --json) reports what the table and the relays look like:
#  1. with Kafka down: the backlog (unsent, not dead-lettered rows), how many wait for a retry,
#     the age of the oldest unsent row, the dead-lettered count, and the one relay's two claim
#     sessions (--sessions default) — their member slots, the backend pids that hold the slots'
#     locks, their 64 lanes between them, their client address, application name and role;
#  2. a second relay shows up as two more sessions, the four owning the 64 lanes together;
#  3. once Kafka is back and the backlog is sent: backlog 0, no age, and the rows sent in the last
#     minute counted (throughput per second = that / 60);
#  4. after the relays stop: no active session; an unreachable database exits 1 with one error line;
#  5. behind a lock on the outbox (a migration's ALTER, a VACUUM FULL) status, dead and requeue
#     do not wait for ever: each exits 1 with one line naming the statement timeout (their
#     --statement-timeout, 2 s here, 30 s by default);
#  6. nor does status against a server that stops answering mid-statement (a SIGSTOPped
#     forwarder in between: the kernel still acknowledges what is sent, nothing comes back, so
#     not even the server's timeout error arrives): exit 1, "did not answer", after its
#     --statement-timeout and as long again (2 s + 2 s here; 30 s + 5 s by default);
#  7. a statement_timeout stricter than theirs (30 s by default), set for the connection (the
#     URL's options, as for a role or a database), stays: the commands only shorten a longer one
#     or none; --statement-timeout sets theirs, and a stricter one of the URL stays over it too;
#     --statement-timeout out of its range (0, more than a day) is bad input, exit 2;
#  8. requeue --all whose wakeup after a full batch (10,000) gets no answer stops there, exit 1,
#     saying PostgreSQL stopped answering and how many were requeued (it went on to the next
#     batch on the connection left mid-statement, which failed with libpq's "another command is
#     already in progress").
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 3
relay_migrate 2>"$T/migrate.log" || fail "migrate"

status() { "$RELAY_BIN" status --database-url "$DATABASE_URL" "$@"; }
json() { status --json | jq -r "$1"; }
sessions_are() { [ "$(json '.sessions | length')" = "$1" ]; }

# Kafka down: the relay claims the rows and waits for the broker (a long delivery timeout keeps
# it from counting failed attempts meanwhile); status reads around its row locks.
broker_down
RELAY_OPTS=(--database-url "$DATABASE_URL" --brokers "$BROKERS" --delivery-timeout 600000
    --kafka reconnect.backoff.max.ms=500 --min-sessions 2) # both sessions always members
relay_start "${RELAY_OPTS[@]}"
first=$RELAY_PID
wait_for "1: the relay's two sessions show as active" 15 sessions_are 2
# The rows come once the two sessions have divided the lanes: a session takes a lane its sibling
# gave up only between batches, and a batch claimed before that (from the few lanes its first
# look found free) waits for Kafka, here as long as the brokers are down (docs/guarantees.md).
all_lanes_owned() { [ "$(json '[.sessions[].lanes] | add')" = 64 ]; }
wait_for "1: the two sessions own the 64 lanes between them" 15 all_lanes_owned
# In one statement, each row as it is to stay (an UPDATE after it would wait behind the claim's
# row locks): 3 dead-lettered, 120 unsent of which the first 5 wait an hour for a retry.
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, attempts,
                            rejections, dead_at, last_error, next_attempt_at)
        SELECT CASE WHEN g <= 3 THEN 'dead' ELSE 'order' END,
               CASE WHEN g <= 3 THEN 'd-' || g ELSE 'o-' || (g - 3) END, 'changed', '{}',
               CASE WHEN g <= 3 THEN 10 WHEN g <= 8 THEN 1 ELSE 0 END,
               CASE WHEN g <= 3 THEN 10 ELSE 0 END,
               CASE WHEN g <= 3 THEN now() END, CASE WHEN g <= 3 THEN 'x' END,
               CASE WHEN g BETWEEN 4 AND 8 THEN now() + interval '1 hour' END
        FROM generate_series(1, 123) AS g" || fail "1: insert the rows"

# --- 1. ---
status >"$T/status.txt" 2>&1
check_eq "1: status exits 0" 0 $?
check "1: text: backlog of 120, 5 waiting for a retry" \
    grep -qE '^backlog: +120 unsent events \(5 waiting for a retry\)' "$T/status.txt"
check "1: text: dead-lettered 3" grep -qE '^dead-lettered: +3$' "$T/status.txt"
check "1: text: two sessions owning 64 lanes" \
    grep -qE '^relay sessions: 2 active, owning 64 of 64 lanes' "$T/status.txt"
status --json >"$T/status.json" 2>&1
check_eq "1: --json exits 0" 0 $?
check_eq "1: --json is one JSON object" 1 "$(jq -s length "$T/status.json")"
check_eq "1: json backlog" 120 "$(jq -r .backlog "$T/status.json")"
check_eq "1: json retrying" 5 "$(jq -r .retrying "$T/status.json")"
check_eq "1: json dead_lettered" 3 "$(jq -r .dead_lettered "$T/status.json")"
check "1: json oldest_unsent_age_seconds > 0" \
    jq -e '.oldest_unsent_age_seconds > 0' "$T/status.json"
# The backends that hold the member-slot locks are the relay's connections. Which session owns
# which lanes depends on who joined first (a session hands lanes over only between batches, and
# the batch waits for Kafka), so only the sum is fixed.
backends=$(psql_q "SELECT string_agg(pid::text, ' ' ORDER BY objid) FROM pg_locks
                   WHERE locktype = 'advisory' AND classid = $MEMBER_NS AND objsubid = 2
                   AND granted")
check_eq "1: json session pids are the backends holding the member slots" "$backends" \
    "$(jq -r '[.sessions[].pid | tostring] | join(" ")' "$T/status.json")"
check_eq "1: json session slots, lanes in all, client addresses" "0 1 64 127.0.0.1" \
    "$(jq -r '"\([.sessions[].slot | tostring] | join(" ")) \([.sessions[].lanes] | add) \([.sessions[].client_addr] | unique | join(","))"' "$T/status.json")"
check "1: json session client_port and backend_start set" \
    jq -e 'all(.sessions[]; .client_port > 0 and (.backend_start | test("^[0-9-]+T[0-9:]+Z$")))' \
    "$T/status.json"
check_eq "1: json sessions name their relay (application_name) and role" \
    "outbox-relay session-0,outbox-relay session-1 postgres" \
    "$(jq -r '"\([.sessions[].application_name] | sort | join(",")) \([.sessions[].user] | unique | join(","))"' "$T/status.json")"
check "1: text shows the application name" grep -qE "outbox-relay session-0 +postgres$" "$T/status.txt"
check "1: text lists the first session's pid" \
    grep -qE "^  0 +${backends%% *} +[0-9]+ +ok +127\.0\.0\.1:" "$T/status.txt"
# Kafka is down for the only relay, whose batch waits out its long delivery timeout: not away.
check_eq "1: json sessions' kafka ok (none away)" ok \
    "$(jq -r '[.sessions[].kafka] | unique | join(",")' "$T/status.json")"

# --- 2. a second relay ---
relay_start "${RELAY_OPTS[@]}"
wait_for "2: four active sessions" 15 sessions_are 4
# (The first relay hands lanes over only between batches, and its batch waits for Kafka.)
wait_for "2: together they own the 64 lanes" 15 all_lanes_owned
check "2: text lists all four" grep -qE '^relay sessions: 4 active, owning 64 of 64 lanes' <(status)
relay_stop
check_eq "2: second relay exits 0" 0 $?
wait_for "2: back to the first relay's two sessions" 15 sessions_are 2

# --- 3. throughput ---
broker_up
backlog_gone() { [ "$(json .backlog)" = 5 ]; } # the 5 waiting rows wait an hour
wait_for "3: the backlog is sent once Kafka is back" 45 backlog_gone
status --json >"$T/status2.json"
check_eq "3: json sent_last_minute counts the 115 rows sent" 115 \
    "$(jq -r .sent_last_minute "$T/status2.json")"
check "3: json throughput_per_second = sent_last_minute / 60" \
    jq -e '(.throughput_per_second - 115 / 60) | fabs < 0.01' "$T/status2.json"
psql_q "UPDATE outbox SET next_attempt_at = NULL WHERE next_attempt_at IS NOT NULL"
no_backlog() { [ "$(json .backlog)" = 0 ]; }
wait_for "3: backlog 0 once the waiting rows are due and sent" 30 no_backlog
check_eq "3: no oldest age without a backlog" null "$(json .oldest_unsent_age_seconds)"
check "3: text shows no age" grep -qE '^oldest unsent: +-$' <(status)

# --- 4. ---
RELAY_PID=$first
relay_stop
check_eq "4: first relay exits 0" 0 $?
wait_for "4: no active session after both relays stopped" 15 sessions_are 0
"$RELAY_BIN" status --database-url "postgresql://postgres@127.0.0.1:1/outbox" >"$T/down.out" 2>&1
check_eq "4: unreachable database: exit 1" 1 $?
check_eq "4: with one line" 1 "$(grep -c '' "$T/down.out")"

# --- 5. a lock on the outbox ---
# Parts 5 and 6 share one lock and wait side by side: 6's status is set waiting behind the lock
# and its forwarder stopped first, then 5's three commands start. Each waits for a bound of its
# own (2 s, 4 s).
table_lock_open
wait_for "5: another client holds ACCESS EXCLUSIVE on the outbox" 15 table_lock_held

# --- 6. a server that stops answering ---
port=$(free_port) || fail "a free port for the forwarder"
socat "TCP-LISTEN:$port,bind=127.0.0.1,fork,reuseaddr" "TCP:127.0.0.1:$PGPORT" 2>"$T/socat.log" &
forwarder=$!
_t_track $forwarder
forwarding() { psql -XAtq -h 127.0.0.1 -p "$port" -c "SELECT 1" >/dev/null 2>&1; }
wait_for "6: the forwarder passes connections on" 10 forwarding
check "6: the lock is held again" table_lock_held
timeout 120 "$RELAY_BIN" status --database-url "postgresql://postgres@127.0.0.1:$port/outbox" \
    --statement-timeout 2s >"$T/stopped.out" 2>&1 &
waiting=$!
_t_track $waiting
status_waits() {
    [ "$(psql_q "SELECT count(*) FROM pg_stat_activity
                 WHERE application_name = 'outbox-relay' AND wait_event_type = 'Lock'")" = 1 ]
}
wait_for "6: status waits behind the lock" 15 status_waits
# The forwarder and the child it forked for status's connection (their pids, no names).
read -ra stopped <<<"$forwarder $(pgrep -P "$forwarder" | tr '\n' ' ')"
kill -STOP "${stopped[@]}"

# 5: before the bound, all three waited for the lock as long as it was held (timeout's 124 here).
declare -A locked_pid
for cmd in status dead requeue; do
    args=("$cmd")
    [ "$cmd" = requeue ] && args+=(--all)
    timeout 120 "$RELAY_BIN" "${args[@]}" --database-url "$DATABASE_URL" --statement-timeout 2s \
        >"$T/$cmd.lock" 2>&1 &
    locked_pid[$cmd]=$!
    _t_track $!
done
for cmd in status dead requeue; do
    wait "${locked_pid[$cmd]}"
    check_eq "5: $cmd gives up on the lock: exit 1" 1 $?
    check_eq "5: $cmd says so in one line" 1 "$(grep -c '' "$T/$cmd.lock")"
    # requeue's own lock bound (fbe96cd) ends its wait for the table's lock before the
    # statement timeout would, and says so.
    if [ "$cmd" = requeue ]; then
        check "5: requeue names the lock on the table" grep -q 'or the outbox table, is locked' \
            "$T/$cmd.lock"
    else
        check "5: $cmd names the statement timeout" grep -q 'statement timeout' "$T/$cmd.lock"
    fi
done

wait "$waiting"
check_eq "6: status gives up on a server that does not answer: exit 1" 1 $?
check "6: and says it did not answer within its bound" \
    grep -q 'did not answer within 4 s' "$T/stopped.out"
kill -CONT "${stopped[@]}"
table_lock_close

# --- 7. a stricter statement_timeout stays ---
# The statement_timeout in force while dead reads its rows, as a view over the table records it
# (a function said to be stable, so the view stays a plain one).
psql_q "CREATE TABLE seen_timeout (setting text);
        CREATE FUNCTION note_timeout() RETURNS boolean LANGUAGE plpgsql AS \$\$ BEGIN
            INSERT INTO seen_timeout VALUES (pg_catalog.current_setting('statement_timeout'));
            RETURN true; END \$\$;
        CREATE VIEW noting_outbox AS SELECT o.* FROM outbox o WHERE note_timeout()"
seen() { psql_q "SELECT string_agg(DISTINCT setting, ',') FROM seen_timeout"; }
"$RELAY_BIN" dead --table noting_outbox \
    --database-url "$DATABASE_URL?options=-c%20statement_timeout%3D5s" >"$T/strict.out" 2>&1
check_eq "7: dead with a statement_timeout of 5 s in the URL: exit 0" 0 $?
check_eq "7: ... which stays 5 s" 5s "$(seen)"
psql_q "TRUNCATE seen_timeout"
"$RELAY_BIN" dead --table noting_outbox --database-url "$DATABASE_URL" >"$T/loose.out" 2>&1
check_eq "7: dead with no statement_timeout: exit 0" 0 $?
check_eq "7: ... gets 30 s" 30s "$(seen)"
psql_q "TRUNCATE seen_timeout"
"$RELAY_BIN" dead --table noting_outbox --database-url "$DATABASE_URL" --statement-timeout 3s \
    >"$T/flag.out" 2>&1
check_eq "7: dead --statement-timeout 3s: exit 0" 0 $?
check_eq "7: ... gets 3 s" 3s "$(seen)"
psql_q "TRUNCATE seen_timeout"
"$RELAY_BIN" dead --table noting_outbox --statement-timeout 1m \
    --database-url "$DATABASE_URL?options=-c%20statement_timeout%3D5s" >"$T/flag-strict.out" 2>&1
check_eq "7: dead --statement-timeout 1m with 5 s in the URL: exit 0" 0 $?
check_eq "7: ... which stays 5 s" 5s "$(seen)"
for bad in 0 off 25h; do
    "$RELAY_BIN" dead --database-url "$DATABASE_URL" --statement-timeout "$bad" >"$T/bad.out" 2>&1
    check_eq "7: --statement-timeout $bad: exit 2" 2 $?
    check_eq "7: ... with one line naming the flag" 1 "$(grep -c -- '--statement-timeout' "$T/bad.out")"
done

# --- 8. no answer to the wakeup after a full batch ---
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, attempts,
            rejections, dead_at, last_error)
        SELECT 'dead8', 'd-' || g, 'changed', '{}', 10, 10, now(), 'x'
        FROM generate_series(1, 10001) AS g"
holding_proxy proxy8 NOTIFY
timeout -k 10 60 "$RELAY_BIN" requeue --all --statement-timeout 1s \
    --database-url "postgresql://postgres@127.0.0.1:$PROXY_PORT/outbox" >"$T/wake.out" 2>"$T/wake.err"
check_eq "8: the wakeup unanswered after a full batch: exit 1" 1 $?
kill "$PROXY_PID" 2>/dev/null
wait "$PROXY_PID" 2>/dev/null
check "8: ... says how many were requeued" grep -q '^requeued 10000 events before the failure' \
    "$T/wake.out"
check "8: ... names the cause" grep -q 'PostgreSQL stopped answering after a batch' "$T/wake.err"
check "8: ... not libpq's state" lacks "$T/wake.err" 'another command is already in progress'
