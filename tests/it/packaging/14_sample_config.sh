#!/bin/bash
# Proves the shipped relay.json (systemd/relay.json, installed as /etc/outbox-relay/relay.json)
# is the sample the option table generates (every option a file may hold, commented out with its
# default and help), so it cannot drift from the options; and that the relay takes it
# as it is: `check --config` finds no configuration error in it (exit 1 for the unreachable
# database of this test, not 2), and a key whose # is removed takes effect.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
"$RELAY_BIN" --help-config >"$T/generated.json" || fail "--help-config"
check "systemd/relay.json is what --help-config prints (regenerate it with that)" \
    diff -u "$ROOT/systemd/relay.json" "$T/generated.json"
check "it is valid JSON" jq -e . "$ROOT/systemd/relay.json"
missing=""
for opt in $("$RELAY_BIN" --help | sed -n 's/^  --\([a-z-]*\) .*/\1/p'); do
    case $opt in config | kafka-allow-unsafe | dry-run | allow-newer-schema | database-url) continue ;; esac # flags only, or a credential
    jq -e --arg k "$opt" 'has($k) or has("#" + $k)' "$ROOT/systemd/relay.json" >/dev/null ||
        missing="$missing $opt"
done
check_eq "every option a file may hold is a key of it" "" "$missing"
# The file's broker (localhost:9092) does not answer here either: check waits for it up to
# --statement-timeout, 1 s given here rather than the 30 s default (a flag, which the file leaves
# commented out: nothing of the file's reading changes).
timeout 60 "$RELAY_BIN" check --config "$ROOT/systemd/relay.json" --statement-timeout 1s \
    --database-url "postgresql://nobody@127.0.0.1:1/none?connect_timeout=2" >"$T/check.out" 2>&1
check_eq "check --config relay.json: no configuration error (1: the database is unreachable)" 1 $?
check "... config ok" grep -q '^ok    config: .*relay.json' "$T/check.out"
jq '. + {"batch-size": ."#batch-size"} | del(."#batch-size") | ."batch-size" = 7' \
    "$ROOT/systemd/relay.json" >"$T/edited.json"
timeout 60 "$RELAY_BIN" check --config "$T/edited.json" --batch-size 0 \
    --database-url "postgresql://nobody@127.0.0.1:1/none" >"$T/edited.out" 2>&1
check_eq "an uncommented key is read (the flag still wins: --batch-size 0 is refused)" 2 $?
