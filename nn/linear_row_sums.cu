// CUDA kernels of Linear's sums over rows, dW = dyᵀ x and db = Σ_rows dy, in exact
// arithmetic (core/exact_sum.h): the same digits as the CPU loops of nn/linear_kernels.cpp,
// whatever the grid. Because the digits of partial sums add as integers, the rows can
// be cut into chunks freely (here: enough chunks to fill the GPU) and the chunks' digits
// meet through integer atomics, whose order cannot change the result. No
// floating-point atomics: the bins are private to a thread.
//
// Layout: a warp owns 32 adjacent columns k of one output row j and a chunk of rows;
// the block's 8 warps take every 8th row of the chunk. Lanes read adjacent x values
// (one coalesced load per row) and share dy[row, j] (a broadcast).
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

// Moves a thread's bins into the launch's digits (integer atomics: order-free).
__device__ void flush_to(exact::BinnedSum& sum, int64_t* digits, int64_t stride) {
  int64_t local[exact::kDigits] = {};
  sum.flush(local, 1);
  exact::add_digits_atomically(local, digits, stride);
}

// Sum (j, k) over rows: Σ a[row, j] * b[row, k] when kProducts, else Σ b[row, k]
// (db: b = dy, one sum per column). Sum index j * columns + k of `count`.
template <bool kProducts>
__global__ void __launch_bounds__(kThreads) row_sums_kernel(ConstRows a, ConstRows b, int64_t rows,
                                                            int64_t columns, int64_t rows_per_chunk,
                                                            int64_t* digits, int64_t count) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t k = int64_t{blockIdx.x} * 32 + lane;
  const int64_t j = blockIdx.y;
  const int64_t row_begin = int64_t{blockIdx.z} * rows_per_chunk;
  const int64_t row_end = min(rows, row_begin + rows_per_chunk);
  if (k >= columns) return;
  exact::BinnedSum sum;
  sum.clear();
  int64_t terms = 0;
  for (int64_t row = row_begin + warp; row < row_end; row += kWarps) {
    const double value = static_cast<double>(b.data[row * b.row_stride + k]);
    sum.add(kProducts ? __dmul_rn(static_cast<double>(a.data[row * a.row_stride + j]), value) : value);
    if (++terms == exact::kTermsPerFlush) {
      flush_to(sum, digits + j * columns + k, count);
      terms = 0;
    }
  }
  flush_to(sum, digits + j * columns + k, count);
}

template <bool kProducts>
void launch_row_sums(ConstRows a, ConstRows b, int64_t rows, int64_t outputs, int64_t columns,
                     exact::ExactSums& sums) {
  exact::check_term_count("linear_backward", rows);
  if (rows == 0 || columns == 0 || outputs == 0) return;
  const int device = sums.device().index;
  const int64_t column_blocks = cuda::ceil_div(columns, 32);
  const int64_t wanted_chunks = std::max<int64_t>(1, kTargetBlocks / (column_blocks * outputs));
  const int64_t rows_per_chunk =
      std::max(kMinRowsPerChunk, cuda::ceil_div(rows, std::min<int64_t>(wanted_chunks, 65535)));
  const int64_t chunks = cuda::ceil_div(rows, rows_per_chunk);
  SEQPAR_CHECK(column_blocks <= 0x7fffffff && outputs <= 65535 && chunks <= 65535,
               "linear_backward: ", outputs, " x ", columns, " sums over ", rows,
               " rows exceed the row-sum kernel's grid");
  cuda::set_device(device);
  const dim3 grid(static_cast<unsigned>(column_blocks), static_cast<unsigned>(outputs),
                  static_cast<unsigned>(chunks));
  row_sums_kernel<kProducts><<<grid, kThreads, 0, cuda::current_stream(device)>>>(
      a, b, rows, columns, rows_per_chunk, sums.digits(), sums.count());
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
