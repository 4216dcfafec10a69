// Adam's first step, as seen in the ranks' copies of the parameters: each copy moves by
// about lr along the sign of its own gradient, so copies that stepped on different
// gradients end 0 or 2 lr apart. seqpar-repro counts these on its own runs and
// seqpar-diagnose on a user's files; both print the same figures.
#pragma once

#include <cstdint>
#include <vector>

namespace seqpar {

// |p_r - p_0| / lr for every rank r > 0 and every parameter, in bins around the
// multiples of lr that Adam's first step produces.
struct LrHistogram {
  int64_t identical = 0;      // bitwise equal
  int64_t below_half = 0;     // (0, 0.5) lr: rounding-level differences
  int64_t about_one = 0;      // [0.5, 1.5) lr
  int64_t about_two = 0;      // [1.5, 2.5) lr: opposite moves of ±lr
  int64_t beyond = 0;         // >= 2.5 lr

  // Counts one pair of copies of a parameter, a and b, into its bin.
  void add(float a, float b, double lr);
};

// Rank r's gradient against rank 0's, element by element, with how far the parameter
// copies ended apart: the mechanism behind the 2·lr peak.
struct SignAgreement {
  int64_t opposite = 0, opposite_two_lr = 0;  // signs differ / ... and ended ~2 lr apart
  int64_t same = 0, same_identical = 0;       // signs agree / ... and ended bitwise equal
};

// Step 1's gradient signs against the parameter differences they produced; both indexed
// [rank][element].
SignAgreement signs_of_first_step(const std::vector<std::vector<float>>& parameters,
                                  const std::vector<std::vector<float>>& gradients, double lr);

bool bitwise_equal(float a, float b);

}  // namespace seqpar
