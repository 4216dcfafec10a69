// CUDA path of nn/linear.h: y = x Wᵀ + b and dx = dy W by GEMM kernels (dW = dyᵀ x and
// db = Σ_rows dy are the exact row sums of nn/cuda/linear_row_sums.cu).
//
// Design note. Both GEMM products are C[M, N] = Σ_k A(m, k) · Bᵀ(n, k) (+ bias[n]),
// whose operands are described by two strides each (Operand and Gemm, in
// nn/cuda/gemm_tile128.h), so a transposed or row-strided view costs nothing but a stride:
//
//   forward  C = y  [n, out]   A = x  (m=row, k=in)     Bᵀ = W (n=out, k=in)
//   dx       C = dx [n, in]    A = dy (m=row, k=out)    Bᵀ = W (n=in, k=out), read down columns
//
// Each element of C is one fma chain over k = 0, 1, ... from +0, then + bias: the order
// of the reference's chains (nn/reference/linear.h), which define the bits and which
// the fast CPU path follows too, so the bits are the reference's (and the CPU's). That
// is why K is never split: partial sums added afterwards would be another order. Both
// kernels keep each element's sum in one register and walk K in increasing order,
// whatever the tile.
//
// The kernel here is the classic tiled GEMM with register blocking: a block of 256
// threads owns a 64 x 64 tile of C, stages 64 x 16 slices of A and Bᵀ in shared memory,
// and each thread accumulates a 4 x 4 sub-tile in registers (rows ty + 16 i, columns
// tx + 16 j, so that a warp's shared-memory reads are broadcasts or consecutive words,
// and its global stores are 16 consecutive floats). The load mapping is a template
// argument: consecutive threads walk whichever index of the operand is contiguous.
//
// The forward of a Linear with few outputs (out_features <= 16) takes the kernel of
// nn/cuda/linear_forward_few_outputs.cu instead, in the same order.
//
// Large products go to the 128 x 128 kernel of nn/cuda/gemm_tile128.cu when the operands
// allow its 16-byte loads and it has at least kGemm128MinBlocks tiles (about one per SM);
// runs_on_gemm128 below decides, from the shape and alignment alone, never the GPU.
#include <cstdint>
#include <memory>

#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "core/device_buffer.h"
#include "core/exact_bins.h"
#include "core/exact_sums.h"
#include "nn/cuda/linear.h"
#include "nn/cuda/gemm_tile128.h"

namespace seqpar::nn::detail {

namespace {

constexpr int kTileM = 64, kTileN = 64, kTileK = 16;
constexpr int kThreadsN = 16, kThreadsM = 16;  // a 16 x 16 grid of threads per tile
constexpr int kThreads = kThreadsM * kThreadsN;
constexpr int kPerThreadM = kTileM / kThreadsM, kPerThreadN = kTileN / kThreadsN;
constexpr int kPad = 1;  // spreads the column-walking tile stores over the banks

// The 128 x 128 kernel runs only with at least this many tiles; a constant, so the
// kernel is the same on every GPU (not that it changes the bits).
constexpr int64_t kGemm128MinBlocks = 128;

// Stages rows [row0, row0 + kRows) x k [k0, k0 + kTileK) of `op` into tile[k][row],
// `zero` outside the matrix and past K (kPastKA or kPastKB: the k past K change no
// chain's sum, a -0 sum included). kAlongK: the operand is contiguous in k, so consecutive
// threads take consecutive k (else consecutive rows).
template <bool kAlongK, int kRows>
__device__ void load_tile(float (*tile)[kRows + kPad], const Operand& op, int64_t row0,
                          int64_t rows, int64_t k0, int64_t k_end, float zero) {
  static_assert(kRows * kTileK % kThreads == 0, "the tile must split evenly over the threads");
#pragma unroll
  for (int step = 0; step < kRows * kTileK / kThreads; ++step) {
    const int i = threadIdx.x + step * kThreads;
    const int r = kAlongK ? i / kTileK : i % kRows;
    const int kk = kAlongK ? i % kTileK : i / kRows;
    const int64_t row = row0 + r, k = k0 + kk;
    tile[kk][r] = (row < rows && k < k_end) ? op.data[row * op.row_stride + k * op.k_stride] : zero;
  }
}

template <bool kAAlongK, bool kBAlongK>
__global__ void __launch_bounds__(kThreads) gemm_kernel(Gemm g) {
  __shared__ float a_tile[kTileK][kTileM + kPad];
  __shared__ float b_tile[kTileK][kTileN + kPad];
  const int tx = threadIdx.x % kThreadsN, ty = threadIdx.x / kThreadsN;
  const int64_t m0 = int64_t{blockIdx.x} * kTileM, n0 = int64_t{blockIdx.y} * kTileN;

  float sum[kPerThreadM][kPerThreadN] = {};
  for (int64_t k0 = 0; k0 < g.k; k0 += kTileK) {
    load_tile<kAAlongK, kTileM>(a_tile, g.a, m0, g.m, k0, g.k, kPastKA);
    load_tile<kBAlongK, kTileN>(b_tile, g.b, n0, g.n, k0, g.k, kPastKB);
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

#pragma unroll
  for (int i = 0; i < kPerThreadM; ++i) {
    const int64_t row = m0 + ty + i * kThreadsM;
#pragma unroll
    for (int j = 0; j < kPerThreadN; ++j) {
      const int64_t col = n0 + tx + j * kThreadsN;
      if (row >= g.m || col >= g.n) continue;
      g.c[row * g.c_row_stride + col] = g.bias ? sum[i][j] + g.bias[col] : sum[i][j];
    }
  }
}

// Whether C = A Bᵀ runs on the 128 x 128 kernel: when it fits and has enough tiles.
template <bool kAAlongK, bool kBAlongK>
bool runs_on_gemm128(const Gemm& g) {
  const int64_t tiles = cuda::ceil_div(g.m, kGemm128Tile) * cuda::ceil_div(g.n, kGemm128Tile);
  return tiles >= kGemm128MinBlocks && gemm128_fits<kAAlongK, kBAlongK>(g);
}

// Runs C = A Bᵀ (+ bias), K whole, on the kernel that runs_on_gemm128 picks.
template <bool kAAlongK, bool kBAlongK>
void gemm(const Gemm& g, int device) {
  if (g.m == 0 || g.n == 0) return;
  cudaStream_t stream = cuda::current_stream(device);
  if (runs_on_gemm128<kAAlongK, kBAlongK>(g)) {
    gemm128_cuda<kAAlongK, kBAlongK>(g, stream);
    return;
  }
  const int64_t tiles_m = cuda::ceil_div(g.m, kTileM), tiles_n = cuda::ceil_div(g.n, kTileN);
  SEQPAR_CHECK(tiles_n <= 65535, "linear: ", g.n, " output columns exceed the kernel's grid");
  const dim3 grid(static_cast<unsigned>(tiles_m), static_cast<unsigned>(tiles_n));
  gemm_kernel<kAAlongK, kBAlongK><<<grid, kThreads, 0, stream>>>(g);
  CUDA_LAUNCH_CHECK();
}

// The two products as GEMMs (the table in the design note). Outputs as the launchers
// take them, with unit column stride.
Gemm output_gemm(const Tensor& x, const Tensor& weight, const float* bias, const Tensor& y) {
  return Gemm{x.size(0), weight.size(0), x.size(1),
              Operand{x.data(), x.stride(0), x.stride(1)},
              Operand{weight.data(), weight.stride(0), weight.stride(1)},
              y.data(), y.stride(0), bias};
}
Gemm grad_input_gemm(const Tensor& grad_y, const Tensor& weight, const Tensor& grad_x) {
  return Gemm{grad_y.size(0), weight.size(1), weight.size(0),
              Operand{grad_y.data(), grad_y.stride(0), grad_y.stride(1)},
              Operand{weight.data(), weight.stride(1), weight.stride(0)},
              grad_x.data(), grad_x.stride(0), nullptr};
}

void check_on_device(const Tensor& tensor, const char* name, int device) {
  SEQPAR_CHECK(tensor.defined() && tensor.device() == Device::cuda(device), "linear (CUDA): ",
               name, " must be defined on cuda:", device);
}

}  // namespace

// The CUDA row of nn/linear.cpp's table, by regime. Every kernel gives the reference's bits
// (nn/reference/linear.h): each keeps an output's chain in one register and walks k up.
//
//   product  regime                                kernel                        why
//   y        out <= 16, in <= 768                  linear_forward_few_outputs.cu  a GEMM tile would
//                                                  (16-byte copies of x when its  be mostly idle;
//                                                  rows allow them; one float at  a few threads a
//                                                  a time otherwise: same bits)   row read x once
//   y, dx    >= 128 tiles of 128 x 128, operands   gemm_tile128.cu                fewer loads per
//            16-byte aligned                                                      fma
//   y, dx    anything else                         gemm_kernel below (64 x 64)    any shape, any
//                                                                                 stride
//
// The choice depends on the shape and the operands' alignment alone, the same eager or
// captured into a graph. dW: the kernel that choose_weight_grad_kernel picks
// (nn/cuda/weight_grad_choice.h); dW and db are summed in nn/cuda/linear_row_sums.cu.
void linear_forward_cuda(const Tensor& x, const Tensor& weight, const Tensor& bias,
                         const Tensor& y, unsigned int* x_largest) {
  SEQPAR_CHECK(x.defined() && x.device().is_cuda(), "linear_forward_cuda: x must be on a GPU");
  const int device = x.device().index;
  check_on_device(weight, "weight", device);
  check_on_device(y, "y", device);
  SEQPAR_CHECK(x.dim() == 2 && weight.dim() == 2 && y.dim() == 2 && y.stride(1) == 1,
               "linear_forward_cuda: x ", x.shape(), ", weight ", weight.shape(), ", y ",
               y.shape(), " (y needs unit column stride)");
  if (bias.defined()) check_on_device(bias, "bias", device);
  cuda::set_device(device);
  const float* bias_data = bias.defined() ? bias.data() : nullptr;
  const ConstRows x_rows = const_rows_of(x);
  if (few_outputs_forward_fits(x_rows, weight.size(0)) && weight.stride(1) == 1) {
    few_outputs_forward_cuda(x_rows, weight.data(), weight.stride(0), bias_data, weight.size(0),
                        y.data(), y.stride(0), device, x_largest);
    return;
  }
  if (x_largest != nullptr) {
    column_maxima_cuda(x_rows, x_largest, nullptr, cuda::current_stream(device));
  }
  gemm</*kAAlongK=*/true, /*kBAlongK=*/true>(output_gemm(x, weight, bias_data, y), device);
}

void linear_grad_input_cuda(const Tensor& grad_y, const Tensor& weight, const Tensor& grad_x) {
  SEQPAR_CHECK(grad_y.defined() && grad_y.device().is_cuda(),
               "linear_grad_input_cuda: grad_y must be on a GPU");
  const int device = grad_y.device().index;
  check_on_device(weight, "weight", device);
  check_on_device(grad_x, "grad_x", device);
  SEQPAR_CHECK(grad_y.dim() == 2 && weight.dim() == 2 && grad_x.dim() == 2 && grad_x.stride(1) == 1,
               "linear_grad_input_cuda: grad_y ", grad_y.shape(), ", weight ", weight.shape(),
               ", grad_x ", grad_x.shape(), " (grad_x needs unit column stride)");
  cuda::set_device(device);
  // dx[row, i] = Σ_o dy[row, o] W[o, i]
  gemm</*kAAlongK=*/true, /*kBAlongK=*/false>(grad_input_gemm(grad_y, weight, grad_x), device);
}

struct LinearBackendState {
  DeviceBuffer<unsigned int> x_largest;  // x's column maxima, as column_maxima_cuda finds them
};

std::shared_ptr<LinearBackendState> linear_forward_cuda_keeping_state(const Tensor& x, const Tensor& weight,
                                                                      const Tensor& bias, const Tensor& y) {
  auto state = std::make_shared<LinearBackendState>();
  state->x_largest = DeviceBuffer<unsigned int>(x.size(1), x.device());
  state->x_largest.zero();  // atomic maxima start from zeros
  linear_forward_cuda(x, weight, bias, y, state->x_largest.data());
  return state;
}

const unsigned int* kept_x_maxima(const LinearBackendState* state) {
  return state != nullptr ? state->x_largest.data() : nullptr;
}

void linear_backward_cuda(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                          const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                          const unsigned int* x_largest) {
  if (grad_x.defined()) linear_grad_input_cuda(grad_y, weight, grad_x);
  const int64_t out = weight.size(0), in = weight.size(1);
  const int64_t weight_count = grad_weight.defined() ? out * in : 0;
  const int64_t bias_count = grad_bias.defined() ? out : 0;
  if (weight_count + bias_count == 0) return;
  SEQPAR_CHECK((!grad_weight.defined() || grad_weight.is_contiguous()) &&
                   (!grad_bias.defined() || grad_bias.is_contiguous()),
               "linear_backward_cuda: grad_weight and grad_bias must be contiguous");
  exact::ExactSums sums(weight_count + bias_count, grad_y.device());
  accumulate_linear_grads_cuda(const_rows_of(grad_y), const_rows_of(x), sums, grad_weight.defined(),
                               grad_bias.defined(), x_largest);
  if (grad_weight.defined()) sums.round_into(grad_weight, 0);
  if (grad_bias.defined()) sums.round_into(grad_bias, weight_count);
}

bool linear_uses_gemm128(LinearProduct product, const Tensor& left, const Tensor& right,
                            const Tensor& result) {
  switch (product) {
    case LinearProduct::Output:
      return runs_on_gemm128<true, true>(output_gemm(left, right, nullptr, result));
    case LinearProduct::GradInput:
      return runs_on_gemm128<true, false>(grad_input_gemm(left, right, result));
  }
  SEQPAR_CHECK(false, "linear_uses_gemm128: unknown product");
  return false;
}

}  // namespace seqpar::nn::detail
