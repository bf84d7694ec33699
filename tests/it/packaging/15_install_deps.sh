#!/bin/bash
# Proves that the apt-get line tools/install-deps.sh prints for a user who is not root (what
# `make test` and `make quickstart` print on a fresh machine) leaves nothing
# to install: run once, it installs every package of tools/packages.txt's build and test
# sections, the entry with alternatives (npm, or NodeSource's node package that ships it)
# included, so the next `make test` goes on instead of stopping at a second line.
# Nothing is installed: a stand-in dpkg-query says no package is, and the printed line runs
# against a stand-in apt-get that only records what it was asked and puts the commands the
# packages provide on its PATH:
#  1. Debian's node package, which lacks npm: the line installs npm after it;
#  2. NodeSource's, which ships npm: the line installs nothing more (Debian's npm would conflict).
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup

mkdir -p "$T/fake"
printf '#!/bin/sh\nexit 0\n' >"$T/fake/dpkg-query"
chmod +x "$T/fake/dpkg-query"
PATH="$T/fake:$PATH" sh "$ROOT/tools/install-deps.sh" --report build test >"$T/deps.out" 2>&1
check_eq "nothing installed: --report exits 1" 1 $?
line=$(sed -n "s/^deps: install them as root (or run 'make deps'):  //p" "$T/deps.out")
[ -n "$line" ] || fail "install-deps.sh printed the apt-get line" "$(cat "$T/deps.out")"

# apt_stub DIR SHIPS_NPM: an apt-get in DIR that logs its arguments to DIR/apt.log and, for each
# package installed, puts the command it provides in DIR (the node package: node, and npm when
# SHIPS_NPM is 1; npm: npm). Builtins and absolute paths only: DIR is all of PATH.
apt_stub() {
    mkdir -p "$1"
    cat >"$1/apt-get" <<EOF
#!/bin/sh
echo "\$*" >>"$1/apt.log"
[ "\$1" = install ] || exit 0
for p in "\$@"; do
    case \$p in
    nodejs) set -- node; [ "$2" = 1 ] && set -- node npm ;;
    npm) set -- npm ;;
    *) continue ;;
    esac
    for c in "\$@"; do printf '#!/bin/sh\n' >"$1/\$c"; /bin/chmod +x "$1/\$c"; done
    exit 0
done
EOF
    chmod +x "$1/apt-get"
}

# --- 1. ---
apt_stub "$T/debian" 0
env -i PATH="$T/debian" /bin/sh -c "$line" >"$T/debian.out" 2>&1
check_eq "1: the line runs to its end" 0 $?
check "1: it installs the node package first" grep -qE '^install .* nodejs( |$)' "$T/debian/apt.log"
check "1: then npm, which Debian's node package lacks" test -x "$T/debian/npm"
check_eq "1: three apt-get runs (update, the list, npm)" 3 "$(grep -c '' "$T/debian/apt.log")"

# --- 2. ---
apt_stub "$T/nodesource" 1
env -i PATH="$T/nodesource" /bin/sh -c "$line" >"$T/nodesource.out" 2>&1
check_eq "2: the line runs to its end" 0 $?
check "2: npm is there (the node package shipped it)" test -x "$T/nodesource/npm"
check_eq "2: Debian's npm is not asked for (two apt-get runs)" 2 \
    "$(grep -c '' "$T/nodesource/apt.log")"
