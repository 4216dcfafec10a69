// Whether every dy of a weight gradient had one magnitude (nn/one_magnitude.h), read on
// the device by the kernels of both paths, so that exactly one of them works.
#pragma once

#include "nn/one_magnitude.h"

namespace seqpar::nn::detail {

// words[0]: the largest |dy| bits; words[1]: the complement of the smallest nonzero
// |dy| bits (0: none), both kept as maxima by the column-maxima pass.
__device__ inline OneMagnitude one_magnitude(const unsigned int* words) {
  return one_magnitude_of(words[0], ~words[1]);
}

}  // namespace seqpar::nn::detail
