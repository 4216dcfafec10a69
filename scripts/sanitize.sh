#!/usr/bin/env bash
# CPU-only sanitizer runs, as CI does them (.ci/run):
#
#   scripts/sanitize.sh asan   # ASan + UBSan build (build-asan/, CUDA toolkit hidden): all
#                              # of ctest, which includes the bad-input corpus
#   scripts/sanitize.sh tsan   # TSan build (build-tsan/): the dist and app tests and the
#                              # corpus, where the threads of the local process group meet
#
# Every report is fatal (halt_on_error, -fno-sanitize-recover), so a clean exit means
# no report. Prints how long each stage took.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

asan() {
  local flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
  # The CUDA toolkit hidden as well: this build is also the one a machine without CUDA gets.
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Release -DSEQPAR_CUDA=OFF \
    -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" > /dev/null
  cmake --build build-asan -j"$jobs"
  ASAN_OPTIONS=halt_on_error=1:detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j"$jobs"
}

tsan() {
  cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=Release -DSEQPAR_CUDA=OFF \
    -DCMAKE_CXX_FLAGS="-fsanitize=thread -fno-omit-frame-pointer" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" > /dev/null
  cmake --build build-tsan -j"$jobs" --target seqpar_dist_tests seqpar_apps_tests seqpar-repro
  export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
  build-tsan/tests/seqpar_dist_tests
  build-tsan/tests/seqpar_apps_tests
  bash tests/apps/bad_input.sh build-tsan/apps/repro/seqpar-repro
}

for stage in "${@:-asan tsan}"; do
  for one in $stage; do
    start=$SECONDS
    "$one"
    echo "sanitize: $one took $((SECONDS - start)) s"
  done
done
