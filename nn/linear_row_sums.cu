// CUDA kernels of Linear's sums over rows, dW = dyᵀ x and db = Σ_rows dy, in exact
// arithmetic (core/exact_sum.h): the same digits as the CPU loops of nn/linear_kernels.cpp,
// whatever the grid. Because the digits of partial sums add as integers, the rows can
// be cut into chunks freely (here: enough chunks to fill the GPU) and the chunks' digits
// meet through integer atomics, whose order cannot change the result. No
// floating-point atomics: the bins are private to a thread.
//
// Layout: a warp owns 32 adjacent columns k of kOutputs output rows j and a chunk of
// rows; the block's 8 warps take every 8th row of the chunk. Lanes read adjacent x
// values (one coalesced load per row, shared by the thread's kOutputs sums) and share
// dy[row, j] (broadcasts). Before summing, the block finds the largest factors of its
// terms and skips the bins no term can reach (exact::first_reachable_bin): with the
// issue's data half of them, and the same bits, since those bins would only get +0.
#include <algorithm>

#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "core/exact_sum.cuh"
#include "core/exact_sums.h"
#include "nn/linear_kernels.h"

namespace seqpar::nn::detail {

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int64_t kMinRowsPerChunk = 512;
constexpr int64_t kTargetBlocks = 1056;  // about 8 per SM of an H200; any value gives the same bits

// Sums per thread: kOutputs output rows j of dW share each x value; db has one.
template <bool kProducts>
constexpr int kOutputs = kProducts ? 4 : 1;

// The block's largest |a[row, j]| and |b[row, k]| over its rows, j and k, multiplied:
// a bound on its terms (integer atomics on the floats' bits, which order non-negative
// floats). fmaxf passes over NaNs, rightly: NaN terms never reach the bins (they go to
// the special sum); an infinity makes every bin reachable.
__device__ double block_term_bound(float a_largest, float b_largest) {
  __shared__ unsigned int largest[2];
  if (threadIdx.x < 2) largest[threadIdx.x] = 0;
  __syncthreads();
  atomicMax(&largest[0], __float_as_uint(a_largest));
  atomicMax(&largest[1], __float_as_uint(b_largest));
  __syncthreads();
  return static_cast<double>(__uint_as_float(largest[0])) *
         static_cast<double>(__uint_as_float(largest[1]));
}

struct RowSumsWork {
  ConstRows a, b;
  int64_t row_begin, row_end;
  int64_t k, j0;
  int outputs;  // of kOutputs: those below the matrix's edge
  int64_t* digits;
  int64_t columns, count;
};

// Moves output jj's bins into the launch's digits (integer atomics: order-free).
template <int kLanes>
__device__ void flush_output(exact::BinnedSums<kLanes>& sums, int jj, const RowSumsWork& w) {
  int64_t local[exact::kDigits] = {};
  sums.flush(jj, local, 1);
  exact::add_digits_atomically(local, w.digits + (w.j0 + jj) * w.columns + w.k, w.count);
}

// Σ a[row, j] * b[row, k] (kProducts) or Σ b[row, k] over this thread's rows, from bin
// kFirstBin on.
template <bool kProducts, int kFirstBin>
__device__ void accumulate_rows(const RowSumsWork& w) {
  constexpr int kLanes = kOutputs<kProducts>;
  exact::BinnedSums<kLanes> sums;
  sums.clear();
  int64_t terms = 0;
  for (int64_t row = w.row_begin + threadIdx.x / 32; row < w.row_end; row += kWarps) {
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
      for (int jj = 0; jj < w.outputs; ++jj) flush_output(sums, jj, w);
      terms = 0;
    }
  }
  for (int jj = 0; jj < w.outputs; ++jj) flush_output(sums, jj, w);
}

// Block (column block, output group, chunk of rows). kProducts: dW's sums; else db's,
// one per column of b (= dy).
template <bool kProducts>
__global__ void __launch_bounds__(kThreads) row_sums_kernel(ConstRows a, ConstRows b, int64_t rows,
                                                            int64_t outputs, int64_t columns,
                                                            int64_t rows_per_chunk,
                                                            int64_t* digits, int64_t count) {
  RowSumsWork w{a, b, 0, 0, 0, 0, 0, digits, columns, count};
  w.k = int64_t{blockIdx.x} * 32 + threadIdx.x % 32;
  w.j0 = int64_t{blockIdx.y} * kOutputs<kProducts>;
  w.outputs = static_cast<int>(min(int64_t{kOutputs<kProducts>}, outputs - w.j0));
  w.row_begin = int64_t{blockIdx.z} * rows_per_chunk;
  w.row_end = min(rows, w.row_begin + rows_per_chunk);
  float a_largest = kProducts ? 0.0f : 1.0f, b_largest = 0.0f;
  for (int64_t row = w.row_begin + threadIdx.x / 32; row < w.row_end; row += kWarps) {
    if (w.k < columns) b_largest = fmaxf(b_largest, fabsf(b.data[row * b.row_stride + w.k]));
    for (int jj = 0; kProducts && jj < w.outputs; ++jj) {
      a_largest = fmaxf(a_largest, fabsf(a.data[row * a.row_stride + w.j0 + jj]));
    }
  }
  const int first = exact::first_reachable_bin(block_term_bound(a_largest, b_largest));
  if (w.k >= columns) return;  // after the block's barriers
  switch (first) {
    case 0: return accumulate_rows<kProducts, 0>(w);
    case 1: return accumulate_rows<kProducts, 1>(w);
    case 2: return accumulate_rows<kProducts, 2>(w);
    case 3: return accumulate_rows<kProducts, 3>(w);
    case 4: return accumulate_rows<kProducts, 4>(w);
    case 5: return accumulate_rows<kProducts, 5>(w);
    case 6: return accumulate_rows<kProducts, 6>(w);
    default: return accumulate_rows<kProducts, 7>(w);
  }
}

template <bool kProducts>
void launch_row_sums(ConstRows a, ConstRows b, int64_t rows, int64_t outputs, int64_t columns,
                     exact::ExactSums& sums) {
  exact::check_term_count("linear_backward", rows);
  if (rows == 0 || columns == 0 || outputs == 0) return;
  const int device = sums.device().index;
  const int64_t column_blocks = cuda::ceil_div(columns, 32);
  const int64_t output_groups = cuda::ceil_div(outputs, kOutputs<kProducts>);
  const int64_t wanted_chunks =
      std::max<int64_t>(1, kTargetBlocks / (column_blocks * output_groups));
  const int64_t rows_per_chunk =
      std::max(kMinRowsPerChunk, cuda::ceil_div(rows, std::min<int64_t>(wanted_chunks, 65535)));
  const int64_t chunks = cuda::ceil_div(rows, rows_per_chunk);
  SEQPAR_CHECK(column_blocks <= 0x7fffffff && output_groups <= 65535 && chunks <= 65535,
               "linear_backward: ", outputs, " x ", columns, " sums over ", rows,
               " rows exceed the row-sum kernel's grid");
  cuda::set_device(device);
  const dim3 grid(static_cast<unsigned>(column_blocks), static_cast<unsigned>(output_groups),
                  static_cast<unsigned>(chunks));
  row_sums_kernel<kProducts><<<grid, kThreads, 0, cuda::current_stream(device)>>>(
      a, b, rows, outputs, columns, rows_per_chunk, sums.digits(), sums.count());
  CUDA_LAUNCH_CHECK();
}

}  // namespace

void accumulate_weight_grad_cuda(const ConstRows& grad_y, const ConstRows& x, exact::ExactSums& sums) {
  SEQPAR_CHECK(grad_y.rows == x.rows && sums.count() == grad_y.cols * x.cols &&
                   sums.device().is_cuda(),
               "accumulate_weight_grad_cuda: dy ", grad_y.rows, " x ", grad_y.cols, ", x ", x.rows,
               " x ", x.cols, ", ", sums.count(), " sums");
  launch_row_sums<true>(grad_y, x, x.rows, grad_y.cols, x.cols, sums);
}

void accumulate_column_sums_cuda(const ConstRows& grad_y, exact::ExactSums& sums) {
  SEQPAR_CHECK(sums.count() == grad_y.cols && sums.device().is_cuda(),
               "accumulate_column_sums_cuda: ", sums.count(), " sums for ", grad_y.cols, " columns");
  launch_row_sums<false>(grad_y, grad_y, grad_y.rows, 1, grad_y.cols, sums);
}

}  // namespace seqpar::nn::detail
