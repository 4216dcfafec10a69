// The all-to-all's reference: a plain model of its permutation (dist/all_to_all.h),
// computed on the host from every rank's input. No Catch2 here: seqpar_nccl_test uses it
// too.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace seqpar::test {

// What rank `rank` must hold after an all-to-all of `inputs` (rank i's input, [rows,
// ...] row-major): chunk i of the result is chunk `rank` of inputs[i].
inline std::vector<float> all_to_all_model(const std::vector<Tensor>& inputs, int rank) {
  const int64_t size = static_cast<int64_t>(inputs.size());
  const int64_t chunk_values = inputs[0].numel() / size;
  std::vector<float> expected;
  for (const Tensor& input : inputs) {
    const std::vector<float> values = input.to_vector();
    const auto first = values.begin() + rank * chunk_values;
    expected.insert(expected.end(), first, first + chunk_values);
  }
  return expected;
}

}  // namespace seqpar::test
