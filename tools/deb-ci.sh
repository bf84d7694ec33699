#!/usr/bin/env bash
# `make package-test` (CI, as root): the package's checks, on this machine (docs/packaging.md):
#   1. the [package] tools of tools/packages.txt installed;
#   2. the man pages (make man-check), the unit (make unit-check) and the alerting rules
#      (make monitoring-check) checked with groff/man, systemd-analyze and promtool;
#   3. `dpkg-buildpackage -us -uc -b` and lintian (make package, tools/deb-build.sh);
#   4. `dpkg -i` of the .deb; `outbox-relay --version` and `man outbox-relay` from the system;
#      systemd-analyze verify of the installed unit;
#   5. tests/pkg/installed_delivery.sh: one end-to-end delivery by the installed binary, started
#      by the installed unit's command line;
#   6. `dpkg --purge`, which must take the binary and the unit away again;
#   7. tests/pkg/systemd_unit.sh: the same .deb in a Debian container booted with systemd
#      (systemd-nspawn), its unit started, stopped and refused by a real systemd, sandbox and all.
# Prints one line per step with its duration; exits non-zero at the first failure.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
[ "$(id -u)" = 0 ] || { echo "package-test: needs root (apt-get, dpkg -i)" >&2; exit 2; }
t0=$(date +%s)
step() { echo "package-test: $* ($(($(date +%s) - t0)) s)"; }

sh tools/install-deps.sh package
step "packaging tools installed"
make -s man-check unit-check monitoring-check
step "man pages, unit and alerting rules checked"
bash tools/deb-build.sh
deb=$(ls bin/deb/outbox-relay_"$(cat VERSION)"_*.deb)
step "built $deb"

# An earlier run's package would make dpkg -i an upgrade; start from none.
dpkg --purge outbox-relay >/dev/null 2>&1 || true
dpkg -i "$deb" 2>&1 | tee "$ROOT/bin/deb/install.log"
grep -q 'stays skipped (not failed) until /etc/outbox-relay/database-url' "$ROOT/bin/deb/install.log" ||
    { echo "package-test: dpkg -i did not say why the unit stays skipped" >&2; exit 1; }
step "installed: $(dpkg-query -W -f='${Package} ${Version} ${Status}' outbox-relay)"
trap 'dpkg --purge outbox-relay >/dev/null 2>&1 || true' EXIT
[ "$(command -v outbox-relay)" = /usr/bin/outbox-relay ] ||
    { echo "package-test: outbox-relay is not /usr/bin/outbox-relay on PATH" >&2; exit 1; }
outbox-relay --version
version=$(outbox-relay --version | awk '{ print $2 }')
[ "$version" = "$(cat VERSION)" ] ||
    { echo "package-test: installed outbox-relay --version says $version, VERSION $(cat VERSION)" >&2; exit 1; }
# The installed page, found by man itself, renders without a warning.
man_err=$(MANWIDTH=80 man --warnings outbox-relay 2>&1 >/dev/null)
[ -z "$man_err" ] || { echo "$man_err" >&2; echo "package-test: man outbox-relay warned" >&2; exit 1; }
echo "package-test: man outbox-relay: $(man -w outbox-relay), no warning"
verify_err=$(systemd-analyze verify /lib/systemd/system/outbox-relay.service 2>&1)
[ -z "$verify_err" ] || { echo "$verify_err" >&2; echo "package-test: systemd-analyze verify of the installed unit" >&2; exit 1; }
echo "package-test: systemd-analyze verify /lib/systemd/system/outbox-relay.service: clean"
# The template, through an instance (verify refuses a bare template name).
inst=$(mktemp -d)
ln -s /lib/systemd/system/outbox-relay@.service "$inst/outbox-relay@second.service"
verify_err=$(systemd-analyze verify "$inst/outbox-relay@second.service" 2>&1)
rm -rf "$inst"
[ -z "$verify_err" ] || { echo "$verify_err" >&2; echo "package-test: systemd-analyze verify of the installed template" >&2; exit 1; }
echo "package-test: systemd-analyze verify of outbox-relay@second.service (the installed template): clean"
step "installed binary, man page and unit checked"

rc=0
bash tests/pkg/installed_delivery.sh || rc=$?
step "delivery test against the installed package exited $rc"
[ "$rc" = 0 ] || exit "$rc"

trap - EXIT
# What the documentation tells an operator to put beside relay.json: purge takes it too (the
# database URL files hold a password).
printf 'postgresql://relay_login:pw@db/outbox\n' >/etc/outbox-relay/database-url
printf 'KAFKA_BROKERS=k:9092\n' >/etc/outbox-relay/environment
printf '{}\n' >/etc/outbox-relay/second.json
printf 'postgresql://relay_login:pw@db2/outbox\n' >/etc/outbox-relay/second.database-url
dpkg --purge outbox-relay
for f in /usr/bin/outbox-relay /lib/systemd/system/outbox-relay.service \
    /lib/systemd/system/outbox-relay@.service /etc/outbox-relay; do
    [ ! -e "$f" ] || { echo "package-test: $f is still there after dpkg --purge" >&2; ls -A "$f" >&2; exit 1; }
done
step "purged: binary, units, configuration, credentials and /etc/outbox-relay gone"

rc=0
bash tests/pkg/systemd_unit.sh || rc=$?
step "the unit under systemd (systemd-nspawn) exited $rc"
[ "$rc" = 0 ] || exit "$rc"
