// What the L1 loss tests share (l1_loss_test.cpp, l1_loss_mask_test.cpp): shapes, inputs
// kept away from the kink, values over many binades, and the canonical loss from its
// definition (nn/l1_loss.h).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "core/generator.h"
#include "core/tensor.h"
#include "nn/l1_loss.h"
#include "tests/exact_reference.h"

namespace seqpar::test::l1 {

struct Shape2 {
  int64_t rows, columns;
  uint64_t seed;
};

inline const std::vector<Shape2> kShapes = {{1, 1, 41}, {1, 17, 42}, {7, 5, 43}, {33, 13, 44}};

// A difference at least 0.05 away from zero in either direction: |input - target|
// stays differentiable under the finite-difference step.
inline Tensor away_from_zero(Generator& generator, const Shape& shape) {
  std::vector<float> values = generator.randn(shape).to_vector();
  for (float& value : values) value = std::copysign(0.05f + std::fabs(value), value);
  return Tensor::from_data(shape, values);
}

// The canonical loss of nn/l1_loss.h, from the definition.
inline float reference_l1(const Tensor& input, const Tensor& target, nn::Reduction reduction) {
  const float s = static_cast<float>(reduction.scale(input.numel()));
  const std::vector<float> a = input.to_vector(), b = target.to_vector();
  test::ReferenceSum sum;
  for (size_t i = 0; i < a.size(); ++i) {
    const float difference = a[i] - b[i];
    sum.add(static_cast<double>(s) * static_cast<double>(std::fabs(difference)));
  }
  return sum.rounded<float>();
}

inline const std::vector<nn::Reduction> kReductions = {
    nn::Reduction::mean(), nn::Reduction::sum(), nn::Reduction::sum_divided_by(7),
    nn::Reduction::sum_divided_by(12000)};

// Values spread over many binades: a normal sample times 2^e, e uniform in
// [-spread, spread].
inline Tensor spread_values(std::mt19937_64& rng, const Shape& shape, int spread) {
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> exponent(-spread, spread);
  std::vector<float> values(static_cast<size_t>(shape[0] * shape[1]));
  for (float& value : values) value = std::ldexp(normal(rng), exponent(rng));
  return Tensor::from_data(shape, values);
}

// Inputs and targets of `shape` with the sign's corner cases among values over many
// binades: ties (a difference of +0), -0 - +0 (-0), +0 - -0 (+0), infinities, inf - inf
// and NaNs, each at random places.
inline std::pair<Tensor, Tensor> with_sign_corners(std::mt19937_64& rng, const Shape& shape) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> a = spread_values(rng, shape, 30).to_vector();
  std::vector<float> b = spread_values(rng, shape, 30).to_vector();
  std::uniform_int_distribution<int> corner(0, 15);
  for (size_t i = 0; i < a.size(); ++i) {
    switch (corner(rng)) {
      case 0: b[i] = a[i]; break;
      case 1: a[i] = -0.0f, b[i] = 0.0f; break;
      case 2: a[i] = 0.0f, b[i] = -0.0f; break;
      case 3: a[i] = inf; break;
      case 4: b[i] = inf; break;
      case 5: a[i] = b[i] = -inf; break;
      case 6: b[i] = nan; break;
      default: break;  // the ordinary values
    }
  }
  return {Tensor::from_data(shape, a), Tensor::from_data(shape, b)};
}

}  // namespace seqpar::test::l1
