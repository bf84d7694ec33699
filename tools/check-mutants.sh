#!/bin/sh
# Checks that every mutant of `make mutate` (tests/mutants/NN_name.patch) still applies to the
# tree, with the fuzz tests/mutate.sh allows (`patch -p1 --fuzz=3`), and names the tests that must
# catch it on its first line ("tests: NAME..."). A patch the code moved away from proves nothing,
# and only `make mutate`, which CI does not run, would say so: one went stale unnoticed that way.
# Run by `make test`; prints one line per stale mutant and exits 1 if there is any.
set -eu
cd "$(dirname "$0")/.."
bad=0
for p in tests/mutants/*.patch; do
    if ! head -n 1 "$p" | grep -q '^tests: [^ ]'; then
        echo "check-mutants: $p: its first line must name the tests that catch it (tests: NAME...)" >&2
        bad=1
    fi
    if ! patch -p1 --fuzz=3 --dry-run --force --silent <"$p" >/dev/null 2>&1; then
        echo "check-mutants: $p no longer applies: refresh it (tests/mutate.sh)" >&2
        bad=1
    fi
done
exit "$bad"
