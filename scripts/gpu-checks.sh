#!/usr/bin/env bash
# Everything that needs a GPU, in one go (GPU time is scarce): the [cuda] tests, the
# app on one GPU, the NCCL paths one GPU allows (and, with two GPUs, the two-process
# NCCL checks, the app over NCCL and the all-reduce figures), and the timings. Logs go
# to OUT_DIR.
#
#   scripts/gpu-checks.sh BIN_DIR OUT_DIR
#
# BIN_DIR holds the test programs (seqpar_core_tests, seqpar_autograd_tests,
# seqpar_nn_tests, seqpar_fused_tests, seqpar_dist_tests, seqpar_apps_tests),
# seqpar-repro, seqpar_nccl_test, seqpar-allreduce-bench and seqpar-bench from a CUDA
# build (they can be built elsewhere for sm_90).
set -u
bin=${1:?BIN_DIR}; out=${2:?OUT_DIR}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
step() { echo "== $1: $(date -u +%FT%TZ)"; }

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  step "[cuda] tests"
  for layer in core autograd nn fused dist apps; do
    echo "seqpar_${layer}_tests:"; "$bin/seqpar_${layer}_tests" "[cuda]" 2>&1 | tail -n 4
  done
  step "seqpar-repro, default placement"
  "$bin/seqpar-repro" --json "$out/repro_default.json" --plot "$out/drift_default.svg" \
    --dump "$out/dump" > "$out/repro_default.txt" 2>&1; echo "rc=$?"
  grep -A4 '^summary' "$out/repro_default.txt"
  step "PyTorch cross-check of the GPU run"
  python3 scripts/crosscheck.py "$out/dump" 2>&1 | tail -n 4; rm -rf "$out/dump"
  step "seqpar-repro, 5 steps, clipping active, sp 4 x dp 2 on one GPU"
  "$bin/seqpar-repro" --steps 5 --set ds_config.gradient_clipping=0.05 \
    --set ds_config.data_parallel_size=2 --plot "$out/drift_5steps.svg" \
    > "$out/repro_5steps.txt" 2>&1; echo "rc=$?"
  grep -A4 '^summary' "$out/repro_5steps.txt"
  step "seqpar-repro over NCCL, a world of one (the program launches itself)"
  "$bin/seqpar-repro" --set ds_config.sequence_parallel_size=1 --set repro.rows=3000 \
    --plot "" 2>&1 | grep -E "placement|^\[rank 0\]   (deepspeed|with-mpu|exact)"; echo "rc=${PIPESTATUS[0]}"
  step "NCCL, one rank"
  "$bin/seqpar_nccl_test" --nproc 1 2>&1 | tail -n 3
  step "NCCL init timeout (a second rank that never comes)"
  RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29555 timeout 60 \
    "$bin/seqpar_nccl_test" --timeout-ms 5000 2>&1 | tail -n 3; echo "rc=${PIPESTATUS[0]}"
  if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
    step "NCCL across 2 processes on 2 GPUs"
    "$bin/seqpar_nccl_test" --nproc 2 2>&1 | tail -n 2
    timeout 60 "$bin/seqpar_nccl_test" --nproc 2 --die-rank 1 --timeout-ms 5000 2>&1 | tail -n 1
    timeout 60 "$bin/seqpar_nccl_test" --nproc 2 --die-rank 1 --enqueued --timeout-ms 5000 2>&1 | tail -n 1
    "$bin/seqpar-repro" --set ds_config.sequence_parallel_size=2 --plot "" 2>&1 | tail -n 4
    "$bin/seqpar-allreduce-bench" --nproc 2 --repeats 200 --warmup 20 2>&1 | tail -n 8
    step "NCCL's transports and tuning for the 41 KB all-reduce (NCCL_DEBUG=INFO; whole log: nccl_debug.log)"
    # Which path the 2 GPUs use (P2P over NVLink: "via P2P/...", or SHM / NET), how
    # many channels, and what the tuner allows: what sets the time of a 41 KB all-reduce.
    NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,GRAPH,TUNING,P2P,SHM,NET \
      timeout 120 "$bin/seqpar-allreduce-bench" --nproc 2 --repeats 20 --warmup 2 > "$out/nccl_debug.log" 2>&1
    echo "rc=$?"
    grep -E "NCCL version|via (P2P|SHM|NET)|Channel [0-9]+/[0-9]+ :|Connected all|NVLS|nvls|CollNet|NCCL_[A-Z_]+ set|P2P (level|plugin)|Trees|Pattern|nvlink|NVLink|comm 0x[0-9a-f]+ rank|threadThresholds|^\[rank 0\] \|" \
      "$out/nccl_debug.log" | sed -E 's/^(\[rank [0-9]+\] )?[^ ]+:[0-9]+:[0-9]+ /\1/' | awk '!seen[$0]++' | head -n 80
    if [ -x "$bin/seqpar-bench" ]; then
      step "issue step on 2 GPUs over NCCL (seqpar-bench --nproc 2): figures and correctness"
      timeout 600 "$bin/seqpar-bench" --nproc 2 --repeats 300 --warmup 30 --json "$out/seqpar_bench_2gpu.json" \
        > "$out/seqpar_bench_2gpu.txt" 2>&1; echo "rc=$?"
      grep -E "PASS|FAIL|step/|allreduce/|CHECKS|error" "$out/seqpar_bench_2gpu.txt"
    fi
  fi
  step "kernel timings (seqpar-bench --kernel-parts-only)"
  "$bin/seqpar-bench" --kernel-parts-only --repeats 500 --warmup 50 --json "$out/kernel_parts.json" 2>&1
  if command -v nsys > /dev/null; then
    step "Nsight Systems: the NVTX ranges of seqpar-repro (4 ranks on one GPU, 5 steps)"
    nsys profile --trace=cuda,nvtx --force-overwrite=true -o "$out/repro_nvtx" \
      "$bin/seqpar-repro" --steps 5 --backend local --plot "" > /dev/null 2>&1; echo "rc=$?"
    nsys stats --report nvtx_sum "$out/repro_nvtx.nsys-rep" 2>&1 | head -n 40
  fi
  step "memcheck, AdamW and linear tests"
  compute-sanitizer --tool memcheck "$bin/seqpar_nn_tests" "AdamW on the GPU matches the CPU bitwise" 2>&1 | tail -n 2
  step "done"
} > "$out/gpu-checks.log" 2>&1
tail -n 60 "$out/gpu-checks.log"
