#!/bin/bash
# Proves a failed event holds back the later events of its own aggregate when the aggregate id
# column has a nondeterministic collation (an adopted table may declare one: case-insensitive,
# or equal up to Unicode normalization). The claim's held-back aggregates are grouped before
# they are looked up by exact key (the jsonb map of statements.c SQL_BLOCKED): grouped under the
# column's collation, 'A' and 'a' became one group named by one of them, and the other's rows
# found nothing held back, so the later event of 'a' was published while the first waited for
# its retry: an order break for the Kafka key 'a'. Grouped by bytes, each id has its own entry.
# A Debezium-layout table whose aggregateid is case-insensitive holds, for type 'n': a 2 MB event
# of 'A', then a 2 MB event of 'a' (both over message.max.bytes: rejected, retried after
# --retry-backoff), then a small event of 'a'. After the rejections, a row of another aggregate
# inserted later is delivered (so later claims ran), while the small event of 'a' stays unsent and
# unpublished. Then the same for the claim's recheck, with the race of 49_blocked_while_waiting
# (below), and for the claim around locks (last). First, the lanes of such a table: migrate hashes the aggregate's bytes (not ICU's sort
# key, which follows the ICU version), and warns of a lane column an older version adopted under
# the collation, naming a fix that works. Last, `replay --aggregate-id` selects that aggregate's
# bytes alone (the old code replayed 'L' with 'l': 6 events, not 3), and still through an index
# on the column (a byte comparison alone could not use one: the whole table was read).
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1

psql_q "CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)" ||
    fail "create a case-insensitive collation (ICU)"
psql_q "CREATE TABLE outbox (
            id uuid NOT NULL PRIMARY KEY DEFAULT gen_random_uuid(),
            aggregatetype varchar(255) NOT NULL,
            aggregateid varchar(255) COLLATE ci NOT NULL,
            type varchar(255) NOT NULL,
            payload jsonb)" || fail "create the Debezium table"
relay_migrate --layout debezium 2>"$T/migrate.log" || fail "migrate adopts the table"
# The lanes hash the aggregate's bytes, not the collation's sort key: under the column's
# nondeterministic collation hashtextextended hashed ICU's sort key, so every stored lane followed
# the ICU library's version (collversion), and after an upgrade an aggregate's new events would
# land in another lane than its earlier unsent ones (the old code: 198 of 200 lanes differed).
psql_q "INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
        SELECT 'lanes', 'agg-' || g, 'changed', '{}' FROM generate_series(1, 200) AS g"
check_eq "each lane is the hash of the aggregate's bytes" "0 of 200" \
    "$(psql_q "SELECT count(*) FILTER (WHERE lane <> outbox_lane(aggregatetype COLLATE \"C\",
                                                                 aggregateid COLLATE \"C\"))
               || ' of ' || count(*) FROM outbox WHERE aggregatetype = 'lanes'")"
lane_warning='lanes hash an aggregate column under its nondeterministic collation'
check_eq "migrate says nothing of the lanes of a table it adopted so" 0 \
    "$(grep -c "$lane_warning" "$T/migrate.log")"
# A table adopted by a version before: its lane column (kept by ADD COLUMN IF NOT EXISTS) hashes
# under the collation. migrate names the column and the fix, and the fix it names works.
psql_q "ALTER TABLE outbox DROP COLUMN lane" || fail "drop the lane column"
psql_q "ALTER TABLE outbox ADD COLUMN lane smallint GENERATED ALWAYS AS
            (outbox_lane(coalesce(aggregatetype::text, ''), coalesce(aggregateid::text, ''))) STORED" ||
    fail "add the lane column as an older version adopted it"
relay_migrate --layout debezium 2>"$T/migrate_old_lane.log" || fail "migrate passes the old lane"
check "migrate warns that the lanes follow the ICU version, naming the column" \
    grep -q "$lane_warning.* column=\"aggregateid\" collation=\"ci\"" "$T/migrate_old_lane.log"
psql_q "ALTER TABLE outbox DROP COLUMN lane" || fail "drop the lane column, as the warning says"
relay_migrate --layout debezium 2>"$T/migrate_again.log" || fail "migrate adopts the table again"
check_eq "then each lane is the hash of the aggregate's bytes" "0 of 200" \
    "$(psql_q "SELECT count(*) FILTER (WHERE lane <> outbox_lane(aggregatetype COLLATE \"C\",
                                                                 aggregateid COLLATE \"C\"))
               || ' of ' || count(*) FROM outbox WHERE aggregatetype = 'lanes'")"
check_eq "and migrate no longer warns" 0 "$(grep -c "$lane_warning" "$T/migrate_again.log")"
psql_q "DELETE FROM outbox WHERE aggregatetype = 'lanes'"
insert() { # insert AGGREGATE_ID SEQ [BLOB_BYTES]
    psql_q "INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
            VALUES ('n', '$1', 'changed',
                    jsonb_build_object('seq', $2, 'blob', repeat('x', ${3:-0})))"
}
insert A 1 $((2 * 1024 * 1024))
insert a 2 $((2 * 1024 * 1024))
insert a 3
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --layout debezium \
    --retry-backoff 60000 --kafka reconnect.backoff.max.ms=500
rejected() {
    [ "$(psql_q "SELECT count(*) FROM outbox WHERE payload->>'seq' IN ('1', '2')
                 AND rejections >= 1")" = 2 ]
}
wait_for "the two 2 MB events (ids 'A' and 'a') are rejected" 30 rejected
insert other 4
other_sent() {
    [ "$(psql_q "SELECT count(*) FROM outbox WHERE aggregateid = 'other'
                 AND sent_at IS NOT NULL")" = 1 ]
}
wait_for "a later row of another aggregate is delivered (claims go on)" 30 other_sent
# The claim that took 'other' (4) found the later event of 'a' (3) first: unless the failed
# event of 'a' (2) holds it back, it was in that batch, ahead of 'other'.
check_eq "the later event of 'a' stays unsent" 0 \
    "$(psql_q "SELECT count(*) FROM outbox WHERE payload->>'seq' = '3' AND sent_at IS NOT NULL")"
# Exact: the mark of 'other' came after Kafka acknowledged its batch, and any batch before it.
consume --topic outbox.event.n --to-end --timeout-ms 30000 >"$T/n.json"
check_eq "and it was not published" 0 \
    "$(jq -r 'select(.key != "other") | .headers.id' "$T/n.json" | wc -l)"
relay_stop
check_eq "the relay exits 0" 0 "$?"

# The claim's recheck (statements.c SQL_CLAIM_RECHECK, tests/it/order/49_blocked_while_waiting.sh
# has the race) is matched byte for byte too (claim.c rechecked_holder): grouped under the
# column's collation it named 'K' and 'k' as one aggregate, and the claimed later events of the
# other were published while its first waited. Each round: one session; aggregates NAME and name
# (upper and lower case) of 3 events each, then 5 other aggregates; another client makes the first
# event of both wait (attempts 1, a retry time an hour ahead) in an open transaction before the
# relay starts, waits until a backend waits for it, and commits at once, within the claim's 200 ms
# lock_timeout. Checks: the others are delivered, none of NAME's or name's events is, and the
# recheck names both. A round whose commit came after the lock_timeout (a loaded machine: the
# claim never met it) is run again under a new name, at most 3 times.
psql_q "DELETE FROM outbox WHERE aggregatetype = 'n'"
# race NAME: 0, or 1 when the claim's lock_timeout came before the commit.
race() {
    local up=$1 low seen firsts first timeouts
    low=$(echo "$1" | tr '[:upper:]' '[:lower:]')
    timeouts=$(grep -c 'canceling statement due to lock timeout' "$T/pg.log")
    psql_q "INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
            SELECT 'w', k, 'changed', jsonb_build_object('seq', s)
            FROM generate_series(1, 3) AS s, (VALUES (1, '$up'), (2, '$low')) AS a(o, k)
            ORDER BY s, o"
    psql_q "INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
            SELECT 'w', '$low-other-' || a, 'changed', jsonb_build_object('seq', 1)
            FROM generate_series(1, 5) AS a ORDER BY a"
    firsts=$(psql_q "SELECT string_agg(m::text, ',' ORDER BY m) FROM (SELECT min(seq) AS m FROM outbox
                     WHERE aggregateid COLLATE \"C\" IN ('$up', '$low')
                     GROUP BY aggregateid COLLATE \"C\") f")
    first=${firsts%%,*}
    [ "$first" != "$firsts" ] || fail "$up: two aggregates in bytes" "$firsts"
    coproc LOCKER { psql -XAtq -v ON_ERROR_STOP=1 2>&1; }
    _t_track "$LOCKER_PID"
    local locker_pid=$LOCKER_PID
    echo "BEGIN; WITH u AS (UPDATE outbox SET attempts = attempts + 1,
              next_attempt_at = now() + interval '1 hour', last_error = 'put off by hand'
              WHERE seq IN ($firsts) RETURNING 1) SELECT 'updated' || count(*) FROM u;" \
        >&"${LOCKER[1]}"
    read -r -t 10 seen <&"${LOCKER[0]}" || fail "$up: the other client updates the rows"
    [ "$seen" = updated2 ] || fail "$up: the other client updates both rows" "$seen"
    relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --layout debezium \
        --sessions 1 --kafka reconnect.backoff.max.ms=500
    locker_commit_once_waited "$up" "${LOCKER[@]}" "$locker_pid"
    others_sent() {
        [ "$(psql_q "SELECT count(*) FROM outbox WHERE aggregateid COLLATE \"C\" LIKE '$low-other-%'
                     AND sent_at IS NULL")" = 0 ]
    }
    wait_for "$up: the other aggregates are delivered" 30 others_sent
    if ! grep -q "events of this claim wait.* id=$first aggregates=" "$RELAY_LOG" &&
        [ "$(grep -c 'canceling statement due to lock timeout' "$T/pg.log")" -gt "$timeouts" ]; then
        echo "# $up: the claim's lock_timeout came before the commit: the race was not met"
        psql_q "UPDATE outbox SET next_attempt_at = NULL WHERE seq IN ($firsts)"
        wait_for "$up: every row is delivered once its first is let go" 30 no_unsent_rows
        relay_stop
        return 1
    fi
    check_eq "$up and $low: none of their events is sent while their first waits" 0 \
        "$(psql_q "SELECT count(*) FROM outbox WHERE aggregateid IN ('$up', '$low')
                   AND sent_at IS NOT NULL")"
    check "$up and $low: the claim's recheck holds both" \
        grep -q "events of this claim wait.* id=$first aggregates=2 " "$RELAY_LOG"
    psql_q "UPDATE outbox SET next_attempt_at = NULL WHERE seq IN ($firsts)"
    wait_for "$up: every row is delivered once the first ones are let go" 30 no_unsent_rows
    relay_stop
    check_eq "$up: the relay exits 0" 0 "$?"
}
for try in 1 2 3; do
    race "K$try" && break
    [ "$try" -lt 3 ] || fail "the claim met the other client's commit in one of 3 rounds"
done
consume --topic outbox.event.w --to-end --timeout-ms 30000 >"$T/w.json"
check "each key's events are published in order" first_copies_in_order "$T/w.json"

# The claim around locks (statements.c SQL_CLAIM_AROUND_LOCKS) groups and matches the aggregates
# with a locked row byte for byte too: under the column's collation a lock on the first event of
# 'l' also held back 'L', another aggregate and Kafka key, for as long as the lock lasted (the
# old code: 'L' stayed unsent). One session; 3 events each of 'L' and 'l'; another client holds
# the first event of 'l' FOR UPDATE until the checks are done. 'L' must be delivered meanwhile,
# none of 'l''s events.
psql_q "DELETE FROM outbox"
psql_q "INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
        SELECT 'l', k, 'changed', jsonb_build_object('seq', s)
        FROM generate_series(1, 3) AS s, (VALUES (1, 'L'), (2, 'l')) AS a(o, k) ORDER BY s, o"
locked=$(psql_q "SELECT min(seq) FROM outbox WHERE aggregateid COLLATE \"C\" = 'l'")
coproc HOLDER { psql -XAtq -v ON_ERROR_STOP=1 2>&1; }
_t_track "$HOLDER_PID"
holder_pid=$HOLDER_PID
echo "BEGIN; SELECT 'locked' || seq FROM outbox WHERE seq = $locked FOR UPDATE;" >&"${HOLDER[1]}"
read -r -t 10 seen <&"${HOLDER[0]}" || fail "the other client locks the first event of 'l'"
[ "$seen" = "locked$locked" ] || fail "the other client locks the first event of 'l'" "$seen"
relay_start --database-url "$DATABASE_URL" --brokers "$BROKERS" --layout debezium \
    --sessions 1 --kafka reconnect.backoff.max.ms=500
upper_sent() {
    [ "$(psql_q "SELECT count(*) FROM outbox WHERE aggregateid COLLATE \"C\" = 'L'
                 AND sent_at IS NOT NULL")" = 3 ]
}
wait_for "'L' is delivered while the first event of 'l' is locked" 30 upper_sent
check_eq "none of 'l''s events is sent while its first is locked" 0 \
    "$(psql_q "SELECT count(*) FROM outbox WHERE aggregateid COLLATE \"C\" = 'l'
               AND sent_at IS NOT NULL")"
echo "COMMIT; SELECT 'committed';" >&"${HOLDER[1]}"
read -r -t 10 seen <&"${HOLDER[0]}" || fail "the other client commits"
echo '\q' >&"${HOLDER[1]}"
wait "$holder_pid" 2>/dev/null
wait_for "every row is delivered once the lock is gone" 30 no_unsent_rows
relay_stop
check_eq "the relay exits 0" 0 "$?"
consume --topic outbox.event.l --to-end --timeout-ms 30000 >"$T/l.json"
check "'L' and 'l': each key's events are published in order" first_copies_in_order "$T/l.json"

# Replay selects an aggregate (and a type, an event type) byte for byte, as Kafka keys them:
# under the column's case-insensitive collation `--aggregate-id l` also selected 'L' (6 events,
# not 3), and put the other aggregate's events out again.
"$RELAY_BIN" replay --database-url "$DATABASE_URL" --layout debezium --aggregate-type l \
    --aggregate-id l --dry-run >"$T/replay_dry.out" 2>"$T/replay_dry.err"
check_eq "replay --aggregate-id l --dry-run exits 0" 0 "$?"
check "replay --aggregate-id l --dry-run selects the 3 events of 'l' alone" \
    grep -q "dry run: 3 events would be replayed" "$T/replay_dry.out"
"$RELAY_BIN" replay --database-url "$DATABASE_URL" --layout debezium --aggregate-type l \
    --aggregate-id l >"$T/replay.out" 2>"$T/replay.err"
check_eq "replay --aggregate-id l exits 0" 0 "$?"
check_eq "replay put the 3 events of 'l' back in line, none of 'L'" "l 3" \
    "$(psql_q "SELECT aggregateid COLLATE \"C\", count(*) FROM outbox
               WHERE sent_at IS NULL GROUP BY 1 ORDER BY 1" | tr '|' ' ')"

# ... and still through an index on the column: one is built under the column's collation and
# serves a comparison under it alone, so the byte comparison alone (COLLATE "C") made a replay
# by aggregate read the whole table however large (400,000 rows read for 20 of them, measured).
# Among 2,000 sent events of other aggregates, and with sequential scans made dear
# (enable_seqscan off, so the few rows here are planned as a large table's would be), the dry run
# for 'L' reads the index on (aggregatetype, aggregateid); the old code could not use it.
psql_q "INSERT INTO outbox (aggregatetype, aggregateid, type, payload, sent_at)
        SELECT 'other', 'other-' || g, 'changed', '{}', now() FROM generate_series(1, 2000) AS g" ||
    fail "insert sent events of other aggregates"
psql_q "CREATE INDEX outbox_aggregate_idx ON outbox (aggregatetype, aggregateid)" ||
    fail "create an index on the aggregate"
psql_q "ANALYZE outbox" || fail "analyze the table"
index_scans() {
    psql_q "SELECT coalesce(sum(idx_scan), 0) FROM pg_stat_user_indexes
            WHERE indexrelname = 'outbox_aggregate_idx'"
}
scans_before=$(index_scans)
PGOPTIONS="-c enable_seqscan=off" "$RELAY_BIN" replay --database-url "$DATABASE_URL" \
    --layout debezium --aggregate-type l --aggregate-id L --dry-run \
    >"$T/replay_index.out" 2>"$T/replay_index.err"
check_eq "replay --aggregate-id L --dry-run exits 0" 0 "$?"
check "replay --aggregate-id L --dry-run selects the 3 events of 'L' alone" \
    grep -q "dry run: 3 events would be replayed" "$T/replay_index.out"
index_read() { [ "$(index_scans)" -gt "$scans_before" ]; }
wait_for "the replay's selection reads the index on the aggregate" 15 index_read
