#!/bin/sh
# Installs seqpar from BUILD_DIR into a scratch prefix and checks it as a user meets it:
#  - what is installed: the CMake package, seqpar.pc, <seqpar/seqpar.h>, <seqpar/config.h>;
#  - every installed header compiles on its own with pkg-config's flags and nothing
#    else (the .cuh device code aside: it needs nvcc), and every header that tests a
#    SEQPAR_WITH_ macro includes <seqpar/config.h>, so that a program built without
#    CMake sees the declarations the libraries were built with;
#  - examples/ (examples/train_linear.cpp) builds and trains three ways: find_package
#    from the install prefix, find_package from the build tree, and a plain compiler
#    command with `pkg-config --cflags --libs seqpar` (no -D of its own);
#  - in a CUDA build, that such a program also sees and links the CUDA-only API;
#  - a program that runs on the CPU alone (seqpar-cpu.pc, and the CMake package's cpu_
#    components: examples/ with -DSEQPAR_EXAMPLES_CPU=ON) builds with no CUDA library
#    and no NCCL on its link line or among the libraries it loads, and trains;
#  - <seqpar/seqpar.h> alone builds examples/train_ulysses.cpp, and brings every header
#    docs/library.md names (but the exact-sum arithmetic and nn's kernels, left out on
#    purpose).
#
#   tests/package/check.sh BUILD_DIR SOURCE_DIR WORK_DIR \
#                          [CMAKE_GENERATOR [CXX_FLAGS [LINKER_FLAGS [CXX]]]]
#
# The consumers are compiled and linked with the build's own compiler and flags, so that
# a sanitizer build's libraries (which need the sanitizer runtime) link.
set -eu
build=$1 source=$2 work=$3 generator=${4:-Ninja} cxx_flags=${5:-} linker_flags=${6:-}
cxx=${7:-c++}
. "$source/tests/package/example_output.sh"
rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" > "$work/install.log"
for file in lib/cmake/seqpar/seqparConfig.cmake lib/cmake/seqpar/seqparConfigVersion.cmake \
            lib/pkgconfig/seqpar.pc lib/pkgconfig/seqpar-cpu.pc include/seqpar/seqpar.h include/seqpar/config.h \
            include/seqpar/version.h include/seqpar/core/tensor.h include/seqpar/nn/linear.h \
            include/seqpar/optim/adamw.h include/seqpar/dist/process_group.h; do
  test -f "$prefix/$file" || { echo "FAIL: $file is not installed"; exit 1; }
done

export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
pc_cflags=$(pkg-config --cflags seqpar)
pc_libs=$(pkg-config --libs seqpar)
case " $pc_cflags " in
  *" -D"*) echo "FAIL: seqpar.pc's Cflags define macros, <seqpar/config.h>'s job: $pc_cflags"
           exit 1 ;;
esac

headers=0
for header in $(cd "$prefix/include" && find seqpar -name '*.h' | sort); do
  path=$prefix/include/$header
  if [ "$header" != seqpar/config.h ] &&
     grep -qE '^[[:space:]]*#[[:space:]]*(if|ifdef|ifndef|elif).*SEQPAR_WITH_' "$path" &&
     ! grep -qE '^#include ["<]seqpar/config\.h[">]' "$path"; then
    echo "FAIL: $header tests a SEQPAR_WITH_ macro but does not include <seqpar/config.h>"
    exit 1
  fi
  printf '#include <%s>\n' "$header" > "$work/header.cpp"
  # shellcheck disable=SC2086 # the flags are lists of words
  if ! "$cxx" -std=c++17 -fsyntax-only $cxx_flags $pc_cflags "$work/header.cpp" \
       > "$work/header.log" 2>&1; then
    echo "FAIL: <$header> does not compile on its own with pkg-config's flags:"
    cat "$work/header.log"
    exit 1
  fi
  headers=$((headers + 1))
done

trains() {  # NAME PROGRAM: runs PROGRAM and checks that it learns
  "$2" > "$work/$1.out" || { echo "FAIL: the $1 build of the example exited $?"; exit 1; }
  check_training_output "$work/$1.out" ||
    { echo "FAIL: the $1 build's output:"; cat "$work/$1.out"; exit 1; }
}
consume() {  # NAME CMAKE_ARGUMENTS...
  name=$1
  shift
  cmake -S "$source/examples" -B "$work/$name" -G "$generator" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_CXX_FLAGS="$cxx_flags" \
    -DCMAKE_EXE_LINKER_FLAGS="$linker_flags" "$@" \
    > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; exit 1; }
  # --verbose: the log holds the link lines, which the CPU consumer's check reads.
  cmake --build "$work/$name" --verbose >> "$work/$name.log" 2>&1 || { cat "$work/$name.log"; exit 1; }
  trains "$name" "$work/$name/train_linear"
}
consume installed -DCMAKE_PREFIX_PATH="$prefix"
consume build_tree -Dseqpar_DIR="$build"
mkdir -p "$work/pkg_config"
# shellcheck disable=SC2086
"$cxx" -std=c++17 $cxx_flags "$source/examples/train_linear.cpp" $pc_cflags $pc_libs \
  $linker_flags -o "$work/pkg_config/train_linear" > "$work/pkg_config.log" 2>&1 ||
  { cat "$work/pkg_config.log"; exit 1; }
trains pkg_config "$work/pkg_config/train_linear"
# In a CUDA build (as the CMake package says), a program built with pkg-config alone
# sees the CUDA-only declarations, through <seqpar/config.h>, and links against their
# definitions.
if grep -q '^set(seqpar_WITH_CUDA ON)$' "$prefix/lib/cmake/seqpar/seqparConfig.cmake"; then
  cat > "$work/cuda_api.cpp" <<'PROGRAM'
#include <seqpar/seqpar.h>
#ifndef SEQPAR_WITH_CUDA
#error "<seqpar/seqpar.h> left SEQPAR_WITH_CUDA undefined in a CUDA build"
#endif
int main() { return seqpar::uniform_on_device == nullptr ? 1 : 0; }
PROGRAM
  # shellcheck disable=SC2086
  "$cxx" -std=c++17 $cxx_flags "$work/cuda_api.cpp" $pc_cflags $pc_libs $linker_flags \
    -o "$work/cuda_api" > "$work/cuda_api.log" 2>&1 || { cat "$work/cuda_api.log"; exit 1; }
  "$work/cuda_api" || { echo "FAIL: the CUDA-only API is missing"; exit 1; }
  echo "package: with pkg-config alone, the CUDA-only API is declared and links"
fi

# A program that runs on the CPU alone links no CUDA library and no NCCL, whichever way
# seqpar was built. (In a CPU-only build this holds of every consumer; in a CUDA build
# only the CPU package gives it.)
gpu_libraries='cudart|cublas|curand|libcuda|nccl'
no_gpu_libraries() {  # WHAT FILE: FILE names no CUDA library and no NCCL
  if grep -Eq "$gpu_libraries" "$2"; then
    echo "FAIL: $1 names a CUDA library or NCCL:"
    grep -E "$gpu_libraries" "$2"
    exit 1
  fi
}
loads_no_gpu_library() {  # PROGRAM
  if command -v ldd > /dev/null; then
    ldd "$1" > "$1.ldd"
    no_gpu_libraries "the libraries $1 loads" "$1.ldd"
  fi
}
pc_cpu_cflags=$(pkg-config --cflags seqpar-cpu)
pc_cpu_libs=$(pkg-config --libs seqpar-cpu)
printf '%s\n' "$pc_cpu_cflags $pc_cpu_libs" > "$work/pkg_config_cpu.flags"
no_gpu_libraries "pkg-config --cflags --libs seqpar-cpu" "$work/pkg_config_cpu.flags"
mkdir -p "$work/pkg_config_cpu"
for program in train_linear train_ulysses; do
  # shellcheck disable=SC2086
  "$cxx" -std=c++17 $cxx_flags "$source/examples/$program.cpp" $pc_cpu_cflags $pc_cpu_libs \
    $linker_flags -o "$work/pkg_config_cpu/$program" > "$work/pkg_config_cpu.log" 2>&1 ||
    { cat "$work/pkg_config_cpu.log"; exit 1; }
  loads_no_gpu_library "$work/pkg_config_cpu/$program"
done
trains pkg_config_cpu "$work/pkg_config_cpu/train_linear"
consume installed_cpu -DCMAKE_PREFIX_PATH="$prefix" -DSEQPAR_EXAMPLES_CPU=ON
grep -E -- '-o [^ ]*train_(linear|ulysses)( |$)' "$work/installed_cpu.log" > "$work/installed_cpu.link"
[ -s "$work/installed_cpu.link" ] || { echo "FAIL: no link line in $work/installed_cpu.log"; exit 1; }
no_gpu_libraries "the link line of examples/ built with -DSEQPAR_EXAMPLES_CPU=ON" "$work/installed_cpu.link"
loads_no_gpu_library "$work/installed_cpu/train_linear"
loads_no_gpu_library "$work/installed_cpu/train_ulysses"
consume build_tree_cpu -Dseqpar_DIR="$build" -DSEQPAR_EXAMPLES_CPU=ON
loads_no_gpu_library "$work/build_tree_cpu/train_ulysses"

# The umbrella header brings what docs/library.md shows: every header it names, and the
# API it shows (library_api.cpp, which includes nothing else). train_ulysses.cpp, which
# includes it alone, built above.
for flags in seqpar seqpar-cpu; do
  # shellcheck disable=SC2046,SC2086
  "$cxx" -std=c++17 $cxx_flags "$source/tests/package/library_api.cpp" $(pkg-config --cflags --libs $flags) \
    $linker_flags -o "$work/library_api_$flags" > "$work/library_api.log" 2>&1 ||
    { echo "FAIL: <seqpar/seqpar.h> alone lacks the API docs/library.md shows ($flags):"
      cat "$work/library_api.log"; exit 1; }
done
printf '#include <seqpar/seqpar.h>\n' > "$work/umbrella.cpp"
# shellcheck disable=SC2086
"$cxx" -std=c++17 -M $cxx_flags $pc_cflags "$work/umbrella.cpp" > "$work/umbrella.deps"
for header in $(grep -oE '(core|autograd|nn|optim|dist)/[a-z0-9_/]+\.h' "$source/docs/library.md" | sort -u); do
  case $header in core/exact_*|nn/cuda/*|nn/cpu/*|nn/reference/*) continue ;; esac
  grep -q "include/seqpar/$header" "$work/umbrella.deps" ||
    { echo "FAIL: docs/library.md names $header, which <seqpar/seqpar.h> does not bring"; exit 1; }
done

cat "$work/installed.out"
echo "package: $headers installed headers compile on their own; examples/ trains when built" \
     "with find_package(seqpar) from the install prefix and the build tree, and with pkg-config;" \
     "built on the CPU package (seqpar-cpu.pc, the cpu_ components) it links no CUDA library and" \
     "no NCCL"
