#!/bin/sh
# Installs seqpar from BUILD_DIR into a scratch prefix, then configures, builds and runs
# tests/package against it with find_package(seqpar): once from the install prefix,
# once from the build tree.
#
#   tests/package/check.sh BUILD_DIR SOURCE_DIR WORK_DIR [CMAKE_GENERATOR [CXX_FLAGS [LINKER_FLAGS]]]
#
# The consumer is compiled and linked with the build's own flags, so that a sanitizer
# build's libraries (which need the sanitizer runtime) link.
set -eu
build=$1 source=$2 work=$3 generator=${4:-Ninja} cxx_flags=${5:-} linker_flags=${6:-}
rm -rf "$work"
mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
test -f "$work/prefix/lib/cmake/seqpar/seqparConfig.cmake"
test -f "$work/prefix/lib/cmake/seqpar/seqparConfigVersion.cmake"
test -f "$work/prefix/include/seqpar/core/tensor.h"
test -f "$work/prefix/include/seqpar/core/version.h"

consume() {  # NAME CMAKE_ARGUMENTS...
  name=$1
  shift
  cmake -S "$source/tests/package" -B "$work/$name" -G "$generator" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_FLAGS="$cxx_flags" -DCMAKE_EXE_LINKER_FLAGS="$linker_flags" "$@" \
    > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; exit 1; }
  cmake --build "$work/$name" >> "$work/$name.log" 2>&1 || { cat "$work/$name.log"; exit 1; }
  "$work/$name/consumer"
}
consume installed -DCMAKE_PREFIX_PATH="$work/prefix"
consume build_tree -Dseqpar_DIR="$build"
echo "package: find_package(seqpar) works from the install prefix and the build tree"
