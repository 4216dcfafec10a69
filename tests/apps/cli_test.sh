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

small="--device cpu --plot= -q --set repro.rows=400 --set ds_config.sequence_parallel_size=2"

expect 0 "usage: seqpar-repro" --help
# --help describes every option, with its default, and gives examples.
"$repro" --help > "$work/help"
for option in --scenario --list-scenarios --config --set --steps --policy --device --backend \
              --nproc --dump --overwrite --json --plot --timeout --print-config --quiet \
              --local_rank --version --help; do
  grep -qe "^  .*$option" "$work/help" || { echo "FAIL: --help lacks $option"; failures=$((failures + 1)); }
done
[ "$(grep -c 'Default:' "$work/help")" -ge 10 ] && grep -q '^examples:' "$work/help" &&
  ! grep -q 'README' "$work/help" || { echo "FAIL: --help lacks defaults or examples"; failures=$((failures + 1)); }
expect 2 "did you mean --steps?" --step 3
expect 2 "did you mean --config?" --cnofig=a.toml
expect 2 "unexpected argument 'x' after --" --print-config -- x
expect 0 "steps = 3" --print-config --steps 3 --
# --set takes a string without quotes; what is neither TOML nor a bare word is refused.
expect 0 "type = 'AdamW'" --print-config --set ds_config.optimizer.type=AdamW
expect 0 "scenario = 'dropout'" --print-config --set repro.scenario=dropout
expect 2 "the value is not TOML" --print-config --set 'ds_config.optimizer.params.betas=[0.9,'
# --print-config writes floats in their shortest form.
expect 0 "betas = [0.9, 0.95]" --print-config --set 'ds_config.optimizer.params.betas=[0.9, 0.95]'
if "$repro" --print-config | grep -qE '[0-9]{12}'; then
  echo "FAIL: --print-config prints a float with 12 digits or more"; failures=$((failures + 1))
fi
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
printf '[repro]\nseed = 7\n' > "$work/seed.toml"
expect 2 "ds_config.fp16" --config "$work/seed.toml" --set 'ds_config.fp16.enabled=true'

# A user's config: what it leaves out is the scenario's, and the report says which.
printf '{"sequence_parallel_size": 2, "train_batch_size": 4, "train_micro_batch_size_per_gpu": 4}\n' \
  > "$work/partial.json"
expect 0 "not given   by your config, so configs/issue6868.toml's: data_parallel_size = 1," \
  --config "$work/partial.json" --device cpu --plot= -q --set repro.rows=400
grep -q "gradient_clipping = 1.0," "$work/out" && grep -q "optimizer.params.lr = 1e-4," "$work/out" ||
  { echo "FAIL: the report does not list lr as the scenario's"; failures=$((failures + 1)); }
printf '{"sequence_parallel_size": 2, "gradient_clipping": 0.5, "repro": {"steps": 2}}\n' > "$work/mine.json"
expect 0 "sp 2" --config "$work/mine.json" --device cpu --plot= -q --set repro.rows=400
! grep -q "gradient_clipping = " "$work/out" ||
  { echo "FAIL: a key the config sets is listed as not given"; failures=$((failures + 1)); }
# A config without settings, a null, a batch size DeepSpeed would refuse.
: > "$work/empty.toml"
expect 2 "holds no settings" --config "$work/empty.toml"
echo '{}' > "$work/empty.json"
expect 2 "holds no settings" --config "$work/empty.json"
echo '{"gradient_clipping": null}' > "$work/null.json"
expect 2 "ds_config.gradient_clipping is null: write a value (0 turns clipping off)" --config "$work/null.json"
echo '{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4}' > "$work/batch.json"
expect 2 "train_batch_size = 8: DeepSpeed requires train_micro_batch_size_per_gpu 4 x gradient_accumulation_steps 1 x data_parallel_size 1 = 4" \
  --config "$work/batch.json"
# Every refusal of a config at once: here three "auto" values and fp16.
echo '{"train_batch_size": "auto", "gradient_accumulation_steps": "auto",
       "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}, "fp16": {"enabled": true}}' > "$work/auto.json"
"$repro" --config "$work/auto.json" > "$work/out" 2> "$work/err"
if [ $? -eq 2 ] && grep -q "4 settings refused" "$work/err" && [ "$(grep -o '"auto"' "$work/err" | wc -l)" -eq 3 ] && [ "$(wc -l < "$work/err")" -eq 1 ] &&
   grep -q "ds_config.fp16" "$work/err"; then
  echo "ok:   every refusal of a config at once"
else
  echo "FAIL: refusals of auto.json"; sed 's/^/  | /' "$work/err" | head -n 6; failures=$((failures + 1))
fi
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

# -q: no progress, even on a run long enough to show it; the report still prints.
"$repro" $small -q --set repro.rows=20000 --set repro.in_features=2000 --steps 3 > "$work/out" 2> "$work/err"
if [ $? -eq 0 ] && [ ! -s "$work/err" ] && grep -q "^summary" "$work/out"; then
  echo "ok:   -q prints the report and nothing on stderr"
else
  echo "FAIL: -q"; sed 's/^/  | /' "$work/err" | head -n 3; failures=$((failures + 1))
fi

# Output options: the same in every scenario, or refused there by name.
expect 2 "--policy: scenario clipping-norms runs its own variants" --scenario clipping-norms --policy exact
expect 2 "--plot: scenario dropout draws no drift picture" --scenario dropout --plot d.svg
# The drift picture: only for 2 steps or more, with its CSV beside it.
expect 0 "drift picture: none for a single step" $small --plot "$work/one.svg"
[ ! -e "$work/one.svg" ] || { echo "FAIL: a picture for one step"; failures=$((failures + 1)); }
expect 0 "drift picture: $work/d.svg" --device cpu -q --set repro.rows=400 --steps 3 --plot "$work/d.svg"
if grep -q "from one rank" "$work/d.svg" && [ "$(wc -l < "$work/d.csv")" -eq 10 ] &&
   head -n 1 "$work/d.csv" | grep -q "^policy,step,max_difference_across_ranks,max_difference_from_one_rank$"; then
  echo "ok:   the drift picture shows both distances; its CSV has a line per policy and step"
else
  echo "FAIL: drift picture or CSV"; failures=$((failures + 1))
fi

# Launcher variables: only a whole set is a launch; --backend local ignores them; a
# malformed set is a one-line usage error.
env SLURM_PROCID=0 SLURM_NTASKS=4 SLURM_LOCALID=0 SLURM_JOB_ID=1 \
  "$repro" $small > "$work/out" 2> "$work/err"
[ $? -eq 0 ] && echo "ok:   an sbatch shell's Slurm variables are no launch" ||
  { echo "FAIL: sbatch shell"; sed 's/^/  | /' "$work/err" | head -n 3; failures=$((failures + 1)); }
env SLURM_PROCID=0 SLURM_NTASKS=4 SLURM_LOCALID=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29999 \
  "$repro" $small --backend local > "$work/out" 2> "$work/err"
[ $? -eq 0 ] && grep -q "as threads of one process" "$work/out" &&
  echo "ok:   --backend local wins over a whole Slurm set" ||
  { echo "FAIL: --backend local under Slurm"; sed 's/^/  | /' "$work/err" | head -n 3; failures=$((failures + 1)); }
env RANK=x WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29999 \
  "$repro" $small > "$work/out" 2> "$work/err"
[ $? -eq 2 ] && [ "$(wc -l < "$work/err")" -eq 1 ] && grep -q "RANK='x' is not" "$work/err" &&
  ! grep -qE '\.(cpp|h):[0-9]+' "$work/err" && echo "ok:   a malformed launcher variable: one line, exit 2" ||
  { echo "FAIL: malformed RANK"; sed 's/^/  | /' "$work/err" | head -n 3; failures=$((failures + 1)); }
# --nproc without a GPU per rank (or without NCCL): one line before any rank starts.
expect 2 "--nproc 512" --nproc 512 $small

# DeepSpeed's launcher: --local_rank=N beside the variables, which must agree.
env RANK=0 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29999 \
  "$repro" $small --local_rank=0 > "$work/out" 2>&1
if [ $? -eq 2 ] && grep -q "disagrees with the launcher's local rank 1" "$work/out"; then
  echo "ok:   --local_rank checked against LOCAL_RANK"
else
  echo "FAIL: --local_rank vs LOCAL_RANK"; sed 's/^/  | /' "$work/out" | head -n 3
  failures=$((failures + 1))
fi

# The bug report's own launch line (deepspeed train_sp.py --config-file=config.yaml
# --deepspeed), and DeepSpeed's --deepspeed_config FILE; one config file at most.
expect 0 "summary" $small --config-file="$source_dir/configs/issue6868.yaml" --deepspeed
expect 0 "summary" $small --deepspeed_config "$source_dir/configs/ds_config.json"
expect 2 "a config was already given" --config-file=a.yaml --deepspeed_config b.json
# A value never comes from the next option (argparse's "expected one argument").
expect 2 "option --json needs a value, got the option '-q'" $small --json -q
[ ! -e ./-q ] || { echo "FAIL: --json -q wrote a file named -q"; rm -f ./-q; failures=$((failures + 1)); }
expect 2 "option --config needs a value, got the option '-q'" --config -q
expect 0 "figures (JSON)" $small --json=-q.json --set repro.steps=1
rm -f ./-q.json
# --plot writes SVG only: another extension is refused, not given SVG under its name.
expect 2 "--plot out.png: the drift picture is written as SVG only" --plot out.png
# A config key's typo gets a did-you-mean; the program itself lists the keys.
expect 2 "unknown config key repro.setps; did you mean repro.steps?" --set repro.setps=3
expect 2 "did you mean ds_config.gradient_clipping?" --set ds_config.gradient_cliping=1
expect 0 "#   ds_config.zero_optimization.stage" --print-config
# Every refusal of a config at once: ZeRO-3 beside bf16, a scheduler and offload.
cat > "$work/many.json" <<'JSON'
{"bf16": {"enabled": true}, "scheduler": {"type": "WarmupLR"},
 "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}
JSON
expect 2 "stage = 3" --config "$work/many.json"
for refused in bf16 scheduler offload_optimizer; do
  grep -qF "$refused" "$work/err" || { echo "FAIL: $refused not refused with ZeRO-3"; failures=$((failures + 1)); }
done
# A launch on a machine without a GPU per rank (or without NCCL): one line, exit 2,
# naming the variables and --backend local; never an internal "seqpar error at".
for launch in "RANK=0 WORLD_SIZE=4 LOCAL_RANK=0" "SLURM_PROCID=0 SLURM_NTASKS=4 SLURM_LOCALID=0"; do
  env $launch MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 "$repro" --device cpu -q > "$work/out" 2> "$work/err"
  if [ $? -eq 2 ] && [ "$(wc -l < "$work/err")" -eq 1 ] && grep -q -- "--backend local" "$work/err" &&
     grep -q "${launch%%=*}" "$work/err" && ! grep -q "seqpar error at" "$work/err"; then
    echo "ok:   $launch without a GPU per rank: one line naming the variables, exit 2"
  else
    echo "FAIL: $launch without GPUs"; sed 's/^/  | /' "$work/err" | head -n 3; failures=$((failures + 1))
  fi
done
# A malformed launcher value is refused, named, even in an incomplete set; an incomplete
# set that is ignored is named in one line.
for bad in "RANK=0 WORLD_SIZE=0 LOCAL_RANK=0:WORLD_SIZE=0" "PMI_RANK=abc PMI_SIZE=4:PMI_RANK='abc'" \
           "PMI_SIZE=0:PMI_SIZE=0"; do
  env ${bad%%:*} "$repro" $small > "$work/out" 2> "$work/err"
  [ $? -eq 2 ] && [ "$(wc -l < "$work/err")" -eq 1 ] && grep -qF "${bad#*:}" "$work/err" &&
    echo "ok:   ${bad%%:*}: refused, named" ||
    { echo "FAIL: ${bad%%:*}"; sed 's/^/  | /' "$work/err" | head -n 3; failures=$((failures + 1)); }
done
for lone in PMI_RANK OMPI_COMM_WORLD_RANK; do
  env $lone=0 "$repro" $small > "$work/out" 2> "$work/err"
  [ $? -eq 0 ] && [ "$(wc -l < "$work/err")" -eq 1 ] && grep -q "$lone set, but not a launcher's whole set" "$work/err" &&
    echo "ok:   a lone $lone is named as ignored" ||
    { echo "FAIL: lone $lone"; sed 's/^/  | /' "$work/err" | head -n 3; failures=$((failures + 1)); }
done
# Echoed values are abbreviated: a 100,000-character argument is not sent back whole.
long=$(printf 'x%.0s' $(seq 1 100000))
for option in --scenario --config; do
  "$repro" $option "$long" > "$work/out" 2> "$work/err"
  [ $? -eq 2 ] && [ "$(wc -c < "$work/err")" -lt 1000 ] && echo "ok:   $option of 100,000 characters: abbreviated" ||
    { echo "FAIL: $option echoed whole ($(wc -c < "$work/err") bytes)"; failures=$((failures + 1)); }
done
"$repro" --set "ds_config.optimizer.type=$long" > "$work/out" 2> "$work/err"
[ $? -eq 2 ] && [ "$(wc -c < "$work/err")" -lt 1000 ] && echo "ok:   a config value of 100,000 characters: abbreviated" ||
  { echo "FAIL: a config value echoed whole ($(wc -c < "$work/err") bytes)"; failures=$((failures + 1)); }

[ "$failures" -eq 0 ] && echo "all command-line checks passed" || echo "$failures failed"
[ "$failures" -eq 0 ]
