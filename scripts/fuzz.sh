#!/usr/bin/env bash
# Builds the libFuzzer harnesses of tests/fuzz/ with clang (ASan and the whole of UBSan,
# `unreachable` included, every report fatal; toml++'s own asserts on) and runs each for
# SECONDS (default 60) on one core, from the seed corpus with its dictionary
# (tests/fuzz/TARGET.dict, else toml.dict).
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]     # targets: config set options yaml json safetensors
#                                             # (default: all)
#   FUZZ_RUNS=1000000 scripts/fuzz.sh 1200 yaml json
#
# With FUZZ_RUNS, each target runs that many executions, SECONDS being only a cap: a
# run that reaches the cap first fails, so "10^6 executions" is a checked claim.
# libFuzzer's seed is FUZZ_SEED (default 1), so a run from the seed corpus is repeatable:
# CI explores the inputs a developer's run explored, and a new crash is a new finding,
# not a roll of the dice. FUZZ_SEED=0 lets libFuzzer pick one.
#
# The corpus grown by a run stays in build-fuzz/corpus/ (the seeds in tests/fuzz/corpus/
# are never written). A crash input is kept in build-fuzz/ and the script exits 1. The
# last line of each run's log says how many executions it made.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(config set options yaml json safetensors)
runs=${FUZZ_RUNS:-}
seed=${FUZZ_SEED:-1}
out=build-fuzz
mkdir -p "$out"

CXX=${FUZZ_CXX:-clang++}
flags=(-std=c++17 -O1 -g -fno-omit-frame-pointer
       -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
       -I. -I"$out/include" -DTOML_HEADER_ONLY=1 -DTOML_EXCEPTIONS=1)
sources=(apps/repro/config.cpp apps/repro/config_deepspeed.cpp apps/repro/config_formats.cpp
         apps/repro/validate.cpp apps/repro/options.cpp
         apps/repro/policy_list.cpp apps/repro/scenario_list.cpp apps/common/command_line.cpp apps/common/input_file.cpp
         apps/common/json_limits.cpp
         apps/common/text.cpp apps/diagnose/safetensors_reader.cpp
         core/error.cpp)
# <seqpar/config.h> of a CPU-only build, which the headers include.
cmake -DSEQPAR_GENERATED_INCLUDE_DIR="$PWD/$out/include" -P cmake/headers.cmake
# The scenarios' compiled-in defaults, generated as the CMake build generates them.
cmake -DSCENARIO_CONFIGS_OUTPUT="$PWD/$out/scenario_configs.cpp" -P cmake/scenario_configs.cmake
sources+=("$out/scenario_configs.cpp")
# yaml-cpp (the YAML configs), its static library as the app links it.
libraries=(-l:libyaml-cpp.a)
# The shared sources once, then one link per harness.
objects=()
for source in "${sources[@]}"; do
  object="$out/$(basename "$source" .cpp).o"
  if [ ! -f "$object" ] || [ "$source" -nt "$object" ]; then
    "$CXX" "${flags[@]/-fsanitize=fuzzer,/-fsanitize=fuzzer-no-link,}" -c "$source" -o "$object"
  fi
  objects+=("$object")
done

status=0
for target in "${targets[@]}"; do
  binary="$out/fuzz_$target"
  "$CXX" "${flags[@]}" "tests/fuzz/fuzz_$target.cpp" "${objects[@]}" "${libraries[@]}" -o "$binary"
  corpus="$out/corpus/$target"
  mkdir -p "$corpus"
  log="$out/fuzz_$target.log"
  echo "fuzz_$target: ${seconds} s"
  dict=tests/fuzz/$target.dict
  [ -f "$dict" ] || dict=tests/fuzz/toml.dict
  if ! UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
       "$binary" "$corpus" "tests/fuzz/corpus/$target" -dict="$dict" ${runs:+-runs="$runs"} -seed="$seed" \
       -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
       -print_final_stats=1 -artifact_prefix="$out/crash_${target}_" > "$log" 2>&1; then
    echo "fuzz_$target FAILED (log: $log)"
    tail -40 "$log"
    status=1
  fi
  grep -E "^stat::number_of_executed_units" "$log" | sed "s/^/fuzz_$target: /" || true
  executed=$(grep -E "^stat::number_of_executed_units" "$log" | grep -oE "[0-9]+$" || echo 0)
  if [ -n "$runs" ] && [ "$executed" -lt "$runs" ]; then
    echo "fuzz_$target: $executed executions, fewer than FUZZ_RUNS=$runs within $seconds s"
    status=1
  fi
done
exit $status
