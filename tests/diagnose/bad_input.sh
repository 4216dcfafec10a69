#!/usr/bin/env bash
# seqpar-diagnose given bad input, one case per row (fixtures: make_fixtures.py).
#
#   tests/diagnose/bad_input.sh path/to/seqpar-diagnose
#
# Each case runs in an empty directory of its own with --json out.json and must end
# with the expected exit status (2 for what the user gave wrong), print exactly one
# line on stderr that starts with "seqpar-diagnose: " and names what was wrong (the
# case's expected text), with no source location, and leave no file behind (no JSON,
# no temporary). The valid cases (0) must write their JSON and name the verdict.
set -uo pipefail
program=$(readlink -f "$1")
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/seqpar_diagnose_bad_input.XXXXXX")
trap 'rm -rf "$work"' EXIT
fx="$work/fixtures"
python3 "$here/make_fixtures.py" "$fx" || { echo "FAIL: cannot write the fixtures"; exit 1; }
mkfifo "$fx/fifo_rank0.safetensors"
mkdir "$fx/dir_rank0.safetensors"
printf '{"sequence_paralel_size": 4}\n' > "$fx/typo.json"
printf '{"sequence_parallel_size": 4, "fp16": {"enabled": true}}\n' > "$fx/fp16.json"
# A Hugging Face Trainer's DeepSpeed config: bf16, a scheduler, ZeRO with offload, and
# "auto" on keys the diagnosis does not read.
cat > "$fx/hf.json" <<'JSON'
{"bf16": {"enabled": "auto"}, "fp16": {"enabled": false},
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
 "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
               "warmup_num_steps": "auto", "total_num_steps": "auto"}},
 "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": true},
                       "offload_param": {"device": "cpu"}, "stage3_gather_16bit_weights_on_model_save": true},
 "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "train_batch_size": "auto",
 "train_micro_batch_size_per_gpu": "auto", "steps_per_print": 2000, "wall_clock_breakdown": false}
JSON
sed 's/"lr": 1e-4/"lr": "auto"/' "$fx/hf.json" > "$fx/hf_auto_lr.json"
printf '{"optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}\n' > "$fx/plain.json"
head -c 1048577 /dev/zero | tr '\0' ' ' > "$fx/huge.json"
ln -s "$fx/good_rank1.safetensors" "$fx/link_to_rank1.json"
ln -s "$fx/noname.safetensors" "$fx/linked_rank0.safetensors"
passed=0
failed=0

# The fixtures' bytes (regular files only: the FIFO would block): no case may change them.
inputs_digest() {
  find "$fx" -type f -print0 | sort -z | xargs -0 cat | md5sum
}

# check NAME STATUS EXPECTED -- ARGUMENTS...
check() {
  local name=$1 expected_status=$2 expected_text=$3
  shift 4
  local dir="$work/case"
  rm -rf "$dir" && mkdir -p "$dir"
  local status
  local before
  before=$(inputs_digest)
  (cd "$dir" && exec timeout -s KILL 60 "$program" --json out.json "$@" > "$work/stdout" 2> "$work/stderr")
  status=$?
  local problems=()
  [ "$(inputs_digest)" = "$before" ] || problems+=("an input file changed")
  grep -q $'\x1b' "$work/stdout" "$work/stderr" && problems+=("a raw ESC reached the terminal")
  [ "$status" -eq "$expected_status" ] || problems+=("exit status $status, expected $expected_status")
  if [ "$expected_status" -ne 0 ]; then
    [ "$(wc -l < "$work/stderr")" -eq 1 ] || problems+=("$(wc -l < "$work/stderr") lines on stderr, expected one")
    head -n 1 "$work/stderr" | grep -q '^seqpar-diagnose: ' || problems+=("no 'seqpar-diagnose: ' prefix")
    grep -qF -- "$expected_text" "$work/stderr" || problems+=("stderr does not name '$expected_text'")
    grep -qE 'seqpar error at|\.(cpp|h):[0-9]' "$work/stderr" && problems+=("an internal error's file:line")
    local left
    left=$(cd "$dir" && find . -mindepth 1 | tr '\n' ' ')
    [ -z "$left" ] || problems+=("left behind: $left")
  else
    [ -s "$dir/out.json" ] || problems+=("no JSON written")
    grep -qF -- "$expected_text" "$dir/out.json" || problems+=("the JSON does not name '$expected_text'")
  fi
  if [ ${#problems[@]} -eq 0 ]; then
    passed=$((passed + 1))
    echo "ok    $name"
  else
    failed=$((failed + 1))
    echo "FAIL  $name: ${problems[*]}"
    sed 's/^/        stderr: /' "$work/stderr" | head -n 5
  fi
}

# ---- what is read correctly
check "four equal float32 ranks" 0 '"verdict": "RANKS AGREE"' -- --ranks "$fx/good_rank*.safetensors"
check "bfloat16 read" 0 '"verdict": "RANKS AGREE"' -- --ranks "$fx/bf16_rank*.safetensors"
check "float16 read" 0 '"verdict": "RANKS AGREE"' -- --ranks "$fx/f16_rank*.safetensors"
check "files listed one by one" 0 '"ranks": 4' -- --ranks "$fx/good_rank2.safetensors" \
  --ranks "$fx/good_rank0.safetensors" --ranks "$fx/good_rank3.safetensors" --ranks "$fx/good_rank1.safetensors"
check "one file, any name" 0 '"ranks": 1' -- --ranks "$fx/noname.safetensors"
# ---- missing and surplus ranks
check "a missing rank" 2 "rank 2 is missing (files for ranks 0, 1, 3, 4)" -- --ranks "$fx/gap_rank*.safetensors"
check "3 files for sp 4" 2 "sp 4: 3 rank file(s) are not a multiple of it (missing ranks?)" -- \
  --ranks "$fx/three_rank*.safetensors" --sp 4
check "3 files for sp 2 x dp 2" 2 "sp 2 x dp 2 = 4 ranks, but --ranks names 3 file(s)" -- \
  --ranks "$fx/three_rank*.safetensors" --sp 2 --dp 2
check "a pattern matching nothing" 2 "matches no file" -- --ranks "$fx/none_rank*.safetensors"
check "no rank in a name" 2 "no rank number in the file's name" -- --ranks "$fx/noname*.safetensors"
check "two files for one rank" 2 "two files for rank 0" -- --ranks "$fx/good_rank0.safetensors" \
  --ranks "$fx/three_rank0.safetensors"
check "no --ranks" 2 "--ranks" -- --lr 1e-4
check "--grads for fewer ranks" 2 "--grads: files for 1 ranks, but --ranks has 4" -- \
  --ranks "$fx/good_rank*.safetensors" --grads "$fx/grads_rank0.safetensors"
# ---- mismatches between ranks
check "mismatched names" 2 "no parameter 'bias', which rank 0 has" -- --ranks "$fx/names_rank*.safetensors"
check "mismatched shapes" 2 "'weight' has shape [3, 4], rank 0's parameter 'weight' [4, 3]" -- \
  --ranks "$fx/shapes_rank*.safetensors"
check "mismatched dtypes" 2 "'weight' is BF16, rank 0's parameter 'weight' F32" -- --ranks "$fx/dtypes_rank*.safetensors"
check "baseline of another shape (--reference, the old name)" 2 "--baseline" -- --ranks "$fx/good_rank*.safetensors" \
  --reference "$fx/reference_shapes.safetensors"
check "a clip_norm of two values" 2 "clip_norm has shape [2]" -- --ranks "$fx/clip_rank0.safetensors"
# ---- broken files
check "a header of {}" 2 "holds no tensors" -- --ranks "$fx/empty_rank0.safetensors"
check "an integer dtype" 2 "tensor 'steps' is I64; seqpar-diagnose reads F32, F16, BF16 and F64" -- \
  --ranks "$fx/int_rank0.safetensors"
check "a truncated file" 2 "truncated: tensor 'bias' ends at byte 64" -- --ranks "$fx/truncated_rank0.safetensors"
check "a huge header" 2 "above the format's limit of 100000000" -- --ranks "$fx/huge_rank0.safetensors"
check "a header longer than the file" 2 "truncated: the header claims 4096 bytes" -- \
  --ranks "$fx/long_rank0.safetensors"
check "a header that is not JSON" 2 "the header is not JSON" -- --ranks "$fx/json_rank0.safetensors"
check "a 2-byte file" 2 "not even the 8-byte header length" -- --ranks "$fx/tiny_rank0.safetensors"
check "offsets that do not fit the shape" 2 "data_offsets [0, 12] do not hold shape [4] of F32" -- \
  --ranks "$fx/offsets_rank0.safetensors"
check "overlapping tensors" 2 "overlap in the data" -- --ranks "$fx/overlap_rank0.safetensors"
check "a FIFO" 2 "not a regular file" -- --ranks "$fx/fifo_rank0.safetensors"
check "a directory" 2 "not a regular file" -- --ranks "$fx/dir_rank0.safetensors"
check "a missing file" 2 "cannot read: No such file or directory" -- --ranks "$fx/absent_rank0.safetensors" \
  --ranks "$fx/good_rank1.safetensors"
# ---- options
check "--betas without a comma" 2 "--betas '0.9': expected B1,B2" -- --ranks "$fx/good_rank*.safetensors" --betas 0.9
check "--lr 0" 2 "--lr 0: expected a number in (0, 1]" -- --ranks "$fx/good_rank*.safetensors" --lr 0
check "--sp not a number" 2 "--sp" -- --ranks "$fx/good_rank*.safetensors" --sp four
check "--gradient-clipping -1" 2 "--gradient-clipping -1: must not be negative" -- \
  --ranks "$fx/good_rank*.safetensors" --gradient-clipping -1
check "an unknown option" 2 "--rank" -- --rank "$fx/good_rank0.safetensors"
check "--precision int8" 2 "--precision 'int8': expected bf16, fp16, tf32, fp32 or fp64" -- \
  --ranks "$fx/good_rank*.safetensors" --precision int8
check "--tokens 0" 2 "--tokens 0 is out of range" -- --ranks "$fx/good_rank*.safetensors" --tokens 0
check "--attention-layout bshd" 2 "--attention-layout 'bshd': expected tokens-first, batch-first or head-sharded" -- \
  --ranks "$fx/good_rank*.safetensors" --attention-layout bshd
check "--json in a missing directory" 2 "--json" -- --ranks "$fx/good_rank*.safetensors" --json /nonexistent/dir/x.json
check "a ds_config with a typo" 2 "sequence_paralel_size" -- --ranks "$fx/good_rank*.safetensors" \
  --ds-config "$fx/typo.json"
# ---- --ds-config is read as --config is: a regular file of at most 1 MiB
check "--ds-config a FIFO" 2 "--ds-config $fx/fifo_rank0.safetensors: a FIFO, not a regular file" -- \
  --ranks "$fx/good_rank*.safetensors" --ds-config "$fx/fifo_rank0.safetensors"
check "--ds-config /dev/zero" 2 "--ds-config /dev/zero: a character device, not a regular file" -- \
  --ranks "$fx/good_rank*.safetensors" --ds-config /dev/zero
check "--ds-config over 1 MiB" 2 "more than the limit of 1048576 bytes" -- \
  --ranks "$fx/good_rank*.safetensors" --ds-config "$fx/huge.json"
check "--ds-config nested 400,000 deep" 2 "--ds-config $fx/deep.json: nested deeper than the limit of 64 levels" -- \
  --ranks "$fx/good_rank*.safetensors" --ds-config "$fx/deep.json"
check "--ds-config a directory" 2 "a directory, not a regular file" -- \
  --ranks "$fx/good_rank*.safetensors" --ds-config "$fx"

# ---- --help and --version: stdout, exit 0
for flag in --help --version; do
  if "$program" "$flag" 2> "$work/stderr" | grep -q "seqpar-diagnose" && [ ! -s "$work/stderr" ]; then
    passed=$((passed + 1)); echo "ok    $flag"
  else
    failed=$((failed + 1)); echo "FAIL  $flag"
  fi
done
check "fp16 in a ds_config is not read" 0 '"verdict": "RANKS AGREE"' -- \
  --ranks "$fx/good_rank*.safetensors" --ds-config "$fx/fp16.json"
# ---- the configs users have: bf16, a scheduler, ZeRO offload, "auto"; DeepSpeed's defaults
check "a Hugging Face ds_config (bf16, scheduler, auto)" 0 '"verdict": "RANKS AGREE"' -- \
  --ranks "$fx/good_rank*.safetensors" --ds-config "$fx/hf.json"
check "\"auto\" on the lr asks for --lr" 2 'optimizer.params.lr is "auto" (the Hugging Face Trainer fills it in): give the value with --lr' -- \
  --ranks "$fx/good_rank*.safetensors" --ds-config "$fx/hf_auto_lr.json"
check "\"auto\" on the lr, with --lr" 0 'gradient_clipping is \"auto\"' -- \
  --ranks "$fx/good_rank*.safetensors" --ds-config "$fx/hf_auto_lr.json" --lr 1e-4
check "a plain ds_config: no sp, no clipping, 2 files" 0 '"sequence_parallel_size": 2' -- \
  --ranks "$fx/two_rank*.safetensors" --ds-config "$fx/plain.json"
check "DeepSpeed's default clipping (0)" 0 "gradient_clipping 0" -- \
  --ranks "$fx/two_rank*.safetensors" --ds-config "$fx/plain.json"
# ---- an output never names an input
check "--json onto a rank file" 2 "is the --ranks file" -- --ranks "$fx/good_rank*.safetensors" \
  --json "$fx/good_rank0.safetensors"
check "--json onto a link to a rank file" 2 "is a symbolic link" -- --ranks "$fx/good_rank*.safetensors" \
  --json "$fx/link_to_rank1.json"
check "--json onto a file a rank's link points to" 2 "is the --ranks file $fx/linked_rank0.safetensors" -- \
  --ranks "$fx/linked_rank*.safetensors" --json "$fx/noname.safetensors"
check "--json onto the ds_config" 2 "is the --ds-config file" -- --ranks "$fx/good_rank*.safetensors" \
  --ds-config "$fx/plain.json" --json "$fx/plain.json"
check "--json onto the baseline" 2 "is the --baseline file" -- --ranks "$fx/good_rank*.safetensors" \
  --baseline "$fx/noname.safetensors" --json "$fx/noname.safetensors"
# ---- the files users have
check "a torch.save file" 2 "a torch.save file (a zip archive), not safetensors; save it as safetensors with: python3 -c" -- \
  --ranks "$fx/torch_rank0.pt"
check "an old torch.save file" 2 "a torch.save file (a pickle)" -- --ranks "$fx/pickle_rank0.pt"
check "an unquoted glob" 2 "quote the glob" -- --ranks "$fx/good_rank0.safetensors" "$fx/good_rank1.safetensors"
check "rank before step: model_rank1_step100 is rank 1" 0 '"ranks": 2' -- --ranks "$fx/model_rank*_step100.safetensors"
check "the rank in the folder: rank1/model.safetensors" 0 '"ranks": 2' -- --ranks "$fx/rank*/model.safetensors"
check "a glob that found only rank 3" 0 "its name says rank 3: ranks 0 to 2 were not given" -- \
  --ranks "$fx/only_rank*.safetensors"
check "ranks that start at 1" 2 "rank 0 is missing (files for ranks 1, 2)" -- --ranks "$fx/late_rank*.safetensors"
check "an optimizer state with its step" 0 'weight.step' -- --ranks "$fx/two_rank*.safetensors" \
  --optimizer "$fx/adam_rank*.safetensors"
# ---- the format, as strict as the safetensors library
check "a header nested 400,000 deep" 2 "the header: nested deeper than the limit of 64 levels" -- \
  --ranks "$fx/deep_rank0.safetensors"
check "a name twice in a header" 2 "the header names 'weight' twice" -- --ranks "$fx/twice_rank0.safetensors"
check "bytes after the last tensor" 2 "data bytes 64 to 72 after the last tensor belong to no tensor" -- \
  --ranks "$fx/tail_rank0.safetensors"
check "bytes between tensors" 2 "data bytes 48 to 64 belong to no tensor" -- --ranks "$fx/hole_rank0.safetensors"
check "a header of 200,000 entries, read in one pass" 2 "tensor 't0' lacks dtype, shape or data_offsets" -- \
  --ranks "$fx/many_rank0.safetensors"
check "a shape of 2^64 elements" 2 "tensor 'weight': shape [4294967296, 4294967296] is too large" -- \
  --ranks "$fx/overflow_rank0.safetensors"
check "2^47 floats in a 4-byte data" 2 "truncated: tensor 'weight' ends at byte 562949953421312 of the data, but the file holds 4" -- \
  --ranks "$fx/petabyte_rank0.safetensors"
check "a negative dimension" 2 "tensor 'weight': shape [2,-2] is not a list of sizes" -- \
  --ranks "$fx/negative_rank0.safetensors"
# ---- names and paths printed escaped, errors on one line
check "ESC and a newline in a tensor name" 2 "tensor 'w\\x1b[31mred\\x0aline' is I64" -- --ranks "$fx/esc_rank0.safetensors"
check "ESC and BEL in a name in the report" 0 '"verdict": "BROKEN: RANKS DIVERGE"' -- \
  --ranks "$fx/escnames_rank*.safetensors"
check "invalid UTF-8 in a path" 2 "\\xff_rank0.safetensors: cannot read" -- --ranks "$fx/"$'\xff'"_rank0.safetensors"
# ---- the four messages
check "--ranks ''" 2 "--ranks: an empty file name" -- --ranks ''
check "--sp 65536 --dp 65536" 2 "sp 65536 x dp 65536 = 4294967296 ranks" -- --ranks "$fx/good_rank*.safetensors" \
  --sp 65536 --dp 65536
check "a --grads file with w and grad.w" 2 "holds both 'weight' and 'grad.weight', one gradient twice" -- \
  --ranks "$fx/good_rank0.safetensors" --grads "$fx/both_grads_rank0.safetensors"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
