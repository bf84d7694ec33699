#!/bin/sh
# `make unit-check`: systemd-analyze verify on the unit as `make install` writes it, pointed at
# this tree's bin/outbox-relay (verify checks that ExecStart= names an executable) and man page,
# and the exposure score of `systemd-analyze security`, offline (no running systemd needed).
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unit=$tmp/outbox-relay.service
sed -e "s|@BINDIR@|$ROOT/bin|g" -e "s|@SYSCONFDIR@|/etc|g" "$ROOT/systemd/outbox-relay.service.in" >"$unit"
# verify also runs `man` for Documentation=man:outbox-relay(1): let it find the generated page.
mkdir -p "$tmp/man/man1"
cp "$ROOT/bin/man/outbox-relay.1" "$tmp/man/man1/"
export MANPATH="$tmp/man"
# verify prints problems on stderr and may still exit 0 for some: both must be clean.
if ! systemd-analyze verify "$unit" 2>"$tmp/err" || [ -s "$tmp/err" ]; then
    cat "$tmp/err" >&2
    echo "unit-check: systemd-analyze verify found problems in systemd/outbox-relay.service.in" >&2
    exit 1
fi
echo "unit-check: systemd-analyze verify: clean"
systemd-analyze security --offline=yes "$unit" 2>/dev/null | tail -n 1 | sed 's/^/unit-check: systemd-analyze security: /'
