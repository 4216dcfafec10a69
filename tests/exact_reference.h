// The tests' independent exact reference for the exact reductions: a sum by the rules of
// core/exact_bins.h (each finite term first put on the 2^-149 grid, ties to even; IEEE
// rules for NaN and the infinities), computed with GMP rationals independently of the
// library's bins, then rounded once to nearest even: by MPFR where the build defines
// SEQPAR_TEST_HAVE_MPFR, else by hand. Plus bitwise comparison of floats.
//
// The exact value is part of the interface (ReferenceSum::value is an mpq_class), so
// this header brings <gmpxx.h>; a program that includes it links gmpxx and gmp (and
// mpfr with SEQPAR_TEST_HAVE_MPFR): see tests/CMakeLists.txt.
#pragma once

#include <gmpxx.h>
#ifdef SEQPAR_TEST_HAVE_MPFR
#include <mpfr.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "tests/test_util.h"

namespace seqpar::test {

struct ReferenceSum {
  // The exact sum of the finite terms, a multiple of 2^-149 (add() keeps it on the grid;
  // a value set directly must be one too).
  mpq_class value = 0;
  bool nan = false, positive_infinity = false, negative_infinity = false;

  void add(double term) {  // an exact double
    if (std::isnan(term)) {
      nan = true;
    } else if (std::fabs(term) >= std::ldexp(1.0, 129)) {  // infinities included
      (term > 0 ? positive_infinity : negative_infinity) = true;
    } else {
      const mpz_class grid = mpz_class(1) << 149;
      const mpq_class units = mpq_class(term) * grid;  // mpq_class(double) is exact
      mpz_class quotient, remainder;
      mpz_fdiv_qr(quotient.get_mpz_t(), remainder.get_mpz_t(), units.get_num_mpz_t(),
                  units.get_den_mpz_t());
      const int half = cmp(2 * remainder, units.get_den());
      if (half > 0 || (half == 0 && mpz_odd_p(quotient.get_mpz_t()))) quotient += 1;
      mpq_class on_grid(quotient, grid);
      on_grid.canonicalize();
      value += on_grid;
    }
  }

  // As add(), for callers whose terms are all finite (below 2^129): anything else is a
  // bug in the test, not a case, and throws std::logic_error.
  void add_finite(double term) {
    if (!(std::fabs(term) < std::ldexp(1.0, 129))) {
      throw std::logic_error("ReferenceSum: a term outside the finite range");
    }
    add(term);
  }

  // The exact sum of a sum with no NaN or infinite term, in units of 2^-149.
  mpz_class units() const {
    if (nan || positive_infinity || negative_infinity) {
      throw std::logic_error("ReferenceSum::units: the sum saw a non-finite term");
    }
    const mpq_class scaled = value * mpq_class(mpz_class(1) << 149);
    if (scaled.get_den() != 1) throw std::logic_error("ReferenceSum::units: value is off the grid");
    return scaled.get_num();
  }

  // Rounded once to nearest even: float (precision 24) or double (precision 53),
  // subnormals and overflow included. An exact zero gives +0.
  template <typename Float>
  Float rounded() const {
    if (nan || (positive_infinity && negative_infinity)) return std::numeric_limits<Float>::quiet_NaN();
    if (positive_infinity) return std::numeric_limits<Float>::infinity();
    if (negative_infinity) return -std::numeric_limits<Float>::infinity();
    constexpr int kPrecision = std::numeric_limits<Float>::digits;
#ifdef SEQPAR_TEST_HAVE_MPFR
    // IEEE emulation (MPFR's manual): the format's exponent range, then subnormalize.
    const mpfr_exp_t old_emin = mpfr_get_emin(), old_emax = mpfr_get_emax();
    mpfr_set_emin(std::numeric_limits<Float>::min_exponent - kPrecision + 1);
    mpfr_set_emax(std::numeric_limits<Float>::max_exponent);
    mpfr_t x;
    mpfr_init2(x, kPrecision);
    int one_magnitude = mpfr_set_q(x, value.get_mpq_t(), MPFR_RNDN);
    one_magnitude = mpfr_check_range(x, one_magnitude, MPFR_RNDN);
    mpfr_subnormalize(x, one_magnitude, MPFR_RNDN);
    Float result;
    if constexpr (kPrecision == 24) {
      result = mpfr_get_flt(x, MPFR_RNDN);
    } else {
      result = static_cast<Float>(mpfr_get_d(x, MPFR_RNDN));
    }
    mpfr_clear(x);
    mpfr_set_emin(old_emin);
    mpfr_set_emax(old_emax);
    if (result == 0) result = Float(0);  // an exact zero is +0 (MPFR keeps no sign for q = 0 anyway)
    return result;
#else
    // value = n * 2^-149 for an integer n: keep its top kPrecision bits (fewer for a
    // float subnormal, whose last bit is 2^-149), round the rest to nearest even.
    const mpz_class n = mpz_class(value * mpq_class(mpz_class(1) << 149));
    if (n == 0) return Float(0);
    const mpz_class magnitude = abs(n);
    const int top = static_cast<int>(mpz_sizeinbase(magnitude.get_mpz_t(), 2)) - 1;
    const int low = std::max(top - kPrecision + 1, 0);
    mpz_class kept = magnitude >> low;
    const mpz_class rest = magnitude - (kept << low);
    if (low > 0) {
      const int half = cmp(2 * rest, mpz_class(1) << low);
      if (half > 0 || (half == 0 && mpz_odd_p(kept.get_mpz_t()))) kept += 1;
    }
    const double result = std::ldexp(kept.get_d(), low - 149);  // exact, below 2^130
    const Float bounded = result >= std::ldexp(1.0, std::numeric_limits<Float>::max_exponent)
                              ? std::numeric_limits<Float>::infinity()
                              : static_cast<Float>(result);
    return n < 0 ? -bounded : bounded;
#endif
  }
};

inline bool same_float(float a, float b) { return same_bits(a, b); }

// The terms' exact sum rounded once to Float.
template <typename Float>
Float exact_reference(const std::vector<double>& terms) {
  ReferenceSum sum;
  for (double term : terms) sum.add(term);
  return sum.rounded<Float>();
}


// A float32 with a random 24-bit significand, exponent in [low, high], random sign;
// rarely a float32 subnormal.
inline float random_float(std::mt19937_64& rng, int low, int high) {
  std::uniform_int_distribution<uint32_t> significand(1u << 23, (1u << 24) - 1);
  std::uniform_int_distribution<int> exponent(low, high);
  std::uniform_int_distribution<int> coin(0, 1);
  std::uniform_int_distribution<int> rare(0, 49);
  float value;
  if (rare(rng) == 0) {  // a subnormal: any bit pattern with a zero exponent field
    const uint32_t bits = std::uniform_int_distribution<uint32_t>(1, (1u << 23) - 1)(rng);
    std::memcpy(&value, &bits, sizeof value);
  } else {
    value = std::ldexp(static_cast<float>(significand(rng)), exponent(rng) - 23);
  }
  return coin(rng) ? -value : value;
}

}  // namespace seqpar::test
