#!/bin/sh
# Installs the Debian packages of tools/packages.txt that are missing (the one list; its header
# says what counts as missing).
#
#   tools/install-deps.sh [--check] [SECTION...]
#
# SECTION: build or test (default: both). Nothing missing: one line, exit 0, in well under a
# second (`make test` and `make quickstart` run this first, every time). Something missing: as
# root, apt-get update, then install it (noninteractive, no recommends), then check again. Not
# root: `make deps` (no --check) uses sudo when there is one; with --check (`make test` and co.)
# it prints the one apt-get line to run and exits 1, rather than prompting for a password
# half-way through a build.
set -e
LIST=$(dirname "$0")/packages.txt
check_only=0
[ "${1:-}" = --check ] && { check_only=1; shift; }
sections=${*:-build test}

# "package file..." lines of the chosen sections, comments and blank lines dropped.
entries=$(awk -v want=" $sections " '
    { sub(/#.*/, "") }
    /^\[.*\]$/ { sec = substr($0, 2, length($0) - 2); next }
    NF && index(want, " " sec " ") { print }' "$LIST")
pkgs=$(printf '%s\n' "$entries" | awk '{ print $1 }')

# find_missing: sets $missing (not installed) and $broken (installed, but a listed file is gone).
find_missing() {
    # One dpkg-query for the whole list keeps the check fast; unknown packages print nothing.
    installed=" $(dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' $pkgs 2>/dev/null |
        awk '$1 == "ii" { printf "%s ", $2 }')"
    missing=""
    broken=""
    while read -r pkg files; do
        case $installed in *" $pkg "*) ;; *) missing="$missing $pkg"; continue ;; esac
        for f in $files; do # unquoted: a path may be a glob (/usr/lib/postgresql/*/bin/initdb)
            case $f in
            /*) [ -e "$f" ] || { broken="$broken $pkg"; break; } ;;
            *) command -v "$f" >/dev/null 2>&1 || { broken="$broken $pkg"; break; } ;;
            esac
        done
    done <<EOF
$entries
EOF
}

find_missing
if [ -z "$missing$broken" ]; then
    echo "deps: the $(printf '%s\n' "$pkgs" | wc -l) packages of tools/packages.txt ($sections) are installed"
    exit 0
fi
# --reinstall only when a file of an installed package is gone: plain install would skip it.
reinstall=""
[ -z "$broken" ] || reinstall=" --reinstall"
line="apt-get install -y --no-install-recommends$reinstall$missing$broken"
echo "deps: missing:$missing${broken:+ (installed, but files are gone:$broken)}"

SUDO=""
if [ "$(id -u)" != 0 ]; then
    if [ "$check_only" = 1 ] || ! command -v sudo >/dev/null 2>&1; then
        echo "deps: run as root:  apt-get update && $line" >&2
        exit 1
    fi
    SUDO=sudo
fi
echo "deps: installing as $( [ -n "$SUDO" ] && echo "root via sudo" || echo root ):$missing$broken"
$SUDO apt-get update -qq
# shellcheck disable=SC2086 # word splitting of the package list is intended
# Use-Pty=0: no dpkg progress bar redrawn into CI logs.
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    -o Dpkg::Use-Pty=0 $reinstall $missing $broken

# A package whose listed file still is not there means packages.txt is wrong: say so now rather
# than reinstalling it on every run.
find_missing
if [ -n "$missing$broken" ]; then
    echo "deps: still missing after apt-get:$missing$broken (check tools/packages.txt)" >&2
    exit 1
fi
echo "deps: done"
