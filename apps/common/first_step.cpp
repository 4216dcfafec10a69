#include "apps/common/first_step.h"

#include <cmath>
#include <cstring>

namespace seqpar {

bool bitwise_equal(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

void LrHistogram::add(float a, float b, double lr) {
  if (bitwise_equal(a, b)) {
    ++identical;
    return;
  }
  const double units = std::abs(double(a) - double(b)) / lr;
  if (units < 0.5) ++below_half;
  else if (units < 1.5) ++about_one;
  else if (units < 2.5) ++about_two;
  else ++beyond;
}

SignAgreement signs_of_first_step(const std::vector<std::vector<float>>& parameters,
                                  const std::vector<std::vector<float>>& gradients, double lr) {
  SignAgreement signs;
  for (size_t rank = 1; rank < gradients.size(); ++rank) {
    for (size_t i = 0; i < gradients[0].size(); ++i) {
      const bool opposite = (gradients[rank][i] > 0) != (gradients[0][i] > 0);
      const double units = std::abs(double(parameters[rank][i]) - parameters[0][i]) / lr;
      if (opposite) {
        ++signs.opposite;
        if (units >= 1.5 && units < 2.5) ++signs.opposite_two_lr;
      } else {
        ++signs.same;
        if (bitwise_equal(parameters[rank][i], parameters[0][i])) ++signs.same_identical;
      }
    }
  }
  return signs;
}

}  // namespace seqpar
