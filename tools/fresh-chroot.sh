#!/usr/bin/env bash
# `make fresh-test`: proves README.md's quick start on a truly fresh Debian 12. CI runs on a
# machine that earlier work left packages on, so a green CI can hide a missing install step; this
# builds a minbase bookworm chroot with debootstrap, adds only `make` and `git` (README.md's one
# prerequisite), clones the current commit into it and runs, as the very first command:
#
#   tools/fresh-chroot.sh [quickstart|test|package-fresh] [TESTS=NAME...]   (default quickstart;
#                                                  make fresh-test FRESH_CMD=test [TESTS=...])
#
# After `make quickstart`, it also runs `make -j2 test-ready`: everything `make test` builds
# links, and everything it calls is installed, with no more packages than the quick start's.
#
# Root only (debootstrap, chroot, mount). The chroot shares the host's network namespace, so apt
# inside it works, and every test address is loopback as usual. Exit status: the make's.
#
# The debootstrap result is cached as a tarball under /var/cache/outbox-relay by
# tools/bookworm-base.sh (rebuilt when a month old, or with FRESH_REBUILD=1), and so are the .deb
# files apt downloads (like a proxy would; emptied with each rebuild), and so is npm's cache
# (npm/: the tests' npm clients, tests/tools/*/package-lock.json); every run unpacks the
# pristine tarball into a new directory, removed at the end (KEEP_CHROOT=1 keeps it).
set -euo pipefail
# The body is one { } block: bash reads it whole before running it, so editing this file during a
# 12-minute run cannot change the rest of that run (bash reads plain scripts as it goes).
{

CMD=${1:-quickstart}
case $CMD in quickstart | test | package-fresh) ;; *) echo "usage: $0 [quickstart|test|package-fresh] [TESTS=NAME...]" >&2; exit 2 ;; esac
# TESTS=: make test's subset of tests (tests/run.sh NAME...), names of letters, digits and _.-
TESTS_ARG=""
case ${2:-} in
"") ;;
TESTS=*[!A-Za-z0-9_.\ -]*) echo "fresh-chroot: TESTS: test names only" >&2; exit 2 ;;
TESTS=*) TESTS_ARG=" '$2'" ;;
*) echo "usage: $0 [quickstart|test|package-fresh] [TESTS=NAME...]" >&2; exit 2 ;;
esac
[ "$(id -u)" = 0 ] || { echo "fresh-chroot: needs root (debootstrap, chroot, mount)" >&2; exit 2; }

REPO=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
COMMIT=$(git -C "$REPO" rev-parse HEAD)
MIRROR=http://deb.debian.org/debian
CACHE=/var/cache/outbox-relay
log() { echo "fresh-chroot: $*"; }

# mounted_under DIR: true while anything is mounted at or below DIR.
mounted_under() { awk -v d="$1" '$2 == d || index($2, d "/") == 1 { f = 1 } END { exit !f }' /proc/mounts; }

# safe_rm DIR: never recurse into a chroot with something still mounted in it (a bound /dev!).
safe_rm() {
    if mounted_under "$1"; then
        log "still mounted under $1, not removing it" >&2
        return 1
    fi
    rm -rf --one-file-system "$1"
}

# ---- the pristine base (tools/bookworm-base.sh: made once a month, cached) -----------------

BASE=$(bash "$(dirname "$0")/bookworm-base.sh")

# ---- a new chroot from it, cleaned up on every exit path -------------------------------------

t0=$(date +%s)
D=$(mktemp -d /var/tmp/outbox-relay-fresh.XXXXXX)
MOUNTS=() # mounted so far, unmounted in reverse
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    local rc=$? p sig left
    # Processes a failed test left running inside keep the mounts busy: stop them (only those
    # whose root is this chroot, i.e. ones this script started), TERM first, then KILL.
    for sig in TERM KILL; do
        left=0
        for p in /proc/[0-9]*; do
            [ "$(readlink "$p/root" 2>/dev/null)" = "$D" ] || continue
            kill "-$sig" "${p#/proc/}" 2>/dev/null && left=1
        done
        [ "$left" = 0 ] && break
        sleep 2
    done
    for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
        umount "${MOUNTS[i]}" 2>/dev/null || umount -l "${MOUNTS[i]}" || true
    done
    # Mounts a test made inside and left behind (`ip netns add` binds /run/netns onto itself):
    # newest first, so a mount on top of another goes before it.
    for m in $(awk -v d="$D" '$2 == d || index($2, d "/") == 1 { print $2 }' /proc/mounts | tac); do
        umount "$m" 2>/dev/null || umount -l "$m" || true
    done
    if [ -n "${KEEP_CHROOT:-}" ]; then
        log "kept $D"
    else
        safe_rm "$D" || rc=1
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM

tar -C "$D" --numeric-owner -xzf "$BASE"
# What a Debian installer writes and debootstrap does not: /etc/hosts (tests resolve localhost),
# and the updates and security suites every installed Debian 12 has.
printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' >"$D/etc/hosts"
printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb %s-security bookworm-security main\n' \
    "$MIRROR" "$MIRROR" "$MIRROR" >"$D/etc/apt/sources.list"
# Packages must not start their daemons (postgresql, redis-server) inside a chroot that shares
# the host's ports; the tests start their own on random ports. Docker images do the same.
printf '#!/bin/sh\nexit 101\n' >"$D/usr/sbin/policy-rc.d"
chmod 755 "$D/usr/sbin/policy-rc.d"

mnt() { # mnt TARGET MOUNT-ARGS...: mount and remember it for cleanup
    local target=$D$1
    shift
    mount "$@" "$target"
    MOUNTS+=("$target")
}
# The chroot's / a mount point of its own: `ip netns exec` (tests/netns_lib.sh) remounts / as a
# slave in its new mount namespace, which fails with EINVAL on a plain directory.
mnt / --bind "$D"
mnt /proc -t proc proc
mnt /sys --bind /sys
mnt /dev --bind /dev
mnt /dev/pts --bind /dev/pts
mnt /dev/shm -t tmpfs -o mode=1777,nosuid,nodev shm # PostgreSQL's shared memory, the chroot's own
mnt /var/cache/apt/archives --bind "$CACHE/debs"
mkdir -p "$CACHE/npm" "$D$CACHE/npm"
mnt "$CACHE/npm" --bind "$CACHE/npm"

in_chroot() { chroot "$D" /usr/bin/env -i HOME=/root TERM="${TERM:-dumb}" \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"; }

log "adding make and git (the README's prerequisite)"
in_chroot sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends make git' >"$D/prereq.log" 2>&1 ||
    { tail -n 20 "$D/prereq.log" >&2; exit 1; }

git -C "$REPO" diff --quiet HEAD || log "note: uncommitted changes in $REPO are not tested"
git clone -q --no-hardlinks "$REPO" "$D/root/outbox-relay"
git -C "$D/root/outbox-relay" checkout -q --detach "$COMMIT"

log "chroot ready in $(($(date +%s) - t0)) s (unpacked, make and git added, commit cloned)"
log "in a fresh bookworm chroot at $(git -C "$REPO" log -1 --format='%h %s' "$COMMIT")"
# in_repo MAKE-ARGS...: `make MAKE-ARGS` in the clone, timed; its status is the make's.
in_repo() {
    local start=$SECONDS rc=0
    log "running: cd outbox-relay && make $*"
    # In the background with `wait`, so a TERM (CI's time limit) runs cleanup at once.
    in_chroot sh -c "cd /root/outbox-relay && make $*" &
    wait $! || rc=$?
    log "make $* exited $rc after $((SECONDS - start)) s"
    return "$rc"
}
rc=0
in_repo "$CMD$TESTS_ARG" || rc=$?
# After the quick start, the rest of `make test`'s install story without its 15 minutes: the
# quick start installed the same packages `make test` does (tools/packages.txt's [build] and
# [test]), so whatever `make test` builds must now link (the sanitizer builds, unit tests,
# demos, fuzzers: the fuzzers' runtimes are what this once lacked) and every command the tests
# call must be here (make test-ready). Two jobs: the machine's two cores.
if [ "$rc" = 0 ] && [ "$CMD" = quickstart ]; then
    in_repo -j2 test-ready || rc=$?
fi
exit "$rc"
}
