// The fused step's sum of two terms (bench/fused/kernels/sum_of_two.h) against the bins
// it stands for and the exact reference, on the edges and on random terms.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "bench/fused/kernels/sum_of_two.h"
#include "core/exact_bins.h"
#include "tests/core/exact_bins_test_util.h"
#include "tests/exact_reference.h"
#include "tests/test_util.h"

using namespace seqpar;
using namespace seqpar::test;  // digits_of, p2, kInfD, kNaND, exact_reference, same_bits

TEST_CASE("sum_of_two rounds two terms as a binned sum of them does", "[fused][cpu]") {
  const auto check = [](double a, double b) {
    const Digits digits = digits_of({a, b});
    const double want = exact::round_to_double(digits.data());
    CAPTURE(a, b, want);
    CHECK(same_bits(fused::kernels::sum_of_two(a, b), want));
    CHECK(same_bits(fused::kernels::sum_of_two(b, a), want));
    CHECK(same_bits(fused::kernels::sum_of_two(a, b), exact_reference<double>({a, b})));
  };
  // The grid's edge (terms rounded to 2^-149 on their own, ties to even), the domain's
  // (2^129), ties of the one rounding, zeros of either sign, the non-finite cases.
  for (const auto& [a, b] : std::vector<std::pair<double, double>>{
           {0.0, 0.0}, {-0.0, -0.0}, {-0.0, 0.0}, {1.0, -1.0}, {-p2(-160), -p2(-160)},
           {p2(-150), p2(-150)}, {3 * p2(-151), 0.0}, {5 * p2(-150), -p2(-149)},
           {p2(-100) + p2(-150), 0.0}, {p2(-100) + 3 * p2(-151), p2(-149)}, {1.0, p2(-150)},
           {1.0, p2(-53)}, {1.0 + p2(-52), p2(-53)}, {1.0, p2(-53) + p2(-149)}, {p2(-80) * p2(-80), p2(-149)},
           {1.5 * p2(128), 1.5 * p2(128)}, {p2(129), 1.0}, {-p2(129), p2(129)}, {p2(129) - p2(76), p2(129) - p2(76)},
           {kInfD, 1.0}, {kInfD, -kInfD}, {-kInfD, -kInfD}, {kNaND, 1.0}, {kNaND, kInfD}}) {
    check(a, b);
  }
  // Random squares of floats over every binade (the norms' squares the fused step adds)
  // and random doubles of either sign from far below the grid to past the domain.
  std::mt19937_64 rng(2026);
  std::uniform_int_distribution<int> float_exponent(-160, 128), double_exponent(-320, 135);
  std::uniform_real_distribution<double> mantissa(1.0, 2.0);
  for (int i = 0; i < 20000; ++i) {
    const float n0 = static_cast<float>(std::ldexp(mantissa(rng), float_exponent(rng)));
    const float n1 = static_cast<float>(std::ldexp(mantissa(rng), float_exponent(rng)));
    check(static_cast<double>(n0) * n0, static_cast<double>(n1) * n1);
    const double a = (rng() % 2 ? -1 : 1) * std::ldexp(mantissa(rng), double_exponent(rng));
    const double b = (rng() % 2 ? -1 : 1) * std::ldexp(mantissa(rng), double_exponent(rng));
    check(a, b);
    check(a, -a * (1.0 + p2(-30)));  // cancellation
  }
}
