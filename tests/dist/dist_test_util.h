// Helpers for the dist tests: per-rank random inputs and the sequential references
// every collective must match bit for bit.
//
// Catch2 assertions are not thread-safe: rank threads only record what they saw
// (each into its own slot), and the test thread checks it after the world joined.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/generator.h"
#include "core/tensor.h"
#include "dist/process_group.h"

namespace seqpar::test {

// Rank r's input: standard normal values from its own seed, on the CPU.
inline std::vector<Tensor> rank_inputs(int world_size, const Shape& shape, uint64_t seed) {
  std::vector<Tensor> inputs;
  for (int rank = 0; rank < world_size; ++rank) {
    Generator generator(seed + static_cast<uint64_t>(rank));
    inputs.push_back(generator.randn(shape));
  }
  return inputs;
}

// The reduction over `ranks` (indices into inputs) as the groups define it: Max
// element by element; Sum the exact sum rounded once; Avg that sum divided by the count.
inline std::vector<float> sequential_reduce(const std::vector<Tensor>& inputs,
                                            const std::vector<int>& ranks, dist::ReduceOp op) {
  // Sums: the exact sum rounded once to float (docs/numerics.md). long double's 64-bit
  // significand holds the sum of a few of these test floats exactly (their exponents
  // lie within 2^30 of each other), so one conversion is one correct rounding.
  std::vector<float> out = inputs[static_cast<size_t>(ranks[0])].to_vector();
  std::vector<long double> sums(out.begin(), out.end());
  for (size_t i = 1; i < ranks.size(); ++i) {
    const std::vector<float> next = inputs[static_cast<size_t>(ranks[i])].to_vector();
    for (size_t k = 0; k < out.size(); ++k) {
      out[k] = std::fmax(out[k], next[k]);
      sums[k] += next[k];
    }
  }
  if (op != dist::ReduceOp::Max) {
    for (size_t k = 0; k < out.size(); ++k) out[k] = static_cast<float>(sums[k]);
  }
  if (op == dist::ReduceOp::Avg) {
    for (float& value : out) value = value / static_cast<float>(ranks.size());
  }
  return out;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline std::vector<int> all_ranks(int world_size) {
  std::vector<int> ranks;
  for (int rank = 0; rank < world_size; ++rank) ranks.push_back(rank);
  return ranks;
}

}  // namespace seqpar::test
