// core/exact_bins.h's exact sums against the exact reference (tests/exact_reference.h):
// the same digits and bits however the terms are split into pieces and ordered, and
// exactness past kTermsPerFlush terms (flushes) and for long sums of large terms.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/exact_bins.h"
#include "core/exact_sums.h"
#include "core/tensor.h"
#include "tests/core/exact_bins_test_util.h"
#include "tests/exact_reference.h"

using namespace seqpar;
using namespace seqpar::test;
using exact::kDigits;

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
  // Terms whose part in one bin is 2^30 - 1 units, the most below the top bin: without
  // the flushes, the bin's double sum passes 2^53 units with odd totals and drops bits.
  // (2^30 - 1) 2^68 = ((2^15 - 1) 2^68) (2^15 + 1), a product of two float32s; its
  // low twin (2^30 - 1) 2^-149 fills the lowest bin the same way.
  const int64_t n = exact::kTermsPerFlush + 1001;
  const double m = static_cast<double>((int64_t{1} << 30) - 1);
  const double high = static_cast<double>(float((1 << 15) - 1) * f2(68)) * double((1 << 15) + 1);
  const double low = m * p2(-149);
  REQUIRE(high == m * p2(68));
  REQUIRE(exact::bin_exponent(1) == 68);
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
    // And by hand: n (2^30 - 1) < 2^54 needs one rounding in double.
    const mpz_class units = mpz_class(static_cast<unsigned long>(n)) * ((mpz_class(1) << 30) - 1);
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
  // n terms of (2^30 - 1) 2^68, then n - 1 of its negation and -2^-149 (the smallest
  // grid unit, eight bins lower): the total is (2^30 - 1) 2^68 - 2^-149.
  const int64_t n = exact::kTermsPerFlush + 1001;
  const double big = static_cast<double>((int64_t{1} << 30) - 1) * p2(68);
  std::vector<double> terms(static_cast<size_t>(n), big);
  for (int64_t i = 0; i + 1 < n; ++i) terms.push_back(-big);
  terms.push_back(-p2(-149));
  const Digits digits = digits_of(terms);
  CHECK(exact::round_to_double(digits.data()) == big);             // below half an ulp
  CHECK(exact::round_to_float(digits.data()) == f2(98));           // 2^30 - 1 rounds up to 2^30
  // The digits hold the rest exactly: adding 2^-149 back leaves big, once more exactly.
  Digits restored = digits;
  add_digits(restored, digits_of({p2(-149), big}));
  CHECK(exact::round_to_double(restored.data()) == 2 * big);
  CHECK(restored[exact::kBins - 1] == 0);
}

TEST_CASE("FlushingSum flushes its bins every kTermsPerFlush terms and at finish", "[exact][cpu]") {
  std::vector<int64_t> digits(kDigits, 0);
  exact::FlushingSum sum(digits.data());
  const double term = 0x1.8p-3;  // 0.1875, exact
  auto all_zero = [&] {
    for (int64_t d : digits) {
      if (d != 0) return false;
    }
    return true;
  };
  for (int64_t i = 0; i + 1 < exact::kTermsPerFlush; ++i) sum.add(term);
  CHECK(all_zero());  // still in the bins
  sum.add(term);
  CHECK_FALSE(all_zero());  // the kTermsPerFlush-th term flushed them
  CHECK(exact::round_to_double(digits.data()) == static_cast<double>(exact::kTermsPerFlush) * term);
  // Two more flushes' worth and a few: the digits hold every term once finished.
  const int64_t more = 2 * exact::kTermsPerFlush + 5;
  for (int64_t i = 0; i < more; ++i) sum.add(-term);
  sum.finish();
  CHECK(exact::round_to_double(digits.data()) ==
        static_cast<double>(exact::kTermsPerFlush - more) * term);
}
