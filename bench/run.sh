#!/usr/bin/env bash
# The benchmarks in one command, on one GPU: seqpar-bench, then PyTorch's
# anchors (bench/torch_reference.py) on the same GPU, then one table and one JSON.
# With 2 GPUs also the step on 2 GPUs over NCCL: seqpar-bench --nproc 2 (its own
# JSON, seqpar_bench_2gpu.json) and torch_reference.py's NCCL section (2 processes,
# in torch_reference.json); with fewer, both say "skipped".
#
#   bash bench/run.sh [BIN] [OUT] [extra arguments for both programs]
#
# BIN: a folder holding seqpar-bench (or a build folder: BIN/bench/seqpar-bench);
# default build. OUT: where the JSON files go; default bench-out. For example, from a
# build made with `cmake -S . -B build -G Ninja && ninja -C build`:
#   bash bench/run.sh build bench-out
set -u
here="$(cd "$(dirname "$0")" && pwd)"
bin="${1:-build}"
out="${2:-bench-out}"
shift 2 2>/dev/null || shift $#
bench="$bin/seqpar-bench"
[ -x "$bench" ] || bench="$bin/bench/seqpar-bench"
mkdir -p "$out"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"  # NVLink multicast stays off (docs/gpu.md)
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
echo "== seqpar-bench ($bench), $(date -u +%Y-%m-%dT%H:%MZ)"
limit="${BENCH_TIMEOUT_S:-900}"  # per program
timeout "$limit" "$bench" --json "$out/seqpar_bench.json" "$@" || echo "seqpar-bench failed: $?"
rm -f "$out/seqpar_bench_2gpu.json"
if [ "${gpus:-0}" -ge 2 ]; then
  echo "== seqpar-bench --nproc 2: the step on 2 GPUs over NCCL, $(date -u +%Y-%m-%dT%H:%MZ)"
  timeout "$limit" "$bench" --nproc 2 --json "$out/seqpar_bench_2gpu.json" "$@" \
    || echo "seqpar-bench --nproc 2 failed: $?"
else
  echo "== seqpar-bench --nproc 2: skipped, ${gpus:-0} GPU(s) here (needs 2)"
fi
echo "== bench/torch_reference.py"
timeout "$limit" python3 "$here/torch_reference.py" --json "$out/torch_reference.json" "$@" || echo "torch_reference.py failed: $?"
echo "== side by side (also in $out/bench.json)"
python3 "$here/merge.py" "$out/seqpar_bench.json" "$out/torch_reference.json" "$out/bench.json" \
  $( [ -f "$out/seqpar_bench_2gpu.json" ] && echo "$out/seqpar_bench_2gpu.json" )
