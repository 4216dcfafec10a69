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
# partial output, no temporary). A refusal (status 2) comes before the run: nothing on
# stdout. No case may send a raw ESC or BEL to the terminal. Prints one line per case
# and a count at the end; the --overwrite and signal tests follow the cases.
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
# Hostile YAML and JSON (each once crashed, hung or was read wrongly).
printf 'ds_config: &x {a: *x}\n' > "$fixtures/self-alias.yaml"
printf 'ds_config:\n  optimizer:\n    params:\n      betas: &b [0.9, *b]\n' > "$fixtures/self-alias-list.yaml"
python3 -c 'print("repro:\n  rows: " + "1" * 100000)' > "$fixtures/long-integer.yaml"
python3 -c 'print("repro:\n  dropout: 0." + "1" * 200000)' > "$fixtures/long-float.yaml"
python3 -c 'print("[" * 100000 + "]" * 100000)' > "$fixtures/deep-arrays.json"
python3 -c 'print("{\"a\": " * 100000 + "1" + "}" * 100000)' > "$fixtures/deep-objects.json"
python3 -c 'print("a: " + "[" * 3000 + "]" * 3000)' > "$fixtures/deep.yaml"
python3 - "$fixtures/laughs.yaml" <<'LAUGHS'  # 9^9 strings from 10 lines, under unread keys
import sys
lines = ['a: &a [' + ', '.join(['"lol"'] * 9) + ']']
for previous, level in zip("abcdefgh", "bcdefghi"):
    lines.append(f"{level}: &{level} [" + ", ".join([f"*{previous}"] * 9) + "]")
open(sys.argv[1], "w").write("\n".join(lines + ["ds_config: {}", ""]))
LAUGHS
printf 'repro:\n  rows: 64\n  rows: 65\n' > "$fixtures/duplicate.yaml"
printf 'ds_config:\n  steps_per_print: 1\nds_config:\n  fp16: {enabled: true}\n' > "$fixtures/duplicate-section.yaml"
printf '{"repro": {"rows": 64, "rows": 65}}\n' > "$fixtures/duplicate.json"
printf 'ds_config: {}\n---\nds_config:\n  fp16:\n    enabled: true\n' > "$fixtures/two-documents.yaml"
printf '{"repro": {"rows": 64}}\0{"repro": {"rows": 65}}\n' > "$fixtures/after-nul.json"
printf 'repro:\n  scenario: "\xff"\n' > "$fixtures/latin1.yaml"
printf 'repro:\n  rows: !!str 64\n' > "$fixtures/tagged-str.yaml"
printf 'ds_config:\n  "optimizer.params.lr": 0.5\n' > "$fixtures/dotted.yaml"
printf '{"optimizer.params.lr": 0.5}\n' > "$fixtures/dotted.json"
printf '[ds_config]\n"optimizer.params.lr" = 0.5\n' > "$fixtures/dotted.toml"
python3 -c 'print("[" + ".".join(["a"] * 60000) + "]")' > "$fixtures/deep-header.toml"
printf '{"repro": {"rows": 18446744073709551615}}\n' > "$fixtures/rows-2-64.json"
printf '{"repro": {"rows": 1e400}}\n' > "$fixtures/overflow.json"
printf 'ds_config:\n  [a]: 1\n' > "$fixtures/list-key.yaml"
printf 'ds_config:\n  optimizer:\n    type: "\\e]0;owned\\a"\n' > "$fixtures/escape-type.yaml"
printf 'ds_config:\n  "\\e[31mred": 1\n' > "$fixtures/escape-key.yaml"
printf 'ds_config: {}\n"x\\n[repro]\\nrows = 5": 1\n' > "$fixtures/newline-key.yaml"
printf 'secret\n' > "$fixtures/precious" && chmod 600 "$fixtures/precious"
ln -s "$fixtures/precious" "$fixtures/planted.svg"
ln -s "$fixtures/nowhere" "$fixtures/dangling.json"
mkdir -m 555 "$fixtures/read-only-dir"
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
    [ "$expected_status" -ne 2 ] || [ ! -s "$work/stdout" ] || problems+=("output on stdout before the refusal")
  else
    grep -qF -- "$expected_text" "$work/stdout" || problems+=("stdout does not contain '$expected_text'")
  fi
  LC_ALL=C grep -q $'[\x1b\x07]' "$work/stdout" "$work/stderr" && problems+=("a raw ESC or BEL on the terminal")
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
check "set empty key part" 2 "--set repro.=3: the key is not TOML" -- --set 'repro.=3'
check "set leading dot" 2 "--set .rows=3: the key is not TOML" -- --set '.rows=3'
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
# ---- text on which toml++ 3.3 reached undefined behaviour or an assertion: refused, with its place
check "U+FE0F after a value" 2 "U+FE0F" -- --config "$fixtures/fe0f.toml"
check "U+FE0F in --set" 2 "U+FE0F" -- --set $'repro.rows=1\xEF\xB8\x8F'
check "keyless table header" 2 "keyless-header.toml line 1 column 3: Error while parsing key" -- --config "$fixtures/keyless-header.toml"
check "not UTF-8" 2 "not valid UTF-8 (byte 0xFF)" -- --config "$fixtures/latin1.toml"
check "date with letters" 2 "date.toml line 2 column 19: Error while parsing time" -- --config "$fixtures/date.toml"

# ---- hostile YAML and JSON: crashes (recursion, stack, memory), each with file, line and limit
check "YAML alias in itself" 2 "self-alias.yaml line 1: nested deeper than the limit of 64" -- \
  --config "$fixtures/self-alias.yaml"
check "YAML alias in its list" 2 "nested deeper than the limit of 64" -- --config "$fixtures/self-alias-list.yaml"
check "YAML 100,000-digit integer" 2 "long-integer.yaml line 2: repro.rows: a number of 100000 characters" -- \
  --config "$fixtures/long-integer.yaml"
check "YAML 200,000-digit float" 2 "more than the limit of 100" -- --config "$fixtures/long-float.yaml"
# (nlohmann's parse callback refuses the depth now; it knows no line or column)
check "JSON 100,000 nested arrays" 2 "deep-arrays.json: nested deeper than the limit of 64" -- \
  --config "$fixtures/deep-arrays.json"
check "JSON 100,000 nested objects" 2 "nested deeper than the limit of 64" -- --config "$fixtures/deep-objects.json"
check "YAML 3,000 nested lists" 2 "deep.yaml line 1: nested deeper than the YAML parser's limit" -- \
  --config "$fixtures/deep.yaml"
check "YAML billion laughs" 2 "laughs.yaml line 1: more than the limit of 100000 values" -- \
  --config "$fixtures/laughs.yaml"
# ---- keys of many dotted parts: each part one level of recursion, in --set as in a file
long_key=$(python3 -c 'print(".".join(["a"] * 60000))')
check "--set key of 60,000 parts" 2 "a key of 119999 characters, more than the limit of 256" -- \
  --set "$long_key=1"
deep_key=$(python3 -c 'print(".".join(["a"] * 100))')
check "--set key 100 deep" 2 "nested deeper than the limit of 64 levels" -- --set "$deep_key=1"
check "TOML table of 60,000 parts" 2 "deep-header.toml: nested deeper than the limit of 64 levels" -- \
  --config "$fixtures/deep-header.toml"
# ---- wrong accepts
check "YAML duplicate key" 2 "duplicate.yaml line 3: duplicate key repro.rows (first at line 2)" -- \
  --config "$fixtures/duplicate.yaml"
check "YAML duplicate section" 2 "duplicate key ds_config (first at line 1)" -- \
  --config "$fixtures/duplicate-section.yaml"
check "JSON duplicate key" 2 "duplicate.json: duplicate key \"rows\"" -- --config "$fixtures/duplicate.json"
check "YAML second document" 2 "two-documents.yaml line 2: a second YAML document" -- \
  --config "$fixtures/two-documents.yaml"
check "JSON after a NUL" 2 "after-nul.json line 1 column 24: a control character (byte 0x00)" -- \
  --config "$fixtures/after-nul.json"
check "YAML not UTF-8" 2 "latin1.yaml line 2 column 14: not valid UTF-8 (byte 0xFF)" -- \
  --config "$fixtures/latin1.yaml"
check "YAML !!str 64 as rows" 2 "repro.rows must be an integer, got \"64\"" -- --config "$fixtures/tagged-str.yaml"
check "YAML dotted key" 2 "has a '.' in its name" -- --config "$fixtures/dotted.yaml"
check "JSON dotted key" 2 "has a '.' in its name" -- --config "$fixtures/dotted.json"
check "TOML dotted key" 2 "has a '.' in its name" -- --config "$fixtures/dotted.toml"
check "dropout 1e-30" 2 "repro.dropout = 1e-30 drops nothing" -- --scenario dropout --set repro.dropout=1e-30
check "json - and dump -" 2 "--dump -: a dump is a directory" -- "${small[@]}" --json - --dump -
check "json - and plot /dev/stdout" 2 "--json - and --plot /dev/stdout are the same file" -- \
  "${small[@]}" --json - --plot /dev/stdout
check "json and plot one file" 2 "--json out and --plot out are the same file" -- "${small[@]}" \
  --json out --plot out
check "plot -" 2 "--plot -: the picture is not written to standard output" -- "${small[@]}" --plot -
check "dump ''" 2 "--dump: the path is empty" -- "${small[@]}" --dump ''
check "json ''" 2 "--json: the path is empty" -- "${small[@]}" --json ''
check "dump d and plot d" 2 "--plot d and --dump d overlap" -- "${small[@]}" --dump d --plot d
# (--json: --plot now refuses any name but .svg before it could reach the dump's files)
check "json in the dump's files" 2 "overlap" -- "${small[@]}" --dump "$fixtures/empty-dir" \
  --json "$fixtures/empty-dir/inputs.safetensors"
check "plot not SVG" 2 "--plot out.png: the drift picture is written as SVG only" -- --plot out.png
# ---- errors that lacked the file name, or came after the run
check "YAML list as a key" 2 "list-key.yaml line 2: a key under ds_config is not a name" -- \
  --config "$fixtures/list-key.yaml"
check "JSON number overflow" 2 "overflow.json: number overflow parsing '1e400'" -- --config "$fixtures/overflow.json"
check "JSON rows 2^64-1" 2 "config key repro.rows = 18446744073709551615 is too large" -- \
  --config "$fixtures/rows-2-64.json"
check "json path of 5,000 characters" 2 "File name too long" -- "${small[@]}" --json "$(printf 'x%.0s' {1..5000})"
check "plot /proc/x" 2 "--plot /proc/x: cannot create files in /proc" -- "${small[@]}" --plot /proc/x
check "json onto a dangling link" 2 "is a symbolic link" -- "${small[@]}" --json "$fixtures/dangling.json"
if [ "$(id -u)" -ne 0 ]; then  # root writes anywhere
  check "dump into a read-only directory" 2 "cannot create files in" -- "${small[@]}" \
    --dump "$fixtures/read-only-dir"
fi
# ---- security: links planted at an output, names echoed to the terminal or into TOML
check "plot onto a planted link" 2 "planted.svg: is a symbolic link" -- "${small[@]}" --plot "$fixtures/planted.svg"
check "ESC in optimizer.type" 2 'type = "\x1b]0;owned\x07"' -- --config "$fixtures/escape-type.yaml"
check "ESC in a key" 2 'unknown config key ds_config.\x1b[31mred' -- --config "$fixtures/escape-key.yaml"
check "ESC in a --config path" 2 '--config \x1b[31m: cannot open' -- --config $'\e[31m'
check "print-config, newline in a key" 0 '# ignored: x\x0a[repro]\x0arows = 5 (outside ds_config' -- \
  --print-config --config "$fixtures/newline-key.yaml"
if grep -qx 'rows = 5' "$work/stdout"; then
  failed=$((failed + 1)); echo "FAIL  print-config: a key's line break made a live TOML line"
fi

# Files that must still be what they were.
[ -c /dev/full ] || { echo "FAIL  /dev/full is no longer a device"; failed=$((failed + 1)); }
[ "$(cat "$fixtures/dump-old/deepspeed-0.16/rank7.safetensors")" = old ] ||
  { echo "FAIL  the older dump was touched"; failed=$((failed + 1)); }
[ "$(cat "$fixtures/precious")" = secret ] && [ -L "$fixtures/planted.svg" ] ||
  { echo "FAIL  the planted link's target was written"; failed=$((failed + 1)); }

# --overwrite, the signals: tests/apps/dump_overwrite.sh.

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
