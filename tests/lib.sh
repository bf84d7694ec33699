# shellcheck shell=bash
# tests/lib.sh: shared helpers for the integration tests in tests/it/. Source it, call t_setup.
#
# Provides a throwaway PostgreSQL (pg_start/pg_stop/pg_restart/psql_q), the mock Kafka cluster
# (broker_start/broker_cmd/broker_down/broker_up), the relay under test (relay_start/relay_stop),
# bounded polling (wait_for), TAP-like reporting (ok/not_ok/check/check_eq) and the fault tests'
# set-up (fault_setup, insert_rows, sent_of/unsent_of, log_lines).
# Every wait is bounded, and every exit path stops what the test started and removes the temp dir
# (set KEEP_TMP=1 to keep it). A script exits non-zero if any check failed.

set -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=$ROOT/bin
if [ -z "${RELAY_BIN:-}" ]; then
    if [ -x "$BIN/asan/outbox-relay" ]; then
        RELAY_BIN=$BIN/asan/outbox-relay
    else
        RELAY_BIN=$BIN/outbox-relay
    fi
fi
PGBIN=${PGBIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}
PATH=$PGBIN:$PATH
# Same settings as tests/run.sh, so a script run on its own behaves the same.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# Leaks inside libraries, each explained in the file.
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$ROOT/tests/lsan.supp:print_suppressions=0}

T=
_T_PASS=0
_T_FAIL=0
_T_PIDS=()
_T_RELAY_N=0
_T_PG_STARTED=0
_T_STANDBY_STARTED=0

# ---- reporting -------------------------------------------------------------------------------

ok() {
    _T_PASS=$((_T_PASS + 1))
    echo "ok - $1"
}

# not_ok DESCRIPTION [DETAIL]
not_ok() {
    _T_FAIL=$((_T_FAIL + 1))
    echo "not ok - $1${2:+: $2}"
}

# fail DESCRIPTION [DETAIL]: a failed precondition; reports it and ends the test.
fail() {
    not_ok "$@"
    exit 1
}

# check DESCRIPTION CMD...: passes when CMD exits 0; its output is shown only on failure.
check() {
    local desc=$1 out rc
    shift
    out=$("$@" 2>&1)
    rc=$?
    if [ "$rc" -eq 0 ]; then
        ok "$desc"
    else
        not_ok "$desc" "'$*' exited $rc"
        [ -z "$out" ] || printf '%s\n' "$out" | tail -n 5 | sed 's/^/#   /'
    fi
    return "$rc"
}

# check_eq DESCRIPTION EXPECTED ACTUAL
check_eq() {
    if [ "$2" = "$3" ]; then
        ok "$1"
    else
        not_ok "$1" "expected '$2', got '$3'"
        return 1
    fi
}

# lacks FILE STRING: true when FILE does not contain STRING (for use with check).
lacks() {
    ! grep -qF -e "$2" "$1"
}

# _poll TIMEOUT_S CMD...: runs CMD every 0.1 s until it succeeds (0) or the time is up (1).
_poll() {
    local limit=$1 deadline
    shift
    deadline=$(($(date +%s%N) + limit * 1000000000))
    until "$@" >/dev/null 2>&1; do
        [ "$(date +%s%N)" -lt "$deadline" ] || return 1
        sleep 0.1
    done
}

# wait_for DESCRIPTION TIMEOUT_S CMD...: reports ok once CMD succeeds, not ok at the timeout.
wait_for() {
    local desc=$1 limit=$2
    shift 2
    if _poll "$limit" "$@"; then
        ok "$desc"
    else
        not_ok "$desc" "not true after ${limit}s: $*"
        return 1
    fi
}

# ---- setup and teardown ----------------------------------------------------------------------

t_setup() {
    T=$(mktemp -d "${TMPDIR:-/tmp}/outbox-relay-test.XXXXXX") || fail "create temp dir"
    chmod 755 "$T" # the postgres user must reach its data dir inside
    trap _t_exit EXIT
    trap '_t_signal INT 130' INT
    trap '_t_signal TERM 143' TERM
    echo "# $(basename "$0"): temp dir $T, relay $RELAY_BIN"
}

_t_signal() {
    not_ok "test interrupted by SIG$1"
    exit "$2"
}

# locker_commit_once_waited LABEL IN OUT PID: the psql coprocess (its stdout IN and stdin OUT, as
# "${COPROC[@]}" gives them, and its PID) holds a transaction that another session is to wait
# on: it commits as soon as pg_locks shows some session waiting on its transaction id (at most 60
# s), then quits. For the tests that make a transaction commit while a claim waits on its lock
# (order/49_blocked_while_waiting, order/37_nondeterministic_collation).
locker_commit_once_waited() {
    local label=$1 in=$2 out=$3 pid=$4 seen
    echo "DO \$\$ BEGIN FOR i IN 1..12000 LOOP
              EXIT WHEN EXISTS (SELECT 1 FROM pg_locks w JOIN pg_locks h
                  ON h.locktype = 'transactionid' AND h.transactionid = w.transactionid
                  AND h.granted AND h.pid = pg_backend_pid()
                  WHERE w.locktype = 'transactionid' AND NOT w.granted);
              PERFORM pg_sleep(0.005);
          END LOOP; END \$\$;
          COMMIT; SELECT 'committed';" >&"$out"
    read -r -t 90 seen <&"$in" || fail "$label: the other client commits"
    [ "$seen" = committed ] || fail "$label: the other client commits" "$seen"
    echo '\q' >&"$out"
    wait "$pid" 2>/dev/null
}

_t_track() {
    _T_PIDS+=("$1")
}

_t_dead() {
    ! kill -0 "$1" 2>/dev/null
}

# Stops a background process: TERM, then KILL if it is still there after `limit` seconds.
_t_reap() {
    local pid=$1 limit=${2:-5}
    kill -TERM "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null; return 0; }
    _poll "$limit" _t_dead "$pid" || kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
}

_t_exit() {
    local rc=$? pid f
    trap - EXIT INT TERM
    for pid in "${_T_PIDS[@]}"; do
        _t_reap "$pid" 5
    done
    [ "$_T_PG_STARTED" = 1 ] && _as_pg pg_ctl -D "$T/pg" -m immediate -w -t 20 stop >/dev/null 2>&1
    [ "$_T_STANDBY_STARTED" = 1 ] &&
        _as_pg pg_ctl -D "$T/standby" -m immediate -w -t 20 stop >/dev/null 2>&1
    if [ "$_T_FAIL" -gt 0 ] && [ -n "$T" ]; then
        for f in "$T"/relay.*.log; do
            [ -f "$f" ] || continue
            echo "# --- last lines of $(basename "$f") ---"
            tail -n 25 "$f" | sed 's/^/# /'
        done
    fi
    if [ -n "$T" ]; then
        if [ "${KEEP_TMP:-0}" = 1 ]; then
            echo "# kept $T"
        else
            rm -rf "$T"
        fi
    fi
    echo "# $(basename "$0"): $_T_PASS passed, $_T_FAIL failed"
    [ "$rc" -eq 0 ] && [ "$_T_FAIL" -gt 0 ] && rc=1
    exit "$rc"
}

# ---- PostgreSQL --------------------------------------------------------------------------------

# initdb refuses to run as root, so the throwaway cluster belongs to the postgres user then.
_as_pg() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

# slot_share FIRST COUNT: "START SIZE", this test's share of FIRST..FIRST+COUNT-1 when split
# evenly between the TEST_JOBS slots of tests/run.sh (tests running at once get disjoint shares).
slot_share() {
    local size=$(($2 / ${TEST_JOBS:-1}))
    echo "$(($1 + ${TEST_SLOT:-0} * size)) $size"
}

# A slot at or past TEST_JOBS would take a share past the range's end (port 92000, subnet
# 10.231.1302.1 for TEST_SLOT=6 alone): refuse it here, saying why, instead of a puzzling
# failure later. By hand, run a test in slot S with TEST_JOBS above S (`TEST_JOBS=8 TEST_SLOT=6`).
case ${TEST_SLOT:-0} in
'' | *[!0-9]*) echo "tests/lib.sh: TEST_SLOT must be a number, not '$TEST_SLOT'" >&2 && exit 2 ;;
esac
if [ "${TEST_SLOT:-0}" -ge "${TEST_JOBS:-1}" ]; then
    echo "tests/lib.sh: TEST_SLOT=$TEST_SLOT needs TEST_JOBS above it (TEST_JOBS=${TEST_JOBS:-1}): run with TEST_JOBS=$((TEST_SLOT + 1)) or more" >&2
    exit 2
fi

# Ports tests pick from: this test's share of 20000-31999, below the kernel's ephemeral range so
# clients cannot hold one. Exported for the scripts a test runs (scripts/demo.sh).
read -r FREE_PORT_BASE FREE_PORT_SPAN <<<"$(slot_share 20000 12000)"
export FREE_PORT_BASE FREE_PORT_SPAN

# free_port picks a port of this test's range that nothing listens on.
# shellcheck source=scripts/free_port.sh
source "$ROOT/scripts/free_port.sh"

PG_PASSWORD=s3cret-Pw-42

# _pg_template: makes (once, under a lock) the cluster pg_start's first call starts from, in
# $OUTBOX_TEST_PG_TEMPLATE/pg: initdb's output with the `outbox` database and the role's password
# PG_PASSWORD, stopped cleanly, its postgresql.conf as initdb wrote it. tests/run.sh sets the
# variable to a directory of its own for the run, so that the tests copy one cluster (0.4 s)
# instead of each running initdb and CREATE DATABASE (1.2 s of a loaded machine's CPU, ~90
# tests). Returns 1 when there is none to copy (not under run.sh, or it could not be made: the
# caller then runs initdb itself).
_pg_template() {
    local dir=${OUTBOX_TEST_PG_TEMPLATE:-}
    [ -n "$dir" ] && [ -d "$dir" ] || return 1
    [ -f "$dir/ready" ] && return 0
    (
        flock -w 120 9 || exit 1
        [ -f "$dir/ready" ] && exit 0
        new=$dir/pg.$$ sock=$dir/sock.$$ started=0
        # A test stopped while it makes the template must not leave its server running.
        trap '[ "$started" = 1 ] && _as_pg pg_ctl -D "$new" -m immediate -w -t 20 stop >/dev/null 2>&1
              rm -rf "$new" "$sock"' EXIT
        mkdir -p "$new" "$sock" && chmod 700 "$new" && touch "$dir/pg.log" || exit 1
        [ "$(id -u)" = 0 ] && chown postgres: "$new" "$sock" "$dir/pg.log"
        _as_pg initdb -D "$new" -U postgres -A trust -E UTF8 --locale=C --no-sync \
            >"$dir/initdb.log" 2>&1 || exit 1
        started=1
        # Not with the lock's descriptor (9>&-): the postmaster leaves pg_ctl's session and would
        # hold the lock as long as it runs, so that a maker killed outright (its trap not run)
        # would leave every later test waiting out flock's 120 s.
        _as_pg pg_ctl -D "$new" -l "$dir/pg.log" -w -t 30 -o "-c listen_addresses='' \
            -c unix_socket_directories='$sock' -c port=5432 -c fsync=off" start >/dev/null 2>&1 9>&- ||
            exit 1
        psql -XAtq -v ON_ERROR_STOP=1 -h "$sock" -p 5432 -U postgres -d postgres \
            -c "CREATE DATABASE outbox" -c "ALTER ROLE postgres PASSWORD '$PG_PASSWORD'" \
            >/dev/null 2>&1 || exit 1
        _as_pg pg_ctl -D "$new" -m fast -w -t 30 stop >/dev/null 2>&1 || exit 1
        started=0
        rm -f "$new/postmaster.opts"
        mv "$new" "$dir/pg" && touch "$dir/ready"
    ) 9>"$dir/lock" && [ -f "$dir/ready" ]
}

# pg_start: first call creates the cluster and the `outbox` database (a copy of _pg_template's
# under tests/run.sh); later calls (pg_restart) start the same data dir on the same port. Exports
# DATABASE_URL, DATABASE_URL_PW (same URL with the role's password, PG_PASSWORD, for masking
# tests) and PGHOST/PGPORT/PGUSER/PGDATABASE.
pg_start() {
    local data=$T/pg first=0 made=0 attempt
    if [ ! -d "$data" ]; then
        first=1
        mkdir -p "$T/pgsock"
        touch "$T/pg.log"
        [ "$(id -u)" = 0 ] && chown postgres: "$T/pgsock" "$T/pg.log"
        if _pg_template && cp -a "$OUTBOX_TEST_PG_TEMPLATE/pg" "$data"; then
            made=1
        else
            rm -rf "$data"
            mkdir -p "$data"
            [ "$(id -u)" = 0 ] && chown postgres: "$data"
            _as_pg initdb -D "$data" -U postgres -A trust -E UTF8 --locale=C --no-sync \
                >"$T/initdb.log" 2>&1 || { cat "$T/initdb.log"; fail "initdb"; }
        fi
        cat >>"$data/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
unix_socket_directories = '$T/pgsock'
fsync = off
synchronous_commit = off
full_page_writes = off
max_connections = 200
EOF
    fi
    for attempt in 1 2 3 4 5; do
        if [ -z "${PGPORT:-}" ] || [ "$first" = 1 ]; then
            PGPORT=$(free_port) || fail "find a free port for PostgreSQL"
            echo "port = $PGPORT" >>"$data/postgresql.conf" # the last setting wins
        fi
        if _as_pg pg_ctl -D "$data" -l "$T/pg.log" -w -t 30 start >/dev/null 2>&1; then
            break
        fi
        # Only a fresh cluster may move to another port (someone took ours meanwhile).
        if [ "$first" != 1 ] || [ "$attempt" = 5 ]; then
            tail -n 20 "$T/pg.log"
            fail "pg_ctl start"
        fi
    done
    _T_PG_STARTED=1
    export PGHOST=127.0.0.1 PGPORT PGUSER=postgres PGDATABASE=outbox
    unset PGAPPNAME # it would name every connection, the relay's sessions too (test 32)
    _poll 30 pg_isready -q -h 127.0.0.1 -p "$PGPORT" || fail "PostgreSQL ready within 30s"
    if [ "$first" = 1 ] && [ "$made" = 0 ]; then
        psql -XAtq -v ON_ERROR_STOP=1 -d postgres -c "CREATE DATABASE outbox" \
            -c "ALTER ROLE postgres PASSWORD '$PG_PASSWORD'" >/dev/null || fail "create database"
    fi
    export PG_PASSWORD
    export DATABASE_URL=postgresql://postgres@127.0.0.1:$PGPORT/outbox
    export DATABASE_URL_PW=postgresql://postgres:$PG_PASSWORD@127.0.0.1:$PGPORT/outbox
}

pg_stop() {
    _as_pg pg_ctl -D "$T/pg" -m fast -w -t 30 stop >/dev/null 2>&1 || fail "pg_ctl stop"
    _T_PG_STARTED=0
}

pg_restart() {
    pg_stop
    pg_start
}

# standby_start [STREAM_PORT]: a streaming standby of the test's PostgreSQL (pg_basebackup -R) in
# $T/standby, stopped when the test exits; sets SB (its data directory) and SB_PORT. It streams
# from STREAM_PORT on 127.0.0.1 (a proxy in front of the primary, say) when given, else PGPORT.
standby_start() {
    SB=$T/standby
    mkdir -p "$SB" && touch "$T/standby.log"
    [ "$(id -u)" = 0 ] && chown postgres: "$SB" "$T/standby.log"
    chmod 700 "$SB"
    _as_pg pg_basebackup -D "$SB" -R -h 127.0.0.1 -p "$PGPORT" -U postgres -X stream -c fast \
        >"$T/basebackup.log" 2>&1 || { tail -n 5 "$T/basebackup.log"; fail "pg_basebackup -R"; }
    SB_PORT=$(free_port) || fail "a free port for the standby"
    echo "port = $SB_PORT" >>"$SB/postgresql.conf"
    [ -z "${1:-}" ] || # the last setting wins, and -R wrote its own here
        echo "primary_conninfo = 'host=127.0.0.1 port=$1 user=postgres'" >>"$SB/postgresql.auto.conf"
    _T_STANDBY_STARTED=1
    _as_pg pg_ctl -D "$SB" -l "$T/standby.log" -w -t 30 start >/dev/null 2>&1 ||
        { tail -n 20 "$T/standby.log"; fail "start the standby"; }
}

# standby_make_synchronous: the test's PostgreSQL waits at each commit for its standby
# (synchronous_commit on, as PostgreSQL's default, where lib.sh's server has it off, and
# synchronous_standby_names '*'); wait for sync_standby before relying on it.
standby_make_synchronous() {
    printf '%s\n' "synchronous_commit = on" "synchronous_standby_names = '*'" >>"$T/pg/postgresql.conf"
    psql_q "SELECT pg_reload_conf()" >/dev/null
}
# sync_standby: the standby streams and acknowledges as the synchronous one.
sync_standby() {
    [ "$(psql_q "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'")" = 1 ]
}

# psql_q SQL [PSQL ARGS...]: unaligned, tuples only, stops at the first error.
psql_q() {
    local sql=$1
    shift
    psql -XAtq -v ON_ERROR_STOP=1 "$@" -c "$sql"
}

# ---- mock Kafka --------------------------------------------------------------------------------

# broker_start [N] [MOCK-BROKER ARGS...]: exports BROKERS (bootstrap servers).
broker_start() {
    local n=${1:-3}
    [ $# -gt 0 ] && shift
    BROKER_CTL=$T/broker.ctl
    rm -f "$BROKER_CTL"
    mkfifo "$BROKER_CTL" || fail "mkfifo $BROKER_CTL"
    # The redirection below truncates in the child, possibly after the poll has read a previous
    # broker's address: remove the old output first.
    rm -f "$T/broker.out"
    "$BIN/mock-broker" --brokers "$n" --control "$BROKER_CTL" "$@" \
        >"$T/broker.out" 2>"$T/broker.log" &
    BROKER_PID=$!
    _t_track "$BROKER_PID"
    _poll 10 test -s "$T/broker.out" || fail "mock broker prints its address within 10s"
    BROKERS=$(head -n 1 "$T/broker.out")
    export BROKERS
}

_broker_lines() {
    grep -c '^mock-broker: ' "$T/broker.log"
}

_broker_logged_after() {
    [ "$(_broker_lines)" -gt "$1" ]
}

# broker_cmd "COMMAND": sends one control command and waits until the broker has applied it
# (it logs one line per command); fails the test when the broker reports an error.
broker_cmd() {
    local before
    before=$(_broker_lines)
    # The broker holds the fifo open, so this only blocks (bounded) if the broker is gone.
    timeout 5 sh -c 'printf "%s\n" "$1" >"$2"' sh "$1" "$BROKER_CTL" || fail "send '$1' to broker"
    _poll 10 _broker_logged_after "$before" || fail "broker applies '$1' within 10s"
    if tail -n 1 "$T/broker.log" | grep -q '^mock-broker: error'; then
        fail "broker command '$1'" "$(tail -n 1 "$T/broker.log")"
    fi
}

broker_down() {
    broker_cmd "down all"
}

broker_up() {
    broker_cmd "up all"
}

# consume ARGS...: bin/consume against the test's brokers.
consume() {
    "$BIN/consume" --brokers "$BROKERS" "$@"
}

# first_copies_in_order FILE: FILE holds consume output whose payloads carry a "seq" that grows
# with the row id per aggregate. At-least-once allows repeats, so only the first copy of each
# event (by its id header) must arrive in seq order per key.
first_copies_in_order() {
    jq -r '[.headers.id, .key, (.value | fromjson | .seq)] | @tsv' "$1" | awk -F '\t' '
        $1 in seen { next }
        { seen[$1] = 1 }
        ($2 in last) && $3 <= last[$2] { print "key " $2 ": seq " $3 " after " last[$2]; bad++ }
        { last[$2] = $3 }
        END { exit bad > 0 }'
}

# check_delivered TYPE [WHAT]: every row of aggregate type TYPE is in Kafka (topic
# outbox.event.TYPE) at least once, and the first copies arrived in seq order per aggregate
# (payloads as first_copies_in_order wants). WHAT names the first check (default "every row
# delivered"); the messages read stay in $T/TYPE.json.
# Exact, no idle-time guess: it waits (30 s at most; callers have usually waited already) until
# the table marks every row of TYPE sent, which the relay does only after Kafka acknowledged it,
# then reads the topic up to the end offsets Kafka gives at that moment (consume --to-end). A row
# still unsent after the wait is not waited for longer: the diff then says whether it is in Kafka.
check_delivered() {
    local file=$T/$1.json
    _poll 30 none_unsent_of "$1" || echo "# $1: $(unsent_of "$1") rows still unsent after 30 s"
    consume --topic "outbox.event.$1" --to-end --timeout-ms 30000 >"$file"
    check "$1: ${2:-every row delivered}" \
        diff <(jq -r .headers.id "$file" | sort -u) \
        <(psql_q "SELECT event_id FROM outbox WHERE aggregate_type = '$1'" | sort)
    check "$1: first copies in order per aggregate" first_copies_in_order "$file"
}

# ---- the relay ---------------------------------------------------------------------------------

# holding_proxy NAME WORD: bin/delay-proxy in front of the test's PostgreSQL, holding (ten
# minutes) the answer to the first statement that names WORD, and only that one: a server that
# stops answering mid-command. Sets PROXY_PORT and PROXY_PID; output in $T/NAME.out.
holding_proxy() {
    [ -x "$BIN/delay-proxy" ] || fail "bin/delay-proxy built (make tools)"
    PROXY_PORT=$(free_port) || fail "a free port for delay-proxy $1"
    "$BIN/delay-proxy" --listen "$PROXY_PORT" --to "$PGPORT" --delay-us 600000000 \
        --only-after "$2" --times 1 >"$T/$1.out" 2>&1 &
    PROXY_PID=$!
    _t_track "$PROXY_PID"
    _poll 10 grep -q listening "$T/$1.out" || fail "delay-proxy $1 listens"
}

# relay_start ARGS...: `outbox-relay run ARGS` in the background; output in $RELAY_LOG.
# RELAY_WRAP (array) may hold an exec-style prefix such as (taskset -c 0).
# First keys of the relay's advisory locks (relay/outbox/schema.h): member slots, lanes, and the
# away and trying marks (keyed by the slot, and the slot + 1024).
MEMBER_NS=1331849729
LANE_NS=1331849730
AWAY_NS=1331849733
# LANE_LOCK: the condition on pg_locks (as l) of a granted lane lock; its objid is the lane.
LANE_LOCK="l.locktype = 'advisory' AND l.classid = $LANE_NS AND l.objsubid = 2 AND l.granted"
# The wakeup lock (migrations/0007_wakeup_lock.sql): a sleeping relay session holds it exclusively.
WAKEUP_KEY=1331849732
# guard_pid: the backend holding the wakeup lock (a sleeping relay's guard), if any.
guard_pid() {
    psql_q "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = 0
            AND objid = $WAKEUP_KEY AND objsubid = 1 AND mode = 'ExclusiveLock' AND granted"
}
# guard_held: some session holds the wakeup lock, i.e. a relay sleeps and producers notify.
guard_held() {
    [ -n "$(guard_pid)" ]
}
# npm_client NAME: prints the directory of the npm client pinned by tests/tools/NAME/'s lockfile
# (tests/tools/npm-ci.sh: cached, offline if it can), for the tests that read the relay's output
# with a client no one here wrote. Without node and npm, or when the install fails, it returns 1
# with the reason in $T/npm.log (it runs in the caller's $(...): the caller fails the test).
npm_client() {
    if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
        echo "node and npm are not installed (tools/packages.txt)" >"$T/npm.log"
        return 1
    fi
    sh "$ROOT/tests/tools/npm-ci.sh" "$1" 2>"$T/npm.log"
}
RELAY_WRAP=()
relay_start() {
    _T_RELAY_N=$((_T_RELAY_N + 1))
    RELAY_LOG=$T/relay.$_T_RELAY_N.log
    "${RELAY_WRAP[@]}" "$RELAY_BIN" run "$@" >"$RELAY_LOG" 2>&1 &
    RELAY_PID=$!
    _t_track "$RELAY_PID"
}

relay_running() {
    kill -0 "$RELAY_PID" 2>/dev/null
}

# relay_stop [TIMEOUT_S]: SIGTERM, wait (default 20 s), return the relay's exit status.
# A relay that does not exit in time is reported, killed, and 137 returned.
relay_stop() {
    local limit=${1:-20} rc
    kill -TERM "$RELAY_PID" 2>/dev/null
    if ! _poll "$limit" _t_dead "$RELAY_PID"; then
        not_ok "relay exits within ${limit}s of SIGTERM" "still running, killed"
        kill -KILL "$RELAY_PID" 2>/dev/null
        wait "$RELAY_PID" 2>/dev/null
        return 137
    fi
    wait "$RELAY_PID" 2>/dev/null
    rc=$?
    return "$rc"
}

# relay_kill: SIGKILL, as a crash would.
relay_kill() {
    kill -KILL "$RELAY_PID" 2>/dev/null
    wait "$RELAY_PID" 2>/dev/null
    return 0
}

# relay_migrate [ARGS...]: `outbox-relay migrate` against the test database.
relay_migrate() {
    "$RELAY_BIN" migrate --database-url "$DATABASE_URL" "$@"
}

# unsent_rows: how many outbox rows still wait for an acknowledgement.
unsent_rows() {
    psql_q "SELECT count(*) FROM outbox WHERE sent_at IS NULL"
}

no_unsent_rows() {
    [ "$(unsent_rows)" = 0 ]
}

# ---- the fault tests' set-up ------------------------------------------------------------------

# fault_setup [BROKERS]: what every test of tests/it/faults/ starts from (after t_setup, and
# fault_init when it sources netns_lib.sh): PostgreSQL, the mock Kafka cluster of BROKERS brokers
# (default 1), the outbox migrated (its output in $T/migrate.log; the test ends at once if it
# fails). Sets FAULT_RELAY_OPTS, the relay flags those tests share: the brokers, and librdkafka's
# reconnect backoff capped at 500 ms (its default grows to 10 s), so that a relay is back on a
# broker within a second of the broker's return and the tests' bounds measure the relay, not the
# backoff. No --database-url: some reach PostgreSQL through a namespace or a list of hosts.
fault_setup() {
    pg_start
    broker_start "${1:-1}"
    relay_migrate 2>"$T/migrate.log" || fail "migrate"
    FAULT_RELAY_OPTS=(--brokers "$BROKERS" --kafka reconnect.backoff.max.ms=500)
}

# insert_rows TYPE FROM TO AGGREGATES: rows FROM to TO of aggregate type TYPE, over AGGREGATES
# aggregates (TYPE-0 ... TYPE-(AGGREGATES-1)), in one transaction; payload seq is the row's
# number, so seq grows with id within each aggregate (what first_copies_in_order checks).
insert_rows() {
    psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            SELECT '$1', '$1-' || (g % $4), 'changed', jsonb_build_object('seq', g)
            FROM generate_series($2, $3) AS g ORDER BY g"
}

# rows_of TYPE / sent_of TYPE / unsent_of TYPE: how many rows of aggregate type TYPE there are,
# are acknowledged, wait for an acknowledgement; none_unsent_of TYPE: none waits.
rows_of() {
    psql_q "SELECT count(*) FROM outbox WHERE aggregate_type = '$1'"
}

sent_of() {
    psql_q "SELECT count(*) FROM outbox WHERE aggregate_type = '$1' AND sent_at IS NOT NULL"
}

unsent_of() {
    psql_q "SELECT count(*) FROM outbox WHERE aggregate_type = '$1' AND sent_at IS NULL"
}

none_unsent_of() {
    [ "$(unsent_of "$1")" = 0 ]
}

# log_lines [FILE]: how many lines FILE (default the last relay's log) has: a mark, so that a
# check reads only what was logged after it (tail -n +$((mark + 1))).
log_lines() {
    grep -c '' "${1:-$RELAY_LOG}"
}

# old_snapshot_open: another client opens a REPEATABLE READ transaction, takes its snapshot and
# keeps it open until the test ends (it sleeps 600 s), so vacuum may not remove any row version
# that outlives it. Returns at once: wait for old_snapshot_held.
old_snapshot_open() {
    psql -XAtq -c "BEGIN ISOLATION LEVEL REPEATABLE READ" -c "SELECT count(*) FROM outbox" \
        -c "SELECT pg_sleep(600)" >/dev/null 2>&1 &
    _t_track $!
}

# old_snapshot_held: true once old_snapshot_open's transaction holds its snapshot.
old_snapshot_held() {
    [ "$(psql_q "SELECT count(*) FROM pg_stat_activity WHERE backend_xmin IS NOT NULL
                 AND query = 'SELECT pg_sleep(600)' AND pid <> pg_backend_pid()")" = 1 ]
}

# old_snapshot_close: ends old_snapshot_open's transaction before the test does.
old_snapshot_close() {
    psql_q "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
            WHERE query = 'SELECT pg_sleep(600)' AND pid <> pg_backend_pid()" >/dev/null
}

# table_lock_open: another client takes ACCESS EXCLUSIVE on the outbox (as a migration's ALTER
# or a VACUUM FULL does) and keeps it until the test ends (it sleeps 600 s). Returns at once:
# wait for table_lock_held.
table_lock_open() {
    PGAPPNAME=table_lock psql -XAtq -c "BEGIN" -c "LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE" \
        -c "SELECT pg_sleep(600)" >/dev/null 2>&1 &
    _t_track $!
}

# table_lock_held: true once table_lock_open's transaction holds its lock.
table_lock_held() {
    [ "$(psql_q "SELECT count(*) FROM pg_locks WHERE relation = 'outbox'::regclass
                 AND mode = 'AccessExclusiveLock' AND granted")" = 1 ]
}

# table_lock_close: ends table_lock_open's transaction before the test does, and waits until
# its lock is gone.
table_lock_close() {
    psql_q "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
            WHERE application_name = 'table_lock'" >/dev/null
    _poll 10 _table_lock_free
}

_table_lock_free() {
    ! table_lock_held
}

# ---- the metrics and health endpoints ----------------------------------------------------------

# metrics_wait: waits for the relay's "metrics listening" line (start it with --metrics-listen
# 127.0.0.1:0 to get a free port) and exports METRICS=HOST:PORT.
metrics_wait() {
    _poll 15 grep -q 'msg="metrics listening"' "$RELAY_LOG" ||
        fail "relay logs its metrics address within 15s"
    METRICS=$(sed -n 's/.*msg="metrics listening" address=\([^ ]*\).*/\1/p' "$RELAY_LOG" |
        tail -n 1)
    export METRICS
}

# http_code PATH [CURL ARGS...]: the HTTP status of a request to the relay ("000": no answer).
http_code() {
    local path=$1
    shift
    curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$@" "http://$METRICS$path"
}

# http_get PATH: the body of a successful GET.
http_get() {
    curl -sf --max-time 5 "http://$METRICS$1"
}

# metric SAMPLE: the value of one sample of /metrics, e.g. metric 'outbox_batches_total' or
# metric 'outbox_failures_total{class="transient"}'; fails when the sample is absent.
metric() {
    http_get /metrics | awk -v n="$1" '$1 == n { print $2; found = 1 } END { exit !found }'
}

# metric_at_least SAMPLE MIN: true when the sample exists and is >= MIN.
metric_at_least() {
    local v
    v=$(metric "$1") && awk -v v="$v" -v min="$2" 'BEGIN { exit !(v + 0 >= min + 0) }'
}

# metric_is SAMPLE VALUE: true when the sample exists and equals VALUE (numerically).
metric_is() {
    local v
    v=$(metric "$1") && awk -v v="$v" -v want="$2" 'BEGIN { exit !(v + 0 == want + 0) }'
}

# claim_open [PID]: a relay claim session (of process PID if given, else any session but psql's)
# holds a claimed batch and waits for its acknowledgements: its transaction has an xid (the
# claim's row locks) and is idle, not marking.
# With the brokers down, such a batch stays in flight until --delivery-timeout (30 s by default):
# a SIGKILL right after this is true certainly hits it.
claim_open() {
    local where="a.application_name <> 'psql'" ports
    if [ -n "${1:-}" ]; then
        ports=$(ss -tnpH "dport = :$PGPORT" | grep -F "pid=$1," |
            awk '{ sub(/.*:/, "", $4); print $4 }' | paste -sd, -)
        [ -n "$ports" ] || return 1
        where="a.client_port IN ($ports)"
    fi
    [ "$(psql_q "SELECT count(*) FROM pg_stat_activity a WHERE a.datname = current_database()
                 AND a.backend_xid IS NOT NULL AND a.state = 'idle in transaction'
                 AND $where")" -gt 0 ]
}
