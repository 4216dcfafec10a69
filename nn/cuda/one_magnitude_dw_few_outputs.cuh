// dW = dyᵀ x on the GPU when every dy has one magnitude (dy = s * f, s in {-1, 0, +1}:
// an L1 loss's backward), by the fixed-point integer sums of nn/one_magnitude.h: the
// exact row sums of nn/cuda/linear_row_sums.cu, the same digits' value and so the same bits
// once rounded, at a fraction of the cost. Elements outside their column's window take
// the binned sum one by one (with their own products, so with the general path's
// rounding and IEEE rules).
//
// Whether dy has one magnitude is known only on the device. The pass that finds dy's
// column maxima (column_maxima.cu) also records its largest and smallest nonzero
// magnitude; the kernel here returns at once unless they agree (and are finite), and
// the general kernel, launched beside it, returns at once if they do. No host round
// trip, and the launches are the same whatever dy holds (why the device keeps this
// choice: nn/cuda/weight_grad_choice.h).
//
// Here the kernel reads dy itself (SignsFromDy): each step's 32 rows x 16 outputs, two a
// thread, whose signs it lays out in shared memory as the warps' tensor-core operand.
//
// The kernel is a template over where its sign operand comes from: nn reads dy and
// lays the signs out itself (SignsFromDy, at the end of this file, launched by
// launch_one_magnitude_dw from nn/cuda/linear_row_sums.cu), and the benchmarks' fused
// step (bench/fused/kernels/) takes them laid out already by the loss that wrote dy.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/async_copy.cuh"
#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "core/cuda_util.cuh"
#include "core/dependent_launch.cuh"
#include "core/exact_bins.cuh"
#include "core/exact_fixed_point.h"
#include "nn/cuda/fixed_point_cut.cuh"
#include "nn/cuda/one_magnitude_dw.cuh"
#include "nn/cuda/weight_grad_choice.h"
#include "nn/rows.h"

namespace seqpar::nn::detail::few_outputs_dw {

// The block: 64 columns of x (one tile of 8 a warp) and a group of 16 outputs, over a
// chunk of at most kRowsPerChunk rows, 32 rows a step.
constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kGroup = 16;             // outputs j per block: one m16 tile
constexpr int kColumns = 8 * kWarps;   // columns k per block
constexpr int kStepRows = 32;          // rows per tensor-core step: the k32 of m16n8k32
constexpr int kStages = 4;             // x's tiles in shared memory: copies go out 3 steps ahead
constexpr int64_t kRowsPerChunk = 512;
// Chunks are shortened (to whole steps) until the grid has about this many blocks per SM
// (two fit: its registers): with few column blocks and output groups, 512-row
// chunks left SMs idle (60 blocks at 3000 rows) or some with twice the work of others.
// Any chunking gives the same integer sums.
constexpr int64_t kBlocksPerSm = 2;
// The int32 accumulators hold at most kRowsPerChunk products of ±1 and a byte.
static_assert(kRowsPerChunk * 255 < (int64_t{1} << 31), "a chunk's limb sums fit in int32");
// A chunk's sum of ±(an element below 2^44) times f's significand (below 2^24) stays below
// add_scaled_integer's 2^93.
static_assert(kWindowBits + 24 + 25 <= 93 && kRowsPerChunk <= (int64_t{1} << 25), "in range");
// An element of the window, v = x / 2^lsb with |v| < 2^44, is 2^23 H + L with
// H = floor(v / 2^23) in [-2^21, 2^21) and L in [0, 2^23): two 23-bit fields once H is
// offset by 2^22.
static_assert(kWindowBits == 2 * kFieldBits - 2 && 3 * 8 >= kFieldBits, "the fields hold the window");
// A chunk's total in int64: the limb sums (below 256 kRowsPerChunk) shifted by up to
// 16 + 23 bits, and the signs' sum times 2^45.
static_assert(kRowsPerChunk * 256 <= (int64_t{1} << 22), "a chunk's total fits in int64");
static_assert(kStepRows * kGroup == 512, "sign_fragment_byte's steps");
static_assert(kStepRows * kColumns == 2 * 4 * kThreads, "two 16-byte copies a thread a step");
// Elements outside their column's window that a warp keeps until its sums are in (below).
constexpr int kOutsidePerWarp = 32;
static_assert(kGroup <= 32, "a lane an output for the kept elements");

// An element outside its column's window, kept: x, its row in the chunk, its column in
// the warp's 8.
struct KeptElement {
  float value;
  int row;
  int column;
};

// D = A B + D on the integer tensor cores, m16n8k32: A 16 outputs x 32 rows of signs
// (s8: -1, 0, +1), B 32 rows x 8 columns of one byte of x's fields (u8). Integer
// products and sums: exact in any order.
__device__ inline void imma_16x8x32(int (&d)[4], const uint4& a, unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
}

// Row r of a lane's 8 in a step, r < 8: 4t + r, then 16 + 4t + r - 4 (the B fragment's
// rows of m16n8k32).
__device__ inline int step_row_of(int t, int r) { return r < 4 ? 4 * t + r : 12 + 4 * t + r; }

// The warp's elements outside the window past the first kOutsidePerWarp, which its list
// holds: the chunk read again (from global memory), in the order the loop met them
// (step, row r, lane), the list's skipped, each other's products with its row's dy, a
// lane an output. Not inlined: only a warp whose list overflowed (a column without a
// window, or x spread over more binades than the window) gets here.
inline __device__ __noinline__ void add_outside_past_list(const ConstRows& dy, const ConstRows& x,
                                                          const Cut& cut, bool whole, int64_t row_begin,
                                                          int64_t rows, int64_t k_warp, int64_t j0,
                                                          int64_t* digits, int64_t count) {
  const int lane = static_cast<int>(threadIdx.x % 32), g = lane / 4, t = lane % 4;
  const int64_t my_column = k_warp + g, j = j0 + lane;
  const bool column_valid = my_column < x.cols;
  int met = 0;
  for (int64_t step_row = 0; step_row < rows; step_row += kStepRows) {
#pragma unroll 1
    for (int r = 0; r < 8; ++r) {
      const int64_t local = step_row + step_row_of(t, r);
      const bool valid = local < rows && column_valid;
      const float value = valid ? x.data[(row_begin + local) * x.row_stride + my_column] : 0.0f;
      unsigned high, low;
      const bool outside = cut_fields(value, cut, high, low) != 0.0f;
      unsigned voters = __ballot_sync(0xffffffffu, valid && (outside || whole));
      for (; voters != 0; voters &= voters - 1, ++met) {
        const int from = __ffs(static_cast<int>(voters)) - 1;
        const float element = __shfl_sync(0xffffffffu, value, from);
        const int64_t element_row = step_row + step_row_of(from % 4, r);
        if (met >= kOutsidePerWarp && lane < kGroup && j < dy.cols) {
          add_outside_product(dy, element, row_begin + element_row, k_warp + from / 4, j, x.cols,
                              digits, count);
        }
      }
    }
  }
}

// Where x's tiles sit in shared memory: a step's 32 rows x 64 columns, each row's 16
// chunks of four columns permuted by its rows' group of four, chunk c at c ^ 2 ((row / 4)
// % 4). A lane reads 8 rows of its column, rows 4t + r and 16 + 4t + r (r < 4): with
// the permutation the warp's 32 reads of one r fall in 32 banks (without it, the four
// t's of a column share one), and a warp's 16-byte copies of a row still do.
__device__ inline int tile_chunk(int row, int chunk) { return chunk ^ (2 * ((row / 4) % 4)); }

// What the block works on, for the sign policies.
struct Block {
  ConstRows dy, x;
  int64_t j0;         // its first output
  int64_t k_block;    // its first column of x
  int64_t row_begin;  // its chunk's first row
  int rows;           // the chunk's rows
};

// dW[j, k] = f * Σ_rows s[row, j] v[row, k], v the fixed-point x of column k's window.
// With v = 2^23 (F_H - 2^22) + F_L (cut_fields), each field cut into three bytes,
// Σ s v = 2^23 Σ_l 2^(8 l) Σ s F_H,l + Σ_l 2^(8 l) Σ s F_L,l - 2^45 Σ s: six
// tensor-core products of the sign matrix with a byte matrix, and the signs' own sums.
//
// x's tiles (32 rows x 64 columns a step) go into shared memory by asynchronous copies,
// kStages - 1 steps ahead of the step that reads them: one barrier a step, and no
// register holds a load in flight. kAligned16: x's rows start 16-byte aligned (16-byte
// copies, two a thread a step); otherwise 4-byte copies (eight).
//
// Fragments (PTX m16n8k32, lane = 4 g + t): a0/a1 = the signs of rows 4t..4t+3 for outputs
// g / g+8, a2/a3 those of rows 16+4t..16+4t+3; b0/b1 = byte l of x's field at rows 4t.. /
// 16+4t.. of column g; d0,d1 / d2,d3 = the sums of outputs g / g+8 at columns 2t, 2t+1.
// Each (j, k) goes into the digits at once, with integer atomics.
//
// Signs, the policy that gives the A fragments (the signs of dy) and their sums Σ s:
//   struct Params;  struct Shared;   what the launch passes; the block's shared memory
//   Signs(params, block, shared)     before dy's magnitude is known: may start loads
//   static general(params, block, x_largest, digits, count)
//                                    dy has not one magnitude: the block's general sums,
//                                    or nothing where a general kernel runs beside it
//   next(step, steps)                top of a step, before its barrier: step + 1's loads
//   fragment(step)                   after the barrier: this lane's A fragment
//   count(a)                         after the step's products
//   finish()                         after the loop, every thread: the sums complete
//   total(d, jj)                     Σ s of fragment d's output, jj in the group
template <class Signs, bool kAligned16>
__global__ void __launch_bounds__(kThreads, 2) one_magnitude_dw_kernel(
    ConstRows dy, ConstRows x, const unsigned int* x_largest, const unsigned int* words,
    int64_t* digits, int64_t count, int64_t rows_per_chunk, typename Signs::Params params) {
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int g = lane / 4, t = lane % 4;
  const int64_t in = x.cols, out = dy.cols;
  const int64_t k_block = int64_t{blockIdx.x} * kColumns;
  const int64_t k_warp = k_block + 8 * warp;  // this warp's 8 columns
  const int64_t my_column = k_warp + g;       // this lane's column of x
  const int64_t row_begin = int64_t{blockIdx.z} * rows_per_chunk;
  const Block block{dy, x, int64_t{blockIdx.y} * kGroup, k_block, row_begin,
                    static_cast<int>(min(x.rows - row_begin, rows_per_chunk))};
  const int64_t j0 = block.j0;
  const int rows = block.rows;
  const int steps = (rows + kStepRows - 1) / kStepRows;

  cuda::wait_for_prior_grids();  // dy, its words and the maxima (and x, if a kernel wrote it)
  cuda::allow_dependent_grids();
  // dy's two words, this lane's column maximum and the signs' first loads, side by side:
  // each is a trip to L2 or beyond, and the loop cannot start before all.
  const unsigned largest = words[0], smallest_complement = words[1];
  const unsigned my_largest = my_column < in ? x_largest[my_column] : 0u;
  __shared__ typename Signs::Shared signs_shared;
  Signs signs(params, block, signs_shared);
  const OneMagnitude magnitude = one_magnitude_of(largest, ~smallest_complement);
  if (!magnitude.holds) {
    Signs::general(params, block, x_largest, digits, count);
    return;
  }

  __shared__ __align__(16) float tiles[kStages][kStepRows][kColumns];
  __shared__ KeptElement kept[kWarps][kOutsidePerWarp];  // each warp's, for the end
  int kept_count = 0;  // the warp's elements outside (the same in every lane)

  // This thread's copies of each step: 16 bytes of rows copy_row and copy_row + 16 at
  // chunk copy_column / 4 (or 4 bytes of 8 rows, 4 apart, at column copy_column), from
  // `copy_from` on, which moves down a step each time. The columns past x's get zeros,
  // which are inside any window, and so do the rows past the chunk's (only its last
  // step has any).
  constexpr int kCopies = kAligned16 ? 2 : 8;
  constexpr int kCopyRowsApart = kStepRows / kCopies;
  const int copy_row = kAligned16 ? static_cast<int>(threadIdx.x) / 16 : static_cast<int>(threadIdx.x) / 64;
  const int copy_column = kAligned16 ? 4 * (static_cast<int>(threadIdx.x) % 16) : static_cast<int>(threadIdx.x) % 64;
  const int64_t columns_left = in - k_block - copy_column;
  const unsigned copy_bytes = columns_left <= 0 ? 0u : 4u * static_cast<unsigned>(min(columns_left, int64_t{kAligned16 ? 4 : 1}));
  const float* copy_from = x.data + (row_begin + copy_row) * x.row_stride + k_block + (copy_bytes > 0 ? copy_column : 0);
  const int64_t copies_apart = kCopyRowsApart * x.row_stride, step_apart = kStepRows * x.row_stride;
  // The shared-memory address of each copy in stage 0. The 16-byte copies' rows, 16
  // apart, are permuted alike, so copy 1 is copy 0's address a fixed offset on.
  unsigned copy_target[kAligned16 ? 1 : kCopies];
#pragma unroll
  for (int c = 0; c < (kAligned16 ? 1 : kCopies); ++c) {
    const int row = copy_row + c * kCopyRowsApart;
    copy_target[c] = cuda::shared_address(&tiles[0][row][4 * tile_chunk(row, copy_column / 4) + copy_column % 4]);
  }
  static_assert(!kAligned16 || kCopyRowsApart % 16 == 0, "the 16-byte copies' rows permuted alike");
  auto copy_step = [&](int step) {
    const unsigned stage = static_cast<unsigned>((step % kStages) * sizeof(tiles[0]));
    const int first_row = step * kStepRows + copy_row;
#pragma unroll
    for (int c = 0; c < kCopies; ++c) {
      const bool valid = first_row + c * kCopyRowsApart < rows;
      const float* from = valid ? copy_from + c * copies_apart : x.data;  // x.data: read nothing
      const unsigned target =
          stage + (kAligned16 ? copy_target[0] + static_cast<unsigned>(c * kCopyRowsApart * sizeof(tiles[0][0]))
                              : copy_target[c]);
      if (kAligned16) {
        cuda::copy_async16_prefix(target, from, valid ? copy_bytes : 0u);
      } else {
        cuda::copy_async4_or_zero(target, from, valid && copy_bytes > 0);
      }
    }
    copy_from += step_apart;
  };

  // This lane's column of x and its window; past the edge the lane reads zeros, inside
  // any window.
  int lsb = 0;
  bool whole = false;
  if (my_column < in) {
    const Window window = column_window(my_largest, magnitude.exponent);
    lsb = max(window.lsb, exact::kLowestExponent);
    whole = window.whole || lsb > 127 - 46;
  }
  const Cut cut = cut_of(whole ? 0 : lsb);
  // This lane's 8 elements of a step in its tile: rows 4t + r and 16 + 4t + r, r < 4.
  const int read_column = 4 * tile_chunk(4 * t, (8 * warp + g) / 4) + g % 4;

  int high_sums[kLimbs][4] = {}, low_sums[kLimbs][4] = {};  // [limb][fragment d0..d3]
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps) copy_step(s);
    cuda::commit_copies();
  }
  for (int step = 0; step < steps; ++step) {
    signs.next(step, steps);
    // This step's tile has landed (this thread's copies; the barrier: everyone's), and
    // every warp is done with the stage the next copies overwrite (read last step).
    cuda::wait_copies<kStages - 2>();
    __syncthreads();
    if (step + kStages - 1 < steps) copy_step(step + kStages - 1);
    cuda::commit_copies();
    const uint4 a = signs.fragment(step);

    const float* tile = &tiles[step % kStages][0][read_column];
    float value[8], missed[8];
    unsigned high[8], low[8];
    float missed_sum = 0.0f;  // nonzero (or NaN) when an element is outside
#pragma unroll
    for (int r = 0; r < 8; ++r) {
      value[r] = tile[step_row_of(t, r) * kColumns];
      missed[r] = cut_fields(value[r], cut, high[r], low[r]);
      missed_sum += fabsf(missed[r]);
    }
    const bool any_outside = whole || missed_sum != 0.0f;
    // Elements outside the window are rare (a few in a million from randn): one vote a
    // step, not a branch an element. Each goes to the warp's list, and its products
    // into the digits once the warp's sums are in, a lane an output. Taken here, one
    // lane's 16 products one after the other held its warp, and so the kernel, long
    // after most SMs had finished. Past the list (a column of infinities), they are
    // found again after the loop (add_outside_past_list), so that the loop makes no
    // call and keeps its registers.
    if (__any_sync(0xffffffffu, any_outside)) {
#pragma unroll
      for (int r = 0; r < 8; ++r) {
        const int local = step * kStepRows + step_row_of(t, r);
        const bool outside = missed[r] != 0.0f || whole;
        const bool keep = outside && local < rows;
        const unsigned voters = __ballot_sync(0xffffffffu, keep);
        if (keep) {
          const int slot = kept_count + __popc(voters & ((1u << lane) - 1u));
          if (slot < kOutsidePerWarp) kept[warp][slot] = {value[r], local, g};
        }
        kept_count += __popc(voters);
        if (outside) {  // the fields of 0: nothing in the window's sums
          high[r] = __float_as_uint(cut.high);
          low[r] = __float_as_uint(cut.low);
        }
      }
    }
    __syncwarp();  // mma.sync wants the whole warp
    unsigned high_0_3[kLimbs], high_16_19[kLimbs], low_0_3[kLimbs], low_16_19[kLimbs];
    field_planes(high, 0, high_0_3);
    field_planes(high, 4, high_16_19);
    field_planes(low, 0, low_0_3);
    field_planes(low, 4, low_16_19);
#pragma unroll
    for (int limb = 0; limb < kLimbs; ++limb) {
      imma_16x8x32(high_sums[limb], a, high_0_3[limb], high_16_19[limb]);
      imma_16x8x32(low_sums[limb], a, low_0_3[limb], low_16_19[limb]);
    }
    signs.count(a);
  }
  signs.finish();

  // Each of this lane's 4 sums: Σ s v = 2^23 Σ_l 2^(8 l) (Σ s F_H,l) + Σ_l 2^(8 l)
  // (Σ s F_L,l) - 2^45 Σ s, times f's significand, into the digits at the window's unit
  // times f's. The sums are of columns 2t and 2t + 1, whose windows lanes 8t and 8t + 4
  // hold (g = 2t, 2t + 1).
  int column_lsb[2];
  bool column_whole[2];
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    column_lsb[c] = __shfl_sync(0xffffffffu, lsb, 4 * (2 * t + c));
    column_whole[c] = __shfl_sync(0xffffffffu, whole, 4 * (2 * t + c));
  }
#pragma unroll
  for (int d = 0; d < 4; ++d) {
    const int jj = g + (d < 2 ? 0 : 8);
    const int64_t j = j0 + jj, k = k_warp + 2 * t + (d % 2);
    if (j >= out || k >= in || column_whole[d % 2]) continue;
    // |Σ s v| < kRowsPerChunk 2^44, and every partial term below 2^62: int64 holds it.
    int64_t total = -(int64_t{signs.total(d, jj)} << (2 * kFieldBits - 1));
#pragma unroll
    for (int limb = 0; limb < kLimbs; ++limb) {
      total += int64_t{high_sums[limb][d]} << (8 * limb + kFieldBits);
      total += int64_t{low_sums[limb][d]} << (8 * limb);
    }
    exact::add_scaled_product_atomically(digits + j * in + k, count, total,
                                         static_cast<uint32_t>(magnitude.significand),
                                         column_lsb[d % 2] + magnitude.exponent);
  }

  if (kept_count > kOutsidePerWarp) {
    add_outside_past_list(dy, x, cut, whole, row_begin, rows, k_warp, j0, digits, count);
  }
  // The warp's kept elements: each one's products with its row's dy, a lane an output.
  __syncwarp();
  const int listed = min(kept_count, kOutsidePerWarp);
  const int64_t j = j0 + lane;
  for (int e = 0; e < listed; ++e) {
    const KeptElement element = kept[warp][e];
    if (lane < kGroup && j < out) {
      add_outside_product(dy, element.value, row_begin + element.row, k_warp + element.column, j,
                          in, digits, count);
    }
  }
}

// Whether the kernel's grid and offsets hold these shapes: row strides below 2^26
// floats, the bound the kernel was written and tested for (its offsets are 64-bit now).
// The host's test of these limits (nn/cuda/weight_grad_choice.h) names this kernel's shape.
static_assert(FewOutputsGrid::kRowsPerChunk == kRowsPerChunk && FewOutputsGrid::kOutputsPerBlock == kGroup &&
                  FewOutputsGrid::kColumnsPerBlock == kColumns && FewOutputsGrid::kStepRows == kStepRows,
              "weight_grad_choice.h's FewOutputsGrid is this kernel's shape");
inline bool fits(const ConstRows& grad_y, const ConstRows& x) {
  return few_outputs_kernel_fits({x.rows, x.cols, grad_y.cols, x.row_stride, grad_y.row_stride});
}

// The kernel's grid for these shapes, which fills the device: blocks of 64 columns x 16
// outputs, the rows cut into chunks (whole steps, at most kRowsPerChunk) until there
// are about kBlocksPerSm blocks an SM; and which of its two forms x's alignment allows.
// Each caller launches one_magnitude_dw_kernel<its Signs, aligned16> itself, so that the
// launch is one step from the function a reader comes from. Only where fits(grad_y, x).
struct LaunchShape {
  dim3 grid;
  int64_t rows_per_chunk;
  bool aligned16;  // x's rows start 16-byte aligned: the kernel's 16-byte copies
};
inline LaunchShape launch_shape(const ConstRows& grad_y, const ConstRows& x) {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  const int64_t column_blocks = cuda::ceil_div(x.cols, int64_t{kColumns});
  const int64_t groups = cuda::ceil_div(grad_y.cols, int64_t{kGroup});
  const int64_t chunks_wanted = std::max<int64_t>(
      1, kBlocksPerSm * cuda::multiprocessor_count(device) / (column_blocks * groups));
  const int64_t rows_per_chunk = std::clamp<int64_t>(
      kStepRows * cuda::ceil_div(cuda::ceil_div(x.rows, chunks_wanted), int64_t{kStepRows}),
      kStepRows, kRowsPerChunk);
  const dim3 grid(static_cast<unsigned>(column_blocks), static_cast<unsigned>(groups),
                  static_cast<unsigned>(cuda::ceil_div(x.rows, rows_per_chunk)));
  return {grid, rows_per_chunk, cuda::aligned16(x.data) && x.row_stride % 4 == 0};
}

// The sign policy of one_magnitude_dw_kernel (its comment lists the calls). The block
// reads each step's 32 x 16 dy once, two a thread (row `row_`, outputs j_ and j_ + 1),
// one step ahead, and lays their signs out in shared memory as the warps' A fragments,
// double-buffered (the step's barrier covers them); each thread counts its dy's signs,
// and the block's counts meet in shared memory after the loop.
class SignsFromDy {
 public:
  struct Params {};
  struct Shared {
    uint4 fragments[2][32];  // a step's A fragments, by lane
    int totals[kGroup];      // Σ s over the chunk, by output
  };
  static_assert(kThreads * 2 == kStepRows * kGroup, "each thread reads two dy of a step");

  __device__ SignsFromDy(const Params&, const Block& block, Shared& shared)
      : shared_(shared),
        row_(static_cast<int>(threadIdx.x) / 8),
        rows_(block.rows),
        row_stride_(block.dy.row_stride) {
    const int j = 2 * (static_cast<int>(threadIdx.x) % 8);
    from_ = block.dy.data + (block.row_begin + row_) * row_stride_ + block.j0 + j;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      byte_at_[e] = static_cast<int>(sign_fragment_byte(row_, j + e));
      valid_[e] = block.j0 + j + e < block.dy.cols;
    }
    // Zero before the loop's first barrier, which makes it visible to every thread.
    if (threadIdx.x < kGroup) shared.totals[threadIdx.x] = 0;
    load(0);
  }

  // Where dy has not one magnitude, the binned kernel launched beside this one does the sums.
  __device__ static void general(const Params&, const Block&, const unsigned int*, int64_t*, int64_t) {}

  __device__ void next(int step, int steps) {
    const float current[2] = {next_[0], next_[1]};
    if (step + 1 < steps) load(step + 1);
    unsigned char* bytes = reinterpret_cast<unsigned char*>(shared_.fragments[step % 2]);
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int s = sign_of(current[e]);
      sums_[e] += s;
      bytes[byte_at_[e]] = static_cast<unsigned char>(s);
    }
  }
  __device__ uint4 fragment(int step) const { return shared_.fragments[step % 2][threadIdx.x % 32]; }
  __device__ void count(const uint4&) {}
  __device__ void finish() {
    const int j = 2 * (static_cast<int>(threadIdx.x) % 8);
    // Σ s of each output over the chunk (integers: exact in any order).
#pragma unroll
    for (int e = 0; e < 2; ++e) atomicAdd(&shared_.totals[j + e], sums_[e]);
    __syncthreads();
  }
  __device__ int total(int, int jj) const { return shared_.totals[jj]; }

 private:
  __device__ void load(int step) {
    const bool row_valid = step * kStepRows + row_ < rows_;
    const float* at = from_ + int64_t{step} * kStepRows * row_stride_;
#pragma unroll
    for (int e = 0; e < 2; ++e) next_[e] = row_valid && valid_[e] ? at[e] : 0.0f;
  }

  Shared& shared_;
  int row_, rows_;
  int64_t row_stride_;
  const float* from_;
  int byte_at_[2];
  bool valid_[2];
  float next_[2] = {0.0f, 0.0f};
  int sums_[2] = {0, 0};
};

}  // namespace seqpar::nn::detail::few_outputs_dw

namespace seqpar::nn::detail {

// dW when every dy has one magnitude, as after an L1 loss, by the kernel above with
// SignsFromDy:
// exact integer sums of ±x in fixed point, the same digits' value as the general row
// sums. x_largest: the columns' largest |x| bits; words: dy's largest and smallest
// nonzero magnitude bits (one_magnitude_dw.cuh): the kernel returns at once unless they
// agree, and they tell the general kernel launched beside it to skip its work when
// this path does it. Only where few_outputs_kernel_fits (nn/cuda/weight_grad_choice.h).
inline void launch_one_magnitude_dw(const ConstRows& grad_y, const ConstRows& x, const unsigned int* x_largest,
                                    const unsigned int* words, int64_t* digits, int64_t stride, cuda::Stream stream) {
  using namespace few_outputs_dw;
  const LaunchShape shape = launch_shape(grad_y, x);
  const auto kernel = shape.aligned16 ? one_magnitude_dw_kernel<SignsFromDy, true>
                                      : one_magnitude_dw_kernel<SignsFromDy, false>;
  cuda::launch_dependent(kernel, shape.grid, dim3(kThreads), 0, stream, grad_y, x, x_largest, words, digits,
                         stride, shape.rows_per_chunk, SignsFromDy::Params{});
  CUDA_LAUNCH_CHECK();
}

}  // namespace seqpar::nn::detail
