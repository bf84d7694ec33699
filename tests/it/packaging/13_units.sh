#!/bin/bash
# Proves that both shipped units pass `systemd-analyze verify` as `make install` writes them (the
# unit and the template outbox-relay@.service, through an instance), with the relay this
# tree built: the same check as `make unit-check` (tools/unit-check.sh), in `make test` too; and
# that the template names the instance's own files.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
command -v systemd-analyze >/dev/null || fail "systemd-analyze (tools/packages.txt [package])"
sh "$ROOT/tools/gen-man.sh" "$ROOT/bin/outbox-relay" "$ROOT/man/outbox-relay.1.in" \
    "$(cat "$ROOT/VERSION")" >"$T/outbox-relay.1" || fail "generate the man page"
check "both units pass systemd-analyze verify" env MAN_PAGE="$T/outbox-relay.1" \
    sh "$ROOT/tools/unit-check.sh"
sed -e "s|@BINDIR@|/usr/bin|g" -e "s|@SYSCONFDIR@|/etc|g" "$ROOT/systemd/outbox-relay.service.in" |
    sed -f "$ROOT/systemd/template.sed" >"$T/template"
check_eq "the template's files are the instance's" \
    "ConditionPathExists=/etc/outbox-relay/%i.database-url
LoadCredential=database-url:/etc/outbox-relay/%i.database-url
LoadCredential=kafka.properties:/etc/outbox-relay/kafka.properties
EnvironmentFile=-/etc/outbox-relay/%i.environment
ExecStart=/usr/bin/outbox-relay run --config /etc/outbox-relay/%i.json --database-url-file %d/database-url --kafka-file %d/kafka.properties --require-tls" \
    "$(grep -E '^(ConditionPathExists|LoadCredential|EnvironmentFile|ExecStart)=' "$T/template")"
