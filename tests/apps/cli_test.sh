#!/bin/sh
# seqpar-repro's command-line conventions, as a user meets them: the exit status and
# the one line each usage error prints.
#
#   tests/apps/cli_test.sh SEQPAR_REPRO SOURCE_DIR
set -u
repro=$1
source_dir=$2
failures=0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# expect STATUS TEXT ARGUMENTS...: runs seqpar-repro, checks its exit status, that
# TEXT is in its output, and that a usage error is one line with no source location.
expect() {
  status=$1 text=$2
  shift 2
  "$repro" "$@" > "$work/out" 2> "$work/err"
  actual=$?
  problem=""
  [ "$actual" -eq "$status" ] || problem="exit $actual, expected $status"
  grep -qF -- "$text" "$work/out" "$work/err" || problem="$problem; no '$text'"
  if [ "$status" -eq 2 ]; then
    [ "$(wc -l < "$work/err")" -eq 1 ] || problem="$problem; stderr is not one line"
    ! grep -qE '\.(cpp|h):[0-9]+' "$work/err" || problem="$problem; source location in the message"
  fi
  if [ -n "$problem" ]; then
    echo "FAIL: seqpar-repro $*: $problem"
    sed 's/^/  | /' "$work/out" "$work/err" | head -n 5
    failures=$((failures + 1))
  else
    echo "ok:   seqpar-repro $* -> $actual"
  fi
}

small="--device cpu --plot= --set repro.rows=400 --set ds_config.sequence_parallel_size=2"

expect 0 "usage: seqpar-repro" --help
expect 0 "seqpar-repro 0." --version
expect 2 "unknown option '--bogus'" --bogus
expect 2 "unknown option '--bogus'" --bogus=1
expect 2 "option --steps needs a value" --steps
expect 2 "--nproc needs a number of ranks" --nproc
expect 2 "'x' is not an integer" --steps=x
expect 2 "out of range" --steps 0
expect 2 "expected cpu or reference or cuda" --device=gpu
expect 2 "expected local or nccl" --backend tcp
expect 2 "unknown policy 'fixed'" --policy fixed
expect 2 "unexpected argument 'extra'" extra
expect 2 "takes no value" --print-config=yes
expect 2 "without a launcher's environment" --local_rank=0 $small
expect 2 "missing.toml: cannot open" --config "$work/missing.toml"
: > "$work/empty.toml"
expect 2 "ds_config.fp16" --config "$work/empty.toml" --set 'ds_config.fp16.enabled=true'
# --opt=value everywhere, and the config formats through --print-config.
expect 0 "steps = 2" --print-config --steps=2 --config="$source_dir/configs/issue6868.yaml"
expect 0 "sequence_parallel_size = 4" --print-config --config "$source_dir/configs/ds_config.json"
expect 0 "# ignored: ds_config.steps_per_print = 10" --print-config --config "$source_dir/configs/ds_config.json"

# --json - : the JSON on stdout (parseable), the report on stderr.
"$repro" $small --json - > "$work/json" 2> "$work/report"
if python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["schema"].startswith("seqpar-repro/")' "$work/json" &&
   grep -q "^summary" "$work/report"; then
  echo "ok:   --json - writes JSON to stdout, the report to stderr"
else
  echo "FAIL: --json -"; failures=$((failures + 1))
fi
[ ! -e ./- ] || { echo "FAIL: --json - wrote a file named '-'"; failures=$((failures + 1)); }

# DeepSpeed's launcher: --local_rank=N beside the variables, which must agree.
env RANK=0 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29999 \
  "$repro" $small --local_rank=0 > "$work/out" 2>&1
if [ $? -eq 2 ] && grep -q "disagrees with the launcher's local rank 1" "$work/out"; then
  echo "ok:   --local_rank checked against LOCAL_RANK"
else
  echo "FAIL: --local_rank vs LOCAL_RANK"; sed 's/^/  | /' "$work/out" | head -n 3
  failures=$((failures + 1))
fi

[ "$failures" -eq 0 ] && echo "all command-line checks passed" || echo "$failures failed"
[ "$failures" -eq 0 ]
