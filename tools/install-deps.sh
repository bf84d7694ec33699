#!/bin/sh
# Installs the Debian packages of tools/packages.txt that are missing (the one list; its header
# says what counts as missing).
#
#   tools/install-deps.sh [--auto|--report] [SECTION...]
#
# SECTION: build, test or package (default: build and test, what `make test` needs and `make
# deps` installs; `make deps-package` installs package). Nothing missing: one line, exit 0, in well under a
# second (`make test` and `make quickstart` run this first, every time). Something missing: as
# root, apt-get update, then install it (noninteractive, no recommends), then check again.
# In two passes when an entry with alternatives ("npm|nodejs") is missing too and one of its
# alternatives is among the rest: the rest first, then that entry checked again and installed
# (what holds depends on what the first pass brought; packages.txt's header).
# Not root: plain (`make deps`) uses sudo when there is one; --auto (`make test` and co.) prints
# the one apt-get line to run (the first pass, then each deferred entry when still missing) and
# exits 1, rather than prompting for a password half-way through
# a build. --report (the build's own check, tools/check-deps.sh) never installs: it prints the
# line and exits 1 even as root, since the build has already read its pkg-config flags.
set -e
LIST=$(dirname "$0")/packages.txt
mode=install
case ${1:-} in --auto | --report) mode=${1#--}; shift ;; esac
sections=${*:-build test}

# "package file..." lines of the chosen sections, comments and blank lines dropped.
entries=$(awk -v want=" $sections " '
    { sub(/#.*/, "") }
    /^\[.*\]$/ { sec = substr($0, 2, length($0) - 2); next }
    NF && index(want, " " sec " ") { print }' "$LIST")
# Every package named, alternatives too ("npm|nodejs": packages.txt's header).
pkgs=$(printf '%s\n' "$entries" | awk '{ print $1 }' | tr '|' '\n')
# Two passes: the entries without alternatives first, then those with ("npm|nodejs"), checked
# again after the first pass installed: which alternative holds depends on what the first pass
# brought. Asked for together, apt would pick NodeSource's nodejs (a higher version, when its repo
# is configured) for "nodejs" and then fail on Debian's npm, which that nodejs conflicts with;
# installed first, that nodejs ships npm itself and the second pass has nothing to do.
plain=$(printf '%s\n' "$entries" | awk '$1 !~ /[|]/')
alts=$(printf '%s\n' "$entries" | awk '$1 ~ /[|]/')

# present FILE: whether FILE is there: an absolute path (a glob, unquoted by the caller) exists,
# a command is in PATH.
present() {
    case $1 in
    /*) [ -e "$1" ] ;;
    *) command -v "$1" >/dev/null 2>&1 ;;
    esac
}

# ships PKG FILE...: whether installed PKG's own file list (dpkg-query -L) holds one of FILEs
# that is gone: a command not in PATH as a bin or sbin path, an absolute path (a glob) as a path
# it matches.
ships() {
    list=$(dpkg-query -L "$1" 2>/dev/null) || return 1
    shift
    for f in "$@"; do
        case $f in
        /*)
            while read -r p; do
                # shellcheck disable=SC2254 # $f is a glob on purpose
                case $p in $f) [ -e "$p" ] || return 0 ;; esac
            done <<EOF
$list
EOF
            ;;
        *)
            if ! present "$f" &&
                printf '%s\n' "$list" | grep -qE "^(/usr)?(/local)?/s?bin/$f\$"; then
                return 0
            fi
            ;;
        esac
    done
    return 1
}

# find_missing ENTRIES: sets $missing (not installed) and $broken (installed, but a listed file is
# gone) for ENTRIES ("package file..." lines).
find_missing() {
    # One dpkg-query for the whole list keeps the check fast; unknown packages print nothing.
    # shellcheck disable=SC2086 # one argument per package
    installed=" $(dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' $pkgs 2>/dev/null |
        awk '$1 == "ii" { printf "%s ", $2 }')"
    missing=""
    broken=""
    while read -r spec files; do
        [ -n "$spec" ] || continue
        # An entry holds when one of its alternatives is installed with every listed file.
        first=${spec%%|*}
        held=""
        for pkg in $(printf '%s' "$spec" | tr '|' ' '); do
            case $installed in *" $pkg "*) ;; *) continue ;; esac
            held=$pkg
            for f in $files; do # unquoted: a path may be a glob (/usr/lib/postgresql/*/bin/initdb)
                present "$f" || {
                    held=""
                    break
                }
            done
            [ -z "$held" ] || break
        done
        [ -n "$held" ] && continue
        # Otherwise: the first alternative, installed, is reinstalled. Else a later one that is
        # installed and ships a listed file that is gone (NodeSource's nodejs without its
        # /usr/bin/npm) is reinstalled: installing the first beside it would conflict. Else the
        # first is installed (Debian's nodejs ships no npm: it cannot stand in, npm is needed).
        case $installed in *" $first "*)
            broken="$broken $first"
            continue
            ;;
        esac
        fix=""
        rest=""
        case $spec in *"|"*) rest=${spec#*|} ;; esac
        for pkg in $(printf '%s' "$rest" | tr '|' ' '); do
            case $installed in *" $pkg "*) ;; *) continue ;; esac
            # set -f: a glob in $files goes to ships as it is, matched against the file list.
            set -f
            # shellcheck disable=SC2086 # one argument per file
            ships "$pkg" $files && fix=$pkg
            set +f
            [ -z "$fix" ] || break
        done
        if [ -n "$fix" ]; then
            broken="$broken $fix"
        else
            missing="$missing $first"
        fi
    done <<EOF
$1
EOF
}

find_missing "$entries"
if [ -z "$missing$broken" ]; then
    echo "deps: the $(printf '%s\n' "$entries" | wc -l) packages of tools/packages.txt ($sections) are installed"
    exit 0
fi
# The first pass, then the alternative entries that do not depend on it: those none of whose
# alternatives the first pass installs. The rest (deferred) are checked after it.
find_missing "$plain"
missing1=$missing
broken1=$broken
find_missing "$alts"
missing2=""
broken2=""
deferred=""
for pkg in $missing $broken; do
    # The entry that named it (one package per entry: find_missing picks one).
    spec=$(printf '%s\n' "$alts" | awk -v p="$pkg" '
        { n = split($1, a, "|"); for (i = 1; i <= n; i++) if (a[i] == p) { print $1; exit } }')
    clash=""
    for alt in $(printf '%s' "$spec" | tr '|' ' '); do
        case " $missing1 $broken1 " in *" $alt "*) clash=1 ;; esac
    done
    if [ -n "$clash" ]; then
        deferred="$deferred $spec"
    else
        case " $missing " in *" $pkg "*) missing2="$missing2 $pkg" ;; *) broken2="$broken2 $pkg" ;; esac
    fi
done
missing=$missing1$missing2
broken=$broken1$broken2
# --reinstall only when a file of an installed package is gone: plain install would skip it.
reinstall=""
[ -z "$broken" ] || reinstall=" --reinstall"
line="apt-get install -y --no-install-recommends$reinstall$missing$broken"
[ -z "$missing" ] || echo "deps: missing:$missing"
[ -z "$broken" ] || echo "deps: installed, but a file the project uses is gone:$broken"
[ -z "$deferred" ] || echo "deps: then, once those are installed, checked again:$deferred"

# The line printed for a user to run must leave nothing missing, or the next `make test` stops
# again on the deferred entries: each rides on it as a step of its own, run after the first
# install and only when what the entry provides is still not there (npm after Debian's nodejs:
# installed; after NodeSource's, which ships it: skipped, as the second pass below does).
followup=""
set -f # a glob of $files goes into the line as it is, for the user's shell
for spec in $deferred; do
    files=$(printf '%s\n' "$alts" | awk -v s="$spec" '$1 == s { $1 = ""; print; exit }')
    cond=""
    for f in $files; do
        case $f in /*) c="ls $f" ;; *) c="command -v $f" ;; esac
        cond="${cond:+$cond && }$c"
    done
    [ -n "$cond" ] || cond="dpkg -s ${spec%%|*}"
    followup="$followup && { { $cond; } >/dev/null 2>&1 || apt-get install -y --no-install-recommends ${spec%%|*}; }"
done
set +f

SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
if [ "$mode" = report ] || { [ -n "$SUDO" ] && { [ "$mode" = auto ] || ! command -v sudo >/dev/null 2>&1; }; }; then
    echo "deps: install them as root (or run 'make deps'):  apt-get update && $line$followup" >&2
    exit 1
fi
echo "deps: installing as $( [ -n "$SUDO" ] && echo "root via sudo" || echo root ):$missing$broken"
# Another apt or dpkg (unattended-upgrades, a second `make deps`) holds a lock for a while: wait
# for it, up to APT_LOCK_TIMEOUT seconds, rather than fail at once. DPkg::Lock::Timeout makes apt
# wait for dpkg's lock; the lists and archives locks it does not wait for, so a run that failed on
# one of those is tried again every 5 s until the deadline.
wait_s=${APT_LOCK_TIMEOUT:-300}
lock="-o DPkg::Lock::Timeout=$wait_s"
deadline=$(($(date +%s) + wait_s))
apt_waiting() { # apt_waiting CMD...: runs CMD, again while it fails on a held lock
    err=$(mktemp)
    while :; do
        if "$@" 2>"$err"; then
            rm -f "$err"
            return 0
        fi
        if grep -q 'Could not get lock\|Unable to lock' "$err" && [ "$(date +%s)" -lt "$deadline" ]; then
            echo "deps: apt's lock is held by another process; waiting (up to ${wait_s} s in all)"
            sleep 5
            continue
        fi
        cat "$err" >&2
        rm -f "$err"
        return 1
    done
}
# shellcheck disable=SC2086 # $lock is two words
apt_waiting $SUDO apt-get $lock update -qq
# Use-Pty=0: no dpkg progress bar redrawn into CI logs.
install() { # install [--reinstall] PACKAGE...
    # shellcheck disable=SC2086 # $lock is two words
    apt_waiting $SUDO env DEBIAN_FRONTEND=noninteractive apt-get $lock install -y -qq \
        --no-install-recommends -o Dpkg::Use-Pty=0 "$@"
}
# shellcheck disable=SC2086 # word splitting of the package list is intended
install $reinstall $missing $broken
# Debian ships promtool only inside the Prometheus server package, whose install enables and
# starts a server on :9090 under systemd. The project wants the checker, not the server: one that
# this run installed is stopped and disabled again (one installed before is left as it was).
case " $missing " in
*" prometheus "*)
    if [ -d /run/systemd/system ] && systemctl is-enabled --quiet prometheus 2>/dev/null; then
        $SUDO systemctl disable --now prometheus >/dev/null 2>&1 &&
            echo "deps: stopped and disabled the Prometheus server installed for promtool"
    fi
    ;;
esac

# The second pass: the alternative entries left for after the first, checked again now.
if [ -n "$deferred" ]; then
    find_missing "$alts"
    if [ -n "$missing$broken" ]; then
        echo "deps: second pass, the alternatives:$missing$broken"
        reinstall=""
        [ -z "$broken" ] || reinstall="--reinstall"
        # shellcheck disable=SC2086 # word splitting of the package list is intended
        install $reinstall $missing $broken
    fi
fi

# A package whose listed file still is not there means packages.txt is wrong: say so now rather
# than reinstalling it on every run.
find_missing "$entries"
if [ -n "$missing$broken" ]; then
    echo "deps: still missing after apt-get:$missing$broken (check tools/packages.txt)" >&2
    exit 1
fi
echo "deps: done"
