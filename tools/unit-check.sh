#!/bin/sh
# `make unit-check`: systemd-analyze verify on the unit and the template unit (an instance of it)
# as `make install` writes them, pointed at
# this tree's bin/outbox-relay (verify checks that ExecStart= names an executable) and man page,
# and the exposure score of `systemd-analyze security`, offline (no running systemd needed).
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unit=$tmp/outbox-relay.service
sed -e "s|@BINDIR@|$ROOT/bin|g" -e "s|@SYSCONFDIR@|/etc|g" "$ROOT/systemd/outbox-relay.service.in" >"$unit"
# verify also runs `man` for Documentation=man:outbox-relay(1): let it find the generated page
# (MAN_PAGE: another copy of it, for tests/it/packaging/13_units.sh, which runs before `make man`).
mkdir -p "$tmp/man/man1"
cp "${MAN_PAGE:-$ROOT/bin/man/outbox-relay.1}" "$tmp/man/man1/outbox-relay.1"
export MANPATH="$tmp/man"
# The template, verified through an instance (verify refuses a bare template name).
sed -f "$ROOT/systemd/template.sed" "$unit" >"$tmp/outbox-relay@.service"
ln -s "outbox-relay@.service" "$tmp/outbox-relay@second.service"
# verify prints problems on stderr and may still exit 0 for some: both must be clean.
for u in "$unit" "$tmp/outbox-relay@second.service"; do
    if ! systemd-analyze verify "$u" 2>"$tmp/err" || [ -s "$tmp/err" ]; then
        cat "$tmp/err" >&2
        echo "unit-check: systemd-analyze verify found problems in $(basename "$u")" >&2
        exit 1
    fi
done
echo "unit-check: systemd-analyze verify: outbox-relay.service and outbox-relay@second.service clean"
systemd-analyze security --offline=yes "$unit" 2>/dev/null | tail -n 1 | sed 's/^/unit-check: systemd-analyze security: /'
