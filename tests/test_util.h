// Shared helpers for the tests: bitwise comparison and device availability.
#pragma once

#include <cstring>
#include <vector>

#include "core/tensor.h"

namespace seqpar::test {

inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  const auto x = a.to_vector(), y = b.to_vector();
  return std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
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
