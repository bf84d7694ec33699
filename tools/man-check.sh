#!/bin/sh
# `make man-check`: each generated man page (bin/man/NAME.1) must
#   - pass groff with every warning on (-ww) without a word on stderr,
#   - render with man -l (what an operator types for a page not yet installed), and
#   - list exactly the options that bin/NAME --help lists, no more, no fewer (they come from the
#     same table, so a difference means the generator dropped or invented one).
# Prints one line per page and exits 1 on the first failure.
set -eu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "man-check: $*" >&2; exit 1; }

for page in "$@"; do
    name=$(basename "$page" .1)
    prog=$(dirname "$(dirname "$page")")/$name
    groff -man -ww -z "$page" 2>"$tmp/groff.err" || fail "$page: groff exited $?"
    [ ! -s "$tmp/groff.err" ] || { cat "$tmp/groff.err" >&2; fail "$page: groff -man -ww warned"; }

    MANWIDTH=80 man --warnings -E UTF-8 -l "$page" >"$tmp/rendered" 2>"$tmp/man.err" ||
        fail "$page: man -l exited $?"
    [ ! -s "$tmp/man.err" ] || { cat "$tmp/man.err" >&2; fail "$page: man -l warned"; }
    for section in NAME SYNOPSIS DESCRIPTION COMMANDS OPTIONS "EXIT STATUS" "SEE ALSO"; do
        grep -q "^$section\$" "$tmp/rendered" || fail "$page: no $section section in man -l output"
    done

    "$prog" --help | sed -n 's/^  --\([a-z0-9.-]*\).*/\1/p' | sort >"$tmp/help.opts"
    # Option tags as manpage.c writes them: \fB\-\-NAME\fR on the line after .TP.
    sed -n 's/^\\fB\\-\\-\([a-z0-9.\\-]*\)\\fR.*/\1/p' "$page" | sed 's/\\-/-/g' | sort >"$tmp/man.opts"
    [ -s "$tmp/help.opts" ] || fail "$prog --help lists no option"
    diff "$tmp/help.opts" "$tmp/man.opts" >"$tmp/diff" ||
        { sed 's/^/  /' "$tmp/diff" >&2; fail "$page and $prog --help list different options (< --help, > man page)"; }
    echo "man-check: $page: groff -ww silent, man -l renders, $(wc -l <"$tmp/man.opts") options as in --help"
done
