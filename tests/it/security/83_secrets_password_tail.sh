#!/bin/bash
# Proves the tail of a password holding an unescaped '@' stays secret. In
# postgresql://app:p@t-pw-s3cret@db/app libpq ends the password at the first '@' and takes the
# rest ("t-pw-s3cret@db") for the host name, which its connect errors, and the relay's own lookup
# errors, quote. No PostgreSQL runs: the name cannot resolve (host names never hold an '@'):
#  1. run with one host: the "postgres unreachable" errors, /readyz and STATUS= do not show the
#     tail;
#  2. run with a host list: the "postgres host failed" errors do not show it;
#  3. check and status: their connect errors do not show it;
#  4. the logs of 1 and 2 do not show it anywhere (the scrub knows the tail; a host= field names
#     a host holding an '@' "...");
#  5. a tail too short for the scrub (3 characters): "postgres host failed" does not show it;
#  6. a password too short for the scrub (libpq's "pw" in 5, "ab" given to check) is warned of
#     at start-up, once; a long one is not;
#  7. a password holding an unescaped '/' (libpq reads none: host "app", port "12"): the start-up
#     line masks it, and no line of the run shows it.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup

TAIL='t-pw-s3cret'
URL="postgresql://app:p@$TAIL@db.invalid:1/app"
URL_LIST="postgresql://app:p@$TAIL@h1.invalid,h2.invalid:1/app"

# errors_lack_tail LOG: LOG's error= fields (the last but retry_in_s) do not hold the tail.
errors_lack_tail() {
    ! sed -n 's/.* error=//p' "$1" | grep -qF "$TAIL"
}

socat -u "UNIX-RECV:$T/notify" "OPEN:$T/notify.out,creat,append" 2>"$T/socat.log" &
_t_track $!
_poll 10 test -S "$T/notify" || fail "socat listens on $T/notify within 10s"

# --- 1. ---
RELAY_WRAP=(env NOTIFY_SOCKET="$T/notify")
relay_start --database-url "$URL" --brokers 127.0.0.1:1 --metrics-listen 127.0.0.1:0
metrics_wait
wait_for "1: the lookup failed" 30 grep -q 'msg="postgres unreachable"' "$RELAY_LOG"
check "1: ... saying why" grep -q 'could not translate host name' "$RELAY_LOG"
curl -s --max-time 5 "http://$METRICS/readyz" >"$T/readyz"
check "1: /readyz says postgres is unreachable" grep -q 'postgres unreachable' "$T/readyz"
check "1: ... without the tail" lacks "$T/readyz" "$TAIL"
wait_for "1: STATUS= says postgres is unreachable" 30 grep -q '^STATUS=.*postgres unreachable' \
    "$T/notify.out"
check "1: ... without the tail" lacks "$T/notify.out" "$TAIL"
relay_stop
check_eq "1: relay exits 0" 0 $?
check "1: the errors logged do not show the tail" errors_lack_tail "$RELAY_LOG"
LOG1=$RELAY_LOG

# --- 2. ---
RELAY_WRAP=()
relay_start --database-url "$URL_LIST" --brokers 127.0.0.1:1 --log-level debug
wait_for "2: a host of the list failed" 30 grep -q 'msg="postgres host failed"' "$RELAY_LOG"
wait_for "2: then the whole list" 30 grep -q 'msg="postgres unreachable"' "$RELAY_LOG"
relay_stop
check_eq "2: relay exits 0" 0 $?
check "2: the errors logged do not show the tail" errors_lack_tail "$RELAY_LOG"
LOG2=$RELAY_LOG

# --- 3. ---
# check then asks 127.0.0.1:1, where no broker answers, for Kafka's metadata, which it waits for
# up to --statement-timeout: 1 s here, not the default 30 s (each check of 3 and 6 sat out the
# whole 30 s; nothing here is about Kafka).
CHECK_KAFKA=(--brokers 127.0.0.1:1 --statement-timeout 1s)
for cmd in check status; do
    args=(--database-url "$URL")
    [ "$cmd" = check ] && args+=("${CHECK_KAFKA[@]}")
    timeout 60 "$RELAY_BIN" "$cmd" "${args[@]}" >"$T/$cmd.out" 2>&1
    check "3: $cmd cannot connect" grep -q 'could not translate host name' "$T/$cmd.out"
    check "3: ... and does not show the tail" lacks "$T/$cmd.out" "$TAIL"
done

# --- 4. ---
check "4: the log of 1 names the host as pg.c does (\"...\": it holds an '@')" \
    grep -qF 'msg="postgres connection not verified" host="..."' "$LOG1"
check "4: ... and nowhere shows the tail" lacks "$LOG1" "$TAIL"
check "4: the log of 2 (debug) does not show the tail" lacks "$LOG2" "$TAIL"

# --- 5. ---
relay_start --database-url "postgresql://app:pw@s3c@h1.invalid:1,h2.invalid:1/app" \
    --brokers 127.0.0.1:1
wait_for "5: a host of the list failed" 30 grep -q 'msg="postgres host failed"' "$RELAY_LOG"
relay_stop
check_eq "5: relay exits 0" 0 $?
grep 'msg="postgres host failed"' "$RELAY_LOG" >"$T/host-failed"
check "5: the failures name the other host" grep -qF 'host="h2.invalid:1"' "$T/host-failed"
check "5: ... and show no tail" lacks "$T/host-failed" 's3c@'
check "5: the connection security warning names the host \"...\"" \
    grep -qF 'msg="postgres connection not verified" host="..."' "$RELAY_LOG"
check "5: ... and the whole log shows no tail" lacks "$RELAY_LOG" 's3c@'

# --- 6. ---
check "6: the relay of 5 warned of its short password" \
    grep -qF 'msg="secret too short to scrub" count=1 min_length=4' "$RELAY_LOG"
timeout 60 "$RELAY_BIN" check --database-url "postgresql://app:ab@db.invalid:1/app" \
    "${CHECK_KAFKA[@]}" >"$T/short.out" 2>&1
check_eq "6: check warns of a 2-character password, once" 1 \
    "$(grep -c 'msg="secret too short to scrub"' "$T/short.out")"
timeout 60 "$RELAY_BIN" check --database-url "postgresql://app:long-enough@db.invalid:1/app" \
    "${CHECK_KAFKA[@]}" >"$T/long.out" 2>&1
check "6: check says why it failed" grep -q 'could not translate host name' "$T/long.out"
check "6: ... and does not warn of a long password" lacks "$T/long.out" "too short"

# --- 7. ---
SLASHED='12/s3cret-slash-pw'
relay_start --database-url "postgresql://app:$SLASHED@db.invalid:1/app" --brokers 127.0.0.1:1
wait_for "7: the relay starts" 30 grep -q 'msg="outbox-relay starting"' "$RELAY_LOG"
wait_for "7: and fails to reach libpq's host" 30 grep -q 'msg="postgres unreachable"' "$RELAY_LOG"
relay_stop
check_eq "7: relay exits 0" 0 $?
check "7: the start-up line masks the password" \
    grep -qF 'database="postgresql://app:***@db.invalid:1/app"' "$RELAY_LOG"
check "7: ... and no line shows it" lacks "$RELAY_LOG" "s3cret-slash"
