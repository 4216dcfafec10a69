// Device helpers for exact sums (core/exact_bins.h): how threads' digits meet. Integer
// operations only (sums of the bin digits, an or of the flags), so neither the order
// of the threads nor that of the atomics can change a bit.
#pragma once

#include <cstdint>

#include "core/exact_bins.h"
#include "core/exact_fixed_point.h"

namespace seqpar::exact {

// digits[d * stride] += local[d] (or |= for the flags), one integer atomic per
// non-zero word: for a thread whose sum is its own.
__device__ inline void add_digits_atomically(const int64_t (&local)[kDigits], int64_t* digits,
                                             int64_t stride) {
  for (int d = 0; d < kDigits; ++d) {
    if (local[d] == 0) continue;
    auto* word = reinterpret_cast<unsigned long long*>(digits + d * stride);
    const auto value = static_cast<unsigned long long>(local[d]);
    if (d == kSpecialDigit) {
      atomicOr(word, value);
    } else {
      atomicAdd(word, value);  // wraps as two's complement: the true total is in range
    }
  }
}

// add_scaled_integer's p * 2^t, added into digits[d * stride] with one integer atomic
// per slice it touches (p below 2^93 spans at most four bins): for a thread whose term
// is its own, without a local copy of the digits.
__device__ inline void add_scaled_integer_atomically(int64_t* digits, int64_t stride, Int128 p, int t) {
  if (p == 0) return;
  const bool negative = p < 0;
  const int offset = t - kLowestExponent;
  int k = kBins - 1 - offset / kBinBits;
  UInt128 magnitude = static_cast<UInt128>(negative ? -p : p) << (offset % kBinBits);
  constexpr uint64_t kSliceMask = (uint64_t{1} << kBinBits) - 1;
  while (magnitude != 0) {
    const auto slice = static_cast<int64_t>(k == 0 ? static_cast<uint64_t>(magnitude)
                                                   : static_cast<uint64_t>(magnitude) & kSliceMask);
    if (slice != 0) {
      atomicAdd(reinterpret_cast<unsigned long long*>(digits + k * stride),
                static_cast<unsigned long long>(negative ? -slice : slice));
    }
    if (k == 0) break;
    magnitude >>= kBinBits;
    --k;
  }
}

// integer * significand * 2^t added into digits[d * stride] as add_scaled_integer_atomically
// adds it, through slice_scaled_product's four slices where they fit below bin 0 (almost
// always): one 64-bit multiply pair and shifts instead of a 128-bit product and loop.
__device__ inline void add_scaled_product_atomically(int64_t* digits, int64_t stride, int64_t integer,
                                                     uint32_t significand, int t) {
  if (integer == 0 || significand == 0) return;
  int64_t slices[4];
  int lowest;
  if (!slice_scaled_product(integer, significand, t, slices, lowest)) {
    add_scaled_integer_atomically(digits, stride, Int128{integer} * significand, t);
    return;
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if (slices[i] != 0) {
      atomicAdd(reinterpret_cast<unsigned long long*>(digits + (lowest - i) * stride),
                static_cast<unsigned long long>(slices[i]));
    }
  }
}

// The sum of every thread's `local` digits into `block` (shared memory, kDigits words),
// visible to every thread on return: a warp's lanes first (shuffles), then the block's
// warps (shared-memory atomics). Every thread of the block must call it; blockDim.x a
// multiple of 32 and at least kDigits.
__device__ inline void sum_block_digits(const int64_t (&local)[kDigits],
                                        unsigned long long (&block)[kDigits]) {
  if (threadIdx.x < kDigits) block[threadIdx.x] = 0;
  __syncthreads();
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int d = 0; d < kDigits; ++d) {
    unsigned long long value = static_cast<unsigned long long>(local[d]);
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
      const unsigned long long other = __shfl_down_sync(0xffffffffu, value, offset);
      value = d == kSpecialDigit ? (value | other) : value + other;
    }
    if (lane == 0 && value != 0) {
      if (d == kSpecialDigit) {
        atomicOr(&block[d], value);
      } else {
        atomicAdd(&block[d], value);
      }
    }
  }
  __syncthreads();
}

// The sum of every thread's `local` digits added into digits[d * stride]: the block's
// sum (sum_block_digits), then one global atomic per word. For threads that share one
// sum; the same conditions as sum_block_digits.
__device__ inline void add_block_digits(const int64_t (&local)[kDigits], int64_t* digits,
                                        int64_t stride) {
  __shared__ unsigned long long block_digits[kDigits];
  sum_block_digits(local, block_digits);
  if (threadIdx.x < kDigits && block_digits[threadIdx.x] != 0) {
    auto* word = reinterpret_cast<unsigned long long*>(digits + threadIdx.x * stride);
    if (threadIdx.x == kSpecialDigit) {
      atomicOr(word, block_digits[threadIdx.x]);
    } else {
      atomicAdd(word, block_digits[threadIdx.x]);
    }
  }
}

}  // namespace seqpar::exact
