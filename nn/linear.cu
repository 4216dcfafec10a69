// CUDA path of nn/linear.h: y = x Wᵀ + b, dx = dy W, dW = dyᵀ x, db = Σ_rows dy.
//
// Design note. All three products are one fp32 GEMM, C[M, N] = Σ_k A(m, k) · Bᵀ(n, k),
// whose operands are described by two strides each (Operand; it and Gemm, the problem
// both GEMM kernels take, are in nn/linear_large.h), so a transposed or row-strided
// view costs nothing but a different stride:
//
//   forward  C = y  [n, out]   A = x  (m=row, k=in)     Bᵀ = W (n=out, k=in)
//   dx       C = dx [n, in]    A = dy (m=row, k=out)    Bᵀ = W (n=in, k=out), read down columns
//   dW       C = dW [out, in]  A = dy (m=out, k=row)    Bᵀ = x (n=in, k=row), both read down columns
//
// The kernel here is the classic tiled GEMM with register blocking: a block of 256 threads
// owns a 64 x 64 tile of C, stages 64 x 16 slices of A and Bᵀ in shared memory, and each
// thread accumulates a 4 x 4 sub-tile in registers (rows ty + 16 i, columns tx + 16 j,
// so that a warp's shared-memory reads are broadcasts or consecutive words, and its
// global stores are 16 consecutive floats). The load mapping is a template argument:
// consecutive threads walk whichever index of the operand is contiguous in memory.
//
// Skinny shapes. The seed's dW reduces over K = n = 3000..12000 into a tiny 16 x 640
// output: only 10 tiles, far too few blocks for 132 SMs. So K is split: grid.z blocks
// each reduce a K range into their own partial tile of a scratch buffer, and a second
// kernel sums the partials in split order. No atomics: every sum has a fixed order,
// and the split count depends only on the shape (not on the GPU), so results are
// bitwise-reproducible. db uses the same two stages: per-chunk column sums, then the
// same fixed-order partial sum, in double as the CPU path sums it.
//
// Large products go to the 128 x 128 kernel of nn/linear_large.cu, which reads both
// layouts too and splits K the same way: when its tiles alone, or its tiles times a K
// split into ranges of at least 1024, make at least 128 blocks (about one per SM), and
// the operands allow its 16-byte loads. The stress shape's dW (1024 x 1024 over 2^20
// rows) is 64 tiles x 4 splits. Its K slices are kLargeSlice deep (16 or 8 by layout,
// in nn/linear_large.h; LinearKernel::Slice8 / Slice16 pick either for
// comparisons), and K is split into whole slices of that depth. choose_gemm below is
// the one place that picks the kernel, its slice depth and the split, from the shape
// (and the layouts' alignment) alone.
//
// The forward and dx never split K: each output is one fma chain over k, the canonical
// order of nn/linear_kernels.h. dW and db are sums over rows, which are exact
// (nn/linear_row_sums.cu); the dW GEMM below is kept for benchmarks only.
#include <algorithm>
#include <cstdint>

#include "core/block_reduce.cuh"
#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "nn/linear.h"
#include "nn/linear_large.h"
#include "core/exact_sums.h"
#include "nn/linear_kernels.h"

namespace seqpar::nn::detail {

namespace {

constexpr int kTileM = 64, kTileN = 64, kTileK = 16;
constexpr int kThreadsN = 16, kThreadsM = 16;  // a 16 x 16 grid of threads per tile
constexpr int kThreads = kThreadsM * kThreadsN;
constexpr int kPerThreadM = kTileM / kThreadsM, kPerThreadN = kTileN / kThreadsN;
constexpr int kPad = 1;  // spreads the column-walking tile stores over the banks

// Split K until about this many blocks are in flight (two per SM on an H200), but
// never into ranges shorter than kMinSplitK (64 x 64 kernel) or kLargeMinSplitK
// (128 x 128 kernel). The 128 x 128 kernel runs only with at least kLargeMinBlocks
// blocks. Constants, so the kernel and the split (and therefore the rounding) are the
// same on every GPU.
constexpr int64_t kTargetBlocks = 256;
constexpr int64_t kMinSplitK = 256;
constexpr int64_t kLargeMinBlocks = 128, kLargeMinSplitK = 1024;

// Stages rows [row0, row0 + kRows) x k [k0, k0 + kTileK) of `op` into tile[k][row],
// zero outside the matrix or the split's K range. kAlongK: the operand is contiguous
// in k, so consecutive threads take consecutive k (else consecutive rows).
template <bool kAlongK, int kRows>
__device__ void load_tile(float (*tile)[kRows + kPad], const Operand& op, int64_t row0,
                          int64_t rows, int64_t k0, int64_t k_end) {
  static_assert(kRows * kTileK % kThreads == 0, "the tile must split evenly over the threads");
#pragma unroll
  for (int step = 0; step < kRows * kTileK / kThreads; ++step) {
    const int i = threadIdx.x + step * kThreads;
    const int r = kAlongK ? i / kTileK : i % kRows;
    const int kk = kAlongK ? i % kTileK : i / kRows;
    const int64_t row = row0 + r, k = k0 + kk;
    tile[kk][r] = (row < rows && k < k_end) ? op.data[row * op.row_stride + k * op.k_stride] : 0.0f;
  }
}

template <bool kAAlongK, bool kBAlongK>
__global__ void __launch_bounds__(kThreads) gemm_kernel(Gemm g) {
  __shared__ float a_tile[kTileK][kTileM + kPad];
  __shared__ float b_tile[kTileK][kTileN + kPad];
  const int tx = threadIdx.x % kThreadsN, ty = threadIdx.x / kThreadsN;
  const int64_t m0 = int64_t{blockIdx.x} * kTileM, n0 = int64_t{blockIdx.y} * kTileN;
  const int64_t k_begin = int64_t{blockIdx.z} * g.k_per_split;
  const int64_t k_end = std::min(g.k, k_begin + g.k_per_split);

  float sum[kPerThreadM][kPerThreadN] = {};
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kTileK) {
    load_tile<kAAlongK, kTileM>(a_tile, g.a, m0, g.m, k0, k_end);
    load_tile<kBAlongK, kTileN>(b_tile, g.b, n0, g.n, k0, k_end);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTileK; ++kk) {
      float a[kPerThreadM], b[kPerThreadN];
#pragma unroll
      for (int i = 0; i < kPerThreadM; ++i) a[i] = a_tile[kk][ty + i * kThreadsM];
#pragma unroll
      for (int j = 0; j < kPerThreadN; ++j) b[j] = b_tile[kk][tx + j * kThreadsN];
#pragma unroll
      for (int i = 0; i < kPerThreadM; ++i) {
#pragma unroll
        for (int j = 0; j < kPerThreadN; ++j) sum[i][j] = fmaf(a[i], b[j], sum[i][j]);
      }
    }
    __syncthreads();  // the next iteration overwrites the tiles
  }

  float* partial = g.partials + int64_t{blockIdx.z} * g.m * g.n;
#pragma unroll
  for (int i = 0; i < kPerThreadM; ++i) {
    const int64_t row = m0 + ty + i * kThreadsM;
#pragma unroll
    for (int j = 0; j < kPerThreadN; ++j) {
      const int64_t col = n0 + tx + j * kThreadsN;
      if (row >= g.m || col >= g.n) continue;
      if (gridDim.z == 1) {
        g.c[row * g.c_row_stride + col] = g.bias ? sum[i][j] + g.bias[col] : sum[i][j];
      } else {
        partial[row * g.n + col] = sum[i][j];
      }
    }
  }
}

// c[row, col] = Σ_s partials[s][row][col] (+ bias[col]), s in increasing order, summed
// in the partials' type (float for GEMM splits, double for column sums).
template <typename Partial>
__global__ void sum_partials_kernel(const Partial* partials, int64_t splits, int64_t m, int64_t n,
                                    const float* bias, float* c, int64_t c_row_stride) {
  const int64_t count = m * n;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    Partial sum = partials[i];
    for (int64_t s = 1; s < splits; ++s) sum += partials[s * count + i];
    const int64_t row = i / n, col = i % n;
    const float total = static_cast<float>(sum);
    c[row * c_row_stride + col] = bias ? total + bias[col] : total;
  }
}

template <typename Partial>
void launch_sum_partials(const Partial* partials, int64_t splits, int64_t m, int64_t n,
                         const float* bias, float* c, int64_t c_row_stride, cudaStream_t stream) {
  constexpr int threads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>(cuda::ceil_div(m * n, threads), 65536));
  sum_partials_kernel<<<blocks, threads, 0, stream>>>(partials, splits, m, n, bias, c,
                                                      c_row_stride);
  CUDA_LAUNCH_CHECK();
}

// K cut into about `wanted` ranges of whole slices of `depth`; rounding a range up to
// whole slices can leave fewer ranges than wanted.
GemmChoice split_k(bool large, int64_t k, int64_t wanted, int64_t depth) {
  const int64_t range = cuda::ceil_div(k, std::max<int64_t>(wanted, 1));
  const int64_t k_per_split = std::max(depth, cuda::ceil_div(range, depth) * depth);
  return {large, std::max<int64_t>(1, cuda::ceil_div(k, k_per_split)), k_per_split, depth};
}

// The 128 x 128 kernel's slice depth for `kernel`: the layout's kLargeSlice unless told.
template <bool kAAlongK, bool kBAlongK>
int64_t large_slice(LinearKernel kernel) {
  constexpr int kDefault = kLargeSlice<kAAlongK, kBAlongK>;
  static_assert(kDefault == 8 || kDefault == 16, "the large kernel has slices of 8 or 16 k");
  switch (kernel) {
    case LinearKernel::Slice8: return 8;
    case LinearKernel::Slice16: return 16;
    default: return kDefault;
  }
}

// The kernel and the K split for C = A Bᵀ: the 128 x 128 kernel when it fits and has
// enough blocks, with or without splitting K; else the 64 x 64 kernel, split until the
// GPU is busy. Shape (and alignment) only, never the GPU.
//
// The forward and dx are reductions inside a row (over features), whose order is
// canonical (nn/linear_kernels.h: one fma chain over k from +0, then + bias): both kernels
// keep each output's sum in one register, k in increasing order, so they follow it
// exactly as long as K is not split. So products within rows never split K
// (`may_split` false); only a dW product (a sum over rows, for benchmarks) may.
template <bool kAAlongK, bool kBAlongK>
GemmChoice choose_gemm(const Gemm& g, LinearKernel kernel, bool may_split) {
  const int64_t large_tiles = cuda::ceil_div(g.m, kLargeTile) * cuda::ceil_div(g.n, kLargeTile);
  if (kernel != LinearKernel::Tiled64 && large_tiles > 0 &&
      large_gemm_fits<kAAlongK, kBAlongK>(g)) {
    const int64_t wanted = large_tiles >= kLargeMinBlocks || !may_split
                               ? 1
                               : std::min(cuda::ceil_div(kTargetBlocks, large_tiles),
                                          g.k / kLargeMinSplitK);
    const GemmChoice large = split_k(true, g.k, wanted, large_slice<kAAlongK, kBAlongK>(kernel));
    if (large_tiles * large.splits >= kLargeMinBlocks) return large;
  }
  const int64_t tiles = cuda::ceil_div(g.m, kTileM) * cuda::ceil_div(g.n, kTileN);
  int64_t wanted = 1;
  if (may_split && tiles > 0 && tiles < kTargetBlocks && g.k > kMinSplitK) {
    wanted = std::min(cuda::ceil_div(kTargetBlocks, tiles), cuda::ceil_div(g.k, kMinSplitK));
  }
  return split_k(false, g.k, wanted, kTileK);
}

// Runs C = A Bᵀ (+ bias) with the kernel and split that choose_gemm picks; with several
// splits, their partials go to stream-ordered scratch and are added in split order.
template <bool kAAlongK, bool kBAlongK>
void gemm(Gemm g, LinearKernel kernel, int device) {
  if (g.m == 0 || g.n == 0) return;
  const GemmChoice choice = choose_gemm<kAAlongK, kBAlongK>(g, kernel, /*may_split=*/!kAAlongK);
  g.k_per_split = choice.k_per_split;
  cudaStream_t stream = cuda::current_stream(device);
  Tensor partials;  // freed after the kernels queued below
  if (choice.splits > 1) {
    partials = Tensor::empty({choice.splits, g.m, g.n}, Device::cuda(device));
    g.partials = partials.data();
  }
  if (choice.large && choice.slice == 16) {
    large_gemm_cuda<kAAlongK, kBAlongK, 16>(g, choice.splits, stream);
  } else if (choice.large) {
    large_gemm_cuda<kAAlongK, kBAlongK, 8>(g, choice.splits, stream);
  } else {
    const int64_t tiles_m = cuda::ceil_div(g.m, kTileM), tiles_n = cuda::ceil_div(g.n, kTileN);
    SEQPAR_CHECK(tiles_n <= 65535, "linear: ", g.n, " output columns exceed the kernel's grid");
    const dim3 grid(static_cast<unsigned>(tiles_m), static_cast<unsigned>(tiles_n),
                    static_cast<unsigned>(choice.splits));
    gemm_kernel<kAAlongK, kBAlongK><<<grid, kThreads, 0, stream>>>(g);
    CUDA_LAUNCH_CHECK();
  }
  if (choice.splits > 1) {
    launch_sum_partials(partials.data(), choice.splits, g.m, g.n, g.bias, g.c, g.c_row_stride,
                        stream);
  }
}

// The three products as GEMMs (the table in the design note). Outputs as the launchers
// take them: y and dx with unit column stride, dW contiguous.
Gemm output_gemm(const Tensor& x, const Tensor& weight, const float* bias, const Tensor& y) {
  return Gemm{x.size(0), weight.size(0), x.size(1),
              Operand{x.data(), x.stride(0), x.stride(1)},
              Operand{weight.data(), weight.stride(0), weight.stride(1)},
              0, y.data(), y.stride(0), bias, nullptr};
}
Gemm grad_input_gemm(const Tensor& grad_y, const Tensor& weight, const Tensor& grad_x) {
  return Gemm{grad_y.size(0), weight.size(1), weight.size(0),
              Operand{grad_y.data(), grad_y.stride(0), grad_y.stride(1)},
              Operand{weight.data(), weight.stride(1), weight.stride(0)},
              0, grad_x.data(), grad_x.stride(0), nullptr, nullptr};
}
Gemm grad_weight_gemm(const Tensor& grad_y, const Tensor& x, const Tensor& grad_weight) {
  return Gemm{grad_y.size(1), x.size(1), x.size(0),
              Operand{grad_y.data(), grad_y.stride(1), grad_y.stride(0)},
              Operand{x.data(), x.stride(1), x.stride(0)},
              0, grad_weight.data(), x.size(1), nullptr, nullptr};
}

void check_on_device(const Tensor& tensor, const char* name, int device) {
  SEQPAR_CHECK(tensor.defined() && tensor.device() == Device::cuda(device), "linear (CUDA): ",
               name, " must be defined on cuda:", device);
}

}  // namespace

void linear_forward_cuda(const Tensor& x, const Tensor& weight, const Tensor& bias,
                         const Tensor& y, LinearKernel kernel) {
  SEQPAR_CHECK(x.defined() && x.device().is_cuda(), "linear_forward_cuda: x must be on a GPU");
  const int device = x.device().index;
  check_on_device(weight, "weight", device);
  check_on_device(y, "y", device);
  SEQPAR_CHECK(x.dim() == 2 && weight.dim() == 2 && y.dim() == 2 && y.stride(1) == 1,
               "linear_forward_cuda: x ", x.shape(), ", weight ", weight.shape(), ", y ",
               y.shape(), " (y needs unit column stride)");
  if (bias.defined()) check_on_device(bias, "bias", device);
  const int64_t rows = x.size(0), in = x.size(1), out = weight.size(0);
  cuda::set_device(device);
  gemm</*kAAlongK=*/true, /*kBAlongK=*/true>(
      output_gemm(x, weight, bias.defined() ? bias.data() : nullptr, y), kernel, device);
}

void linear_backward_cuda(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                          const Tensor& grad_x, const Tensor& grad_weight,
                          const Tensor& grad_bias, LinearKernel kernel) {
  SEQPAR_CHECK(grad_y.defined() && grad_y.device().is_cuda(),
               "linear_backward_cuda: grad_y must be on a GPU");
  const int device = grad_y.device().index;
  check_on_device(x, "x", device);
  check_on_device(weight, "weight", device);
  SEQPAR_CHECK(grad_y.dim() == 2 && x.dim() == 2 && weight.dim() == 2,
               "linear_backward_cuda: grad_y ", grad_y.shape(), ", x ", x.shape(), ", weight ",
               weight.shape());
  const int64_t rows = x.size(0), in = x.size(1), out = weight.size(0);
  cuda::set_device(device);
  if (grad_x.defined()) {  // dx[row, i] = Σ_o dy[row, o] W[o, i]
    check_on_device(grad_x, "grad_x", device);
    SEQPAR_CHECK(grad_x.stride(1) == 1, "linear_backward_cuda: grad_x needs unit column stride");
    gemm</*kAAlongK=*/true, /*kBAlongK=*/false>(grad_input_gemm(grad_y, weight, grad_x), kernel,
                                                device);
  }
  // dW and db are sums over rows: exact (nn/linear_row_sums.cu), added over the ranks of
  // the current CrossRankScope, rounded once.
  if (grad_weight.defined()) {  // dW[o, i] = Σ_row dy[row, o] x[row, i]
    check_on_device(grad_weight, "grad_weight", device);
    SEQPAR_CHECK(grad_weight.is_contiguous(), "linear_backward_cuda: grad_weight must be contiguous");
    exact::ExactSums sums(out * in, Device::cuda(device));
    accumulate_weight_grad_cuda(const_rows_of(grad_y), const_rows_of(x), sums);
    exact::combine_across_ranks(sums);
    sums.round_into(grad_weight);
  }
  if (grad_bias.defined()) {  // db[o] = Σ_row dy[row, o]
    check_on_device(grad_bias, "grad_bias", device);
    SEQPAR_CHECK(grad_y.stride(1) == 1 || out <= 1,
                 "linear_backward_cuda: grad_y needs unit column stride");
    exact::ExactSums sums(out, Device::cuda(device));
    accumulate_column_sums_cuda(const_rows_of(grad_y), sums);
    exact::combine_across_ranks(sums);
    sums.round_into(grad_bias);
  }
}

GemmChoice linear_gemm_choice(LinearProduct product, const Tensor& left, const Tensor& right,
                              const Tensor& result, LinearKernel kernel) {
  switch (product) {
    case LinearProduct::Output:
      return choose_gemm<true, true>(output_gemm(left, right, nullptr, result), kernel, false);
    case LinearProduct::GradInput:
      return choose_gemm<true, false>(grad_input_gemm(left, right, result), kernel, false);
    case LinearProduct::GradWeight:
      return choose_gemm<false, false>(grad_weight_gemm(left, right, result), kernel, true);
  }
  SEQPAR_CHECK(false, "linear_gemm_choice: unknown product");
  return {};
}

}  // namespace seqpar::nn::detail
