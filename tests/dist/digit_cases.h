// Exact sums of random terms over many magnitudes, one set per rank, for the tests of the
// exact all-reduce (its packed words, dist/packed_digits.h): the threads group's
// (exact_all_reduce_test.cpp) and NCCL's (nccl_test_main.cpp). Not Catch2-dependent.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/exact_bins.h"
#include "core/exact_sums.h"

namespace seqpar::test {

// Where a sum's terms come from. Each term is a float, or the product of two floats
// (exact in a double), as Linear's row sums form them.
enum class Magnitudes {
  Tiny,               // subnormal and near-subnormal floats
  SubnormalProducts,  // products below the grid's 2^-149, rounded onto it
  Huge,               // products up to 2^128, some past the bins' 2^129 (infinities)
  Narrow,             // products of one magnitude: an L1 loss's gradient
  Mixed,              // factors from 2^-75 to 2^64
  NonFinite,          // mixed, with NaNs and infinities among them
  Cancelling,         // pairs t, -t: nonzero terms, all-zero digits
  OneRank,            // mixed on rank 0, nothing anywhere else
  EachSumItsOwn,      // every sum one of the above, at random
};

inline const std::vector<Magnitudes>& all_magnitudes() {
  static const std::vector<Magnitudes> all{
      Magnitudes::Tiny,   Magnitudes::SubnormalProducts, Magnitudes::Huge,
      Magnitudes::Narrow, Magnitudes::Mixed,             Magnitudes::NonFinite,
      Magnitudes::Cancelling, Magnitudes::OneRank,       Magnitudes::EachSumItsOwn};
  return all;
}

inline std::string magnitudes_name(Magnitudes m) {
  const char* names[] = {"tiny", "subnormal products", "huge", "narrow", "mixed", "non-finite",
                         "cancelling", "one rank", "each sum its own"};
  return names[static_cast<int>(m)];
}

namespace detail {

inline double factor(std::mt19937_64& rng, int low_exponent, int high_exponent) {
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> exponent(low_exponent, high_exponent);
  return static_cast<double>(std::ldexp(normal(rng), exponent(rng)));  // a float
}

// One sum's terms, added into `sum`.
inline void add_terms(exact::BinnedSum& sum, std::mt19937_64& rng, Magnitudes m, int rank) {
  std::uniform_int_distribution<int> term_count(0, 12);
  const int terms = term_count(rng);
  for (int t = 0; t < terms; ++t) {
    switch (m) {
      case Magnitudes::Tiny: sum.add(static_cast<float>(factor(rng, -149, -118))); break;
      case Magnitudes::SubnormalProducts: sum.add(factor(rng, -90, -60) * factor(rng, -90, -60)); break;
      case Magnitudes::Huge: sum.add(factor(rng, 50, 64) * factor(rng, 50, 64)); break;
      case Magnitudes::Narrow: sum.add(factor(rng, -3, 1) * 0x1.5f3p-18); break;
      case Magnitudes::Mixed: sum.add(factor(rng, -75, 64) * factor(rng, -75, 64)); break;
      case Magnitudes::NonFinite: {
        const double specials[] = {std::numeric_limits<double>::quiet_NaN(), INFINITY, -INFINITY};
        const bool special = std::uniform_int_distribution<int>(0, 15)(rng) == 0;
        sum.add(special ? specials[rng() % 3] : factor(rng, -75, 64) * factor(rng, -75, 64));
        break;
      }
      case Magnitudes::Cancelling: {
        const double term = factor(rng, -75, 64) * factor(rng, -75, 64);
        sum.add(term);
        sum.add(-term);
        break;
      }
      case Magnitudes::OneRank:
        if (rank == 0) sum.add(factor(rng, -75, 64) * factor(rng, -75, 64));
        break;
      case Magnitudes::EachSumItsOwn: break;  // resolved per sum by random_sums
    }
  }
}

}  // namespace detail

// Rank `rank`'s `count` sums on the CPU, from `seed` (the same arguments, the same digits).
inline exact::ExactSums random_sums(uint64_t seed, int rank, int64_t count, Magnitudes m) {
  std::mt19937_64 rng(seed * 1000003 + static_cast<uint64_t>(rank));
  std::mt19937_64 per_sum_choice(seed);  // the same choice of magnitudes on every rank
  exact::ExactSums sums(count, Device::cpu());
  for (int64_t i = 0; i < count; ++i) {
    Magnitudes own = m;
    if (m == Magnitudes::EachSumItsOwn) {
      own = all_magnitudes()[per_sum_choice() % (all_magnitudes().size() - 1)];
    }
    exact::BinnedSum sum;
    sum.clear();
    detail::add_terms(sum, rng, own, rank);
    sum.flush(sums.digits() + i, count);
  }
  return sums;
}

// A copy of host `sums` on `device`.
inline exact::ExactSums copy_to(const exact::ExactSums& sums, Device device) {
  if (device.is_host()) {
    exact::ExactSums copy(sums.count(), device);
    copy.copy_from(sums);
    return copy;
  }
  exact::ExactSums copy(sums.count(), device);
  if (sums.words() > 0) {
    cuda::copy(copy.digits(), device, sums.digits(), Device::cpu(),
               sizeof(int64_t) * static_cast<size_t>(sums.words()));
  }
  return copy;
}

// Every rank's sums added word by word: what an all-reduce of every word leaves.
inline std::vector<int64_t> full_all_reduce(uint64_t seed, int world_size, int64_t count,
                                            Magnitudes m) {
  exact::ExactSums total(count, Device::cpu());
  for (int rank = 0; rank < world_size; ++rank) total.add(random_sums(seed, rank, count, m));
  return total.to_host();
}

}  // namespace seqpar::test
