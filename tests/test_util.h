// Shared helpers for the tests: bitwise comparison (NaN-tolerant where a NaN is all the
// numerics promise) and device availability.
#pragma once

#include <cmath>
#include <cstring>
#include <vector>

#include "core/tensor.h"

namespace seqpar::test {

inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  const auto x = a.to_vector(), y = b.to_vector();
  return std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

// Bitwise equality; any NaN equals any NaN (the sums promise a NaN, not its payload).
template <typename Float>
bool same_bits(Float a, Float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::memcmp(&a, &b, sizeof a) == 0;
}

// The same for two tensors, element by element (and the same element count).
inline bool same_bits(const Tensor& a, const Tensor& b) {
  const auto x = a.to_vector(), y = b.to_vector();
  if (x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!same_bits(x[i], y[i])) return false;
  }
  return true;
}

}  // namespace seqpar::test

// First line of a [cuda] test: on a machine (or build) without a CUDA device the test
// passes with a visible warning instead of failing.
#define SEQPAR_REQUIRE_CUDA()                                \
  do {                                                       \
    if (::seqpar::cuda_device_count() == 0) {                \
      WARN("no CUDA device: skipped");                       \
      return;                                                \
    }                                                        \
  } while (0)
