#!/usr/bin/env bash
set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
B=build-gpu-carry
L=$OUT/x2-checks.txt
nvidia-smi -L > $L
R=$B/apps/repro/seqpar-repro
rm -rf $OUT/dump; timeout 60 $R --nproc 2 --steps 3 --set ds_config.sequence_parallel_size=2 --plot "" --dump $OUT/dump > $OUT/nccl_sp2.txt 2>&1; echo "golden sp2 over NCCL rc=$?" >> $L
python3 scripts/dump_fingerprints.py $OUT/dump --check tests/golden/issue6868-sp2-3steps.txt 2>&1 | tail -n 2 >> $L; rm -rf $OUT/dump
( timeout 60 $B/tests/seqpar_nccl_test --nproc 2 2>&1 | tail -n 2 ) >> $L
for t in $B/tests/seqpar_*_tests; do echo "-- $t" >> $L; timeout 60 $t "[cuda]~[large]" 2>&1 | tail -n 2 >> $L; done
timeout 90 $B/bench/seqpar-bench --nproc 2 --no-stress --json $OUT/seqpar_bench_2gpu.json > $OUT/bench-2gpu.txt 2>&1; echo "bench --nproc 2 rc=$?" >> $L
