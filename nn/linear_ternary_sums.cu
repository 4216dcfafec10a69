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

// The block: 32 columns of x (four tiles of 8) and a group of 16 outputs, over a chunk of
// kRowsPerChunk rows. Warp w takes column tile w % 4 and every kRowWarps-th step of 32
// rows from step w / 4.
constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kColumnWarps = 4;
constexpr int kRowWarps = kWarps / kColumnWarps;
constexpr int kGroup = 16;             // outputs j per block: one m16 tile
constexpr int kColumns = 32;           // columns k per block
constexpr int kStepRows = 32;          // rows per tensor-core step: the k32 of m16n8k32
constexpr int kLimbs = 6;              // bytes of a fixed-point element plus 2^44: 45 bits
constexpr int64_t kRowsPerChunk = 512;
// The int32 accumulators hold at most kRowsPerChunk products of ±1 and a byte.
static_assert(kRowsPerChunk * 255 < (int64_t{1} << 31), "a chunk's limb sums fit in int32");
// A chunk's sum of ±(an element below 2^44) times f's significand (below 2^24) stays below
// add_scaled_integer's 2^93.
static_assert(kWindowBits + 24 + 25 <= 93 && kRowsPerChunk <= (int64_t{1} << 25), "in range");
static_assert(kWindowBits + 1 <= 8 * kLimbs, "an element plus 2^44 fits in the limbs");
static_assert(kRowsPerChunk % (kStepRows * kRowWarps) == 0, "whole steps per warp");

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

// D = A B + D on the integer tensor cores, m16n8k32: A 16 outputs x 32 rows of signs
// (s8: -1, 0, +1), B 32 rows x 8 columns of one byte of the offset fixed-point x (u8).
// Integer products and sums: exact in any order.
__device__ inline void imma_16x8x32(int (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ inline int sign_of(float value) { return value > 0.0f ? 1 : value < 0.0f ? -1 : 0; }

// Byte `limb` of u[first], ..., u[first + 3], packed low to high.
__device__ inline unsigned byte_of_four(const unsigned long long (&u)[8], int first, int limb) {
  const int word = limb / 4, byte = limb % 4;
  auto part = [&](int i) {
    return static_cast<unsigned>(word == 0 ? u[first + i] : u[first + i] >> 32);
  };
  // __byte_perm(x, y, s): byte n of the result is byte (s >> 4n) & 7 of the pair (x, y).
  const unsigned low = __byte_perm(part(0), part(1), byte | ((byte + 4) << 4));
  const unsigned high = __byte_perm(part(2), part(3), byte | ((byte + 4) << 4));
  return __byte_perm(low, high, 0x5410);
}

// dW[j, k] = f * Σ_rows s[row, j] v[row, k], v the fixed-point x of column k's window.
// With u = v + 2^44 in [0, 2^45) cut into six bytes u_l, Σ s v = Σ_l 2^(8 l) Σ s u_l -
// 2^44 Σ s: six tensor-core products of the sign matrix with a byte matrix, and the
// signs' own sums. Fragments (PTX m16n8k32, lane = 4 g + t): a0/a1 = the signs of rows
// 4t..4t+3 for outputs g / g+8, a2/a3 those of rows 16+4t..16+4t+3; b0/b1 = byte l of x
// at rows 4t.. / 16+4t.. of column g; d0,d1 / d2,d3 = the sums of outputs g / g+8 at
// columns 2t, 2t+1. The block's row warps add their sums in shared memory; then each
// (j, k) goes into the digits at once, with integer atomics.
__global__ void __launch_bounds__(kThreads, 2) ternary_weight_grad_kernel(
    ConstRows dy, ConstRows x, const unsigned int* x_largest, const unsigned int* words,
    int64_t* digits, int64_t count) {
  const OneMagnitude magnitude = one_magnitude(words);
  if (!magnitude.holds) return;
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int g = lane / 4, t = lane % 4;
  const int tile = warp % kColumnWarps, row_warp = warp / kColumnWarps;
  const int64_t in = x.cols, out = dy.cols;
  const int64_t j0 = int64_t{blockIdx.y} * kGroup;
  const int64_t k_warp = int64_t{blockIdx.x} * kColumns + 8 * tile;  // this warp's 8 columns
  const int64_t row_begin = int64_t{blockIdx.z} * kRowsPerChunk;
  const int64_t rows = min(x.rows - row_begin, kRowsPerChunk);

  // This lane's column of x (k_warp + g) as one factor: 2^-lsb, a power of two (x times
  // it is exact); NaN for a column that takes the general path whole (every element then
  // fails the window test); 0 past the edge (zeros, inside any window).
  const int64_t my_column = k_warp + g;
  double scale = 0.0;
  if (my_column < in) {
    const Window window = column_window(x_largest[my_column], magnitude.exponent);
    scale = window.whole ? CUDART_NAN : ldexp(1.0, -window.lsb);
  }
  const bool output_valid[2] = {j0 + g < out, j0 + 8 + g < out};

  // One step's loads: this lane's 8 rows (4t + i and 16 + 4t + i), its 2 outputs of dy
  // and its column of x. Loaded a step ahead, so that their latency overlaps a step.
  struct Loaded {
    float dy[2][8], x[8];
  };
  auto load = [&](int64_t step_row) {
    Loaded loaded;
#pragma unroll
    for (int r = 0; r < 8; ++r) {
      const int64_t local = step_row + (r < 4 ? 4 * t + r : 16 + 4 * t + r - 4);
      const bool row_valid = local < rows;
      const int64_t row = row_begin + local;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        loaded.dy[h][r] = row_valid && output_valid[h] ? dy.data[row * dy.row_stride + j0 + 8 * h + g] : 0.0f;
      }
      loaded.x[r] = row_valid && my_column < in ? x.data[row * x.row_stride + my_column] : 0.0f;
    }
    return loaded;
  };

  int sums[kLimbs][4] = {};     // [limb][fragment d0..d3]
  int sign_sums[2] = {0, 0};    // Σ s over this lane's rows, outputs g and g + 8
  constexpr int64_t kStride = int64_t{kStepRows} * kRowWarps;
  Loaded next = load(int64_t{kStepRows} * row_warp);
  for (int64_t step_row = int64_t{kStepRows} * row_warp; step_row < rows; step_row += kStride) {
    const Loaded current = next;
    if (step_row + kStride < rows) next = load(step_row + kStride);
    // The signs as s8 bytes (-1 is 0xff), four rows a register.
    unsigned a[4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int part = 0; part < 2; ++part) {
        unsigned packed = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int s = sign_of(current.dy[h][4 * part + i]);
          sign_sums[h] += s;
          packed |= (static_cast<unsigned>(s) & 0xffu) << (8 * i);
        }
        a[2 * part + h] = packed;
      }
    }
    unsigned long long u[8];
#pragma unroll
    for (int r = 0; r < 8; ++r) {
      double fixed = static_cast<double>(current.x[r]) * scale;
      // An integer below 2^44 (false for NaN and the infinities too).
      if (!(fabs(fixed) < kWindowLimit && fixed == trunc(fixed))) {
        const int64_t local = step_row + (r < 4 ? 4 * t + r : 16 + 4 * t + r - 4);
        if (local < rows) {  // (a row past the chunk's end reads 0, NaN in a whole column)
          add_outside_window(dy, current.x[r], row_begin + local, my_column, j0, in, digits, count);
        }
        fixed = 0.0;
      }
      u[r] = static_cast<unsigned long long>(static_cast<long long>(fixed) + (1ll << kWindowBits));
    }
    __syncwarp();  // mma.sync wants the whole warp
#pragma unroll
    for (int limb = 0; limb < kLimbs; ++limb) {
      imma_16x8x32(sums[limb], a, byte_of_four(u, 0, limb), byte_of_four(u, 4, limb));
    }
  }

  // The signs' sums of outputs g and g + 8 over the warp's rows: the four lanes of a g
  // hold its rows between them.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    sign_sums[h] += __shfl_xor_sync(0xffffffffu, sign_sums[h], 1);
    sign_sums[h] += __shfl_xor_sync(0xffffffffu, sign_sums[h], 2);
  }
  // The row warps' sums added in shared memory (integers: exact), into row warp 0's.
  constexpr int kWords = kLimbs * 4 + 2;
  __shared__ int shared_sums[kRowWarps - 1][kColumnWarps][kWords][32];
  if (row_warp > 0) {
    int* mine = &shared_sums[row_warp - 1][tile][0][lane];
    int w = 0;
#pragma unroll
    for (int limb = 0; limb < kLimbs; ++limb) {
#pragma unroll
      for (int d = 0; d < 4; ++d) mine[32 * w++] = sums[limb][d];
    }
    mine[32 * w++] = sign_sums[0];
    mine[32 * w] = sign_sums[1];
  }
  __syncthreads();
  if (row_warp > 0) return;
  for (int other = 0; other < kRowWarps - 1; ++other) {
    const int* theirs = &shared_sums[other][tile][0][lane];
    int w = 0;
#pragma unroll
    for (int limb = 0; limb < kLimbs; ++limb) {
#pragma unroll
      for (int d = 0; d < 4; ++d) sums[limb][d] += theirs[32 * w++];
    }
    sign_sums[0] += theirs[32 * w++];
    sign_sums[1] += theirs[32 * w];
  }

  // Each of this lane's 4 sums: Σ s v = Σ_l 2^(8 l) (Σ s u_l) - 2^44 Σ s, times f's
  // significand, into the digits at the window's unit times f's. (Σ s over rows: the
  // four lanes of a g hold the same total now.)
#pragma unroll
  for (int d = 0; d < 4; ++d) {
    const int64_t j = j0 + g + (d < 2 ? 0 : 8);
    const int64_t k = k_warp + 2 * t + (d % 2);
    if (j >= out || k >= in) continue;
    const Window window = column_window(x_largest[k], magnitude.exponent);
    if (window.whole) continue;
    exact::Int128 total = -(exact::Int128{sign_sums[d < 2 ? 0 : 1]} << kWindowBits);
#pragma unroll
    for (int limb = 0; limb < kLimbs; ++limb) total += exact::Int128{sums[limb][d]} << (8 * limb);
    if (total == 0) continue;
    int64_t local[exact::kDigits] = {};
    exact::add_scaled_integer(local, 1, total * magnitude.significand, window.lsb + magnitude.exponent);
    exact::add_digits_atomically(local, digits + j * in + k, count);
  }
}

}  // namespace

bool ternary_weight_grad_fits(const ConstRows& grad_y, const ConstRows& x) {
  return cuda::ceil_div(x.rows, kRowsPerChunk) <= 65535 &&
         cuda::ceil_div(grad_y.cols, kGroup) <= 65535 && cuda::ceil_div(x.cols, kColumns) <= 0x7fffffff;
}

void launch_ternary_weight_grad(const ConstRows& grad_y, const ConstRows& x,
                                const unsigned int* x_largest, unsigned int* words,
                                exact::ExactSums& sums, cuda::Stream stream) {
  const dim3 grid(static_cast<unsigned>(cuda::ceil_div(x.cols, kColumns)),
                  static_cast<unsigned>(cuda::ceil_div(grad_y.cols, kGroup)),
                  static_cast<unsigned>(cuda::ceil_div(x.rows, kRowsPerChunk)));
  ternary_weight_grad_kernel<<<grid, kThreads, 0, stream>>>(grad_y, x, x_largest, words,
                                                            sums.digits(), sums.count());
  CUDA_LAUNCH_CHECK();
}

}  // namespace seqpar::nn::detail
