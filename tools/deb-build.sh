#!/usr/bin/env bash
# `make package`: builds outbox-relay_VERSION_ARCH.deb with `dpkg-buildpackage -us -uc -b` and
# checks it with lintian (no error or warning allowed; every tag it reports is printed). The result goes to
# bin/deb/. The build runs in a copy of the tree under a temp dir: dpkg-buildpackage cleans the
# tree it builds in (make clean), which here would take this tree's bin/ with it, and it writes
# its results beside that tree.
#
# debian/changelog must name the version of VERSION: the package and `outbox-relay --version`
# must agree.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
log() { echo "deb-build: $*"; }

version=$(cat VERSION)
changelog_version=$(dpkg-parsechangelog -S Version)
if [ "$changelog_version" != "$version" ]; then
    echo "deb-build: debian/changelog is at $changelog_version but VERSION says $version: add a changelog entry (dch -v $version)" >&2
    exit 1
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-relay-deb.XXXXXX")
trap 'rm -rf "$work"' EXIT
src=$work/outbox-relay-$version
mkdir -p "$src"
# The files git knows of (committed or not, ignored ones left out); a tree without git: all but bin/.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -z --cached --others --exclude-standard |
        while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
        tar --null -T - -cf - | tar -xf - -C "$src"
else
    tar --exclude=./bin -cf - . | tar -xf - -C "$src"
fi

log "dpkg-buildpackage -us -uc -b in $src"
start=$(date +%s)
(cd "$src" && dpkg-buildpackage -us -uc -b) >"$work/build.log" 2>&1 || {
    tail -n 40 "$work/build.log" >&2
    echo "deb-build: dpkg-buildpackage failed (last 40 lines above)" >&2
    exit 1
}
log "built in $(($(date +%s) - start)) s"

mkdir -p bin/deb
rm -f bin/deb/outbox-relay*
# The package, its automatic debug symbols package (outbox-relay-dbgsym), .changes and .buildinfo.
cp "$work"/outbox-relay*_"$version"_*.deb "$work"/outbox-relay_"$version"_*.changes \
    "$work"/outbox-relay_"$version"_*.buildinfo bin/deb/
deb=$(ls bin/deb/outbox-relay_"$version"_*.deb)
log "$deb"
dpkg-deb --contents "$deb" | awk '{ print "deb-build:   " $1 " " $6 }'

# lintian on the .changes checks the .deb and the .buildinfo; --fail-on error,warning makes it exit
# non-zero on any error or warning tag (an intended one is overridden, with its reason, in
# debian/outbox-relay.lintian-overrides); info and pedantic tags are printed for the record.
log "lintian $(lintian --version | awk '{ print $2 }'):"
lintian_rc=0
lintian --fail-on error,warning --display-info --pedantic bin/deb/outbox-relay_"$version"_*.changes \
    >"$work/lintian.log" 2>&1 || lintian_rc=$?
sed 's/^/deb-build:   /' "$work/lintian.log"
[ -s "$work/lintian.log" ] || log "  (no tag)"
if [ "$lintian_rc" != 0 ]; then
    echo "deb-build: lintian reports errors or warnings (exit $lintian_rc)" >&2
    exit 1
fi
log "lintian: no error, no warning"
