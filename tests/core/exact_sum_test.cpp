// core/exact_sum.h and core/exact_sums.h against an independent exact reference (GMP
// rationals, rounded once by MPFR, or by hand where MPFR is not installed): random and
// adversarial terms, both sides of the documented exactness domain, invariance under
// any split and order, long sums across flushes. ExactSums itself, the cross-rank
// scopes and the GPU: tests/core/exact_sums_test.cpp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "core/exact_sum.h"
#include "core/exact_sums.h"
#include "core/tensor.h"
#include "tests/cuda_test_util.h"
#include "tests/exact_reference.h"
#include "tests/test_util.h"

using namespace seqpar;
using exact::kDigits;
using test::exact_reference;
using test::random_float;
using test::ReferenceSum;
using test::same_bits;

namespace {

// ---------------------------------------------------------------- the reference

using Digits = std::array<int64_t, kDigits>;

// The terms through one BinnedSum, flushed every kTermsPerFlush terms as the library's
// loops do, into fresh digits.
Digits digits_of(const std::vector<double>& terms) {
  Digits digits{};
  exact::BinnedSum sum;
  sum.clear();
  int64_t pending = 0;
  for (double term : terms) {
    sum.add(term);
    if (++pending == exact::kTermsPerFlush) {
      sum.flush(digits.data());
      pending = 0;
    }
  }
  sum.flush(digits.data());
  return digits;
}

// Digit-wise integer addition (two's complement wrap-around, as ExactSums::add).
void add_digits(Digits& into, const Digits& other) {
  for (int d = 0; d < kDigits; ++d) {
    into[d] = static_cast<int64_t>(static_cast<uint64_t>(into[d]) + static_cast<uint64_t>(other[d]));
  }
}

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

double p2(int e) { return std::ldexp(1.0, e); }
float f2(int e) { return std::ldexp(1.0f, e); }

// Terms of the kinds the ops produce: float32s and products of two float32s, each
// factor's exponent in [-spread, spread].
std::vector<double> random_terms(std::mt19937_64& rng, size_t count, int spread) {
  std::uniform_int_distribution<int> kind(0, 2);
  std::vector<double> terms(count);
  for (double& term : terms) {
    if (kind(rng) == 0) {
      term = random_float(rng, -spread, spread);
    } else {
      term = static_cast<double>(random_float(rng, -spread, spread)) *
             static_cast<double>(random_float(rng, -spread, spread));
    }
  }
  return terms;
}

const float kInf = std::numeric_limits<float>::infinity();
const double kInfD = std::numeric_limits<double>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const double kNaND = std::numeric_limits<double>::quiet_NaN();
const float kMax = std::numeric_limits<float>::max();

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

// ---------------------------------------------------------------- 3. partition invariance

namespace {

// Random terms, with a non-finite one now and then.
std::vector<double> mixed_terms(std::mt19937_64& rng, size_t count) {
  std::vector<double> terms = random_terms(rng, count, 60);
  std::uniform_int_distribution<int> special(0, 400);
  for (double& term : terms) {
    const int s = special(rng);
    if (s == 0) term = kInfD;
    if (s == 1) term = -kInfD;
    if (s == 2) term = kNaND;
    if (s == 3) term = p2(129);
  }
  return terms;
}

// Random cut points in [0, size], repeats allowed (empty pieces), sorted, with 0 and
// size at the ends.
std::vector<size_t> random_cuts(std::mt19937_64& rng, size_t size) {
  std::uniform_int_distribution<size_t> pieces(0, 12), at(0, size);
  std::vector<size_t> cuts = {0, size};
  const size_t count = pieces(rng);
  for (size_t i = 0; i < count; ++i) cuts.push_back(at(rng));
  std::sort(cuts.begin(), cuts.end());
  return cuts;
}

}  // namespace

TEST_CASE("exact sums do not depend on the split into pieces or the order", "[exact][cpu]") {
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<size_t> size(0, 400);
  std::uniform_int_distribution<int> coin(0, 2);
  for (int trial = 0; trial < 80; ++trial) {
    CAPTURE(trial);
    // Finite terms only in half the trials, so the finite rounding is exercised too.
    std::vector<double> terms = trial % 2 ? mixed_terms(rng, size(rng)) : random_terms(rng, size(rng), 60);
    if (trial % 10 == 0) terms.resize(std::min<size_t>(terms.size(), 3));  // tiny lists
    const Digits whole = digits_of(terms);
    const float want_float = exact::round_to_float(whole.data());
    const double want_double = exact::round_to_double(whole.data());
    CHECK(same_bits(want_float, exact_reference<float>(terms)));
    CHECK(same_bits(want_double, exact_reference<double>(terms)));

    // Pieces, each into its own digits, added as integers.
    const std::vector<size_t> cuts = random_cuts(rng, terms.size());
    CAPTURE(cuts);
    Digits added{};
    exact::ExactSums total(1, Device::cpu());
    for (size_t p = 0; p + 1 < cuts.size(); ++p) {
      const std::vector<double> piece(terms.begin() + cuts[p], terms.begin() + cuts[p + 1]);
      const Digits digits = digits_of(piece);
      add_digits(added, digits);
      exact::ExactSums sums(1, Device::cpu());
      std::copy(digits.begin(), digits.end(), sums.digits());
      total.add(sums);
    }
    for (int d = 0; d < exact::kBins; ++d) CHECK(added[d] == whole[d]);  // the digits themselves
    CHECK(same_bits(exact::round_to_float(added.data()), want_float));
    CHECK(same_bits(exact::round_to_double(added.data()), want_double));
    const Tensor out = Tensor::full({1}, kNaN);
    total.round_into(out);
    CHECK(same_bits(out.item(), want_float));
    const std::vector<int64_t> host = total.to_host();
    CHECK(std::equal(host.begin(), host.end(), added.begin()));

    // One-term pieces: every term as its own sum.
    Digits singles{};
    for (double term : terms) add_digits(singles, digits_of({term}));
    CHECK(same_bits(exact::round_to_float(singles.data()), want_float));
    CHECK(same_bits(exact::round_to_double(singles.data()), want_double));

    // Shuffled.
    std::vector<double> shuffled = terms;
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    const Digits reordered = digits_of(shuffled);
    CHECK(std::equal(reordered.begin(), reordered.end(), whole.begin()));
    CHECK(same_bits(exact::round_to_float(reordered.data()), want_float));
    CHECK(same_bits(exact::round_to_double(reordered.data()), want_double));

    // One BinnedSum flushed at random points into the same digits.
    Digits flushed{};
    exact::BinnedSum sum;
    sum.clear();
    for (double term : terms) {
      sum.add(term);
      if (coin(rng) == 0) sum.flush(flushed.data());
      if (coin(rng) == 0) sum.flush(flushed.data());  // twice in a row: an empty flush
    }
    sum.flush(flushed.data());
    // The bins' digits are the same; the flags word may differ (flags are or-ed per
    // flush: +inf and -inf in different flushes set both fields, in one flush NaN),
    // with the same meaning.
    CHECK(std::equal(flushed.begin(), flushed.begin() + exact::kBins, whole.begin()));
    CHECK(same_bits(exact::round_to_float(flushed.data()), want_float));

    // Eight lanes (the CPU loops' layout), terms dealt round-robin, all flushed into
    // one set of digits with a stride.
    exact::BinnedSums<8> lanes;
    lanes.clear();
    for (size_t i = 0; i < terms.size(); i += 8) {
      double batch[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (size_t l = 0; l < 8 && i + l < terms.size(); ++l) batch[l] = terms[i + l];
      lanes.add(batch);
    }
    int64_t strided[2 * kDigits] = {};
    for (int l = 0; l < 8; ++l) lanes.flush(l, strided + 1, 2);
    Digits gathered{};
    for (int d = 0; d < kDigits; ++d) gathered[d] = strided[1 + 2 * d];
    CHECK(std::equal(gathered.begin(), gathered.begin() + exact::kBins, whole.begin()));
    CHECK(same_bits(exact::round_to_float(strided + 1, 2), want_float));
    CHECK(same_bits(exact::round_to_double(strided + 1, 2), want_double));
  }
}

// ---------------------------------------------------------------- 4. many terms

TEST_CASE("exact sums stay exact past kTermsPerFlush terms", "[exact][cpu]") {
  // Terms whose part in one bin is 2^34 - 1 units, the most below the top bin: without
  // the flushes, the bin's double sum passes 2^53 units with odd totals and drops bits.
  // (2^34 - 1) 2^61 = ((2^17 - 1) 2^61) (2^17 + 1), a product of two float32s; its
  // low twin (2^34 - 1) 2^-149 fills the lowest bin the same way.
  const int64_t n = exact::kTermsPerFlush + 1001;
  const double m = static_cast<double>((int64_t{1} << 34) - 1);
  const double high = static_cast<double>(float((1 << 17) - 1) * f2(61)) * double((1 << 17) + 1);
  const double low = m * p2(-149);
  REQUIRE(high == m * p2(61));
  for (const double term : {high, -high, low, -low}) {
    CAPTURE(term);
    exact::BinnedSum sum;
    sum.clear();
    Digits digits{};
    int64_t pending = 0;
    for (int64_t i = 0; i < n; ++i) {
      sum.add(term);
      if (++pending == exact::kTermsPerFlush) {
        sum.flush(digits.data());
        pending = 0;
      }
    }
    sum.flush(digits.data());
    // The exact total, n * term, in closed form.
    const mpq_class exact_total = mpq_class(n) * mpq_class(term);
    ReferenceSum reference_sum;
    reference_sum.value = exact_total;
    CHECK(same_bits(exact::round_to_double(digits.data()), reference_sum.rounded<double>()));
    CHECK(same_bits(exact::round_to_float(digits.data()), reference_sum.rounded<float>()));
    // And by hand: n (2^34 - 1) < 2^54 needs one rounding in double.
    const mpz_class units = mpz_class(static_cast<unsigned long>(n)) * ((mpz_class(1) << 34) - 1);
    CHECK(mpz_sizeinbase(units.get_mpz_t(), 2) == 54);
  }

  // i * 2^-20 for i < n: the sum n (n - 1) / 2 * 2^-20, exact in a double.
  exact::BinnedSums<8> lanes;
  lanes.clear();
  Digits digits{};
  int64_t pending = 0;
  for (int64_t i = 0; i < n; i += 8) {
    double batch[8];
    for (int l = 0; l < 8; ++l) batch[l] = i + l < n ? static_cast<double>(i + l) * p2(-20) : 0.0;
    lanes.add(batch);
    if (++pending == exact::kTermsPerFlush) {
      for (int l = 0; l < 8; ++l) lanes.flush(l, digits.data(), 1);
      pending = 0;
    }
  }
  for (int l = 0; l < 8; ++l) lanes.flush(l, digits.data(), 1);
  const double closed_form = static_cast<double>(n) * static_cast<double>(n - 1) / 2 * p2(-20);
  CHECK(exact::round_to_double(digits.data()) == closed_form);
  CHECK(exact::round_to_float(digits.data()) == static_cast<float>(closed_form));
}

TEST_CASE("exact sums: a long sum of large terms, one flush per kTermsPerFlush", "[exact][cpu]") {
  // n terms of (2^34 - 1) 2^61, then n - 1 of its negation and -2^-149 (the smallest
  // grid unit, seven bins lower): the total is (2^34 - 1) 2^61 - 2^-149.
  const int64_t n = exact::kTermsPerFlush + 1001;
  const double big = static_cast<double>((int64_t{1} << 34) - 1) * p2(61);
  std::vector<double> terms(static_cast<size_t>(n), big);
  for (int64_t i = 0; i + 1 < n; ++i) terms.push_back(-big);
  terms.push_back(-p2(-149));
  const Digits digits = digits_of(terms);
  CHECK(exact::round_to_double(digits.data()) == big);             // below half an ulp
  CHECK(exact::round_to_float(digits.data()) == f2(95));           // 2^34 - 1 rounds up to 2^34
  CHECK(same_bits(exact::round_to_double(digits.data()), exact_reference<double>(terms)));
  CHECK(same_bits(exact::round_to_float(digits.data()), exact_reference<float>(terms)));
  // The digits hold the rest exactly: adding 2^-149 back leaves big, once more exactly.
  Digits restored = digits;
  add_digits(restored, digits_of({p2(-149), big}));
  CHECK(exact::round_to_double(restored.data()) == 2 * big);
  CHECK(restored[exact::kBins - 1] == 0);
}

TEST_CASE("add_scaled_integer adds p * 2^t exactly, in any unit, either sign", "[exact][cpu]") {
  // The digits' value against GMP: Σ digit_k 2^b_k before plus p 2^t must equal after.
  auto value_of = [](const int64_t (&digits)[kDigits]) {
    mpq_class value = 0;
    for (int k = 0; k < exact::kBins; ++k) {
      mpq_class unit = exact::bin_exponent(k) >= 0
                           ? mpq_class(mpz_class(1) << exact::bin_exponent(k))
                           : mpq_class(mpz_class(1), mpz_class(1) << -exact::bin_exponent(k));
      unit.canonicalize();
      value += mpq_class(mpz_class(std::to_string(digits[k]))) * unit;
    }
    return value;
  };
  auto scaled = [](exact::Int128 p, int t) {
    const bool negative = p < 0;
    exact::UInt128 magnitude = negative ? -static_cast<exact::UInt128>(p) : p;
    mpz_class n = 0;
    for (int shift = 96; shift >= 0; shift -= 32) {
      n = (n << 32) + mpz_class(static_cast<unsigned long>((magnitude >> shift) & 0xffffffffu));
    }
    if (negative) n = -n;
    mpq_class value = t >= 0 ? mpq_class(n * (mpz_class(1) << t))
                             : mpq_class(n, mpz_class(1) << -t);
    value.canonicalize();
    return value;
  };
  std::mt19937_64 random(20261130);
  for (int trial = 0; trial < 20000; ++trial) {
    // Magnitudes from 1 bit to 93 (the limit), units from 2^-149 up to where the top
    // digit still fits.
    const int bits = 1 + static_cast<int>(random() % 93);
    exact::Int128 p = static_cast<exact::Int128>(random()) << 64 | random();
    p = static_cast<exact::Int128>(static_cast<exact::UInt128>(p) >> (128 - bits));
    if (random() % 2) p = -p;
    const int highest_t = std::min(exact::kTopBinExponent + exact::kBinBits - 1,
                                   exact::kTopBinExponent + 61 - bits);
    const int t = exact::kLowestExponent +
                  static_cast<int>(random() % static_cast<uint64_t>(highest_t - exact::kLowestExponent + 1));
    int64_t digits[kDigits] = {};
    for (int k = 0; k < exact::kBins; ++k) {  // an earlier sum's digits, either sign
      digits[k] = static_cast<int64_t>(random() % (uint64_t{1} << 40)) - (int64_t{1} << 39);
    }
    const mpq_class before = value_of(digits);
    exact::add_scaled_integer(digits, 1, p, t);
    INFO("trial " << trial << ": " << bits << " bits at 2^" << t);
    const bool exact = value_of(digits) == before + scaled(p, t);  // (no mpq printing)
    REQUIRE(exact);
  }
  // The edges: the grid's last unit, the top bin's, and p = 0 (no digit touched).
  int64_t digits[kDigits] = {};
  exact::add_scaled_integer(digits, 1, 3, exact::kLowestExponent);
  CHECK(digits[exact::kBins - 1] == 3);
  exact::add_scaled_integer(digits, 1, -5, exact::kTopBinExponent + exact::kBinBits - 1);
  CHECK(digits[0] == -5 * (int64_t{1} << (exact::kBinBits - 1)));
  int64_t untouched[kDigits] = {1, 2, 3, 4, 5, 6, 7, 8, 0};
  exact::add_scaled_integer(untouched, 1, 0, 0);
  CHECK(untouched[0] == 1);
  CHECK(untouched[7] == 8);
}
