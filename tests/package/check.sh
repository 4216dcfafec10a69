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
#  - in a CUDA build, that such a program also sees and links the CUDA-only API.
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
            lib/pkgconfig/seqpar.pc include/seqpar/seqpar.h include/seqpar/config.h \
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
  cmake --build "$work/$name" >> "$work/$name.log" 2>&1 || { cat "$work/$name.log"; exit 1; }
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
cat "$work/installed.out"
echo "package: $headers installed headers compile on their own; examples/ trains when built" \
     "with find_package(seqpar) from the install prefix and the build tree, and with pkg-config"
