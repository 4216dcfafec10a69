#!/usr/bin/env bash
# The bad-input corpus: seqpar-repro run as a hostile user would, one case per row.
#
#   tests/apps/bad_input.sh path/to/seqpar-repro
#
# Each case runs in an empty directory of its own, under a time limit, and must: end
# with the expected exit status (2 for what the user gave wrong, 1 for an output that
# failed, 0 for input that is valid), not by a signal and not by the time limit; print
# on stderr exactly one line that starts with "seqpar-repro: " (or "seqpar launcher: ",
# for --nproc) and names the key, option
# or file (the case's expected text); and leave no file behind in its directory (no
# partial output, no temporary). Prints one line per case and a count at the end.
set -uo pipefail
program=$(readlink -f "$1")
work=$(mktemp -d "${TMPDIR:-/tmp}/seqpar_bad_input.XXXXXX")
trap 'rm -rf "$work"' EXIT
fixtures="$work/fixtures"
mkdir -p "$fixtures/dump-old/deepspeed-0.16" "$fixtures/empty-dir"
mkfifo "$fixtures/fifo"
printf 'a = 1\xEF\xB8\x8F\n' > "$fixtures/fe0f.toml"
printf '[ =""[repro]\n' > "$fixtures/keyless-header.toml"
printf '[repro]\nrows = \xff\n' > "$fixtures/latin1.toml"
printf '[repro]\nrows = 1979-05-27Tbe:32:00Z\n' > "$fixtures/date.toml"
printf 'old\n' > "$fixtures/dump-old/deepspeed-0.16/rank7.safetensors"
printf 'x\n' > "$fixtures/regular-file"
head -c 2000000 /dev/zero | tr '\0' '#' > "$fixtures/big.toml"
# A small scenario that runs in a second: for the cases that must succeed.
small=(--device cpu --backend local --steps 2 --set repro.rows=64 --set repro.in_features=8
       --set repro.out_features=2)

passed=0
failed=0

# check NAME STATUS EXPECTED -- ARGUMENTS...: runs one case and judges it.
check() {
  local name=$1 expected_status=$2 expected_text=$3
  shift 4
  local dir="$work/case"
  rm -rf "$dir" && mkdir -p "$dir"
  local status
  (cd "$dir" && exec timeout -s KILL 120 "$program" "$@" > "$work/stdout" 2> "$work/stderr")
  status=$?
  local problems=()
  [ "$status" -eq "$expected_status" ] || problems+=("exit status $status, expected $expected_status")
  [ "$status" -lt 128 ] || problems+=("ended by signal $((status - 128)) (137: the time limit)")
  if [ "$expected_status" -ne 0 ]; then
    local lines
    lines=$(wc -l < "$work/stderr")
    [ "$lines" -eq 1 ] || problems+=("$lines lines on stderr, expected one")
    head -n 1 "$work/stderr" | grep -Eq '^seqpar(-repro| launcher): ' || problems+=("no 'seqpar-repro: ' prefix")
    grep -qF -- "$expected_text" "$work/stderr" || problems+=("stderr does not name '$expected_text'")
    grep -q 'seqpar error at\|\.cpp:[0-9]' "$work/stderr" && problems+=("an internal error's file:line")
  else
    grep -qF -- "$expected_text" "$work/stdout" || problems+=("stdout does not contain '$expected_text'")
  fi
  local left
  left=$(cd "$dir" && find . -mindepth 1 | sort | tr '\n' ' ')
  [ -z "$left" ] || problems+=("left behind: $left")
  if [ ${#problems[@]} -eq 0 ]; then
    passed=$((passed + 1))
    echo "ok    $name"
  else
    failed=$((failed + 1))
    echo "FAIL  $name: ${problems[*]}"
    sed 's/^/        stderr: /' "$work/stderr" | head -n 5
  fi
}

# ---- sizes that overflowed or exhausted memory (a segfault, a 16 GiB fill)
check "rows 2^62" 2 "repro.rows" -- --set repro.rows=4611686018427387904
check "in = out = 2^32" 2 "repro.out_features x repro.in_features" -- \
  --set repro.in_features=4294967296 --set repro.out_features=4294967296
check "dp 2^62" 2 "ds_config.data_parallel_size" -- --set ds_config.data_parallel_size=4611686018427387904
check "sp x dp beyond 1024" 2 "must be at most 1024" -- --set ds_config.sequence_parallel_size=2048 \
  --set repro.rows=4096
check "rows beyond memory" 2 "GiB of memory" -- --set repro.rows=100000000
check "negative rows" 2 "repro.rows = -5" -- --set repro.rows=-5
check "in_features 0" 2 "repro.in_features = 0" -- --set repro.in_features=0
# ---- what hung
check "lr 1e308" 2 "ds_config.optimizer.params.lr" -- --set ds_config.optimizer.params.lr=1e308
check "lr 1e39" 2 "ds_config.optimizer.params.lr = 1e+39" -- --set ds_config.optimizer.params.lr=1e39
check "steps 10^12" 2 "repro.steps = 1000000000000" -- --steps 1000000000000
check "steps 0" 2 "--steps 0 is out of range" -- --steps 0
check "steps not a number" 2 "--steps 'abc' is not an integer" -- --steps abc
check "steps beyond int64" 2 "--steps '99999999999999999999'" -- --steps 99999999999999999999
check "config FIFO" 2 "a FIFO, not a regular file" -- --config "$fixtures/fifo"
check "config /dev/zero" 2 "/dev/zero: a character device" -- --config /dev/zero
check "config directory" 2 "a directory, not a regular file" -- --config "$fixtures/empty-dir"
check "config missing" 2 "No such file or directory" -- --config "$fixtures/missing.toml"
check "config 2 MB" 2 "more than the limit" -- --config "$fixtures/big.toml"
# ---- wrong inputs that were accepted
check "eps inf" 2 "ds_config.optimizer.params.eps = inf" -- --set ds_config.optimizer.params.eps=inf
check "eps nan" 2 "ds_config.optimizer.params.eps = nan" -- --set ds_config.optimizer.params.eps=nan
check "weight_decay inf" 2 "weight_decay = inf" -- --set ds_config.optimizer.params.weight_decay=inf
check "gradient_clipping inf" 2 "gradient_clipping = inf" -- --set ds_config.gradient_clipping=inf
check "lr 0" 2 "lr = 0: must be in (0, 1]" -- --set ds_config.optimizer.params.lr=0
check "lr below float32" 2 "not representable in float32" -- --set ds_config.optimizer.params.lr=1e-60
check "beta rounds to 1" 2 "betas[1] = 0.99999999" -- \
  --set 'ds_config.optimizer.params.betas=[0.9, 0.99999999]'
check "dropout 1" 2 "repro.dropout = 1: the drop probability must be in [0, 1)" -- --set repro.dropout=1
check "dropout rounds to 1" 2 "repro.dropout = 0.99999999" -- --set repro.dropout=0.99999999
check "dropout nan" 2 "repro.dropout = nan" -- --set repro.dropout=nan
check "dropout scenario, p 0" 2 "repro.dropout = 0 drops nothing" -- --scenario dropout --set repro.dropout=0
check "set with line breaks" 2 "control characters" -- --set $'repro.rows=64\n[repro]\nseed = 5'
check "set empty key part" 2 "empty key part" -- --set 'repro.=3'
check "set leading dot" 2 "empty key part" -- --set '.rows=3'
check "set unknown key" 2 "unknown config key repro.colums" -- --set repro.colums=3
check "set without =" 2 "expected section.key=value" -- --set repro.rows
check "set quoted key" 0 "rows = 1001" -- --set 'repro."rows"=1001' --print-config
check "set inline table" 2 "repro.rows must be an integer" -- --set 'repro.rows={}'
# ---- options
check "unknown option" 2 "unknown option '--colour'" -- --colour
check "option without value" 2 "option --json needs a value" -- --json
check "bad device" 2 "--device 'gpu'" -- --device gpu
check "bad policy" 2 "unknown policy 'fixed'" -- --policy fixed
check "timeout 0" 2 "--timeout 0" -- --timeout 0
check "timeout text" 2 "--timeout soon" -- --timeout soon
check "nproc 999999" 2 "--nproc 999999: at most 1024" -- --nproc 999999
check "nproc 100000" 2 "at most 1024" -- --nproc 100000
# ---- outputs: refused before the run, or failed without a partial file
check "json to /dev/full" 1 "/dev/full: write: No space left on device" -- "${small[@]}" --plot '' \
  --json /dev/full
check "plot to /dev/full" 1 "/dev/full: write: No space left on device" -- "${small[@]}" --plot /dev/full
check "json into a directory" 2 "--json $fixtures/empty-dir: is a directory" -- "${small[@]}" \
  --json "$fixtures/empty-dir"
check "json in a missing directory" 2 "--json $fixtures/none/x.json" -- "${small[@]}" \
  --json "$fixtures/none/x.json"
check "dump onto a file" 2 "exists and is not a directory" -- "${small[@]}" --plot '' \
  --dump "$fixtures/regular-file"
check "dump into an older dump" 2 "the directory is not empty" -- "${small[@]}" --plot '' \
  --dump "$fixtures/dump-old"
check "json to /dev/null" 0 "figures (JSON): /dev/null" -- "${small[@]}" --plot '' --json /dev/null
# ---- text toml++ 3.3 must not see (undefined behaviour or asserts in it)
check "U+FE0F after a value" 2 "U+FE0F" -- --config "$fixtures/fe0f.toml"
check "U+FE0F in --set" 2 "U+FE0F" -- --set $'repro.rows=1\xEF\xB8\x8F'
check "keyless table header" 2 "a table header without a key" -- --config "$fixtures/keyless-header.toml"
check "not UTF-8" 2 "not valid UTF-8 (byte 0xFF)" -- --config "$fixtures/latin1.toml"
check "date with letters" 2 "a date or time" -- --config "$fixtures/date.toml"

# Files that must still be what they were.
[ -c /dev/full ] || { echo "FAIL  /dev/full is no longer a device"; failed=$((failed + 1)); }
[ "$(cat "$fixtures/dump-old/deepspeed-0.16/rank7.safetensors")" = old ] ||
  { echo "FAIL  the older dump was touched"; failed=$((failed + 1)); }

# --overwrite replaces an older dump: no file of it stays beside the new one.
dump="$work/dump-overwrite"
cp -r "$fixtures/dump-old" "$dump"
if (cd "$work" && timeout -s KILL 120 "$program" "${small[@]}" --plot '' --policy exact \
      --dump "$dump" --overwrite > /dev/null 2>&1) &&
    [ ! -e "$dump/deepspeed-0.16/rank7.safetensors" ] && [ -s "$dump/exact/rank0.safetensors" ] &&
    [ -z "$(find "$dump" -name '.*tmp*')" ]; then
  passed=$((passed + 1))
  echo "ok    dump --overwrite replaces an older dump"
else
  failed=$((failed + 1))
  echo "FAIL  dump --overwrite: $(find "$dump" | tr '\n' ' ')"
fi

# A report that cannot be written is a failed run, not exit 0.
(cd "$work" && timeout -s KILL 120 "$program" --print-config > /dev/full 2> "$work/stderr")
status=$?
if [ "$status" -eq 1 ] && grep -q "cannot write the report to standard output" "$work/stderr"; then
  passed=$((passed + 1))
  echo "ok    report to /dev/full"
else
  failed=$((failed + 1))
  echo "FAIL  report to /dev/full: exit status $status, stderr: $(cat "$work/stderr")"
fi

echo "bad-input corpus: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
