// dW = dyᵀ x on the GPU when every dy has one magnitude (dy = s * f, s in {-1, 0, +1}:
// an L1 loss's backward), by the fixed-point integer sums of nn/one_magnitude.h: the
// exact row sums of nn/linear_row_sums.cu, the same digits' value and so the same bits
// once rounded, at a fraction of the cost. Elements outside their column's window take
// the binned sum one by one (with their own products, so with the general path's
// rounding and IEEE rules).
//
// Whether dy has one magnitude is known only on the device. The pass that finds dy's
// column maxima (linear_row_sums.cu) also records its largest and smallest nonzero
// magnitude; the kernels here return at once unless they agree (and are finite), and
// the general kernel returns at once if they do. No host round trip, and the launches
// are the same whatever dy holds.
#include <math_constants.h>

#include <algorithm>

#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "core/device_buffer.h"
#include "core/exact_sum.cuh"
#include "core/exact_sums.h"
#include "nn/linear_kernels.h"
#include "nn/linear_ternary.cuh"

namespace seqpar::nn::detail {

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kGroup = 16;  // outputs j per block
constexpr int64_t kRowsPerChunk = 512;  // kRowsPerChunk * 2^kWindowBits = 2^53
static_assert(kRowsPerChunk << kWindowBits == int64_t{1} << 53, "a chunk's sum stays exact");

// One element outside the window: its products with the group's dy, each through a
// binned sum (the general path's rules: rounded to the grid, NaN and inf as IEEE), into
// the digits with integer atomics.
__device__ void add_outside_window(const ConstRows& dy, float value, int64_t row, int64_t k,
                                   int64_t j0, int64_t in, int64_t* digits, int64_t count) {
  for (int jj = 0; jj < kGroup && j0 + jj < dy.cols; ++jj) {
    const float factor = dy.data[row * dy.row_stride + j0 + jj];
    exact::BinnedSum sum;
    sum.clear();
    sum.add(__dmul_rn(static_cast<double>(factor), static_cast<double>(value)));
    int64_t local[exact::kDigits] = {};
    sum.flush(local, 1);
    exact::add_digits_atomically(local, digits + (j0 + jj) * in + k, count);
  }
}

// D = A B + C on the FP64 tensor cores, m8n8k4 (A: 8 outputs x 4 rows of signs; B: 4 rows
// x 8 columns of fixed-point x). Every product is ±an integer or 0 and every partial
// sum an integer below 2^53, so each of the unit's FMAs is exact in whatever order it
// takes them: the result is the integer sum.
__device__ inline void dmma_8x8x4(double (&c)[2], double a, double b) {
  asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};"
               : "+d"(c[0]), "+d"(c[1])
               : "d"(a), "d"(b));
}

__device__ inline double sign_of(float value) {
  return value > 0.0f ? 1.0 : value < 0.0f ? -1.0 : 0.0;
}

// Block (32 columns, a group of 16 outputs, a chunk of 512 rows), 8 warps on every 8th
// group of 4 rows. Per 4 rows a warp does 8 DMMAs: 2 halves of 8 outputs x 4 groups of
// 8 columns. Fragments (PTX m8n8k4 .f64): lane = 4 g + t; A[g][t] = sign(dy[row t,
// output g]), B[t][g] = x[row t, column g] in fixed point, C[g][2t + e] = the sum of
// (output g, column 2t + e). So a lane converts 4 elements of x (row t, columns
// 8c + g) and reads 2 of dy per 4 rows. The block's 8 partial sums of each (j, k) are
// then added in shared memory (still exact) and stored for the finishing kernel.
__global__ void __launch_bounds__(kThreads, 4) ternary_weight_grad_kernel(
    ConstRows dy, ConstRows x, const unsigned int* x_largest, const unsigned int* words,
    double* partials, int64_t* digits, int64_t count) {
  const OneMagnitude magnitude = one_magnitude(words);
  if (!magnitude.holds) return;
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int g = lane / 4, t = lane % 4;
  const int64_t in = x.cols, out = dy.cols;
  const int64_t k0 = int64_t{blockIdx.x} * 32, j0 = int64_t{blockIdx.y} * kGroup;
  const int64_t chunk = blockIdx.z, row_begin = chunk * kRowsPerChunk;
  const int64_t rows = min(x.rows - row_begin, kRowsPerChunk);

  // This lane's 4 columns of x (k0 + 8c + g) as one factor each: 2^-lsb, a power of two
  // (x times it is exact); NaN for a column that takes the general path whole (every
  // element then fails the window test); 0 past the edge (zeros, inside any window).
  double scale[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int64_t k = k0 + 8 * c + g;
    if (k >= in) {
      scale[c] = 0.0;
    } else {
      const Window window = column_window(x_largest[k], magnitude.exponent);
      scale[c] = window.whole ? CUDART_NAN : ldexp(1.0, -window.lsb);
    }
  }
  const bool output_valid[2] = {j0 + g < out, j0 + 8 + g < out};

  // Group r of 4 rows: this lane's row r + t, its 4 elements of x and 2 of dy, loaded
  // before the previous group's work so that their latency overlaps it.
  struct Loaded {
    float x[4], dy[2];
  };
  auto load = [&](int64_t r) {
    Loaded loaded;
    const bool row_valid = r + t < rows;
    const int64_t row = row_begin + r + t;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      loaded.x[c] = row_valid && k0 + 8 * c + g < in ? x.data[row * x.row_stride + k0 + 8 * c + g] : 0.0f;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      loaded.dy[h] = row_valid && output_valid[h] ? dy.data[row * dy.row_stride + j0 + 8 * h + g] : 0.0f;
    }
    return loaded;
  };

  double sums[2][4][2] = {};  // [half][column group][pair]
  constexpr int64_t kStride = 4 * kWarps;
  Loaded next = load(4 * warp);
  for (int64_t r = 4 * warp; r < rows; r += kStride) {
    const Loaded current = next;
    if (r + kStride < rows) next = load(r + kStride);
    const double a[2] = {sign_of(current.dy[0]), sign_of(current.dy[1])};
    double fixed[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      fixed[c] = static_cast<double>(current.x[c]) * scale[c];
      // An integer below 2^44 (false for NaN and the infinities too).
      if (!(fabs(fixed[c]) < kWindowLimit && fixed[c] == trunc(fixed[c]))) {
        if (r + t < rows) {  // (a row past the chunk's end reads 0, NaN in a whole column)
          add_outside_window(dy, current.x[c], row_begin + r + t, k0 + 8 * c + g, j0, in,
                             digits, count);
        }
        fixed[c] = 0.0;
      }
    }
    __syncwarp();  // mma.sync wants the whole warp
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      dmma_8x8x4(sums[0][c], a[0], fixed[c]);
      dmma_8x8x4(sums[1][c], a[1], fixed[c]);
    }
  }

  __shared__ double block_sums[kWarps][kGroup][32];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      block_sums[warp][8 * h + g][8 * c + 2 * t] = sums[h][c][0];
      block_sums[warp][8 * h + g][8 * c + 2 * t + 1] = sums[h][c][1];
    }
  }
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < kGroup * 32; i += kThreads) {
    const int jj = i / 32, k = i % 32;
    double total = 0.0;
    for (int w = 0; w < kWarps; ++w) total += block_sums[w][jj][k];  // below 2^53: exact
    if (k0 + k < in && j0 + jj < out) partials[(chunk * out + j0 + jj) * in + k0 + k] = total;
  }
}

// One thread per (j, k): the chunks' integer sums added in 128 bits, times f's
// significand, into the digits at the window's unit times f's.
__global__ void ternary_finish_kernel(const unsigned int* x_largest, const unsigned int* words,
                                      const double* partials, int64_t chunks, int64_t out,
                                      int64_t in, int64_t* digits, int64_t count) {
  const OneMagnitude magnitude = one_magnitude(words);
  if (!magnitude.holds) return;
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;  // j * in + k
  if (i >= out * in) return;
  const Window window = column_window(x_largest[i % in], magnitude.exponent);
  if (window.whole) return;
  exact::Int128 total = 0;
#pragma unroll 8
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    total += static_cast<int64_t>(partials[chunk * out * in + i]);
  }
  // total < 2^72 (2^19 chunks of 2^53 at most) and the significand < 2^24: two halves
  // keep each product below add_scaled_integer's 2^93.
  constexpr int kLowBits = 40;
  const exact::Int128 low = total & ((exact::Int128{1} << kLowBits) - 1);
  const exact::Int128 high = total >> kLowBits;  // floor: low + high 2^40 = total
  const int unit = window.lsb + magnitude.exponent;
  exact::add_scaled_integer(digits + i, count, low * magnitude.significand, unit);
  exact::add_scaled_integer(digits + i, count, high * magnitude.significand, unit + kLowBits);
}

}  // namespace

bool ternary_weight_grad_fits(const ConstRows& grad_y, const ConstRows& x) {
  return cuda::ceil_div(x.rows, kRowsPerChunk) <= 65535 &&
         cuda::ceil_div(grad_y.cols, kGroup) <= 65535 && cuda::ceil_div(x.cols, 32) <= 0x7fffffff;
}

void launch_ternary_weight_grad(const ConstRows& grad_y, const ConstRows& x,
                                const unsigned int* x_largest, unsigned int* words,
                                exact::ExactSums& sums, cuda::Stream stream) {
  const int64_t rows = x.rows, in = x.cols, out = grad_y.cols;
  const int64_t chunks = cuda::ceil_div(rows, kRowsPerChunk);
  DeviceBuffer<double> partials(chunks * out * in, sums.device());
  const dim3 grid(static_cast<unsigned>(cuda::ceil_div(in, 32)),
                  static_cast<unsigned>(cuda::ceil_div(out, kGroup)), static_cast<unsigned>(chunks));
  ternary_weight_grad_kernel<<<grid, kThreads, 0, stream>>>(
      grad_y, x, x_largest, words, partials.data(), sums.digits(), sums.count());
  CUDA_LAUNCH_CHECK();
  const int64_t finish_blocks = cuda::ceil_div(out * in, kThreads);
  ternary_finish_kernel<<<static_cast<unsigned>(finish_blocks), kThreads, 0, stream>>>(
      x_largest, words, partials.data(), chunks, out, in, sums.digits(), sums.count());
  CUDA_LAUNCH_CHECK();
}

}  // namespace seqpar::nn::detail
