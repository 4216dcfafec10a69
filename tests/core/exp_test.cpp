// core/exp.h against MPFR: edge cases and sampled inputs in CI; every float in the
// hidden [.exhaustive] case (run by hand: ./seqpar_core_tests "[.exhaustive]" "[exp]").
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/exp.h"
#include "tests/mpfr_float.h"
#include "tests/test_util.h"

using namespace seqpar;
using test::same_bits;

namespace {

float float_of_bits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

#ifdef SEQPAR_TEST_HAVE_MPFR
// The correctly rounded e^x: the double e^x (glibc: error below 1 ulp of double) where
// it is far from any float rounding boundary, MPFR where it is not (a few per million).
struct ExpOracle {
  test::MpfrFloat mpfr;
  int64_t mpfr_calls = 0;
  float operator()(float x) {
    const double y = std::exp(static_cast<double>(x));
    const float below = static_cast<float>(y * (1.0 - 0x1p-45)), above = static_cast<float>(y * (1.0 + 0x1p-45));
    if (same_bits(below, above)) return below;  // also e^x beyond double's range: inf or 0
    ++mpfr_calls;
    return mpfr(mpfr_exp, x);
  }
};
#endif

}  // namespace

#ifdef SEQPAR_TEST_HAVE_MPFR

TEST_CASE("exp: edge cases are MPFR's correctly rounded values", "[exp]") {
  test::MpfrFloat mpfr;
  const float max = std::numeric_limits<float>::max(), tiny = std::numeric_limits<float>::denorm_min();
  std::vector<float> inputs = {0.0f, -0.0f, 1.0f, -1.0f, 0.5f, -0.5f, tiny, -tiny, 0x1p-25f, -0x1p-25f,
                               0x1p-24f, -0x1p-24f, 0x1.000002p-24f, -0x1.000002p-25f,
                               88.0f, 88.72283f, 88.722839f, 88.72284f, 88.7229f, 89.0f, 100.0f, max,
                               -87.33654f, -87.336548f, -87.33655f, -103.0f, -103.27893f, -103.9720840f,
                               -103.97208f, -103.9721f, -104.0f, -105.0f, -max, 0x1.62e43p-1f, 10.0f};
  for (uint32_t bits = 0x42b17200; bits < 0x42b17300; ++bits) inputs.push_back(float_of_bits(bits));
  for (uint32_t bits = 0xc2cff000; bits < 0xc2d00100; ++bits) inputs.push_back(float_of_bits(bits));
  for (const float x : inputs) {
    INFO("x = " << x << " (" << std::hexfloat << x << ")");
    CHECK(same_bits(correctly_rounded_exp(x), mpfr(mpfr_exp, x)));
  }
  CHECK(correctly_rounded_exp(INFINITY) == INFINITY);
  CHECK(same_bits(correctly_rounded_exp(-INFINITY), 0.0f));
  CHECK(std::isnan(correctly_rounded_exp(NAN)));
}

TEST_CASE("exp: random floats are MPFR's correctly rounded values", "[exp]") {
  test::MpfrFloat mpfr;
  std::mt19937 random(20261205);
  std::uniform_real_distribution<float> softmax_range(-30.0f, 0.0f);
  std::uniform_int_distribution<uint32_t> bits;
  int64_t mismatches = 0;
  for (int n = 0; n < 200000; ++n) {
    // Half where the softmax lives, half any bit pattern (most beyond the range: 0 or inf).
    const float x = n % 2 == 0 ? softmax_range(random) : float_of_bits(bits(random));
    if (std::isnan(x)) continue;
    const float got = correctly_rounded_exp(x), want = mpfr(mpfr_exp, x);
    const bool in_range = x >= -104.0f && x <= 89.0f;  // the double-double path's domain
    if (!same_bits(got, want) || (in_range && !same_bits(exp_detail::double_double_exp(x), want))) {
      if (++mismatches <= 5) UNSCOPED_INFO(std::hexfloat << "x " << x << ": " << got << ", MPFR " << want);
    }
  }
  CHECK(mismatches == 0);
}

// Both evaluations: the function, and its double-double path alone (which the function
// takes for only a handful of floats, too few to check it through the function).
TEST_CASE("exp: every float is correctly rounded", "[exp][.exhaustive]") {
  ExpOracle oracle;
  int64_t mismatches = 0, double_double_mismatches = 0;
  for (uint64_t bits = 0; bits <= 0xffffffffu; ++bits) {
    const float x = float_of_bits(static_cast<uint32_t>(bits));
    if (std::isnan(x)) continue;
    const float got = correctly_rounded_exp(x), want = oracle(x);
    if (!same_bits(got, want)) {
      if (++mismatches <= 10) UNSCOPED_INFO(std::hexfloat << "x " << x << ": " << got << ", MPFR " << want);
    }
    if (x >= -104.0f && x <= 89.0f && !same_bits(exp_detail::double_double_exp(x), want)) {
      if (++double_double_mismatches <= 10) UNSCOPED_INFO(std::hexfloat << "double-double at x " << x);
    }
  }
  CHECK(double_double_mismatches == 0);
  WARN("MPFR called for " << oracle.mpfr_calls << " inputs near a rounding boundary");
  CHECK(mismatches == 0);
}

#else
TEST_CASE("exp: MPFR checks", "[exp]") { WARN("MPFR is not installed: core/exp.h is not checked"); }
#endif
