#!/bin/sh
# The build's first step (bin/.deps-ok): fails early, naming the packages to install, instead of a
# wall of compiler errors. Reads the one list, tools/packages.txt ([build] section), and never
# installs: by now make has read its pkg-config flags, so `make test` and `make quickstart`
# install before that instead, and `make deps` installs on request.
exec sh "$(dirname "$0")/install-deps.sh" --report build
