#!/usr/bin/env bash
# The bug report at full scale, on a machine of 4 or 8 GPUs, in one go: one process per
# GPU over NCCL throughout. On 4 GPUs the report's set-up (sp 4); on 8, sp 4 x dp 2.
#
#   1. seqpar-repro with that scenario (its three verdicts); with a GPU for every rank
#      it starts one process per GPU over NCCL by itself;
#   2. seqpar-repro over 1000 steps, its dump fingerprinted against the CPU's run of the
#      same scenario (tests/golden/): the exact numerics must give the same bits;
#   3. the NCCL process group's tests at that many ranks, and with a rank that dies
#      (the others must end in an error naming the group, not hang);
#   4. the all-reduce of the gradient bucket and of 64 MiB, NCCL's own call beside
#      seqpar's exact Sum (seqpar-allreduce-bench prints both);
#   5. the issue step on all GPUs against PyTorch on the same machine (seqpar-bench and
#      bench/torch_reference.py, the JSON of both in OUT_DIR).
#
#   scripts/multi-gpu-checks.sh BUILD_DIR OUT_DIR
#
# BUILD_DIR is a CUDA build (or a copy of its programs in the same layout: tests/,
# apps/repro/, bench/). Logs go to OUT_DIR/multi-gpu-checks.log.
set -u
build=${1:?BUILD_DIR}; out=${2:?OUT_DIR}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
here=$(cd "$(dirname "$0")/.." && pwd)
repro=$build/apps/repro/seqpar-repro
gpus=$(nvidia-smi --list-gpus 2>/dev/null | wc -l)
case "$gpus" in
  4) scenario=(); golden=tests/golden/issue6868-sp4-1000steps.txt ;;
  8) scenario=(--set ds_config.data_parallel_size=2)
     golden=tests/golden/issue6868-sp4-dp2-1000steps.txt ;;
  *) echo "multi-gpu-checks.sh: needs 4 or 8 GPUs (sp 4, or sp 4 x dp 2); nvidia-smi lists ${gpus}" >&2
     exit 2 ;;
esac
step() { echo "== $1: $(date -u +%FT%TZ)"; }
verdicts() { grep -E "placement|verdict|^(\[rank 0\] )?  (deepspeed-0.16|with-mpu|exact) " | cut -c1-240; }

{
  nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
  step "seqpar-repro ${scenario[*]:-(no arguments)}: one process per GPU over NCCL"
  timeout 300 "$repro" "${scenario[@]}" --plot "" > "$out/repro.txt" 2>&1
  echo "rc=$?"; verdicts < "$out/repro.txt"

  step "seqpar-repro --steps 1000 over NCCL, the dump against $golden"
  rm -rf "$out/dump"
  start=$(date +%s)
  timeout 600 "$repro" "${scenario[@]}" --steps 1000 --plot "" --dump "$out/dump" \
    > "$out/repro_1000.txt" 2>&1
  echo "rc=$? $(( $(date +%s) - start )) s wall"; verdicts < "$out/repro_1000.txt"
  python3 "$here/scripts/dump_fingerprints.py" "$out/dump" --check "$here/$golden" | tail -n 4
  rm -rf "$out/dump"

  step "seqpar_nccl_test --nproc $gpus"
  timeout 300 "$build/tests/seqpar_nccl_test" --nproc "$gpus" 2>&1 | grep -E "PASS|FAIL|ALL" | tail -n 12
  step "seqpar_nccl_test --nproc $gpus --die-rank 2: the others must fail, not hang"
  timeout 60 "$build/tests/seqpar_nccl_test" --nproc "$gpus" --die-rank 2 --timeout-ms 5000 2>&1 | tail -n "$gpus"

  step "seqpar-allreduce-bench --nproc $gpus: the bucket and 64 MiB, NCCL's call beside seqpar's"
  timeout 300 "$build/bench/seqpar-allreduce-bench" --nproc "$gpus" --repeats 100 --warmup 10 2>&1 | tail -n 12

  step "the issue step on $gpus GPUs: seqpar-bench --nproc $gpus --no-stress"
  timeout 600 "$build/bench/seqpar-bench" --nproc "$gpus" --no-stress --json "$out/seqpar_bench_${gpus}gpu.json" \
    2>&1 | grep -E "^\[rank 0\] (step/|allreduce/|PASS|FAIL|ALL)" | cut -c1-200 | tail -n 30
  step "PyTorch on the same machine: bench/torch_reference.py --only-nccl --nccl-world $gpus"
  timeout 600 python3 "$here/bench/torch_reference.py" --only-nccl --nccl-world "$gpus" \
    --json "$out/torch_${gpus}gpu.json" 2>&1 | tail -n 12
  step "done"
} 2>&1 | tee "$out/multi-gpu-checks.log"
