#!/bin/sh
# Installs what tests/tools/NAME/package-lock.json pins (npm ci: exactly the lockfile, each
# tarball by its resolved URL and integrity) into /var/cache/outbox-relay/NAME-<hash of the two
# files>, once per lockfile version, and prints that directory (node_modules inside).
#
#   sh tests/tools/npm-ci.sh NAME        (schemaregistry: 98; cloudevents: 97)
#
# npm's cache is the project's, /var/cache/outbox-relay/npm, which make fresh-test lends its
# chroots as it does apt's .deb files: --prefer-offline takes what it holds without asking the
# registry, so the install works offline once any run on the machine has fetched the tarballs,
# and from registry.npmjs.org otherwise. Bounded: npm and its retries run under timeout 300.
# Installed beside the directory and renamed into place, so an interrupted install is never
# taken for one, and two tests installing at once both end with a whole one. npm's output goes
# to stderr; exit 1 when the install fails.
set -eu
src=$(cd "$(dirname "$0")/$1" && pwd)
dest=/var/cache/outbox-relay/$1-$(cat "$src/package.json" "$src/package-lock.json" | md5sum | cut -c1-12)
if [ ! -d "$dest" ]; then
    mkdir -p /var/cache/outbox-relay
    new=$(mktemp -d "$dest.XXXXXX")
    trap 'rm -rf "$new"' EXIT
    chmod 755 "$new"
    cp "$src/package.json" "$src/package-lock.json" "$new/"
    (cd "$new" && timeout 300 npm ci --prefer-offline --cache /var/cache/outbox-relay/npm \
        --no-audit --no-fund --loglevel=error) >&2
    mv -T "$new" "$dest" 2>/dev/null || true # a run beside this one was first: as good
fi
echo "$dest"
