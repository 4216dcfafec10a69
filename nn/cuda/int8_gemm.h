// Integer matrix products on the tensor cores, through cuBLASLt: C = Aᵀ B, or C += Aᵀ B,
// with A [k, m] and B [k, n] of int8 and C [m, n] of int32, all column-major, each
// column's k elements contiguous (A and B "K-major", the layout the integer tensor
// cores read best). Integer products and sums are exact in any order, so C does not
// depend on the algorithm or the split cuBLASLt chooses: the same bits on every run.
// The caller keeps every |C| below 2^31 (k * 128 * 128 < 2^31 for any int8 values).
#pragma once

#include <cstdint>

#include "core/cuda_runtime.h"

namespace seqpar::nn::detail {

struct Int8Product {
  int64_t m, n, k;   // each a multiple of 16
  const int8_t* a;   // [k, m], column j at a + j * a_stride
  const int8_t* b;   // [k, n], column j at b + j * k
  int32_t* c;        // [m, n], column j at c + j * m
  bool accumulate;   // C += Aᵀ B rather than C = Aᵀ B
  int64_t a_stride = 0;  // 0: k (A whole); else a multiple of 16, at least k (A a block of rows of a longer matrix)
  // Several products of the same shape in one launch (cuBLASLt's strided batch): product
  // b reads A at a + b * a_batch_stride, B at b + b * b_batch_stride and writes C at
  // c + b * c_batch_stride (elements; multiples of 16). One launch costs less than
  // `batch` launches when each product is small.
  int batch = 1;
  int64_t a_batch_stride = 0, b_batch_stride = 0, c_batch_stride = 0;
};

// Stream-ordered on `stream` (of `device`, the current device); takes its workspace from
// the device's stream-ordered allocator. Throws seqpar::Error naming cuBLASLt's status.
void int8_product(const Int8Product& product, int device, cuda::Stream stream);

}  // namespace seqpar::nn::detail
