#!/usr/bin/env bash
# Prints the path of a pristine Debian 12 minbase tarball (debootstrap --variant=minbase
# bookworm), making it first when there is none or it is a month old (FRESH_REBUILD=1: always).
# Shared by tools/fresh-chroot.sh (the fresh-machine quick start) and tests/compose/compose_up.sh
# (imported as the debian:bookworm base image, since no registry can be reached).
#
# Cached under /var/cache/outbox-relay, with the .deb files apt downloads inside chroots made
# from it (debs/, emptied with each rebuild). Root only. Progress goes to stderr.
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "bookworm-base: needs root (debootstrap)" >&2; exit 2; }

MIRROR=http://deb.debian.org/debian
CACHE=/var/cache/outbox-relay
BASE=$CACHE/bookworm-minbase.tar.gz
log() { echo "bookworm-base: $*" >&2; }

# safe_rm DIR: never recurse into a tree with something still mounted in it (a bound /dev!).
safe_rm() {
    if awk -v d="$1" '$2 == d || index($2, d "/") == 1 { f = 1 } END { exit !f }' /proc/mounts; then
        log "still mounted under $1, not removing it"
        return 1
    fi
    rm -rf --one-file-system "$1"
}

command -v debootstrap >/dev/null || {
    log "installing debootstrap on the host"
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >&2
}
mkdir -p "$CACHE/debs"
if [ -n "${FRESH_REBUILD:-}" ] || [ -z "$(find "$BASE" -mtime -30 2>/dev/null)" ]; then
    log "debootstrap --variant=minbase bookworm (cached in $BASE)"
    tmp=$CACHE/base.tmp
    safe_rm "$tmp"
    debootstrap --variant=minbase bookworm "$tmp" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 ||
        { tail -n 20 "$CACHE/debootstrap.log" >&2; safe_rm "$tmp"; exit 1; }
    tar -C "$tmp" --numeric-owner -czf "$BASE.tmp" . && mv "$BASE.tmp" "$BASE"
    safe_rm "$tmp"
    rm -f "$CACHE"/debs/*.deb # a month of superseded versions at most
fi
echo "$BASE"
