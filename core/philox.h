// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11)
// and the stream layout of cuRAND's host generator, written out so that Generator
// needs no CUDA toolkit and gives the bits cuRAND's host API gave
// (tests/core/philox_test.cpp compares the two wherever cuRAND is installed).
//
// A Philox block is ten rounds of a bijection on a 128-bit counter under a 64-bit key
// (the seed); each block yields four 32-bit values. cuRAND's host generator spreads
// its stream over 65536 subsequences the way its GPU kernel's threads would: value n
// of the stream is word n % 4 of the block whose counter holds the subsequence
// (n / 4) % 65536 in its upper 64 bits and the position (n / 4) / 65536 in its lower
// 64 bits. Normal values come in Box-Muller pairs from consecutive values, in float,
// with the C library's logf and sincosf, as cuRAND computes them on the host.
//
// The block function and the stream layout are integer arithmetic only, compiled for
// the host and for CUDA kernels alike (SEQPAR_HOST_DEVICE): a kernel that reads the
// stream gets the host's words bit for bit (nn/cuda/dropout.cu does).
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

#include "core/host_device.h"

namespace seqpar::philox {

using Block = std::array<uint32_t, 4>;

SEQPAR_HOST_DEVICE Block philox4x32_10(Block counter, uint64_t key) {
  constexpr uint32_t kMultiplier0 = 0xD2511F53u, kMultiplier1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  uint32_t key0 = static_cast<uint32_t>(key), key1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t product0 = uint64_t{kMultiplier0} * counter[0];
    const uint64_t product1 = uint64_t{kMultiplier1} * counter[2];
    counter = {static_cast<uint32_t>(product1 >> 32) ^ counter[1] ^ key0,
               static_cast<uint32_t>(product1),
               static_cast<uint32_t>(product0 >> 32) ^ counter[3] ^ key1,
               static_cast<uint32_t>(product0)};
    key0 += kWeyl0;
    key1 += kWeyl1;
  }
  return counter;
}

constexpr uint64_t kSubsequences = 65536;

// Values 4 * index .. 4 * index + 3 of cuRAND's host stream for `seed`.
SEQPAR_HOST_DEVICE Block stream_block(uint64_t seed, uint64_t index) {
  const uint64_t subsequence = index % kSubsequences, step = index / kSubsequences;
  return philox4x32_10({static_cast<uint32_t>(step), static_cast<uint32_t>(step >> 32),
                        static_cast<uint32_t>(subsequence),
                        static_cast<uint32_t>(subsequence >> 32)},
                       seed);
}

// cuRAND's host stream for `seed`, read from any position.
class HostStream {
 public:
  static constexpr uint64_t kSubsequences = philox::kSubsequences;

  explicit HostStream(uint64_t seed) : seed_(seed) {}

  // Values 4 * index .. 4 * index + 3 of the stream.
  Block block(uint64_t index) const { return stream_block(seed_, index); }

  uint32_t at(uint64_t position) {
    if (position / 4 != cached_block_) {
      cached_block_ = position / 4;
      cached_ = block(cached_block_);
    }
    return cached_[position % 4];
  }

 private:
  uint64_t seed_;
  uint64_t cached_block_ = UINT64_MAX;
  Block cached_{};
};

// cuRAND's maps from 32 random bits to floats (curand_uniform.h, curand_normal.h).
// Each product and sum is rounded on its own, as cuRAND's float code does.
constexpr float kTwoPowMinus32 = 2.3283064e-10f;
constexpr float kTwoPowMinus32TwoPi = 2.3283064e-10f * 6.2831855f;

// (0, 1]
inline float uniform(uint32_t bits) {
  const float scaled = static_cast<float>(bits) * kTwoPowMinus32;
  return scaled + kTwoPowMinus32 / 2.0f;
}

// Box-Muller: two standard normal values from two words.
inline std::array<float, 2> normal_pair(uint32_t first, uint32_t second) {
  const float u = uniform(first);
  const float angle_scaled = static_cast<float>(second) * kTwoPowMinus32TwoPi;
  const float angle = angle_scaled + kTwoPowMinus32TwoPi / 2.0f;
  const float radius = std::sqrt(-2.0f * std::log(u));
  float sine, cosine;
  ::sincosf(angle, &sine, &cosine);
  return {sine * radius, cosine * radius};
}

}  // namespace seqpar::philox
