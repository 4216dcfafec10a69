// The general path of Linear's sums over rows (dW = dyᵀ x, db = Σ_rows dy), one block's
// share: binned sums in each thread, integer atomics into the launch's digits. The row
// sums kernel (linear_row_sums.cu) runs it for each of its blocks; the benchmarks'
// fused step runs it in its one-magnitude dW's blocks, over each block's own share, when
// dy turns out not to have one magnitude (bench/fused/kernels/weight_grad_fragments.cu),
// so that it needs no launch of the general kernel beside that one.
//
// A block: kRowSumsWarps warps; lane l owns column k0 + l, of kRowSumsOutputs outputs
// from j0 on, and the warps take every kRowSumsWarps-th row of [row_begin, row_end).
#pragma once

#include "core/exact_bins.cuh"
#include "nn/rows.h"

namespace seqpar::nn::detail {

constexpr int kRowSumsWarps = 8;
// Sums per thread. One: the FP64 chains of a term are long, so occupancy (many warps
// with few registers) hides their latency better than sums that share an x load
// (measured: bench/RESULTS.md).
template <bool kProducts>
constexpr int kRowSumsOutputs = 1;

struct RowSumsWork {
  ConstRows a, b;
  int64_t row_begin, row_end;
  int64_t k, j0;
  int outputs;  // of kRowSumsOutputs: those below the matrix's edge
  int64_t* digits;
  int64_t columns, count;
};

// Moves the bins into the launch's digits (integer atomics: order-free). The loop over
// the outputs is unrolled so that every index into the bins is a constant: the bins
// stay in registers.
template <int kLanes>
__device__ void flush_outputs(exact::BinnedSums<kLanes>& sums, const RowSumsWork& w) {
#pragma unroll
  for (int jj = 0; jj < kLanes; ++jj) {
    int64_t local[exact::kDigits] = {};
    sums.flush(jj, local, 1);
    if (jj < w.outputs) {
      exact::add_digits_atomically(local, w.digits + (w.j0 + jj) * w.columns + w.k, w.count);
    }
  }
}

// Σ a[row, j] * b[row, k] (kProducts) or Σ b[row, k] over this thread's rows, from bin
// kFirstBin on.
template <bool kProducts, int kFirstBin>
__device__ void accumulate_rows(const RowSumsWork& w) {
  constexpr int kLanes = kRowSumsOutputs<kProducts>;
  exact::BinnedSums<kLanes> sums;
  sums.clear();
  int64_t terms = 0;
  for (int64_t row = w.row_begin + threadIdx.x / 32; row < w.row_end; row += kRowSumsWarps) {
    const double value = static_cast<double>(w.b.data[row * w.b.row_stride + w.k]);
    double products[kLanes];
#pragma unroll
    for (int jj = 0; jj < kLanes; ++jj) {
      const float factor =
          !kProducts ? 1.0f : jj < w.outputs ? w.a.data[row * w.a.row_stride + w.j0 + jj] : 0.0f;
      products[jj] = __dmul_rn(static_cast<double>(factor), value);
    }
    sums.template add<kFirstBin>(products);
    if (++terms == exact::kTermsPerFlush) {
      flush_outputs(sums, w);
      terms = 0;
    }
  }
  flush_outputs(sums, w);
}

// Block (k0 / 32, j0, rows [row_begin, row_end)) of the general sums: Σ a[row, j] *
// b[row, k] (kProducts: dW, a = dy and b = x) or Σ b[row, k] (db, b = dy) into
// digits[d * count + j * columns + k]. largest_a, largest_b: the factors' column maxima
// (each warp skips the bins no term of its columns can reach). Every thread of the
// block calls it.
template <bool kProducts>
__device__ void sum_rows_block(const ConstRows& a, const ConstRows& b, int64_t outputs, int64_t columns,
                               int64_t k0, int64_t j0, int64_t row_begin, int64_t row_end,
                               const unsigned int* largest_a, const unsigned int* largest_b,
                               int64_t* digits, int64_t count) {
  RowSumsWork w{a, b, row_begin, row_end, k0 + threadIdx.x % 32, j0, 0, digits, columns, count};
  w.outputs = static_cast<int>(min(int64_t{kRowSumsOutputs<kProducts>}, outputs - w.j0));
  // The first bin this warp's terms can reach, from the largest factors over all rows:
  // the same for the whole warp (a reduction over its columns), so no lane diverges.
  const unsigned int b_bits = w.k < columns ? largest_b[w.k] : 0u;
  const float b_largest = __uint_as_float(__reduce_max_sync(0xffffffffu, b_bits));
  float a_largest = kProducts ? 0.0f : 1.0f;
  for (int jj = 0; kProducts && jj < w.outputs; ++jj) {
    a_largest = fmaxf(a_largest, __uint_as_float(largest_a[w.j0 + jj]));
  }
  const int first = exact::first_reachable_bin(static_cast<double>(a_largest) *
                                               static_cast<double>(b_largest));
  if (w.k >= columns) return;
  switch (first) {
    case 0: return accumulate_rows<kProducts, 0>(w);
    case 1: return accumulate_rows<kProducts, 1>(w);
    case 2: return accumulate_rows<kProducts, 2>(w);
    case 3: return accumulate_rows<kProducts, 3>(w);
    case 4: return accumulate_rows<kProducts, 4>(w);
    case 5: return accumulate_rows<kProducts, 5>(w);
    case 6: return accumulate_rows<kProducts, 6>(w);
    case 7: return accumulate_rows<kProducts, 7>(w);
    default: return accumulate_rows<kProducts, 8>(w);
  }
}
static_assert(exact::kBins == 9, "sum_rows_block's switch has a case for each first bin");

}  // namespace seqpar::nn::detail
