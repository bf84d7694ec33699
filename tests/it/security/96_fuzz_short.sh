#!/bin/bash
# Runs every libFuzzer harness of tests/fuzz/ (bin/fuzz/, built by `make fuzzers` and by
# `make test`) for a few seconds (FUZZ_SHORT_S, default 5) from its committed seeds, two at a
# time (the machine's two cores; `make test` must stay under 20 minutes), after
# replaying its regression inputs: a short smoke run, under ASan + UBSan, that a parser change
# which crashes on a known input or a nearby one fails `make test`. The long run is `make fuzz`.
# run.sh: alone (both cores fuzzing: a test beside it would crawl)
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
# run.sh prints one ok/not ok line per harness (counted by tests/run.sh) and exits 1 on any crash.
FUZZ_PARALLEL=${FUZZ_PARALLEL:-2} bash "$ROOT/tests/fuzz/run.sh" "${FUZZ_SHORT_S:-5}"
rc=$?
check "every harness ran without a crash" test "$rc" = 0
