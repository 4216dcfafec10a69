#!/bin/sh
# `--scenario NAME` runs exactly what `--config configs/NAME.toml` runs: the same
# configuration (--print-config) and the same report, timings aside.
#
#   tests/apps/scenario_config_test.sh SEQPAR_REPRO SOURCE_DIR
set -u
repro=$1
source_dir=$2
failures=0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The report with its timings (ms/step, seconds) blanked out.
without_timings() {
  sed -E 's/[0-9.]+ (ms|us|s)([ /:)]|$)/T \1\2/g' "$1"
}

run="--device cpu --backend local --plot= --steps 2 -q"
for pair in issue-6868:issue6868 zero-stage:zero-stage shifted-targets:shifted-targets \
            clipping-norms:clipping-norms dropout:dropout masked-tokens:masked-tokens \
            context-parallel:context_parallel; do
  scenario=${pair%%:*}
  config=$source_dir/configs/${pair#*:}.toml
  "$repro" --print-config --scenario "$scenario" > "$work/scenario.toml"
  "$repro" --print-config --config "$config" > "$work/config.toml"
  if ! cmp -s "$work/scenario.toml" "$work/config.toml"; then
    echo "FAIL: --print-config --scenario $scenario differs from --config $config:"
    diff "$work/scenario.toml" "$work/config.toml" | head -n 10
    failures=$((failures + 1))
    continue
  fi
  # shellcheck disable=SC2086
  "$repro" --scenario "$scenario" $run > "$work/scenario.out" 2>&1
  status_scenario=$?
  # shellcheck disable=SC2086
  "$repro" --config "$config" $run > "$work/config.out" 2>&1
  status_config=$?
  without_timings "$work/scenario.out" > "$work/scenario.report"
  without_timings "$work/config.out" > "$work/config.report"
  if [ "$status_scenario" -ne 0 ] || [ "$status_config" -ne 0 ] ||
     ! cmp -s "$work/scenario.report" "$work/config.report"; then
    echo "FAIL: --scenario $scenario (exit $status_scenario) vs --config $config (exit $status_config):"
    diff "$work/scenario.report" "$work/config.report" | head -n 10
    failures=$((failures + 1))
  else
    echo "ok:   --scenario $scenario = --config $config ($(wc -l < "$work/scenario.report") lines)"
  fi
  # The report's lines stay within about 100 columns.
  if awk 'length($0) > 105 { found = 1 } END { exit !found }' "$work/scenario.out"; then
    echo "FAIL: --scenario $scenario: report lines over 105 columns:"
    awk 'length($0) > 105' "$work/scenario.out" | head -n 3
    failures=$((failures + 1))
  fi
done
[ "$failures" -eq 0 ] && echo "every scenario runs as its config" || echo "$failures failed"
[ "$failures" -eq 0 ]
