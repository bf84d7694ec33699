#!/bin/bash
# Proves the command line contract: every kind of bad input (flags, values, config file, --kafka
# properties, missing settings, --metrics-listen and --retention formats, numbers and durations
# with blanks or signs) is rejected before any
# network work, within a second, with exit status 2 and exactly one line on stderr (no password
# echoed); --help documents every flag;
# --version works (and output that cannot be written exits 1); and the precedence flag > environment > config file > default holds.
# A runtime failure at start-up (no descriptor for the producer or the event loop, no thread for
# librdkafka) exits 1 in one line.
# Needs neither PostgreSQL nor Kafka: the addresses below have nothing listening.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup

DB=postgresql://postgres@127.0.0.1:1/outbox
KB=127.0.0.1:1
BAD_DB='postgresql://u:hunter2@127.0.0.1:1/outbox?no_such_param=1' # libpq rejects the parameter
unset DATABASE_URL KAFKA_BROKERS

cfg() { # cfg NAME JSON: writes a config file, prints its path
    printf '%s\n' "$2" >"$T/$1.json"
    echo "$T/$1.json"
}

# bad DESCRIPTION ARGS...: `outbox-relay ARGS` must exit 2 (within 10 s: a loaded machine) with one
# stderr line.
bad() {
    local desc=$1 rc lines
    shift
    timeout 10 "$RELAY_BIN" "$@" >"$T/out" 2>"$T/err"
    rc=$?
    lines=$(grep -c '' "$T/err")
    if [ "$rc" = 2 ] && [ "$lines" = 1 ] && [ -s "$T/err" ]; then
        ok "rejects $desc"
    else
        not_ok "rejects $desc" "exit $rc (want 2; 124 = still running after 10 s), $lines stderr lines (want 1)"
        head -n 5 "$T/err" | sed 's/^/#   /'
    fi
}

bad "an unknown flag" run --database-url "$DB" --brokers "$KB" --no-such-flag
bad "an unknown subcommand" frobnicate --database-url "$DB" --brokers "$KB"
bad "no subcommand arguments at all" --no-such-flag
bad "a flag without its value" run --database-url "$DB" --brokers "$KB" --batch-size
bad "--batch-size abc" run --database-url "$DB" --brokers "$KB" --batch-size abc
bad "--batch-size 0" run --database-url "$DB" --brokers "$KB" --batch-size 0
bad "--batch-size -1" run --database-url "$DB" --brokers "$KB" --batch-size -1
bad "--batch-size 10x" run --database-url "$DB" --brokers "$KB" --batch-size 10x
bad "--batch-size overflowing" run --database-url "$DB" --brokers "$KB" \
    --batch-size 99999999999999999999999
bad "--poll-interval abc" run --database-url "$DB" --brokers "$KB" --poll-interval abc
bad "--shutdown-timeout -5" run --database-url "$DB" --brokers "$KB" --shutdown-timeout -5
bad "--log-level loud" run --database-url "$DB" --brokers "$KB" --log-level loud
bad "--metrics-listen without a port" run --database-url "$DB" --brokers "$KB" \
    --metrics-listen 127.0.0.1
bad "--metrics-listen with an unbracketed IPv6 address" run --database-url "$DB" --brokers "$KB" \
    --metrics-listen ::1:9187
bad "--retention without a unit" run --database-url "$DB" --brokers "$KB" --retention 10
bad "--retention with an unknown unit" run --database-url "$DB" --brokers "$KB" --retention 3w
# strtol skips blanks and takes a sign: " -5s" was -5 s (retention off), " 5" was 5.
bad "--retention ' -5s' (a blank, then a sign)" run --database-url "$DB" --brokers "$KB" \
    --retention ' -5s'
bad "--horizon-warn ' -1m'" run --database-url "$DB" --brokers "$KB" --horizon-warn ' -1m'
bad "--batch-size ' 5'" run --database-url "$DB" --brokers "$KB" --batch-size ' 5'
bad "--batch-size +5" run --database-url "$DB" --brokers "$KB" --batch-size +5
bad "migrate --connect-wait ' -1h'" migrate --database-url "$DB" --connect-wait ' -1h'
bad "verify --since off (a window of nothing)" verify --database-url "$DB" --brokers "$KB" \
    --since off
bad "verify --since ' -1h'" verify --database-url "$DB" --brokers "$KB" --since ' -1h'
bad "a topic template with an unknown placeholder" run --database-url "$DB" --brokers "$KB" \
    --topic-template 'outbox.{nope}'
# verify and replay name topics as run does: the same template check (verify reported every row
# missing, FAILED; replay --dry-run said "to (no legal topic)", exit 0).
bad "verify with a topic template run refuses" verify --database-url "$DB" --brokers "$KB" \
    --topic-template 'a.{bogus}'
bad "replay with a topic template run refuses" replay --database-url "$DB" --dry-run --from-id 1 \
    --topic-template 'a.{bogus}'
bad "verify with {event_type} but no --order-scope topic" verify --database-url "$DB" \
    --brokers "$KB" --topic-template 'a.{event_type}'
bad "verify --kafka property librdkafka rejects" verify --database-url "$DB" --brokers "$KB" \
    --kafka bogus.prop=1
bad "verify --kafka value librdkafka rejects" verify --database-url "$DB" --brokers "$KB" \
    --kafka linger.ms=abc
bad "a missing config file" run --database-url "$DB" --brokers "$KB" --config "$T/nope.json"
bad "a directory as config file" run --database-url "$DB" --brokers "$KB" --config "$T"
check "...saying it is a directory (not a JSON error)" grep -q 'Is a directory' "$T/err"
bad "a JSON true for a string option" run --database-url "$DB" --brokers "$KB" \
    --config "$(cfg booltable '{"table": true}')"
bad "a malformed config file" run --database-url "$DB" --brokers "$KB" \
    --config "$(cfg malformed '{"batch-size": 10,')"
bad "a config file that is not an object" run --database-url "$DB" --brokers "$KB" \
    --config "$(cfg array '[1, 2]')"
bad "an unknown config key" run --database-url "$DB" --brokers "$KB" \
    --config "$(cfg unknown '{"no-such-key": 1}')"
bad "a config value of the wrong type" run --database-url "$DB" --brokers "$KB" \
    --config "$(cfg wrongtype '{"batch-size": "lots"}')"
bad "a config value out of range" run --database-url "$DB" --brokers "$KB" \
    --config "$(cfg range '{"batch-size": 0}')"
bad "--kafka without =" run --database-url "$DB" --brokers "$KB" --kafka linger.ms
bad "--kafka with an empty key" run --database-url "$DB" --brokers "$KB" --kafka =5
bad "--kafka property librdkafka rejects" run --database-url "$DB" --brokers "$KB" \
    --kafka no.such.prop=1
bad "--kafka value librdkafka rejects" run --database-url "$DB" --brokers "$KB" \
    --kafka linger.ms=notanumber
bad "--kafka enable.idempotence=false (order depends on it)" run --database-url "$DB" \
    --brokers "$KB" --kafka enable.idempotence=false
check "...and the line says why" grep -q 'enable.idempotence=false: must stay true' "$T/err"
bad "--kafka enable.gapless.guarantee=false (order depends on it)" run --database-url "$DB" \
    --brokers "$KB" --kafka enable.gapless.guarantee=false
check "...and the line says why" grep -q 'enable.gapless.guarantee=false: must stay true' "$T/err"
bad "--kafka transactional.id (every message outside a transaction is refused)" run \
    --database-url "$DB" --brokers "$KB" --kafka transactional.id=relay-1
check "...and the line says why" grep -q 'transactional.id: the relay does not use transactions' \
    "$T/err"
printf 'delivery.timeout.ms=5000\n' >"$T/timeout.properties"
bad "a message timeout (delivery.timeout.ms) shorter than --delivery-timeout" run \
    --database-url "$DB" --brokers "$KB" --kafka-file "$T/timeout.properties"
check "...and the line names the file and line and says why" grep -qF \
    "kafka-file $T/timeout.properties line 1: delivery.timeout.ms=5000: must be 0 (no limit" "$T/err"
bad "--kafka queue.buffering.max.kbytes under one message.max.bytes" run --database-url "$DB" \
    --brokers "$KB" --kafka queue.buffering.max.kbytes=1
check "...and the line says why" grep -q 'queue must hold one message of message.max.bytes' "$T/err"
bad "a config kafka property librdkafka rejects" run --database-url "$DB" --brokers "$KB" \
    --config "$(cfg kafka '{"kafka": {"no.such.prop": "1"}}')"
check "...and the line names the config file, not --kafka" \
    grep -qF "config file $T/kafka.json: kafka no.such.prop: " "$T/err"
printf 'linger.ms=1\n# comment\nno.such.prop=1\n' >"$T/kafka.properties"
bad "a --kafka-file property librdkafka rejects" run --database-url "$DB" --brokers "$KB" \
    --kafka-file "$T/kafka.properties"
check "...and the line names the file and the line, not --kafka" \
    grep -qF "kafka-file $T/kafka.properties line 3: no.such.prop: " "$T/err"
# verify names it as run does (it said "--kafka no.such.prop" whatever the origin).
bad "a --kafka-file property librdkafka rejects, for verify" verify --database-url "$DB" \
    --brokers "$KB" --kafka-file "$T/kafka.properties"
check "...and the line names the file and the line, not --kafka" \
    grep -qF "kafka-file $T/kafka.properties line 3: no.such.prop: " "$T/err"
bad "a config kafka property librdkafka rejects, for verify" verify --database-url "$DB" \
    --brokers "$KB" --config "$(cfg kafka '{"kafka": {"no.such.prop": "1"}}')"
check "...and the line names the config file, not --kafka" \
    grep -qF "config file $T/kafka.json: kafka no.such.prop: " "$T/err"
# Properties librdkafka refuses only when the producer is made: check refuses them as run does,
# with the same status and line (check printed "ok config", then a FAIL, exit 1), naming the origin.
for cmd in run check; do
    bad "$cmd --kafka acks=1 (idempotence needs acks=all)" $cmd --database-url "$DB" \
        --brokers "$KB" --kafka acks=1
    check "...and the line names --kafka acks" grep -qF -- "--kafka acks: " "$T/err"
done
# The registry's files are checked with the configuration: check refuses what run refuses, with
# the same status (check made an unreadable auth file a FAIL line, exit 1).
REGISTRY=(--value-format avro --schema-registry-url http://127.0.0.1:1)
bad "run with an unreadable --schema-registry-auth-file" run --database-url "$DB" \
    --brokers "$KB" "${REGISTRY[@]}" --schema-registry-auth-file "$T/nope"
bad "check with an unreadable --schema-registry-auth-file" check --database-url "$DB" \
    --brokers "$KB" "${REGISTRY[@]}" --schema-registry-auth-file "$T/nope"
bad "run without a database URL" run --brokers "$KB"
bad "migrate without a database URL" migrate
bad "run without brokers" run --database-url "$DB"
bad "an invalid database URL" run --database-url "$BAD_DB" --brokers "$KB"
check "the invalid-URL error does not echo the password" lacks "$T/err" hunter2
# Values libpq checks only when it connects: run retried forever, check said "ok config", then FAIL.
bad "a database URL whose port is not a number" run \
    --database-url 'postgresql://u:hunter2@127.0.0.1:notaport/db' --brokers "$KB"
check "...and the line names the port, not the password" \
    bash -c "grep -q 'database URL: port' '$T/err' && ! grep -q hunter2 '$T/err'"
bad "check with sslmode=bogus" check \
    --database-url 'postgresql://u:hunter2@127.0.0.1:1/db?sslmode=bogus' --brokers "$KB"
check "...and the line names sslmode, not the password" \
    bash -c "grep -q 'database URL: sslmode' '$T/err' && ! grep -q hunter2 '$T/err'"
bad "a database URL with target_session_attrs=master" status \
    --database-url 'postgresql://u@127.0.0.1:1/db?target_session_attrs=master'
bad "--brokers ','" run --database-url "$DB" --brokers ','
bad "--brokers localhost:notaport" run --database-url "$DB" --brokers localhost:notaport
KAFKA_BROKERS=localhost:x bad "KAFKA_BROKERS with a port that is not a number" run \
    --database-url "$DB"

# --- help and version ---
# Nothing may follow them (the extras were ignored, exit 0).
bad "version --bogus" version --bogus
bad "--version extra" --version extra
bad "help foo" help foo
timeout 10 "$RELAY_BIN" --help >"$T/help" 2>&1
check_eq "--help exits 0" 0 $?
for flag in --database-url --brokers --batch-size --topic-template --kafka --log-level --config \
    --poll-interval --shutdown-timeout --database-url-file --kafka-file --metrics-listen \
    --retention; do
    check "--help mentions $flag" grep -q -e "$flag" "$T/help"
done
version=$(timeout 10 "$RELAY_BIN" --version 2>&1)
check_eq "--version exits 0" 0 $?
check "--version prints the VERSION file's version" grep -qF "$(cat "$ROOT/VERSION")" <<<"$version"
# Output that cannot be written is a failure, named in one line (before: exit 0, nothing said).
for cmd in --version --help; do
    timeout 10 "$RELAY_BIN" "$cmd" >/dev/full 2>"$T/full.err"
    check_eq "$cmd to a full disk exits 1" 1 $?
    check_eq "$cmd to a full disk: one line" 1 "$(grep -c 'cannot write to standard output: No space left on device' "$T/full.err")"
done

# --- precedence: flag > environment > config file > default ---
# A relay given a valid database URL keeps running (retrying the connection); an invalid one
# exits 2 at once. So "still running after 1 s" shows which source won.
runs_for_a_second() {
    local pid rc
    "$@" >"$T/prec.log" 2>&1 &
    pid=$!
    sleep 1
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid"
        _poll 20 _t_dead "$pid" || kill -KILL "$pid"
        wait "$pid" 2>/dev/null
        return 0
    fi
    wait "$pid"
    rc=$?
    echo "exited $rc: $(head -n 1 "$T/prec.log")"
    return 1
}
bad_file=$(cfg baddb "{\"database-url\": \"$BAD_DB\"}")
check "flag beats environment" \
    runs_for_a_second env DATABASE_URL="$BAD_DB" "$RELAY_BIN" run --database-url "$DB" \
    --brokers "$KB"
check "environment beats config file" \
    runs_for_a_second env DATABASE_URL="$DB" "$RELAY_BIN" run --config "$bad_file" --brokers "$KB"
check "flag beats config file" \
    runs_for_a_second "$RELAY_BIN" run --config "$bad_file" --database-url "$DB" --brokers "$KB"
check "KAFKA_BROKERS supplies the brokers" \
    runs_for_a_second env KAFKA_BROKERS="$KB" "$RELAY_BIN" run --database-url "$DB"
check "config file supplies settings over defaults" \
    runs_for_a_second "$RELAY_BIN" run --brokers "$KB" \
    --config "$(cfg good "{\"database-url\": \"$DB\", \"batch-size\": 5, \"kafka\": {\"linger.ms\": \"5\"}}")"
DATABASE_URL=$BAD_DB bad "an invalid DATABASE_URL from the environment" run --brokers "$KB"
bad "a bad flag even when the config file has a good value" run --brokers "$KB" \
    --config "$(cfg gooddb "{\"database-url\": \"$DB\"}")" --database-url "$BAD_DB"

# A runtime failure at start-up exits 1, not 2 (2 is bad input, which the unit does not restart:
# RestartPreventExitStatus=2). The failure: no descriptor left for the producer's wake-up pipe,
# with the open-file limit lowered step by step from 3 until the relay starts (each lower limit
# fails somewhere; the ones that fail making the producer are the runtime failure meant here).
# started_or_gone PID FILE: the relay PID has exited, or logged its start in FILE.
started_or_gone() {
    ! kill -0 "$1" 2>/dev/null || grep -q 'msg="outbox-relay starting"' "$2"
}
producer_failures=0 producer_rcs="" crashes=""
for limit in $(seq 3 64); do
    out=$T/fds.$limit
    # shellcheck disable=SC2016 # $1 and $@ are the inner shell's
    ASAN_OPTIONS=detect_leaks=0 bash -c 'ulimit -n "$1" && shift && exec "$@"' _ "$limit" \
        "$RELAY_BIN" run --database-url "$DB" --brokers "$KB" >"$out" 2>&1 &
    pid=$!
    _poll 10 started_or_gone "$pid" "$out" || fail "fd limit $limit: neither exited nor started in 10 s"
    if grep -q 'msg="outbox-relay starting"' "$out"; then
        _t_reap "$pid"
        break
    fi
    wait "$pid"
    rc=$?
    [ "$rc" -le 128 ] || crashes="$crashes limit $limit: exit $rc ($(head -c 200 "$out"));"
    if grep -q 'cannot create the producer' "$out"; then
        producer_failures=$((producer_failures + 1))
        producer_rcs="$producer_rcs $rc"
    fi
done
check "a start-up failure making the producer was seen (some descriptor limit)" \
    [ "$producer_failures" -gt 0 ]
check_eq "a runtime start-up failure (cannot create the producer) exits 1, not 2" \
    "$(printf ' 1%.0s' $(seq 1 "$producer_failures"))" "$producer_rcs"
check_eq "no descriptor limit crashes the relay (libev's failures exit 1 too)" "" "$crashes"

# The same for a thread librdkafka cannot start (a process limit: RLIMIT_NPROC, which binds a user
# other than root, here nobody, raised step by step from 1): the trial producer's refusal read
# "invalid Kafka configuration" and exited 2.
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
    # nobody runs a copy in $T (755): the checkout may be where nobody cannot reach (a clone in
    # /root, as CI's and tools/fresh-chroot.sh's are).
    nobody_relay=$T/outbox-relay-as-nobody
    cp "$RELAY_BIN" "$nobody_relay" && chmod 755 "$nobody_relay"
    check "nobody can run the relay's copy (the process limit binds that user)" \
        setpriv --reuid=65534 --regid=65534 --clear-groups "$nobody_relay" --version
    thread_failures=0 thread_rcs=""
    for limit in $(seq 1 64); do
        out=$T/nproc.$limit
        # shellcheck disable=SC2016 # $1 and $@ are the inner shell's
        ASAN_OPTIONS=detect_leaks=0 setpriv --reuid=65534 --regid=65534 --clear-groups \
            bash -c 'ulimit -u "$1" && shift && exec "$@"' _ "$limit" \
            "$nobody_relay" run --database-url "$DB" --brokers "$KB" >"$out" 2>&1 &
        pid=$!
        _poll 10 started_or_gone "$pid" "$out" ||
            fail "process limit $limit: neither exited nor started in 10 s"
        if grep -q 'msg="outbox-relay starting"' "$out"; then
            _t_reap "$pid"
            break
        fi
        wait "$pid"
        rc=$?
        if grep -q 'Failed to create thread' "$out"; then
            thread_failures=$((thread_failures + 1))
            thread_rcs="$thread_rcs $rc"
            grep -q 'outbox-relay: cannot create the producer: Failed to create thread' "$out" ||
                not_ok "process limit $limit: the line says what failed" "$(head -c 300 "$out")"
        fi
    done
    check "a start-up failure to start a librdkafka thread was seen (some process limit)" \
        [ "$thread_failures" -gt 0 ]
    check_eq "no thread for librdkafka at start-up exits 1, not 2 (bad configuration)" \
        "$(printf ' 1%.0s' $(seq 1 "$thread_failures"))" "$thread_rcs"
else
    ok "# skip: a process limit needs root (setpriv to another user)"
fi
