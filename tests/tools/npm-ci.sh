#!/bin/sh
# Installs what tests/tools/NAME/package-lock.json pins (npm ci: exactly the lockfile, each
# tarball by its resolved URL and integrity) into /var/cache/outbox-relay/npm-ci/NAME-<hash of
# the two files>, once per lockfile version, and prints that directory (node_modules inside).
#
#   sh tests/tools/npm-ci.sh NAME        (schemaregistry: 98; cloudevents: 97)
#
# npm's cache is the project's, /var/cache/outbox-relay/npm, which make fresh-test lends its
# chroots as it does apt's .deb files: --prefer-offline takes what it holds without asking the
# registry, so the install works offline once any run on the machine has fetched the tarballs,
# and from registry.npmjs.org otherwise. Bounded: npm and its retries run under timeout 300; a
# timeout says so on stderr.
# Installed beside the directory, marked finished (.done) and only then renamed into place, so an
# interrupted or failed install is never taken for one, and two tests installing at once both
# end with a whole one. Only a directory with .done counts: the tests' older install code left
# half-installed NAME-<hash> directories directly under /var/cache/outbox-relay, which is why
# the installs now live under npm-ci/. The half-made directory is removed on every exit,
# including SIGINT, SIGTERM and SIGHUP (dash runs no EXIT trap on a signal by itself).
# npm's output goes to stderr; exit 1 when the install fails.
set -eu
limit=300
src=$(cd "$(dirname "$0")/$1" && pwd)
dir=/var/cache/outbox-relay/npm-ci
dest=$dir/$1-$(cat "$src/package.json" "$src/package-lock.json" | md5sum | cut -c1-12)
if [ ! -f "$dest/.done" ]; then
    mkdir -p "$dir"
    new=$(mktemp -d "$dest.XXXXXX")
    trap 'rm -rf "$new"' EXIT
    trap 'exit 129' HUP
    trap 'exit 130' INT
    trap 'exit 143' TERM
    chmod 755 "$new"
    cp "$src/package.json" "$src/package-lock.json" "$new/"
    rc=0
    (cd "$new" && timeout "$limit" npm ci --prefer-offline --cache /var/cache/outbox-relay/npm \
        --no-audit --no-fund --loglevel=error) >&2 || rc=$?
    if [ "$rc" = 124 ]; then
        echo "npm-ci: npm ci for $1 did not finish within $limit s (timeout); nothing installed" >&2
        exit 1
    elif [ "$rc" != 0 ]; then
        echo "npm-ci: npm ci for $1 failed (exit $rc); nothing installed" >&2
        exit 1
    fi
    : >"$new/.done"
    # The rename fails when a run beside this one was first (its directory is as good: it has
    # .done) or for a real reason (then there is no finished install to print). A $dest without
    # .done is not this script's (it renames only finished ones): left for a person to remove,
    # since removing it here could race with a run that is renaming its own into place.
    mv -T "$new" "$dest" 2>/dev/null || [ -f "$dest/.done" ] || {
        echo "npm-ci: could not rename $new to $dest, and no finished install is there" \
            "(a $dest without .done is not this script's: remove it)" >&2
        exit 1
    }
fi
echo "$dest"
