#!/bin/sh
# `make monitoring-check`: the files of monitoring/ checked with the real tools.
#   - promtool check rules and promtool test rules (each alert's unit tests) on the alerting rules;
#   - the Grafana dashboard parses as JSON, and each panel's query parses as PromQL (promtool
#     checks them as recording rules, with Grafana's variables replaced by plain values), and
#     its stats of the whole table give the right number for two databases (promtool test rules);
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

# The table's stats add the databases up: every relay of a database reports the same table-wide
# value (the max over its relays is it), and the databases shown are summed; lanes are summed
# over the relays, and the database with the fewest owned is shown. Two relays serve two
# databases here; a stat taking the max (or the sum) over every series would show 100 (or 96).
panel() { # panel TITLE: the first query of the stat panel TITLE, its variables replaced
    jq -r --arg t "$1" '.panels[] | select(.title == $t and .type == "stat") | .targets[0].expr' \
        outbox-relay.dashboard.json | sed -e 's/\$__rate_interval/5m/g' -e 's/\$job/.*/g' \
        -e 's/\$instance/.*/g' -e 's/\$database/.*/g'
}
cat >"$tmp/stats.rules.yml" <<RULES
groups:
  - name: stats
    rules:
      - record: stat:backlog
        expr: '$(panel Backlog)'
      - record: stat:dead
        expr: '$(panel Dead-lettered)'
      - record: stat:lanes
        expr: '$(panel "Lanes owned")'
RULES
cat >"$tmp/stats.test.yml" <<'TEST'
rule_files: [stats.rules.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - {series: 'outbox_backlog_rows{job="r", instance="a", database="orders"}', values: '100'}
      - {series: 'outbox_backlog_rows{job="r", instance="b", database="orders"}', values: '100'}
      - {series: 'outbox_backlog_rows{job="r", instance="a", database="billing"}', values: '30'}
      - {series: 'outbox_backlog_rows{job="r", instance="b", database="billing"}', values: '30'}
      - {series: 'outbox_dead_letter_rows{job="r", instance="a", database="orders"}', values: '2'}
      - {series: 'outbox_dead_letter_rows{job="r", instance="b", database="orders"}', values: '2'}
      - {series: 'outbox_dead_letter_rows{job="r", instance="a", database="billing"}', values: '1'}
      - {series: 'outbox_dead_letter_rows{job="r", instance="b", database="billing"}', values: '1'}
      - {series: 'outbox_lanes_owned{job="r", instance="a", database="orders"}', values: '40'}
      - {series: 'outbox_lanes_owned{job="r", instance="b", database="orders"}', values: '24'}
      - {series: 'outbox_lanes_owned{job="r", instance="a", database="billing"}', values: '32'}
      - {series: 'outbox_lanes_owned{job="r", instance="b", database="billing"}', values: '0'}
    promql_expr_test:
      - {expr: 'stat:backlog', eval_time: 0m, exp_samples: [{labels: 'stat:backlog', value: 130}]}
      - {expr: 'stat:dead', eval_time: 0m, exp_samples: [{labels: 'stat:dead', value: 3}]}
      - {expr: 'stat:lanes', eval_time: 0m, exp_samples: [{labels: 'stat:lanes', value: 32}]}
TEST
(cd "$tmp" && promtool test rules stats.test.yml) >"$tmp/stats.out" 2>&1 ||
    { cat "$tmp/stats.out" >&2; fail "a stat of the dashboard does not add up the databases (above)"; }
echo "monitoring-check: the dashboard's Backlog, Dead-lettered and Lanes owned stats add up two databases"

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
