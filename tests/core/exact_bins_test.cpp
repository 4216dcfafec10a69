// core/exact_bins.h and core/exact_sums.h against an independent exact reference (GMP
// rationals, rounded once by MPFR, or by hand where MPFR is not installed): random and
// adversarial terms, both sides of the documented exactness domain, invariance under
// any split and order (exact_bins_split_test.cpp, with long sums across flushes) and
// add_scaled_integer (scaled_integer_test.cpp). ExactSums itself, the cross-rank scopes
// and the GPU: tests/core/exact_sums_test.cpp.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "core/exact_bins.h"
#include "core/exact_fixed_point.h"
#include "tests/core/exact_bins_test_util.h"
#include "tests/exact_reference.h"
#include "tests/test_util.h"

using namespace seqpar;
using exact::kDigits;
using test::exact_reference;
using test::random_float;
using test::ReferenceSum;
using test::same_bits;
using namespace seqpar::test;  // the shared helpers: digits_of, p2, random_terms, ...

namespace {

// Checks round_to_float and round_to_double of the terms' sum against the reference.
void check_sum(const std::vector<double>& terms) {
  const Digits digits = digits_of(terms);
  const float got_float = exact::round_to_float(digits.data());
  const double got_double = exact::round_to_double(digits.data());
  const float want_float = exact_reference<float>(terms);
  const double want_double = exact_reference<double>(terms);
  CAPTURE(terms.size(), got_float, want_float, got_double, want_double);
  CHECK(same_bits(got_float, want_float));
  CHECK(same_bits(got_double, want_double));
}

// The same, plus hand-computed expected results (independent of the reference too).
void check_sum(const std::vector<double>& terms, float want_float, double want_double) {
  INFO("terms: " << ::Catch::Detail::stringify(terms));
  check_sum(terms);
  const Digits digits = digits_of(terms);
  const float got_float = exact::round_to_float(digits.data());
  const double got_double = exact::round_to_double(digits.data());
  CAPTURE(got_float, want_float, got_double, want_double);
  CHECK(same_bits(got_float, want_float));
  CHECK(same_bits(got_double, want_double));
}

}  // namespace

// ---------------------------------------------------------------- 1. random terms

TEST_CASE("exact sums of random float32s and products round like the exact reference",
          "[exact][cpu]") {
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<size_t> size(1, 3000);
  for (int trial = 0; trial < 60; ++trial) {
    CAPTURE(trial);
    const int spread = trial % 3 == 0 ? 60 : (trial % 3 == 1 ? 20 : 3);
    check_sum(random_terms(rng, size(rng), spread));
  }
}

TEST_CASE("exact sums with heavy cancellation keep every low bit (fixed seeds)", "[exact][cpu]") {
  for (uint64_t seed : {1u, 2u, 3u, 4u, 5u}) {
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    std::vector<double> terms = random_terms(rng, 500, 60);
    // Every term again with the opposite sign, except a few small ones: the result is
    // what survives, many binades below the largest terms.
    const size_t n = terms.size();
    for (size_t i = 0; i < n; ++i) terms.push_back(-terms[i]);
    for (int i = 0; i < 5; ++i) terms.push_back(random_float(rng, -140, -100));
    std::shuffle(terms.begin(), terms.end(), rng);
    check_sum(terms);
  }
}

// ---------------------------------------------------------------- 2. adversarial

TEST_CASE("exact sums: cancellation", "[exact][cpu]") {
  check_sum({1e8, 1.0, -1e8}, 1.0f, 1.0);
  check_sum({p2(30) * p2(30), 1.0, -(p2(30) * p2(30))}, 1.0f, 1.0);
  check_sum({p2(100), p2(-100), -p2(100)}, f2(-100), p2(-100));
  check_sum({p2(120), p2(-149), -p2(120)}, f2(-149), p2(-149));
  check_sum({p2(128) - p2(104), 3.0, -(p2(128) - p2(104)), -1.0}, 2.0f, 2.0);
  check_sum({1.0, -1.0}, 0.0f, 0.0);
  check_sum({-0.0}, 0.0f, 0.0);  // an exact zero is +0
  check_sum({-0.0, -0.0}, 0.0f, 0.0);
  check_sum({-1.0, 1.0, -0.0}, 0.0f, 0.0);
  check_sum({}, 0.0f, 0.0);
}

TEST_CASE("exact sums: ties round to even, in both directions", "[exact][cpu]") {
  // float: 1 + 2^-24 is halfway between 1 and 1 + 2^-23: to even, down.
  check_sum({1.0, p2(-24)}, 1.0f, 1.0 + p2(-24));
  check_sum({-1.0, -p2(-24)}, -1.0f, -1.0 - p2(-24));
  // 1 + 3*2^-24 is halfway between 1 + 2^-23 (odd) and 1 + 2^-22 (even): up.
  check_sum({1.0, p2(-24), p2(-23)}, 1.0f + f2(-22), 1.0 + 3 * p2(-24));
  check_sum({-1.0, -p2(-24), -p2(-23)}, -1.0f - f2(-22), -1.0 - 3 * p2(-24));
  // A sticky bit far below the halfway point breaks the tie, both ways.
  check_sum({1.0, p2(-24), p2(-149)}, 1.0f + f2(-23), 1.0 + p2(-24) + p2(-149));
  check_sum({1.0, p2(-24), -p2(-149)}, 1.0f, 1.0 + p2(-24) - p2(-149));
  check_sum({1.0, p2(-24), p2(-80)}, 1.0f + f2(-23), 1.0 + p2(-24) + p2(-80));
  // double: 1 + 2^-53 down to 1, 1 + 3*2^-53 up to 1 + 2^-51, a sticky bit up.
  check_sum({1.0, p2(-53)}, 1.0f, 1.0);
  check_sum({1.0, p2(-53), p2(-52)}, 1.0f, 1.0 + p2(-51));
  check_sum({1.0, p2(-53), p2(-149)}, 1.0f, 1.0 + p2(-52));
  check_sum({-1.0, -p2(-53), -p2(-149)}, -1.0f, -1.0 - p2(-52));
  // Ties at large magnitudes: 2^100 + 2^76 (float tie, to even: down).
  check_sum({p2(100), p2(76)}, f2(100), p2(100) + p2(76));
  check_sum({p2(100), p2(76), p2(77)}, f2(100) + f2(78), p2(100) + 3 * p2(76));
}

TEST_CASE("exact sums: float32 subnormal results", "[exact][cpu]") {
  check_sum({p2(-149)}, f2(-149), p2(-149));
  check_sum({-p2(-149)}, -f2(-149), -p2(-149));
  check_sum({p2(-148), -p2(-149)}, f2(-149), p2(-149));
  check_sum({1.5 * p2(-126), -p2(-126)}, f2(-127), p2(-127));
  check_sum({1.0, p2(-149), -1.0}, f2(-149), p2(-149));
  check_sum({p2(-126), -p2(-149)}, f2(-126) - f2(-149), p2(-126) - p2(-149));
  // Products landing on the grid: 2^-75 * 2^-74 is the smallest subnormal.
  check_sum({p2(-75) * p2(-74), 3.0 * p2(-75) * p2(-74)}, f2(-147), p2(-147));
  // A sum of subnormals crossing into the normal range.
  check_sum({p2(-126) - p2(-149), p2(-149)}, f2(-126), p2(-126));
}

TEST_CASE("exact sums: rounding up across a binade boundary", "[exact][cpu]") {
  const double below_one = 1.0 - p2(-24);  // the largest float below 1 (odd significand)
  check_sum({below_one, p2(-25)}, 1.0f, 1.0 - p2(-25));              // a tie: to even, up
  check_sum({below_one, p2(-26), p2(-26), p2(-27)}, 1.0f, 1.0 - p2(-24) + 5 * p2(-27));  // above half
  check_sum({below_one, p2(-26), p2(-27)}, float(below_one), 1.0 - p2(-24) + 3 * p2(-27));  // below
  check_sum({2.0 - p2(-23), 0.75 * p2(-23)}, 2.0f, 2.0 - 0.25 * p2(-23));
  check_sum({-(2.0 - p2(-23)), -0.75 * p2(-23)}, -2.0f, -2.0 + 0.25 * p2(-23));
  // double: 2 - 2^-52 + 2^-53 is a tie with an odd significand: up to 2.
  check_sum({2.0 - p2(-52), p2(-53)}, 2.0f, 2.0);
}

TEST_CASE("exact sums: float32 overflow inside the domain", "[exact][cpu]") {
  const double max = kMax;
  check_sum({max, max}, kInf, 2 * max);
  check_sum({-max, -max}, -kInf, -2 * max);
  check_sum({max, max, -max}, kMax, max);  // an overflowing partial sum does no harm
  // FLT_MAX + half an ulp (2^103) is a tie with an odd significand: to 2^128, infinity.
  check_sum({max, p2(103)}, kInf, max + p2(103));
  check_sum({max, p2(103), -p2(50)}, kMax, max + p2(103) - p2(50));
  check_sum({max, p2(102)}, kMax, max + p2(102));
  check_sum({-max, -p2(103)}, -kInf, -max - p2(103));
}

TEST_CASE("exact sums: the domain's upper edge, 2^129", "[exact][cpu]") {
  const double max = kMax;
  // Products of two floats just below 2^129 are summed exactly.
  const double twice_max = max * 2.0;                             // 2^129 - 2^105
  const double near_limit = max * static_cast<double>(2.0f - f2(-23));  // (2^48 - 2^25 + 1) 2^81
  REQUIRE(near_limit < p2(129));
  check_sum({twice_max}, kInf, twice_max);
  check_sum({near_limit}, kInf, near_limit);
  check_sum({-near_limit}, -kInf, -near_limit);
  check_sum({twice_max, 1.0, -twice_max}, 1.0f, 1.0);
  check_sum({near_limit, p2(-149), -near_limit}, f2(-149), p2(-149));
  check_sum({near_limit, -twice_max}, static_cast<float>(near_limit - twice_max), near_limit - twice_max);
  // At 2^129 a term leaves the domain and becomes an infinity of its sign, whatever
  // else the sum holds (double results too), and both infinities make a NaN.
  const double limit = p2(64) * p2(65);
  check_sum({limit}, kInf, kInfD);
  check_sum({-limit}, -kInf, -kInfD);
  check_sum({limit, -twice_max}, kInf, kInfD);
  check_sum({limit, -limit}, kNaN, kNaND);
  check_sum({max * max}, kInf, kInfD);
  check_sum({-max * max, 1.0}, -kInf, -kInfD);
  check_sum({limit, kInfD}, kInf, kInfD);
  check_sum({limit, -kInfD}, kNaN, kNaND);
}

TEST_CASE("exact sums: terms below the grid are rounded to 2^-149, ties to even",
          "[exact][cpu]") {
  // Each term is put on the grid on its own, before it is added (the documented rule).
  check_sum({p2(-160)}, 0.0f, 0.0);
  check_sum({-p2(-160)}, 0.0f, 0.0);
  check_sum({3 * p2(-151)}, f2(-149), p2(-149));   // 0.75 units: up
  check_sum({-3 * p2(-151)}, -f2(-149), -p2(-149));
  check_sum({p2(-150)}, 0.0f, 0.0);                 // 0.5 units: to even, 0
  check_sum({3 * p2(-150)}, f2(-148), p2(-148));   // 1.5 units: to even, 2
  check_sum({5 * p2(-150)}, f2(-148), p2(-148));   // 2.5 units: to even, 2
  check_sum({-5 * p2(-150)}, -f2(-148), -p2(-148));
  check_sum({p2(-149), p2(-150)}, f2(-149), p2(-149));  // not 1.5 units rounded as a whole
  check_sum({p2(-150), p2(-150)}, 0.0f, 0.0);            // each rounds to 0
  check_sum({p2(-150), p2(-150), p2(-150), p2(-150)}, 0.0f, 0.0);
  check_sum({1.0, p2(-150), -1.0}, 0.0f, 0.0);
  // A term with bits both on and below the grid: 2^-100 + 2^-150 (a tie) and + 3*2^-151.
  check_sum({p2(-100) + p2(-150)}, f2(-100), p2(-100));
  check_sum({p2(-100) + 3 * p2(-151)}, f2(-100), p2(-100) + p2(-149));
  check_sum({p2(-100) + p2(-149) + p2(-150)}, f2(-100), p2(-100) + p2(-148));
  // As products of floats whose exponents add to less than -103 (outside exactness).
  check_sum({static_cast<double>(1.0f + f2(-23)) * p2(-75) * p2(-75)}, f2(-149), p2(-149));
  check_sum({p2(-80) * p2(-80)}, 0.0f, 0.0);
}

TEST_CASE("exact sums: NaN and infinite terms", "[exact][cpu]") {
  check_sum({kNaND}, kNaN, kNaND);
  check_sum({1.0, kNaND, 2.0}, kNaN, kNaND);
  check_sum({kInfD, 1.0}, kInf, kInfD);
  check_sum({-kInfD, 1e30}, -kInf, -kInfD);
  check_sum({kInfD, kInfD}, kInf, kInfD);
  check_sum({-kInfD, 5.0, -kInfD}, -kInf, -kInfD);
  check_sum({kInfD, -kInfD}, kNaN, kNaND);
  check_sum({kInfD, kNaND}, kNaN, kNaND);
  check_sum({-kInfD, kNaND, kInfD}, kNaN, kNaND);
  check_sum({kNaND, -kNaND}, kNaN, kNaND);
}

// ---------------------------------------------------------------- 7. ScaledAbsSum

namespace {

// The terms (double)scale * (double)|a|, as a BinnedSum of them sums them (digits_of),
// and through ScaledAbsSum, flushed at random points: the same exact value (the
// digits' difference is exactly zero), so the same bits once rounded.
void check_scaled_abs_sum(float scale, const std::vector<float>& values, std::mt19937_64& rng) {
  std::vector<double> terms;
  for (float a : values) terms.push_back(static_cast<double>(scale) * static_cast<double>(std::fabs(a)));
  const Digits want = digits_of(terms);
  Digits got{};
  exact::ScaledAbsSum sum(scale);
  std::uniform_int_distribution<int> flush_now(0, 999);
  for (float a : values) {
    sum.add_abs(a);
    if (flush_now(rng) == 0) sum.flush(got.data());
  }
  sum.flush(got.data());
  CAPTURE(scale, values.size());
  // Flags are or-ed at each flush, so where non-finite terms meet they may differ in
  // which fields are set; what they round to may not.
  REQUIRE((got[exact::kSpecialDigit] != 0) == (want[exact::kSpecialDigit] != 0));
  if (want[exact::kSpecialDigit] != 0) {
    CHECK(same_bits(exact::round_to_float(got.data()), exact::round_to_float(want.data())));
    CHECK(same_bits(exact::round_to_float(got.data()), exact_reference<float>(terms)));
    return;
  }
  Digits difference = want;
  for (int k = 0; k < exact::kBins; ++k) {
    difference[k] = static_cast<int64_t>(static_cast<uint64_t>(want[k]) - static_cast<uint64_t>(got[k]));
  }
  CHECK(exact::round_to_double(difference.data()) == 0.0);  // zero only for an exact zero
  CHECK(same_bits(exact::round_to_float(got.data()), exact_reference<float>(terms)));
  CHECK(same_bits(exact::round_to_double(got.data()), exact_reference<double>(terms)));
}

}  // namespace

TEST_CASE("ScaledAbsSum sums scale * |a| exactly, on its integer and its binned path",
          "[exact][cpu]") {
  std::mt19937_64 rng(GENERATE(11u, 12u, 13u));
  const float inf = std::numeric_limits<float>::infinity();
  const float scales[] = {
      1.0f, 1.0f / 192000, 0x1p-30f, -0.375f, 3.0f,
      0x1p-70f,       // the smallest normal scale whose products keep the integer path
      0x1.8p-71f,     // below it: every term binned
      0x1.fffffep120f,  // the largest scale with the integer path
      0x1p121f,       // above it
      0x1p-130f,      // subnormal
      0.0f, -0.0f, inf, std::numeric_limits<float>::quiet_NaN()};
  // which scales take the integer path: those whose products stay on the grid
  const bool integer_path[] = {true, true, true, true, true, true, false, true, false, false,
                               false, false, false, false};
  static_assert(std::size(scales) == std::size(integer_path));
  std::uniform_int_distribution<int> kind(0, 99);
  for (size_t s = 0; s < std::size(scales); ++s) {
    const float scale = scales[s];
    CHECK(exact::ScaledAbsSum(scale).integer_path() == integer_path[s]);
    // |a| from 2^-45 to 2^13: both sides of the integer range [2^-33, 2^8) and subnormals
    std::vector<float> values(5000);
    for (float& a : values) a = random_float(rng, -45, 12);
    check_scaled_abs_sum(scale, values, rng);
    // the same with zeros and a rare infinity or NaN among them
    for (float& a : values) {
      const int k = kind(rng);
      if (k < 5) a = k % 2 ? 0.0f : -0.0f;
      if (k == 5 && kind(rng) < 2) a = kind(rng) % 2 ? -inf : std::numeric_limits<float>::quiet_NaN();
    }
    check_scaled_abs_sum(scale, values, rng);
  }
}

TEST_CASE("ScaledAbsSum: many large terms carry into the fixed-point sum's upper half",
          "[exact][cpu]") {
  // 2^20 terms just below 2^8: 2^84 units of 2^-56 in one flush.
  const float a = 0x1.fffffep7f;
  Digits digits{};
  exact::ScaledAbsSum sum(1.0f);
  for (int i = 0; i < (1 << 20); ++i) sum.add_abs(i % 2 ? a : -a);
  sum.flush(digits.data());
  CHECK(exact::round_to_double(digits.data()) == 0x1p20 * static_cast<double>(a));  // exact
  exact::ScaledAbsSum thirds(1.0f / 3);
  Digits scaled{};
  for (int i = 0; i < (1 << 20); ++i) thirds.add_abs(a);
  thirds.flush(scaled.data());
  // (double)(1/3f) * a * 2^20: 24 + 24 significant bits, exact in a double
  CHECK(exact::round_to_double(scaled.data()) ==
        static_cast<double>(1.0f / 3) * static_cast<double>(a) * 0x1p20);
}

// ---------------------------------------------------------------- rounding any digits
// round_to_float / round_to_double take digits as sums, flushes, atomics and the ranks'
// combines leave them: any signs, up to 2^62 in magnitude, carries not propagated. Each
// case below is a value V (in units of 2^-149) written as digits in a random way, and
// the rounding must give the reference's rounding of V.

namespace {

// V as digits: its base-2^31 bins, then carries moved between neighbours at random
// (d[k - 1] -= a, d[k] += a * 2^31: the same value) and each digit kept within 2^62.
Digits scatter_digits(const mpz_class& units, std::mt19937_64& rng) {
  Digits digits{};
  mpz_class rest = units;
  for (int k = exact::kBins - 1; k >= 1; --k) {  // bins below the top: non-negative remainders
    mpz_class low;
    mpz_fdiv_r_2exp(low.get_mpz_t(), rest.get_mpz_t(), exact::kBinBits);
    digits[static_cast<size_t>(k)] = static_cast<int64_t>(low.get_si());
    mpz_fdiv_q_2exp(rest.get_mpz_t(), rest.get_mpz_t(), exact::kBinBits);
  }
  digits[0] = static_cast<int64_t>(rest.get_si());  // |V| < 2^310: the top digit within 2^62
  std::uniform_int_distribution<int> bin(1, exact::kBins - 1), bits(0, 30);
  for (int moves = static_cast<int>(rng() % 12); moves > 0; --moves) {
    const auto k = static_cast<size_t>(bin(rng));
    const int64_t a = static_cast<int64_t>(rng() >> (64 - bits(rng) - 1)) * (rng() % 2 ? 1 : -1);
    const int64_t moved = digits[k] + a * (int64_t{1} << exact::kBinBits);
    const int64_t above = digits[k - 1] - a;
    const int64_t limit = int64_t{1} << 62;
    if (moved > -limit && moved < limit && above > -limit && above < limit) {
      digits[k] = moved;
      digits[k - 1] = above;
    }
  }
  return digits;
}

void check_digits_round(const mpz_class& units, std::mt19937_64& rng) {
  const Digits digits = scatter_digits(units, rng);
  ReferenceSum reference;
  reference.value = mpq_class(units, mpz_class(1) << 149);
  reference.value.canonicalize();
  const float want_float = reference.rounded<float>();
  const double want_double = reference.rounded<double>();
  const float got_float = exact::round_to_float(digits.data());
  const double got_double = exact::round_to_double(digits.data());
  CAPTURE(units.get_str(16), got_float, want_float, got_double, want_double);
  CHECK(same_bits(got_float, want_float));
  CHECK(same_bits(got_double, want_double));
}

}  // namespace

TEST_CASE("rounding digits in any form (signs, carries, ties, cancellation) matches the exact reference",
          "[exact][cpu]") {
  std::mt19937_64 rng(0x5e9a7ull);
  // |V| below 2^300 units (2^151): every bin reached, past float's range (2^277 units).
  std::uniform_int_distribution<int> length(0, 300);
  for (int trial = 0; trial < 20000; ++trial) {
    const int bits = length(rng);
    mpz_class units = 0;
    for (int b = 0; b < bits; b += 64) units = (units << 64) + mpz_class(std::to_string(rng()));
    mpz_fdiv_r_2exp(units.get_mpz_t(), units.get_mpz_t(), static_cast<unsigned long>(bits));
    if (bits > 0) mpz_setbit(units.get_mpz_t(), static_cast<unsigned long>(bits - 1));
    // Every third value a tie or a near tie at float's or double's precision: the bits
    // below the kept ones are 100..0, 100..01 or 011..1.
    if (trial % 3 == 0 && bits > 26) {
      const int kept = rng() % 2 ? 24 : 53;
      const int below = bits - kept;
      if (below >= 2) {
        mpz_fdiv_q_2exp(units.get_mpz_t(), units.get_mpz_t(), static_cast<unsigned long>(below));
        mpz_mul_2exp(units.get_mpz_t(), units.get_mpz_t(), static_cast<unsigned long>(below));
        const int kind = static_cast<int>(rng() % 3);
        if (kind == 0) mpz_setbit(units.get_mpz_t(), static_cast<unsigned long>(below - 1));
        if (kind == 1) {
          mpz_setbit(units.get_mpz_t(), static_cast<unsigned long>(below - 1));
          mpz_setbit(units.get_mpz_t(), 0);
        }
        if (kind == 2) units += (mpz_class(1) << (below - 1)) - 1;
      }
    }
    if (rng() % 2) units = -units;
    check_digits_round(units, rng);
  }
  // Values at the edges: zero, the grid's unit, float's subnormal and normal ranges, the
  // bins' boundaries, float's largest and just past it (to infinity).
  for (const int power : {0, 1, 22, 23, 24, 31, 62, 93, 124, 126, 127, 149, 150, 155, 186, 217,
                          248, 276, 277, 278, 300}) {
    for (const int offset : {-1, 0, 1}) {
      const mpz_class units = (mpz_class(1) << power) + offset;
      check_digits_round(units, rng);
      check_digits_round(-units, rng);
    }
  }
  check_digits_round(0, rng);
  // float's largest (2^128 - 2^104) and the halfway point above it, in units of 2^-149
  const mpz_class largest = (mpz_class(1) << 277) - (mpz_class(1) << 253);
  check_digits_round(largest, rng);
  check_digits_round(largest + (mpz_class(1) << 252), rng);
  check_digits_round(largest + (mpz_class(1) << 252) - 1, rng);
}
