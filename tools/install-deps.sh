#!/bin/sh
# Installs the Debian packages the project needs to build, test and benchmark. Run as root.
set -e
PKGS="build-essential pkg-config libpq-dev librdkafka-dev libjansson-dev libev-dev \
libmicrohttpd-dev libcmocka-dev postgresql postgresql-contrib jq kcat clang-format procps \
curl docker-compose"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -z "$missing" ]; then
    echo "deps: all installed"
    exit 0
fi
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
echo "deps: installing$missing"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
