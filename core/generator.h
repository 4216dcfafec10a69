// Generator: a Philox4x32-10 counter-based generator with an explicit seed and
// offset, giving the numbers cuRAND's host generator gives (core/philox.h).
//
// A Philox stream is a pure function of (seed, position), so the same seed gives the
// same numbers in any process, on any rank, in any order of construction. A draw of
// n values reads positions [offset, offset + n) and then advances the offset by n
// rounded up to a multiple of 4 (one Philox block), the way PyTorch's Philox offsets
// advance. Two generators with the same seed and offset therefore agree on every
// later draw.
//
// Values are always computed on the host (no CUDA toolkit needed) and copied to the
// requested device. That makes initialization device-independent: a CPU run and a
// GPU run start from bitwise-identical parameters and inputs.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace seqpar {

class Generator {
 public:
  explicit Generator(uint64_t seed, uint64_t offset = 0);

  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void set_offset(uint64_t offset) { offset_ = offset; }

  // Standard normal values (mean 0, standard deviation 1).
  Tensor randn(const Shape& shape, Device device = Device::cpu());
  // Uniform values in (low, high]; requires low < high.
  Tensor uniform(const Shape& shape, float low, float high, Device device = Device::cpu());

 private:
  enum class Distribution { Normal, Uniform };
  Tensor draw(const Shape& shape, Distribution distribution, Device device);

  uint64_t seed_;
  uint64_t offset_;
};

}  // namespace seqpar
