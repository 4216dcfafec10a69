#!/usr/bin/env bash
# The exact numerics on the GPU machine, in one go: the [cuda] tests (CPU and GPU
# bitwise), memcheck of the exact kernels, the golden fingerprints of whole runs on one
# GPU (threads sharing it) and, with two GPUs, over NCCL, and seqpar-repro over 1000
# steps. Logs go to OUT_DIR.
#
#   scripts/exact-checks.sh BUILD_DIR OUT_DIR
set -u
build=${1:?BUILD_DIR}; out=${2:?OUT_DIR}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
repro=$build/apps/repro/seqpar-repro
step() { echo "== $1: $(date -u +%FT%TZ)"; }
golden() {  # golden SP ARGS...: a 3-step run's dump against tests/golden
  local sp=$1; shift
  rm -rf "$out/dump"
  "$@" --steps 3 --set ds_config.sequence_parallel_size="$sp" --plot "" --dump "$out/dump" \
    > "$out/golden_sp$sp.txt" 2>&1 || { echo "run failed:"; tail -n 5 "$out/golden_sp$sp.txt"; }
  python3 scripts/dump_fingerprints.py "$out/dump" --check "tests/golden/issue6868-sp$sp-3steps.txt" | tail -n 4
  rm -rf "$out/dump"
}
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  step "[cuda] tests, every layer's program"
  for t in "$build"/tests/seqpar_*_tests; do
    echo "-- $(basename "$t")"; "$t" "[cuda]" 2>&1 | tail -n 3
  done
  step "golden fingerprints, 4 ranks as threads on one GPU"
  golden 4 "$repro" --device cuda --backend local
  step "golden fingerprints, sp 2 as threads on one GPU"
  golden 2 "$repro" --device cuda --backend local
  if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
    step "golden fingerprints, sp 2 over NCCL on 2 GPUs"
    golden 2 "$repro" --nproc 2
    step "NCCL collectives across 2 processes"
    "$build/tests/seqpar_nccl_test" --nproc 2 2>&1 | tail -n 2
  fi
  step "seqpar-repro, 1000 steps, 4 ranks as threads on one GPU"
  rm -rf "$out/dump"
  "$repro" --device cuda --backend local --steps 1000 --plot "$out/drift_1000.svg" \
    --json "$out/repro_1000.json" --dump "$out/dump" > "$out/repro_1000.txt" 2>&1; echo "rc=$?"
  grep -E "^policy|verdict|^summary|^  (deepspeed|with-mpu|exact) " "$out/repro_1000.txt" | cut -c1-220
  # the CPU's 1000-step run, fingerprinted (tests/golden): the same bits after 1000 steps
  python3 scripts/dump_fingerprints.py "$out/dump" > "$out/fingerprints_1000.txt"
  [ -f tests/golden/issue6868-sp4-1000steps.txt ] &&
    python3 scripts/dump_fingerprints.py "$out/dump" --check tests/golden/issue6868-sp4-1000steps.txt | tail -n 4
  rm -rf "$out/dump"
  step "memcheck and racecheck: the exact fused step's kernels (bench/fused/kernels/exact_step.cu)"
  small="the exact step's kernels at small shapes equal the public API's (for the sanitizers)"
  compute-sanitizer --tool memcheck "$build/tests/seqpar_fused_tests" "$small" 2>&1 | tail -n 1
  compute-sanitizer --tool racecheck "$build/tests/seqpar_fused_tests" "$small" 2>&1 | tail -n 1
  step "memcheck: core's and nn's [cuda] tests (exact sums, Linear, L1, clip), less the [large] ones"
  for t in seqpar_core_tests seqpar_nn_tests; do
    compute-sanitizer --tool memcheck "$build/tests/$t" "[cuda]~[large]" 2>&1 | tail -n 1
  done
  step "racecheck: the kernels with shared memory (exact sums' block combine in L1 and the norm, the one-magnitude dW's sign fragments, the few-outputs forward's Wᵀ, the large GEMM's slices)"
  compute-sanitizer --tool racecheck "$build/tests/seqpar_core_tests" "[cuda]" 2>&1 | tail -n 1
  compute-sanitizer --tool racecheck "$build/tests/seqpar_nn_tests" \
    "l1 loss forward and backward on the GPU match the CPU","l1 loss with a row mask on the GPU is bitwise the CPU's","gradient norm and clipping on the GPU match the CPU","linear on the GPU gives the CPU's bits","dW from a one-magnitude dy on the GPU gives the CPU's exact bits","every variant of the few-outputs forward gives the CPU's bits","dropout on the GPU equals the CPU bit for bit","the large GEMM gives the CPU's bits at both slice depths and in a graph","both GEMM kernels keep a chain's -0 past K (seed 17)" 2>&1 | tail -n 1
  step "racecheck: the many-outputs one-magnitude dW (dy's sign matrix, the byte planes, cuBLASLt's int8 GEMM)"
  timeout 240 compute-sanitizer --tool racecheck "$build/tests/seqpar_nn_tests" \
    "dW from a many-outputs one-magnitude dy on the GPU (int8 GEMM) gives the CPU's exact bits" 2>&1 | tail -n 1
  step "memcheck and racecheck: attention's and RoPE's kernels (tiles of 64 queries and 64 keys)"
  compute-sanitizer --tool memcheck "$build/tests/seqpar_nn_tests" "attention on the GPU gives the reference's bits under every mask","attention's autograd on the GPU equals the CPU's","RoPE on the GPU gives the reference's bits, forward and backward" 2>&1 | tail -n 1
  compute-sanitizer --tool racecheck "$build/tests/seqpar_nn_tests" "attention on the GPU gives the reference's bits under every mask" 2>&1 | tail -n 1
  step "memcheck: the scenarios' [cuda] cases (the pitfall kit, dropout, masked tokens)"
  compute-sanitizer --tool memcheck "$build/tests/seqpar_apps_tests" "[cuda]" 2>&1 | tail -n 1
  step "done"
} > "$out/exact-checks.log" 2>&1
tail -n 80 "$out/exact-checks.log"
