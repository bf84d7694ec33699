#!/bin/bash
# Proves `make demo` end to end, with the sanitizer builds: scripts/demo.sh takes orders through
# producer-demo (a retried request replayed from Redis, a reused key refused, a PATCH applied and a
# stale one refused with 412), outbox-relay publishes them,
# consumer-demo applies each once (also when the relay sends some again), and the final check
# orders = outbox events = shipments passes. The programs' logs carry no sanitizer report.
source "$(dirname "$0")/../../lib.sh"
t_setup

out=$(MOCK_BROKER=$BIN/mock-broker BIN=$BIN/asan KEEP_TMP=1 TMPDIR=$T \
    bash "$ROOT/scripts/demo.sh" 2>&1)
rc=$?
printf '%s\n' "$out" | sed 's/^/# /' | tail -n 40
check_eq "the demo exits 0" 0 "$rc"
check "the final check passes" grep -q '^FINAL CHECK PASSED: orders = shipments = ' <<<"$out"
check "the retry was replayed byte for byte" grep -q 'same status, byte-identical body' <<<"$out"
check "the retry was served from Redis" grep -q 'served from Redis' <<<"$out"
check "a PATCH with the current ETag: 200" grep -q -- '-> 200 ETag: "2"' <<<"$out"
check "a PATCH with a stale ETag: 412 with the current one" grep -q -- '-> 412 ETag: "2"' <<<"$out"
check "the consumer applied the update" grep -q "shipment: version 2, amount 4500" <<<"$out"
check "the reused key was refused with 422" grep -q -- '-> 422 .*already used with a different' \
    <<<"$out"
# The demo prints the shipment count after the re-send whatever it is: compare it with the final
# count (orders = outbox events = shipments), which the final check proved.
after_resend=$(sed -n 's/.*shipments still \([0-9]*\): the processed_events dedupe absorbed.*/\1/p' <<<"$out")
final=$(sed -n 's/.*FINAL CHECK PASSED: orders = shipments = \([0-9]*\),.*/\1/p' <<<"$out")
check "the consumer absorbed the re-sent events (shipments after the re-send = orders)" \
    test -n "$final" -a "$after_resend" = "$final"
demo_dir=$(ls -d "$T"/outbox-demo.* 2>/dev/null | head -n 1)
check "the demo kept its logs" test -n "$demo_dir"
check "no sanitizer report in the programs' logs" \
    bash -c "! grep -l 'ERROR: AddressSanitizer\|ERROR: LeakSanitizer\|runtime error:' \
        '$demo_dir'/*.log"
