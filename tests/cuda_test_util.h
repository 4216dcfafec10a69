// Helpers for the [cuda] tests: poisoned outputs and error measures.
//
// The kernels are compared with the CPU path (the readable reference) on fresh random
// inputs. Outputs are poisoned with NaN before a kernel writes them, so an element it
// forgets to write shows up as a failure instead of passing on a lucky zero.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/tensor.h"

namespace seqpar::test {

inline Tensor poisoned(const Shape& shape, Device device) {
  return Tensor::full(shape, std::numeric_limits<float>::quiet_NaN(), device);
}

// For tests through the public API, which allocate their own outputs: empties the
// device's block cache and leaves a large NaN-filled block in its memory pool, so the
// next allocations on its stream (the op's outputs and scratch) are carved from NaN
// rather than from zeros or from an earlier op's results.
inline void poison_pool(Device device, int64_t elements = int64_t{16} << 20) {
  cuda::release_cached(device.index);
  Tensor block = poisoned({elements}, device);
}

// max |actual - expected| / max |expected|: normwise, so elements near zero do not
// blow it up. Any NaN, or a shape mismatch, gives infinity.
inline double relative_error(const Tensor& actual, const Tensor& expected) {
  if (actual.shape() != expected.shape()) return std::numeric_limits<double>::infinity();
  const std::vector<float> a = actual.to_vector(), e = expected.to_vector();
  double difference = 0.0, scale = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(double(a[i]) - double(e[i]));
    if (!(d <= difference)) difference = std::isnan(d) ? std::numeric_limits<double>::infinity() : d;
    scale = std::max(scale, std::fabs(double(e[i])));
  }
  return difference == 0.0 ? 0.0 : difference / std::max(scale, 1e-30);
}

// The largest distance in units in the last place between corresponding elements
// (0: bitwise equal, up to the sign of zero). NaN or a shape mismatch: INT64_MAX.
inline int64_t max_ulp_distance(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return INT64_MAX;
  auto ordered = [](float value) {
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    const int64_t magnitude = bits & 0x7fffffffu;
    return (bits >> 31) ? -magnitude : magnitude;
  };
  const std::vector<float> x = a.to_vector(), y = b.to_vector();
  int64_t worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) || std::isnan(y[i])) return INT64_MAX;
    const int64_t distance = ordered(x[i]) - ordered(y[i]);
    worst = std::max(worst, distance < 0 ? -distance : distance);
  }
  return worst;
}

}  // namespace seqpar::test
