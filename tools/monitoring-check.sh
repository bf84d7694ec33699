#!/bin/sh
# `make monitoring-check`: the files of monitoring/ checked with the real tools.
#   - promtool check rules and promtool test rules (each alert's unit tests) on the alerting rules;
#   - the Grafana dashboard parses as JSON, and each panel's query parses as PromQL (promtool
#     checks them as recording rules, with Grafana's variables replaced by plain values);
#   - every outbox_* metric the rules and the dashboard name is one the relay's metrics.c serves, and
#     the dashboard shows every metric it serves, so a renamed or new metric cannot go unnoticed.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT/monitoring"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "monitoring-check: $*" >&2; exit 1; }

promtool check rules outbox-relay.rules.yml
promtool test rules outbox-relay.rules.test.yml

jq -e '.panels | length > 0' outbox-relay.dashboard.json >/dev/null ||
    fail "outbox-relay.dashboard.json: not JSON, or no panels"
{
    echo "groups:"
    echo "  - name: dashboard"
    echo "    rules:"
    jq -r '.panels[] | select(.targets) | .title as $t | .targets[] | [$t, .expr] | @tsv' \
        outbox-relay.dashboard.json |
        awk -F '\t' '{
            e = $2
            gsub(/\$__rate_interval/, "5m", e)
            gsub(/\$(job|instance|database)/, ".*", e)
            gsub(/\x27/, "\x27\x27", e)
            printf "      - record: dashboard:panel_%d\n        expr: \x27%s\x27\n", NR, e
        }'
} >"$tmp/dashboard.rules.yml"
promtool check rules "$tmp/dashboard.rules.yml" >"$tmp/promtool.out" 2>&1 ||
    { cat "$tmp/promtool.out" >&2; fail "a dashboard query is not valid PromQL (above)"; }
echo "monitoring-check: the dashboard's $(grep -c 'record:' "$tmp/dashboard.rules.yml") queries parse as PromQL"

# Wherever the layout puts it (relay/service/metrics.c today).
metrics_c=$(find "$ROOT/relay" -name metrics.c | head -n 1)
[ -n "$metrics_c" ] || fail "no metrics.c under relay/"
grep -o '"outbox_[a-z_]*"' "$metrics_c" | tr -d '"' | sort -u >"$tmp/served"
[ -s "$tmp/served" ] || fail "no outbox_* metric name found in $metrics_c"
for f in outbox-relay.rules.yml outbox-relay.dashboard.json; do
    grep -o 'outbox_[a-z_]*[a-z]' "$f" | sed -E 's/_(bucket|sum|count)$//' | sort -u >"$tmp/used"
    unknown=$(comm -23 "$tmp/used" "$tmp/served")
    [ -z "$unknown" ] || fail "$f names metrics ${metrics_c#"$ROOT"/} does not serve: $unknown"
done
missing=$(comm -13 "$tmp/used" "$tmp/served")
[ -z "$missing" ] || fail "outbox-relay.dashboard.json shows no panel for: $missing"
echo "monitoring-check: rules and dashboard name only served metrics; the dashboard shows all $(wc -l <"$tmp/served")"
