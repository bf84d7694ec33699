#!/usr/bin/env bash
# `make test-ready`, and so every `make test`: are the commands the tests call on this machine,
# and does tools/test-commands.txt name all of them?
#
#   tools/check-test-commands.sh
#
# 1. Present: every entry of tools/test-commands.txt is a command in PATH (or, for an absolute
#    path, an existing file). In CI's fresh chroot, after `make quickstart` installed what
#    tools/packages.txt lists, this is what fails when a package the tests need is not listed.
# 2. Complete: every word of the test scripts that names, on this machine, a command of a Debian
#    package outside the "required" set (which every Debian has, debootstrap minbase included)
#    is in the list. This one has teeth on a full machine, such as CI's host, where the tests'
#    commands are installed whether or not tools/packages.txt lists them: a new `xxd` in a test
#    fails here until it is listed. It reads every word, comments aside, rather than guess which
#    words a shell would run (`check "what" jq ...`, `timeout 5 redis-cli ...`); the few prose
#    words that happen to name commands are set aside below (PROSE).
# 3. Not stale: every listed command still appears in the test scripts.
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@" # `sh tools/check-test-commands.sh` too
set -euo pipefail
cd "$(dirname "$0")/.."
LIST=tools/test-commands.txt

# What `make test` runs: the runner, its libraries, every test, the fuzz runner, the scripts the
# tests start, and the check `make test` runs first.
SCRIPTS=(tests/run.sh tests/lib.sh tests/netns_lib.sh tests/demo_lib.sh tests/it/*/*.sh
    tests/fuzz/run.sh scripts/demo.sh scripts/free_port.sh tools/check-floors.sh tools/check-mutants.sh)

# Words of the scripts that name a command on some machine but are not run as one: prose in
# messages and SQL ("line 1 column", "the floor's look"), options (--shutdown-timeout,
# --idle-ms, --event-id-column), variables (52's $postmaster), arguments (99's `trickle dh`).
# Only a word the scan flagged on a real machine, and checked by hand, belongs here.
PROSE=" as column dh duplicates file free idle look make postmaster shutdown size systemd w write "
# ... and: faketime (41_wall_clock_step.sh names the package; the library is listed by path), man
# (a directory of gen-man.sh's arguments in 13_units.sh), opt and col (loop variables in 14 and
# 16), nodejs (the package 15_install_deps.sh's stand-in apt-get "installs"; node is listed).
PROSE="$PROSE faketime man opt col nodejs "
# Commands a test uses only when the machine has them, saying "# SKIP" otherwise: none now
# (node and npm, for 97 and 98, are listed and installed).
OPTIONAL=" "

# The tests put PostgreSQL's bin directory first in PATH (tests/lib.sh): so does this check.
for d in /usr/lib/postgresql/*/bin; do [ -d "$d" ] && PATH=$d:$PATH; done

listed=$(sed -e 's/#.*//' "$LIST" | awk 'NF { printf "%s ", $1 }')
fail=0

# ---- 1. present ------------------------------------------------------------------------------
for entry in $listed; do # unquoted: an absolute path may be a glob
    case $entry in
    /*) [ -e "$entry" ] && continue ;;
    *) command -v "$entry" >/dev/null && continue ;;
    esac
    echo "test-commands: the tests call $entry, which this machine lacks (tools/packages.txt must install it)" >&2
    fail=1
done

# ---- 2. complete -----------------------------------------------------------------------------
# Words after comments are cut (a line's own, or from " #" on), lowercase first letter, and
# absolute /usr/bin/python3-style paths by their last part. Functions the scripts define are
# theirs, not commands (67_patch.sh's `patch`).
words=$(sed -e 's/^[[:space:]]*#.*//' -e 's/[[:space:]]#.*//' "${SCRIPTS[@]}" |
    grep -oE '[A-Za-z0-9_.+/-]+' | sed 's|.*/||' | grep -E '^[a-z][a-z0-9_.+-]*$' | sort -u)
funcs=" $(grep -ohE '^[[:space:]]*[a-z_][a-z0-9_]*\(\)' "${SCRIPTS[@]}" | tr -d ' \t()' | tr '\n' ' ') "

# For each word that is a command here and not accounted for: the paths dpkg may know it by.
# Debian 12 has merged /usr but dpkg records a file under the path its package ships it at
# (/bin/ps and /usr/bin/pgrep alike), and PATH may hold non-Debian copies (/usr/local, pyenv).
# compgen lists PATH's commands in one go (a `type` per word forks a thousand times); builtins
# and keywords (test, time, select) are the shell's own.
in_path=$(comm -23 <(compgen -c | sort -u) <({ compgen -b; compgen -k; } | sort -u))
declare -A word_of
for w in $(comm -12 <(echo "$words") <(echo "$in_path")); do
    case " $listed $PROSE $OPTIONAL $funcs " in *" $w "*) continue ;; esac
    # type -P and readlink without a fork each (a hundred forks take seconds on a busy machine)
    p="" r=""
    IFS=: read -ra dirs <<<"$PATH"
    for d in "${dirs[@]}"; do [ -x "$d/$w" ] && { p=$d/$w; break; }; done
    [ -n "$p" ] || continue
    [ -L "$p" ] && r=$(readlink -f "$p")
    for q in "$p" /usr/bin/"$w" /bin/"$w" /usr/sbin/"$w" /sbin/"$w" ${r:+"$r" "${r#/usr}" "/usr${r#/usr}"}; do
        [ -f "$q" ] && word_of[$q]+=" $w" # postmaster and postgres: one file, two words
    done
done
# Absolute paths of commands (/usr/bin/time): by their last part above, a shell keyword or builtin
# (time, test) is set aside as the shell's own, but the path runs the package's program.
for q in $(sed -e 's/^[[:space:]]*#.*//' -e 's/[[:space:]]#.*//' "${SCRIPTS[@]}" |
    grep -oE '(^|[^A-Za-z0-9_./-])/(usr/)?s?bin/[a-z][a-z0-9_.+-]*' | grep -oE '/.*' | sort -u); do
    case " $listed $PROSE $OPTIONAL " in *" $q "* | *" ${q##*/} "*) continue ;; esac
    [ -f "$q" ] && word_of[$q]+=" $q"
done
if [ ${#word_of[@]} -gt 0 ]; then
    # Who ships each path: one grep over dpkg's file lists ("pkg[:arch].list:/path" lines), where
    # a `dpkg -S` of a few hundred paths takes most of a minute.
    # shellcheck disable=SC2062 # the glob is the files to read; the patterns come from stdin
    owners=$(printf '%s\n' "${!word_of[@]}" | grep -Fx -f - /var/lib/dpkg/info/*.list || true)
    declare -A pkg_of
    while IFS= read -r line; do
        [ -n "$line" ] || continue
        pkg=${line%%:/*}
        pkg=${pkg##*/}
        pkg=${pkg%.list}
        for w in ${word_of[${line#*.list:}]}; do pkg_of[$w]=${pkg%%:*}; done
    done <<<"$owners"
    # Priority "required": in every Debian, nothing to list.
    declare -A required
    for p in $(dpkg-query -W -f='${Package} ${Priority}\n' | awk '$2 == "required" { print $1 }'); do
        required[$p]=1
    done
    for w in $(printf '%s\n' "${pkg_of[@]+"${!pkg_of[@]}"}" | sort); do
        [ -z "${required[${pkg_of[$w]}]:-}" ] || continue
        echo "test-commands: the tests call $w (${pkg_of[$w]}), which $LIST does not list" \
            "(list it, and its package in tools/packages.txt; a mere word goes in $0's PROSE)" >&2
        fail=1
    done
fi

# ---- 3. not stale ----------------------------------------------------------------------------
for entry in $listed; do
    case $entry in /*) continue ;; esac
    grep -qx -- "$entry" <<<"$words" && continue
    echo "test-commands: $LIST lists $entry, which no test script mentions (remove it)" >&2
    fail=1
done

[ "$fail" = 0 ] && echo "test-commands: the $(echo "$listed" | wc -w) commands and files of $LIST are here, and the tests call no other non-required Debian command"
exit "$fail"
