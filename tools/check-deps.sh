#!/bin/sh
# Checks that every header the build needs is present and names the Debian package that provides
# a missing one, so a fresh machine gets one clear line instead of a wall of compiler errors.
CC=${CC:-cc}
missing=""
for pair in "ev.h:libev-dev" "libpq-fe.h:libpq-dev" "librdkafka/rdkafka.h:librdkafka-dev" \
    "jansson.h:libjansson-dev" "microhttpd.h:libmicrohttpd-dev"; do
    header=${pair%%:*}
    pkg=${pair#*:}
    inc=$(pkg-config --cflags libpq 2>/dev/null)
    if ! printf '#include <%s>\n' "$header" | $CC $inc -E -x c - >/dev/null 2>&1; then
        echo "missing header <$header>: install it with 'make deps' (or: apt-get install $pkg)" >&2
        missing="$missing $pkg"
    fi
done
if ! command -v pkg-config >/dev/null 2>&1; then
    echo "missing pkg-config: install it with 'make deps' (or: apt-get install pkg-config)" >&2
    missing="$missing pkg-config"
fi
[ -z "$missing" ] || exit 1
