#!/usr/bin/env bash
# Installs what seqpar's build and tests need on Debian 12 / Ubuntu, with apt.
# Idempotent: packages already installed are left alone, and apt is not touched at
# all when nothing is missing. The CUDA toolkit (nvcc, cuRAND, NCCL), needed only for
# the CUDA backend, is expected at /usr/local/cuda; it is not an apt package here.
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config time
  libeigen3-dev          # CPU kernels and float64 test references
  libgmp-dev libmpfr-dev # exact references (rationals, correct rounding) in the tests
  libtomlplusplus-dev    # configs/*.toml
  libyaml-cpp-dev nlohmann-json3-dev  # configs/*.yaml (the report's), DeepSpeed's ds_config.json
  catch2                 # tests (v2: catch2/catch.hpp)
  python3 python3-numpy python3-torch   # the PyTorch cross-check of seqpar-repro
  clang libclang-rt-14-dev  # libFuzzer (scripts/fuzz.sh)
)

missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$package")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
else
  echo "install-deps: installing ${missing[*]}"
  sudo_prefix=""
  [ "$(id -u)" -eq 0 ] || sudo_prefix="sudo"
  $sudo_prefix apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_prefix apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

if [ ! -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null; then
  echo "install-deps: note: no nvcc found; seqpar builds CPU-only (no CUDA toolkit needed)" >&2
fi
