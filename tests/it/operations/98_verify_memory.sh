#!/bin/bash
# Proves `outbox-relay verify --json` costs no more memory than the window's rows, however many of
# them are missing: missing_events (every missing row, for `replay --missing`) was built whole as
# one JSON tree and then its text, some 700 bytes a row on top of the rows (200,000 rows all
# missing peaked at 224 MB, against 84 MB without --json), so a window of --max-rows rows all
# missing (a topic gone, the wrong brokers) took three times what the bound is documented to cost.
#  1. 200,000 rows marked sent whose topic does not exist: verify and verify --json both find all
#     200,000 missing (exit 1), and --json lists every one of them, in order;
#  2. the peak RSS of verify --json stays within a quarter (plus 8 MB) of verify's without it;
#  3. verify's own peak is under 300 bytes a row above that of a run that reads no window (one
#     refused by --max-rows 1, which creates no consumer: the consumer's share, a few MB, is in
#     the margin): the rows are read one at a time, each copied as it comes; read whole, the
#     result and the copies coexisted, some 420 bytes a row.
# The peaks are measured on the build without ASan (its allocator keeps freed memory a while).
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup
pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"

# Marked sent by hand, never produced: the topic outbox.event.order does not exist.
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, sent_at)
        SELECT 'order', 'o-' || (g % 1000), 'Updated', '{}', now()
        FROM generate_series(1, 200000) g" || fail "insert"

# peak_verify OUT [FLAGS...]: runs verify (the build without ASan), stdout to OUT; prints its peak
# RSS in kB and returns its exit status.
peak_verify() {
    local out=$1 rc
    shift
    /usr/bin/time -o "$T/time.out" -f "%M" "$BIN/outbox-relay" verify \
        --database-url "$DATABASE_URL" --brokers "$BROKERS" --since 1h --from-beginning "$@" \
        >"$out" 2>"$T/verify.err"
    rc=$?
    tail -n 1 "$T/time.out"
    return "$rc"
}

# --- 1. ---
plain_kb=$(peak_verify "$T/plain.out")
check_eq "1: verify: exit 1" 1 $?
check "1: ... all 200,000 rows missing" grep -q 'rows=200000 .*missing=200000 ' "$T/plain.out"
json_kb=$(peak_verify "$T/json.out" --json)
check_eq "1: verify --json: exit 1" 1 $?
check_eq "1: ... missing 200000, every row listed" "200000 200000" \
    "$(jq -r '"\(.missing) \(.missing_events | length)"' "$T/json.out")"
check_eq "1: ... in the rows' order, each with its event_id and topic" "true" \
    "$(jq '[.missing_events[].id] == [range(1; 200001)] and
           all(.missing_events[]; .event_id != null and .topic == "outbox.event.order")' \
        "$T/json.out")"

# --- 2. ---
echo "# peak RSS: ${plain_kb} kB without --json, ${json_kb} kB with it"
check "2: --json's peak RSS within a quarter (+8 MB) of verify's without it" \
    awk -v p="${plain_kb:-0}" -v j="${json_kb:-999999999}" 'BEGIN { exit !(p > 0 && j <= p * 1.25 + 8192) }'

# --- 3. ---
base_kb=$(peak_verify "$T/base.out" --max-rows 1)
check_eq "3: verify --max-rows 1: exit 2 (the window is larger)" 2 $?
echo "# peak RSS: ${base_kb} kB reading no window"
check "3: verify's peak RSS under 300 bytes a row above a run that reads no window" \
    awk -v p="${plain_kb:-999999999}" -v b="${base_kb:-0}" 'BEGIN { exit !(b > 0 && (p - b) * 1024 < 300 * 200000) }'
