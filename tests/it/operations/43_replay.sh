#!/bin/bash
# Proves `outbox-relay replay` (docs/operations.md#replay) against a real PostgreSQL, the mock
# broker and real consumers:
#  1. verify finds 3 events marked sent whose messages never reached Kafka; a dry run of replay
#     over verify's --json list names the 3 and their topic and changes nothing; replay puts
#     exactly those back in line as fresh rows (new ids above every other, attempts 0, not
#     through 0008's trigger); a relay publishes them once each and nothing else again; verify
#     is then clean;
#  2. under load from two producers and two relays, a replay by the time events were marked sent
#     (in batches of 500) re-publishes exactly the selected events: the first copies of every
#     aggregate stay in order, the replayed copies come in order too, no attempt is counted and
#     nothing is dead-lettered; a large selection without --yes and without a terminal is refused
#     with one line and changes nothing;
#  3. bad input (no selection, an unreadable timestamp, a time range inverted or empty, an
#     inconclusive verify's list, a file that is not verify's, a list larger than 32 MiB, which
#     would be held in memory whole, a file that cannot be opened) exits 2 with one line;
#  4. a replay that stops short (a batch fails; a SIGTERM or a SIGHUP, after the batch under
#     way) exits 1 with a last line giving the count and the bounds of the rest, which its first
#     line on stderr gave already, and the same command with those bounds replays only the
#     rest, though the relay has re-sent the first part meanwhile (without them it would take
#     that part again); a list naming an event twice counts it once; an order column that draws
#     no values (no identity, no default) is refused with one line before anything changes.
#  5. on a table another session holds locked (a migration, a VACUUM FULL) it gives up after 10 s
#     with exit 1 and one line, rather than wait as long as the lock is held;
#  6. a selection whose read takes longer than the 30 s the one-shot commands dead, status and
#     the like give a statement (a large table scanned whole) still completes: replay bounds its
#     lock waits only, not its statements.
#  Also in 1: verify with --timestamp-column (messages carrying the events' own times, which
#  cannot find the window's start) reads the partitions whole, without --from-beginning.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 3
relay_migrate 2>"$T/migrate.log" || fail "migrate"

OPTS=(--database-url "$DATABASE_URL" --brokers "$BROKERS")
verify() {
    "$RELAY_BIN" verify "${OPTS[@]}" --since 1h --from-beginning "$@"
}
replay() {
    "$RELAY_BIN" replay --database-url "$DATABASE_URL" "$@"
}
# table_digest: every column of every row, to show that something changed nothing.
table_digest() {
    psql_q "SELECT md5(string_agg(o::text, '|' ORDER BY id)) FROM outbox o"
}

# --- 1. missing from Kafka, found by verify, replayed from its list ---
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'order', 'o-' || (g % 10), 'Updated', jsonb_build_object('seq', g)
        FROM generate_series(1, 300) g ORDER BY g"
relay_start "${OPTS[@]}"
wait_for "1: every row sent" 60 no_unsent_rows
relay_stop
# Lost: marked sent, no message (as a topic recreated or an unclean election leaves them).
lost=$(psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
               SELECT 'order', 'o-lost-' || g, 'Created', jsonb_build_object('seq', 1000 + g),
                      now()
               FROM generate_series(1, 3) g ORDER BY g RETURNING event_id" | sort)
old_max=$(psql_q "SELECT max(id) FROM outbox")

verify --json >"$T/verify.json" 2>"$T/verify.err"
check_eq "1: verify finds rows missing: exit 1" 1 $?
check_eq "1: ... 3 missing, listed in missing_events" "3 3" \
    "$(jq -r '"\(.missing) \(.missing_events | length)"' "$T/verify.json")"
check_eq "1: ... the 3 lost events" "$lost" "$(jq -r '.missing_events[].event_id' "$T/verify.json" | sort)"

before=$(table_digest)
replay --missing - --dry-run <"$T/verify.json" >"$T/dry.out" 2>"$T/dry.err"
check_eq "1: dry run: exit 0" 0 $?
check "1: dry run: says 3 events and their topic" grep -q \
    '^replay: dry run: 3 events would be replayed (ids [0-9]*-[0-9]*): 3 to outbox.event.order$' \
    "$T/dry.out"
check_eq "1: dry run: the table is unchanged" "$before" "$(table_digest)"

replay --missing - <"$T/verify.json" >"$T/replay.out" 2>"$T/replay.err"
check_eq "1: replay: exit 0" 0 $?
check "1: replay: the final line says 3 replayed" grep -q \
    '^replay: 3 events replayed in .* s: 3 to outbox.event.order' "$T/replay.out"
check_eq "1: exactly the 3 lost rows are unsent again" "$lost" \
    "$(psql_q "SELECT event_id FROM outbox WHERE sent_at IS NULL ORDER BY 1")"
check_eq "1: ... with new ids above every row, in their old order, attempts 0 (fresh rows)" \
    "3|0|t" "$(psql_q "SELECT count(*), max(attempts), bool_and(id > $old_max)
                      FROM outbox WHERE sent_at IS NULL")"
check_eq "1: ... replayed in their old order" "$(printf '%s\n' 1001 1002 1003)" \
    "$(psql_q "SELECT payload->>'seq' FROM outbox WHERE sent_at IS NULL ORDER BY id")"

relay_start "${OPTS[@]}"
wait_for "1: the replayed rows sent" 60 no_unsent_rows
relay_stop
# Every row is marked sent (after Kafka acknowledged it) and the relay stopped: the topic is
# read up to the end offsets Kafka gives now, with no idle-time guess (as check_delivered does).
consume --topic outbox.event.order --to-end --timeout-ms 30000 >"$T/order.json"
check_eq "1: the topic read up to its end offsets" 0 $?
check_eq "1: Kafka has each lost event once now" "$lost" \
    "$(jq -r '.headers.id' "$T/order.json" | sort | uniq -c |
        awk '$1 == 1' | grep -F -f <(printf '%s\n' "$lost") | awk '{print $2}' | sort)"
check_eq "1: ... and nothing else was published again (303 messages, 303 ids)" "303 303" \
    "$(jq -r '.headers.id' "$T/order.json" | wc -l) $(jq -r '.headers.id' "$T/order.json" | sort -u | wc -l)"
verify >"$T/verify2.out" 2>"$T/verify2.err"
check_eq "1: verify after the replay: exit 0" 0 $?
check "1: ... none missing" grep -q '^verify: ok: .* rows=303 messages=303 missing=0 out_of_order=0' \
    "$T/verify2.out"
check_eq "1: no attempt counted, nothing dead" "0|0" \
    "$(psql_q "SELECT max(attempts), count(*) FILTER (WHERE dead_at IS NOT NULL) FROM outbox")"
# The mock broker cannot look offsets up by time: a verify that searched by time would read
# nothing and call every row missing (inconclusive, exit 3).
"$RELAY_BIN" verify "${OPTS[@]}" --since 1h --timestamp-column created_at \
    >"$T/verify3.out" 2>"$T/verify3.err"
check_eq "1: verify --timestamp-column without --from-beginning: exit 0" 0 $?
check "1: ... it read every partition whole, and says why" \
    grep -q 'reading every partition from its first offset' "$T/verify3.err"

# --- 2. by time, under load from producers and two relays ---
# Events of aggregate type 'load': each producer writes its own aggregates, seq growing with id.
produce_load() { # PRODUCER BATCHES
    local p=$1 b
    for ((b = 0; b < $2; b++)); do
        psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
                SELECT 'load', '$p-' || (g % 20), 'Step', jsonb_build_object('seq', $b * 1000 + g)
                FROM generate_series(1, 200) g ORDER BY g" || return 1
    done
}
produce_load p0 60 || fail "2: the first rows"
t0=$(psql_q "SELECT now()")
relay_start "${OPTS[@]}" --sessions 2
pids=("$RELAY_PID")
relay_start "${OPTS[@]}" --sessions 2
pids+=("$RELAY_PID")
wait_for "2: the first 12,000 rows sent" 120 no_unsent_rows
t1=$(psql_q "SELECT now()")
selected=$(psql_q "SELECT count(*) FROM outbox WHERE sent_at >= '$t0' AND sent_at < '$t1'")
check "2: more than 10,000 events sent in the window (a large selection)" test "$selected" -gt 10000

before=$(table_digest)
replay --sent-after "$t0" --sent-before "$t1" </dev/null >"$T/large.out" 2>"$T/large.err"
check_eq "2: a large selection without --yes and without a terminal: exit 2" 2 $?
check_eq "2: ... one line" 1 "$(grep -c '' "$T/large.err")"
check "2: ... that names --yes" grep -q -- "$selected events selected, more than 10000: pass --yes" \
    "$T/large.err"
check_eq "2: ... and nothing changed" "$before" "$(table_digest)"

produce_load p1 30 &
p1=$!
produce_load p2 30 &
p2=$!
replay --sent-after "$t0" --sent-before "$t1" --yes --batch-rows 500 >"$T/load.out" 2>"$T/load.err"
check_eq "2: replay by time under load: exit 0" 0 $?
check "2: ... replays every selected event" grep -q "^replay: $selected events replayed in " \
    "$T/load.out"
wait "$p1" || fail "2: producer 1"
wait "$p2" || fail "2: producer 2"
wait_for "2: every row sent" 120 no_unsent_rows
for pid in "${pids[@]}"; do
    RELAY_PID=$pid
    relay_stop
done
consume --topic outbox.event.load --to-end --timeout-ms 60000 >"$T/load.json"
check_eq "2: the topic read up to its end offsets" 0 $?
check_eq "2: every load event in Kafka" "$(psql_q "SELECT count(*) FROM outbox WHERE aggregate_type = 'load'")" \
    "$(jq -r .headers.id "$T/load.json" | sort -u | wc -l)"
check "2: first copies in order per aggregate" first_copies_in_order "$T/load.json"
# The events published twice are exactly the replayed ones (at-least-once may add a few more
# on a relay's crash, but nothing here crashes).
check_eq "2: the events published twice are the $selected replayed ones" "$selected" \
    "$(jq -r .headers.id "$T/load.json" | sort | uniq -d | wc -l)"
check "2: the replayed (second) copies come in order per aggregate too" \
    bash -c "jq -r '[.headers.id, .key, (.value | fromjson | .seq)] | @tsv' '$T/load.json' | awk -F '\t' '
        seen[\$1]++ != 1 { next }
        (\$2 in last) && \$3 <= last[\$2] { bad++ }
        { last[\$2] = \$3 }
        END { exit bad > 0 }'"
check_eq "2: no attempt counted, nothing dead" "0|0" \
    "$(psql_q "SELECT max(attempts), count(*) FILTER (WHERE dead_at IS NOT NULL) FROM outbox")"

# --- 3. bad input ---
replay >"$T/bad.out" 2>"$T/bad.err"
check_eq "3: no selection: exit 2" 2 $?
check_eq "3: ... one line naming the selections" 1 "$(grep -c -- '--sent-after' "$T/bad.err")"
replay --sent-after 'yesterday-ish' >"$T/bad.out" 2>"$T/bad.err"
check_eq "3: an unreadable timestamp: exit 2" 2 $?
check_eq "3: ... one line" 1 "$(grep -c '' "$T/bad.err")"
# Swapped bounds select nothing: "nothing to replay", exit 0, would read as "nothing was sent then".
replay --sent-after '2026-11-26 10:00+00' --sent-before '2026-11-26 11:00+01' >"$T/bad.out" 2>"$T/bad.err"
check_eq "3: --sent-after not before --sent-before (the same instant): exit 2" 2 $?
check_eq "3: ... one line" 1 "$(grep -c '' "$T/bad.err")"
check "3: ... that says so" grep -q -- '--sent-after (.*) is not before --sent-before' "$T/bad.err"
check_eq "3: ... and nothing on stdout" "" "$(cat "$T/bad.out")"
replay --sent-after "$t1" --sent-before "$t0" --yes >"$T/bad.out" 2>"$T/bad.err"
check_eq "3: a time range inverted: exit 2" 2 $?
check "3: ... one line that says so" grep -q -- '--sent-after (.*) is not before --sent-before' \
    "$T/bad.err"
echo '{"result": "inconclusive", "missing_events": [{"id": 1, "event_id": "x"}]}' |
    replay --missing - >"$T/bad.out" 2>"$T/bad.err"
check_eq "3: verify's inconclusive list: exit 2" 2 $?
check "3: ... one line saying it proves nothing" grep -q 'inconclusive.*proves nothing' "$T/bad.err"
echo '{"ok": true}' | replay --missing - >"$T/bad.out" 2>"$T/bad.err"
check_eq "3: not verify's output: exit 2" 2 $?
check "3: ... one line saying so" grep -q 'not the output of `verify --json`' "$T/bad.err"
# A list is parsed whole (about 7 bytes of memory a byte): one larger than 32 MiB is refused
# before it is, here one of 40 MiB (spaces: to an unbounded reader, a list of nothing).
{
    printf '{"result": "failed", "missing_events": []'
    head -c $((40 << 20)) /dev/zero | tr '\0' ' '
    printf '}\n'
} | replay --missing - --dry-run >"$T/bad.out" 2>"$T/bad.err"
check_eq "3: a list larger than 32 MiB: exit 2" 2 $?
check_eq "3: ... one line" 1 "$(grep -c '' "$T/bad.err")"
check "3: ... naming the limit and the selection by time" \
    grep -q -- '--missing -: larger than 32 MiB .*--sent-after, --sent-before' "$T/bad.err"
replay --missing "$T/no-such-file" >"$T/bad.out" 2>"$T/bad.err"
check_eq "3: a list that cannot be opened: exit 2" 2 $?
check "3: ... one line saying why" grep -q -- "--missing $T/no-such-file: No such file or directory$" \
    "$T/bad.err"

# --- 4. stopped short, and resumed ---
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'rerun', 'r-' || (g % 5), CASE WHEN g = 21 THEN 'Stop' ELSE 'Step' END,
               jsonb_build_object('seq', g)
        FROM generate_series(1, 30) g ORDER BY g"
relay_start "${OPTS[@]}"
wait_for "4: the rerun rows sent" 60 no_unsent_rows
# The 21st row refuses to be made unsent: a stand-in for any failure mid-run. A data exception
# (class 22, as a check of the writers' own raises) is the row's, not the selection's: exit 1,
# as for any failure after batches committed (it was taken for bad input, exit 2).
psql_q "CREATE FUNCTION refuse_replay() RETURNS trigger LANGUAGE plpgsql AS \$\$
        BEGIN
            IF OLD.event_type = 'Stop' AND NEW.sent_at IS NULL THEN
                RAISE EXCEPTION 'refused for the test' USING ERRCODE = 'data_exception';
            END IF;
            RETURN NEW;
        END \$\$;
        CREATE TRIGGER refuse_replay BEFORE UPDATE ON outbox FOR EACH ROW
            EXECUTE FUNCTION refuse_replay()"
replay --aggregate-type rerun --batch-rows 10 >"$T/stop.out" 2>"$T/stop.err"
check_eq "4: a batch fails: exit 1" 1 $?
check "4: ... logged as a failure, its error quoted (not as bad input)" \
    grep -q 'level=error msg="replay failed; the batches before it stay replayed" error=.*refused for the test' \
    "$T/stop.err"
check "4: ... the last line: 20 replayed, and the bounds of the rest" grep -q \
    "^replay: 20 events replayed before the failure; to replay the rest, run it again with --to-id [0-9]* --sent-before '[0-9T:.Z-]*' in place of" \
    "$T/stop.out"
wait_for "4: the relay sends the 20 again" 60 no_unsent_rows
psql_q "DROP TRIGGER refuse_replay ON outbox"
rest_to=$(sed -n 's/.*--to-id \([0-9]*\) .*/\1/p' "$T/stop.out")
rest_before=$(sed -n "s/.*--sent-before '\([^']*\)'.*/\1/p" "$T/stop.out")
replay --aggregate-type rerun --batch-rows 10 --to-id "$rest_to" --sent-before "$rest_before" \
    >"$T/rest.out" 2>"$T/rest.err"
check_eq "4: the same command with those bounds: exit 0" 0 $?
check "4: ... replays only the 10 left" grep -q '^replay: 10 events replayed in ' "$T/rest.out"
wait_for "4: ... and they are sent" 60 no_unsent_rows
consume --topic outbox.event.rerun --to-end --timeout-ms 30000 >"$T/rerun.json"
check_eq "4: the topic read up to its end offsets" 0 $?
check_eq "4: each of the 30 events in Kafka twice (its first copy and one replay)" "30 2" \
    "$(jq -r .headers.id "$T/rerun.json" | sort | uniq -c | awk '{print $1}' | uniq -c |
        awk '{print $1, $2}')"

# A SIGTERM mid-run, and a SIGHUP (a terminal gone: an ssh session dropped while the output goes
# to a file). The replay's second batch waits at a gate the test holds (a trigger looping while
# replay_gate has a row); the signal comes while it waits, then the gate opens: that batch
# finishes, and the run stops there, with exactly 20 of the 30 replayed. Its first line on stderr
# gave the same bounds of the rest before the first batch, for an end that prints no last line.
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT a, 'i-' || (g % 5), 'Step', jsonb_build_object('seq', g)
        FROM generate_series(1, 30) g, unnest(ARRAY['intr', 'hup']) a ORDER BY a, g"
wait_for "4: the intr and hup rows sent" 60 no_unsent_rows
psql_q "CREATE TABLE replay_gate (closed bool);
        CREATE FUNCTION gate_replay() RETURNS trigger LANGUAGE plpgsql AS \$\$
        BEGIN
            IF NEW.aggregate_type IN ('intr', 'hup') AND OLD.sent_at IS NOT NULL
               AND NEW.sent_at IS NULL AND (NEW.payload->>'seq')::int > 10 THEN
                WHILE EXISTS (SELECT 1 FROM replay_gate) LOOP
                    PERFORM pg_sleep(0.05);
                END LOOP;
            END IF;
            RETURN NEW;
        END \$\$;
        CREATE TRIGGER gate_replay BEFORE UPDATE ON outbox FOR EACH ROW
            EXECUTE FUNCTION gate_replay()"
gated_replayed() { # AGGREGATE_TYPE HIGH
    psql_q "SELECT count(*) FROM outbox WHERE aggregate_type = '$1' AND id > $2"
}
gated_at_gate() { # AGGREGATE_TYPE HIGH
    [ "$(gated_replayed "$1" "$2")" = 10 ] &&
        [ "$(psql_q "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'DO \$replay\$%'
                     AND state = 'active'")" = 1 ]
}
for agg_sig in intr:TERM hup:HUP; do
    agg=${agg_sig%%:*} sig=${agg_sig#*:}
    psql_q "INSERT INTO replay_gate VALUES (true)"
    high=$(psql_q "SELECT max(id) FROM outbox")
    # The binary itself in the background (not the replay function: $! would be a subshell).
    "$RELAY_BIN" replay --database-url "$DATABASE_URL" --aggregate-type "$agg" --batch-rows 10 \
        >"$T/$agg.out" 2>"$T/$agg.err" &
    gated_pid=$!
    wait_for "4: $agg: the first batch replayed, the second at the gate" 30 gated_at_gate "$agg" "$high"
    kill -"$sig" "$gated_pid"
    psql_q "DELETE FROM replay_gate"
    wait "$gated_pid"
    check_eq "4: SIG$sig mid-run: exit 1" 1 $?
    check_eq "4: ... the batch under way finished, and no other" 20 "$(gated_replayed "$agg" "$high")"
    check "4: ... the last line gives the count and the bounds of the rest" grep -q \
        "^replay: 20 events replayed before the signal; to replay the rest, run it again with --to-id" \
        "$T/$agg.out"
    check "4: ... stderr said it stops after the batch under way" \
        grep -q 'stopping after the batch under way' "$T/$agg.err"
    last=$(sed -n 's/.*\(--to-id [0-9]* --sent-before [^ ]*\) .*/\1/p' "$T/$agg.out")
    first=$(sed -n 's/^replay: 30 events, in transactions of 10; should it stop short, run it again with \(--to-id [0-9]* --sent-before [^ ]*\) .*/\1/p' "$T/$agg.err")
    check "4: ... stderr gave the same bounds before the first batch ($first)" \
        test -n "$first" -a "$first" = "$last"
done
psql_q "DROP TRIGGER gate_replay ON outbox"
wait_for "4: the interrupted part sent" 60 no_unsent_rows
rest_to=$(sed -n 's/.*--to-id \([0-9]*\) .*/\1/p' "$T/intr.out")
rest_before=$(sed -n "s/.*--sent-before '\([^']*\)'.*/\1/p" "$T/intr.out")
replay --aggregate-type intr --to-id "$rest_to" --sent-before "$rest_before" \
    >"$T/intr2.out" 2>"$T/intr2.err"
check "4: ... and its bounds replay the 10 left" grep -q '^replay: 10 events replayed in ' \
    "$T/intr2.out"
wait_for "4: those sent" 60 no_unsent_rows
relay_stop

# A list that names an event twice (two verify outputs joined) and one that is gone.
IFS='|' read -r one_id one_eid < <(psql_q "SELECT id, event_id FROM outbox WHERE sent_at IS NOT NULL
                                          ORDER BY id LIMIT 1")
printf '{"result": "failed", "missing_events": [%s, %s, {"id": 999999999, "event_id": "gone"}]}' \
    "{\"id\": $one_id, \"event_id\": \"$one_eid\"}" "{\"id\": $one_id, \"event_id\": \"$one_eid\"}" |
    replay --missing - --dry-run >"$T/twice.out" 2>"$T/twice.err"
check_eq "4: a list naming an event twice: exit 0" 0 $?
check "4: ... counts it once" grep -q '^replay: 2 events listed, 1 of them still in the table as sent' \
    "$T/twice.err"

# An order column with no sequence behind it (an adopted table's plain bigint).
psql_q "ALTER TABLE outbox ALTER COLUMN id DROP IDENTITY"
before=$(table_digest)
replay --aggregate-type rerun >"$T/noseq.out" 2>"$T/noseq.err"
check_eq "4: an order column that draws no values: exit 1" 1 $?
check_eq "4: ... one line" 1 "$(grep -c '' "$T/noseq.err")"
check "4: ... that says so" grep -q 'neither an identity nor a default' "$T/noseq.err"
check_eq "4: ... and nothing changed" "$before" "$(table_digest)"

# --- 5. a table someone else holds locked ---
# A migration's ALTER, a VACUUM FULL, or an ALTER queued behind a long transaction (which every
# later reader queues behind) locks the whole table: replay's reads wait for it at most 10 s,
# then it says so and exits 1, where it used to wait as long as the lock was held, silently.
psql_q "ALTER TABLE outbox ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY"
table_lock_open
wait_for "5: the table locked by another session" 10 table_lock_held
timeout 40 "$RELAY_BIN" replay --database-url "$DATABASE_URL" --aggregate-type rerun --dry-run \
    >"$T/locked.out" 2>"$T/locked.err"
check_eq "5: a dry run on a locked table gives up: exit 1" 1 $?
check_eq "5: ... one line" 1 "$(grep -c '' "$T/locked.err")"
check "5: ... that names the lock timeout" grep -q 'lock timeout' "$T/locked.err"
table_lock_close

# --- 6. a selection that takes longer to read than dead's and status's statement bound ---
# A view of the table whose aggregate_type takes 31 s a row to read stands in for a selection
# scanned on a large table; a dry run of one row reads it once (the summary's topics). The
# function is said to be stable so that the planner leaves it out where the column is not read.
psql_q "CREATE FUNCTION slow_text(t text) RETURNS text LANGUAGE plpgsql STABLE AS
            \$\$ BEGIN PERFORM pg_catalog.pg_sleep(31); RETURN t; END \$\$;
        CREATE VIEW slow_outbox AS SELECT o.id, o.event_id,
            slow_text(o.aggregate_type) AS aggregate_type, o.aggregate_id, o.event_type,
            o.payload, o.sent_at, o.attempts
        FROM outbox o;
        ALTER VIEW slow_outbox ALTER COLUMN id SET DEFAULT 0"
slow_id=$(psql_q "SELECT min(id) FROM outbox WHERE sent_at IS NOT NULL")
replay --table slow_outbox --from-id "$slow_id" --to-id "$slow_id" --dry-run \
    >"$T/slow.out" 2>"$T/slow.err"
check_eq "6: a dry run whose read takes 31 s: exit 0" 0 $?
check_eq "6: ... no statement timeout" 0 "$(grep -c 'statement timeout' "$T/slow.err")"
