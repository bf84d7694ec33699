#!/bin/bash
# Proves what `dead` and `purge-dead` show and ask on an operator's terminal:
#  1. purge-dead --all on a terminal (a pty of script(1)) asks "purge N dead-lettered events for
#     good? [y/N]" first, as replay asks about a large selection: any answer but y (n, or the end
#     of input) deletes nothing and exits 1 saying so; y deletes them; --yes asks nothing; without
#     a terminal (a script) it asks nothing and deletes, as it always has; --id (one event) asks
#     nothing. Before, it deleted every dead event unasked.
#  3. the purge keeps to the events the question counted: events that die while it waits (an id
#     above them, and one below) are not deleted with them. Before, "purge 2 ... [y/N]" answered y
#     deleted 4.
#  4. ... nor one whose death's transaction began before the count and committed after it (a
#     relay's batch): its dead_at (its transaction's start) is older than the latest death counted
#     and its id lower than the highest counted. Before, "purge 2 ... [y/N]" answered y deleted 3.
#  5. a counted event whose row changed while the question waited (as when a relay records a failed
#     copy to the dead-letter topic) is left, and the purge says so.
#  6. ... also in a cluster past its first 2^32 transactions (epoch 1, pg_resetwal -e), when the
#     counted row changes while the purge waits for a lock on the one before it: the purge reads
#     the changed row's new version again (FOR UPDATE's recheck), whose xmin is newer than the
#     purge's snapshot. Before, that xmin was taken as the id 2^32 below it, which the count's
#     snapshot saw: the changed row was deleted.
#  2. dead's table shows an aggregate name whole up to some 500 bytes, and cuts a longer one with
#     "..."; --json gives every name whole. Before, the table cut every name at 255 bytes unmarked.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
relay_migrate 2>"$T/migrate.log" || fail "migrate"

export DATABASE_URL RELAY_BIN
# A dead-lettered event of aggregate $1, as the relay leaves one (attempts and rejections counted).
insert_dead() {
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            VALUES ('order', '$1', 'Broken', '{}');
            UPDATE outbox SET attempts = 2, rejections = 2, dead_at = now(), last_error = 'x'
            WHERE aggregate_id = '$1'"
}
dead_count() { psql_q "SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL AND sent_at IS NULL"; }
# tty_cmd ARGS...: the command line script(1) runs: the relay with ARGS and the database URL.
tty_cmd() {
    # shellcheck disable=SC2016 # expanded by the shell script(1) runs, from the environment
    local cmd='exec "$RELAY_BIN"' a
    for a in "$@"; do
        cmd+=" $(printf '%q' "$a")"
    done
    # shellcheck disable=SC2016
    cmd+=' --database-url "$DATABASE_URL"'
    printf '%s' "$cmd"
}
# on_tty ANSWER OUT ARGS...: runs the relay with ARGS on a pseudo-terminal (stdin, stdout and
# stderr), ANSWER (with a newline unless empty) typed in; its output (the typed answer echoed
# among it) goes to OUT; returns its exit status.
on_tty() {
    local answer=$1 out=$2
    shift 2
    if [ -n "$answer" ]; then answer+=$'\n'; fi
    printf '%s' "$answer" |
        SHELL=/bin/bash timeout 30 script -q -e -c "$(tty_cmd "$@")" /dev/null >"$out" 2>&1
}
# answer_later OUT SQL: once the question is in OUT (waits up to 30 s), runs SQL, then types y.
answer_later() {
    local i
    for i in $(seq 300); do
        if grep -qF '[y/N]' "$1" 2>/dev/null; then break; fi
        sleep 0.1
    done
    psql_q "$2" >/dev/null
    printf 'y\n'
}
QUESTION='purge 2 dead-lettered events for good? [y/N]'
REFUSED='purge-dead: not confirmed; nothing changed'

# --- 1. ---
insert_dead p-1
insert_dead p-2
on_tty n "$T/no.out" purge-dead --all
check_eq "1: purge-dead --all on a terminal, answered n: exit 1" 1 $?
check "1: ... it asked, naming how many" grep -qF "$QUESTION" "$T/no.out"
check "1: ... and said nothing changed" grep -qF "$REFUSED" "$T/no.out"
check_eq "1: ... both events still dead" 2 "$(dead_count)"
on_tty '' "$T/eof.out" purge-dead --all
check_eq "1: purge-dead --all on a terminal, end of input: exit 1, both still dead" "1 2" \
    "$? $(dead_count)"
on_tty y "$T/id.out" purge-dead --id "$(psql_q "SELECT id FROM outbox WHERE aggregate_id = 'p-1'")"
check_eq "1: purge-dead --id on a terminal: exit 0, one left" "0 1" "$? $(dead_count)"
check "1: ... asked nothing (one event)" lacks "$T/id.out" '[y/N]'
insert_dead p-3
on_tty y "$T/yes.out" purge-dead --all
check_eq "1: purge-dead --all on a terminal, answered y: exit 0, none left" "0 0" "$? $(dead_count)"
check "1: ... after the question" grep -qF "$QUESTION" "$T/yes.out"
check "1: ... purged both" grep -q 'purged 2 events' "$T/yes.out"
insert_dead p-4
on_tty '' "$T/flag.out" purge-dead --all --yes
check_eq "1: purge-dead --all --yes on a terminal: exit 0, none left" "0 0" "$? $(dead_count)"
check "1: ... asked nothing" lacks "$T/flag.out" '[y/N]'
insert_dead p-5
timeout 30 "$RELAY_BIN" purge-dead --all --database-url "$DATABASE_URL" </dev/null \
    >"$T/script.out" 2>&1
check_eq "1: purge-dead --all without a terminal (a script): exit 0, none left" "0 0" \
    "$? $(dead_count)"
check "1: ... asked nothing" lacks "$T/script.out" '[y/N]'
on_tty '' "$T/none.out" purge-dead --all
check_eq "1: purge-dead --all on a terminal with nothing dead: exit 0, nothing asked" "0 0" \
    "$? $(grep -cF '[y/N]' "$T/none.out")"

# --- 2. ---
long=$(printf 'x%.0s' $(seq 300))
longer=$(printf 'y%.0s' $(seq 1000))
insert_dead "$long"
insert_dead "$longer"
timeout 30 "$RELAY_BIN" dead --database-url "$DATABASE_URL" >"$T/dead.txt" 2>"$T/dead.err"
check_eq "2: dead exits 0" 0 $?
check "2: a name of 306 bytes is shown whole" grep -qF " order/$long " "$T/dead.txt"
shown=$(awk '$3 ~ /^order\/y/ { print $3 }' "$T/dead.txt")
check "2: a name of 1006 bytes is cut, marked \"...\" ($(printf '%s' "$shown" | wc -c) bytes shown)" \
    grep -qE '^order/y{400,}\.\.\.$' <<<"$shown"
timeout 30 "$RELAY_BIN" dead --json --database-url "$DATABASE_URL" >"$T/dead.json" 2>"$T/dead.err"
check_eq "2: dead --json gives both names whole" "300 1000" \
    "$(jq -r '.aggregate_id | length' "$T/dead.json" | sort -n | paste -sd' ')"

# --- 3. ---
psql_q "DELETE FROM outbox" >/dev/null
# Two events die while the question waits: one with an id above those counted (a new event), one
# below them (an event inserted first, dead-lettered now). Neither was among the 2 asked about.
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        VALUES ('order', 'r-low', 'Broken', '{}')"
insert_dead r-1
insert_dead r-2
answer_later "$T/race.out" "UPDATE outbox SET attempts = 2, rejections = 2, dead_at = now(),
                            last_error = 'x' WHERE aggregate_id = 'r-low';
                            INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
                            VALUES ('order', 'r-high', 'Broken', '{}');
                            UPDATE outbox SET attempts = 2, rejections = 2, dead_at = now(),
                            last_error = 'x' WHERE aggregate_id = 'r-high'" |
    SHELL=/bin/bash timeout 30 script -q -e -c "$(tty_cmd purge-dead --all)" /dev/null \
        >"$T/race.out" 2>&1
check_eq "3: purge-dead --all, 2 events counted, 2 more dead before the answer y: exit 0" 0 $?
check "3: ... asked about the 2" grep -qF "$QUESTION" "$T/race.out"
check "3: ... purged those 2" grep -q 'purged 2 events' "$T/race.out"
check_eq "3: ... the 2 that died while it asked are still dead" "r-high r-low" \
    "$(psql_q "SELECT string_agg(aggregate_id, ' ' ORDER BY aggregate_id) FROM outbox
               WHERE dead_at IS NOT NULL AND sent_at IS NULL")"

# --- 4. ---
psql_q "DELETE FROM outbox" >/dev/null
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        VALUES ('order', 's-early', 'Broken', '{}')" >/dev/null
# Another session dead-letters s-early in a transaction it keeps open (as a relay's batch does)
# until the question is asked: its dead_at, now() of that transaction, is older than the deaths
# of s-1 and s-2, committed after it began, and its id is the lowest.
mkfifo "$T/early.in"
psql -XAtq -v ON_ERROR_STOP=1 <"$T/early.in" >"$T/early.out" 2>&1 &
early=$!
_t_track "$early"
exec 7>"$T/early.in"
echo "BEGIN; UPDATE outbox SET attempts = 2, rejections = 2, dead_at = now(), last_error = 'x'
      WHERE aggregate_id = 's-early'; SELECT 'dying';" >&7
_poll 30 grep -qx dying "$T/early.out" || fail "4: the other session dead-letters s-early"
insert_dead s-1
insert_dead s-2
# commit_then_yes: once the question is in race2.out, the other session commits; then types y.
commit_then_yes() {
    local i
    for i in $(seq 300); do
        if grep -qF '[y/N]' "$T/race2.out" 2>/dev/null; then break; fi
        sleep 0.1
    done
    echo "COMMIT; SELECT 'committed';" >&7
    _poll 30 grep -qx committed "$T/early.out" || fail "4: the other session commits"
    printf 'y\n'
}
commit_then_yes | SHELL=/bin/bash timeout 30 script -q -e -c "$(tty_cmd purge-dead --all)" \
    /dev/null >"$T/race2.out" 2>&1
check_eq "4: purge-dead --all, 2 events counted, a third dying in a transaction begun before: exit 0" \
    0 $?
check "4: ... asked about the 2" grep -qF "$QUESTION" "$T/race2.out"
check "4: ... purged those 2" grep -q 'purged 2 events' "$T/race2.out"
check_eq "4: ... the one whose death committed after the count is still dead" "s-early" \
    "$(psql_q "SELECT string_agg(aggregate_id, ' ' ORDER BY aggregate_id) FROM outbox
               WHERE dead_at IS NOT NULL AND sent_at IS NULL")"
exec 7>&-
wait "$early" 2>/dev/null

# --- 5. ---
psql_q "DELETE FROM outbox" >/dev/null
insert_dead t-1
insert_dead t-2
answer_later "$T/changed.out" "UPDATE outbox SET next_attempt_at = now() + interval '1 minute'
                               WHERE aggregate_id = 't-1'" |
    SHELL=/bin/bash timeout 30 script -q -e -c "$(tty_cmd purge-dead --all)" /dev/null \
        >"$T/changed.out" 2>&1
check_eq "5: purge-dead --all, 2 counted, one's row changed before the answer y: exit 0" 0 $?
check "5: ... purged the other" grep -qE $'purged 1 event\r?$' "$T/changed.out"
check "5: ... says the changed one was left" \
    grep -qF '1 of the 2 counted changed since the count' "$T/changed.out"
check_eq "5: ... which is still dead" "t-1" \
    "$(psql_q "SELECT string_agg(aggregate_id, ' ' ORDER BY aggregate_id) FROM outbox
               WHERE dead_at IS NOT NULL AND sent_at IS NULL")"

# --- 6. ---
psql_q "DELETE FROM outbox" >/dev/null
pg_stop
_as_pg pg_resetwal -e 1 "$T/pg" >"$T/resetwal.log" 2>&1 || fail "6: pg_resetwal -e 1"
pg_start
check_eq "6: the cluster is at epoch 1" 1 \
    "$(psql_q "SELECT pg_current_xact_id()::text::bigint >> 32")"
insert_dead u-1
insert_dead u-2
# Another session holds u-1 locked (as a relay's batch does) until u-2 has changed.
mkfifo "$T/lock.in"
psql -XAtq -v ON_ERROR_STOP=1 <"$T/lock.in" >"$T/lock.out" 2>&1 &
locker=$!
_t_track "$locker"
exec 8>"$T/lock.in"
echo "BEGIN; SELECT 1 FROM outbox WHERE aggregate_id = 'u-1' FOR UPDATE; SELECT 'locked';" >&8
_poll 30 grep -qx locked "$T/lock.out" || fail "6: the other session locks u-1"
purge_waits() { [ "$(psql_q "SELECT count(*) FROM pg_locks WHERE NOT granted")" -gt 0 ]; }
# yes_then_change: once the question is in epoch.out, types y; once the purge waits for u-1, u-2
# changes (as when a relay records a failed copy) and the other session lets u-1 go.
yes_then_change() {
    local i
    for i in $(seq 300); do
        if grep -qF '[y/N]' "$T/epoch.out" 2>/dev/null; then break; fi
        sleep 0.1
    done
    printf 'y\n'
    _poll 30 purge_waits || fail "6: the purge waits for u-1"
    psql_q "UPDATE outbox SET next_attempt_at = now() + interval '1 minute'
            WHERE aggregate_id = 'u-2'" >/dev/null
    echo "COMMIT; SELECT 'released';" >&8
    _poll 30 grep -qx released "$T/lock.out" || fail "6: the other session lets u-1 go"
}
yes_then_change | SHELL=/bin/bash timeout 30 script -q -e -c "$(tty_cmd purge-dead --all)" \
    /dev/null >"$T/epoch.out" 2>&1
check_eq "6: epoch 1, purge-dead --all, u-2 changed while the purge waited for u-1: exit 0" 0 $?
check "6: ... purged u-1" grep -qE $'purged 1 event\r?$' "$T/epoch.out"
check "6: ... says the changed one was left" \
    grep -qF '1 of the 2 counted changed since the count' "$T/epoch.out"
check_eq "6: ... which is still dead" "u-2" \
    "$(psql_q "SELECT string_agg(aggregate_id, ' ' ORDER BY aggregate_id) FROM outbox
               WHERE dead_at IS NOT NULL AND sent_at IS NULL")"
exec 8>&-
wait "$locker" 2>/dev/null
