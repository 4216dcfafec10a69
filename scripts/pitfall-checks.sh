#!/usr/bin/env bash
# Every scenario of seqpar-repro on the GPU machine: on one GPU (ranks as threads) and,
# with two GPUs, over NCCL; each scenario's dump on the GPU compared byte for byte with
# the CPU's dump of the same run. Logs go to OUT_DIR.
#
#   scripts/pitfall-checks.sh BUILD_DIR OUT_DIR
set -u
build=${1:?BUILD_DIR}; out=${2:?OUT_DIR}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
repro=$build/apps/repro/seqpar-repro
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
# The scenarios the program lists, but the default one (exact-checks.sh runs that).
scenarios=$("$repro" --list-scenarios | awk '/^[a-z]/ && $1 != "issue-6868" {print $1}')
{
  for s in $scenarios; do
    echo "== $s: $(date -u +%FT%TZ)"
    args=(--scenario "$s" --steps 3)
    [ -f "configs/$s.toml" ] && args=(--config "configs/$s.toml" --steps 3)
    dumps=()
    [ "$s" = zero-stage ] || dumps=(yes)
    for where in cpu cuda; do
      rm -rf "$out/dump_$where"
      extra=()
      [ -n "${dumps[*]}" ] && extra=(--dump "$out/dump_$where")
      "$repro" "${args[@]}" --device "$where" --backend local "${extra[@]}" > "$out/${s}_$where.txt" 2>&1
      echo "-- $where (4 ranks as threads): rc=$?"
      grep -E "exact|bitwise|DIFFER|x sp|sqrt|WRONG|DIVERGE|consistent|refuse" "$out/${s}_$where.txt" | head -n 12
    done
    if [ -n "${dumps[*]}" ] && [ ! -d "$out/dump_cuda" ]; then
      echo "-- no GPU dump to compare (the GPU run refused or failed: see ${s}_cuda.txt)"
    elif [ -n "${dumps[*]}" ]; then
      same=yes
      for f in "$out"/dump_cpu/*.safetensors; do
        cmp -s "$f" "$out/dump_cuda/$(basename "$f")" || { same=no; echo "   $(basename "$f") differs"; }
      done
      echo "-- dumps, GPU against CPU, byte for byte: $same"
    fi
    if [ "$gpus" -ge 2 ]; then
      "$repro" "${args[@]}" --nproc 2 --set ds_config.sequence_parallel_size=2 \
        > "$out/${s}_nccl.txt" 2>&1
      echo "-- sp 2 over NCCL on 2 GPUs: rc=$?"
      grep -E "placement|exact|bitwise|DIFFER" "$out/${s}_nccl.txt" | head -n 8
    fi
  done
  rm -rf "$out/dump_cpu" "$out/dump_cuda"
} > "$out/pitfall-checks.log" 2>&1
cat "$out/pitfall-checks.log"
