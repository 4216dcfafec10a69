// dW = dyᵀ x on the GPU when every dy has one magnitude (dy = s * f, s in {-1, 0, +1}:
// an L1 loss's backward), by the fixed-point integer sums of nn/one_magnitude.h: the
// exact row sums of nn/linear_row_sums.cu, the same digits' value and so the same bits
// once rounded, at a fraction of the cost. Elements outside their column's window take
// the binned sum one by one (with their own products, so with the general path's
// rounding and IEEE rules).
//
// Whether dy has one magnitude is known only on the device. The pass that finds dy's
// column maxima (linear_row_sums.cu) also records its largest and smallest nonzero
// magnitude; the kernel here returns at once unless they agree (and are finite), and
// the general kernel returns at once if they do. No host round trip, and the launches
// are the same whatever dy holds.
#include <algorithm>

#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "core/dependent_launch.cuh"
#include "core/exact_sum.cuh"
#include "nn/linear_kernels.h"
#include "nn/linear_ternary.cuh"

namespace seqpar::nn::detail {

namespace {

// The block: 64 columns of x (one tile of 8 a warp) and a group of 16 outputs, over a
// chunk of at most kRowsPerChunk rows, 32 rows a step.
constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kGroup = 16;             // outputs j per block: one m16 tile
constexpr int kColumns = 8 * kWarps;   // columns k per block
constexpr int kStepRows = 32;          // rows per tensor-core step: the k32 of m16n8k32
constexpr int kLimbs = 6;              // bytes of a fixed-point element plus 2^44: 45 bits
constexpr int64_t kRowsPerChunk = 512;
// Chunks are shortened (to whole steps) until the grid has about this many blocks per SM
// (two fit: 128 registers a thread): with few column blocks and output groups, 512-row
// chunks left SMs idle (60 blocks at 3000 rows) or some with twice the work of others.
// Any chunking gives the same integer sums.
constexpr int64_t kBlocksPerSm = 2;
// The int32 accumulators hold at most kRowsPerChunk products of ±1 and a byte.
static_assert(kRowsPerChunk * 255 < (int64_t{1} << 31), "a chunk's limb sums fit in int32");
// A chunk's sum of ±(an element below 2^44) times f's significand (below 2^24) stays below
// add_scaled_integer's 2^93.
static_assert(kWindowBits + 24 + 25 <= 93 && kRowsPerChunk <= (int64_t{1} << 25), "in range");
static_assert(kWindowBits + 1 <= 8 * kLimbs, "an element plus 2^44 fits in the limbs");
// A chunk's total in int64: the limb sums (below 255 kRowsPerChunk) shifted by up to 40
// bits, and the signs' sum times 2^44.
static_assert(kRowsPerChunk * 256 <= (int64_t{1} << 22), "a chunk's total fits in int64");
static_assert(kThreads * 2 == kStepRows * kGroup, "each thread reads two dy of a step");
static_assert(kGroup == kSignFragmentOutputs && kStepRows * kGroup == 512, "sign_fragment_byte's steps");
// Elements outside their window that a warp keeps until its sums are in (below).
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
// (s8: -1, 0, +1), B 32 rows x 8 columns of one byte of the offset fixed-point x (u8).
// Integer products and sums: exact in any order.
__device__ inline void imma_16x8x32(int (&d)[4], const uint4& a, unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
}

// x in its column's fixed point, offset: u = x / 2^lsb + 2^44, in [0, 2^45), when
// y = x / 2^lsb is an integer below 2^44 in magnitude (the window is the column's
// largest |x|'s), as its low and high 32 bits; `outside` when it is not (a fraction
// left, too large, NaN or infinite). In double: y = x * 2^-lsb is exact, and adding
// kMagic = 2^52 + 2^51 + 2^44, whose unit in the last place is 1, rounds y to an
// integer: exactly y when y is one, and then the significand's low 45 bits are u
// (2^51 + u sits between 2^51 and 2^52). So five double operations, no integer shifts.
struct Offset {
  unsigned low, high;
};
__device__ inline Offset offset_fixed(float x, double scale, bool& outside) {
  constexpr double kMagic = 0x1p52 + 0x1p51 + 0x1p44;
  const double y = __dmul_rn(static_cast<double>(x), scale);
  const double d = __dadd_rn(y, kMagic);
  outside = !(fabs(y) < kWindowLimit && __dsub_rn(d, kMagic) == y);
  return {static_cast<unsigned>(__double2loint(d)), static_cast<unsigned>(__double2hiint(d))};
}

// The six byte planes of four offsets u[first..first+3]: planes[l] holds byte l of each,
// low to high. A byte transpose: two permutes pair the rows' bytes, two more take the
// pairs apart (12 permutes for the six planes).
__device__ inline void byte_planes(const Offset (&u)[8], int first, unsigned (&planes)[kLimbs]) {
  // __byte_perm(x, y, s): byte n of the result is byte (s >> 4n) & 7 of the pair (x, y).
  const unsigned low01 = __byte_perm(u[first].low, u[first + 1].low, 0x5140);       // b0 b0 b1 b1
  const unsigned low01_high = __byte_perm(u[first].low, u[first + 1].low, 0x7362);  // b2 b2 b3 b3
  const unsigned low23 = __byte_perm(u[first + 2].low, u[first + 3].low, 0x5140);
  const unsigned low23_high = __byte_perm(u[first + 2].low, u[first + 3].low, 0x7362);
  planes[0] = __byte_perm(low01, low23, 0x5410);
  planes[1] = __byte_perm(low01, low23, 0x7632);
  planes[2] = __byte_perm(low01_high, low23_high, 0x5410);
  planes[3] = __byte_perm(low01_high, low23_high, 0x7632);
  const unsigned high01 = __byte_perm(u[first].high, u[first + 1].high, 0x5140);
  const unsigned high23 = __byte_perm(u[first + 2].high, u[first + 3].high, 0x5140);
  planes[4] = __byte_perm(high01, high23, 0x5410);
  planes[5] = __byte_perm(high01, high23, 0x7632);
}

// dW[j, k] = f * Σ_rows s[row, j] v[row, k], v the fixed-point x of column k's window.
// With u = v + 2^44 in [0, 2^45) cut into six bytes u_l, Σ s v = Σ_l 2^(8 l) Σ s u_l -
// 2^44 Σ s: six tensor-core products of the sign matrix with a byte matrix, and the
// signs' own sums.
//
// Fragments (PTX m16n8k32, lane = 4 g + t): a0/a1 = the signs of rows 4t..4t+3 for outputs
// g / g+8, a2/a3 those of rows 16+4t..16+4t+3; b0/b1 = byte l of x at rows 4t.. / 16+4t..
// of column g; d0,d1 / d2,d3 = the sums of outputs g / g+8 at columns 2t, 2t+1. Each
// (j, k) goes into the digits at once, with integer atomics.
//
// Where the signs come from:
//   - kFragments: laid out already by whoever wrote dy (sign_fragment_byte): each lane
//     loads its 16 bytes a step (the block's eight warps the same 512, from L1), and a
//     seventh product with a matrix of ones gives Σ s. No barrier: the warps run apart.
//   - else: the block reads each step's 32 x 16 dy once, two a thread, and lays their
//     signs out in shared memory as the warps' A fragments, double-buffered: one barrier
//     a step; each thread counts its dy's signs for Σ s.
template <bool kFragments>
__global__ void __launch_bounds__(kThreads, 2) ternary_weight_grad_kernel(
    ConstRows dy, ConstRows x, const unsigned int* x_largest, const unsigned int* words,
    int64_t* digits, int64_t count, int64_t rows_per_chunk, const uint8_t* sign_fragments) {
  cuda::wait_for_prior_grids();  // dy, its words and the maxima
  cuda::allow_dependent_grids();
  const OneMagnitude magnitude = one_magnitude(words);
  if (!magnitude.holds) return;
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int g = lane / 4, t = lane % 4;
  const int64_t in = x.cols, out = dy.cols;
  const int64_t j0 = int64_t{blockIdx.y} * kGroup;
  const int64_t k_warp = int64_t{blockIdx.x} * kColumns + 8 * warp;  // this warp's 8 columns
  const int64_t row_begin = int64_t{blockIdx.z} * rows_per_chunk;
  const int64_t rows = min(x.rows - row_begin, rows_per_chunk);

  __shared__ uint4 fragments[kFragments ? 1 : 2][32];  // a step's A fragments, by lane
  __shared__ int sign_totals[kGroup];                  // Σ s over the chunk, by output
  __shared__ KeptElement kept[kWarps][kOutsidePerWarp];  // each warp's, for the end
  int kept_count = 0;  // the warp's elements outside (the same in every lane)
  if (!kFragments && threadIdx.x < kGroup) sign_totals[threadIdx.x] = 0;
  // The chunk's fragments: a step's 512 bytes after another (rows_per_chunk is whole steps).
  const uint4* chunk_fragments =
      kFragments ? reinterpret_cast<const uint4*>(sign_fragments + sign_fragment_byte(row_begin, 0)) : nullptr;

  // Without fragments, this thread's two dy of each step: row dy_row, outputs dy_j and
  // dy_j + 1, and where their signs go among the fragments' bytes.
  const int dy_row = static_cast<int>(threadIdx.x) / 8, dy_j = 2 * (static_cast<int>(threadIdx.x) % 8);
  int byte_at[2];
#pragma unroll
  for (int e = 0; e < 2; ++e) byte_at[e] = static_cast<int>(sign_fragment_byte(dy_row, dy_j + e));
  const bool dy_valid[2] = {j0 + dy_j < out, j0 + dy_j + 1 < out};
  int my_sign_sums[2] = {0, 0};

  // This lane's column of x and its window: lsb, or every element outside (a column with
  // no window); past the edge the lane reads zeros, inside any window.
  const int64_t my_column = k_warp + g;
  const bool column_valid = my_column < in;
  // The window's unit as a factor: 2^-lsb, a power of two (x times it is exact in
  // double); 0 past the edge (zeros, inside any window).
  double scale = 0.0;
  bool whole = false;
  int lsb = 0;
  if (column_valid) {
    const Window window = column_window(x_largest[my_column], magnitude.exponent);
    scale = ldexp(1.0, -window.lsb);
    whole = window.whole;
    lsb = window.lsb;
  }
  const float* x_column = x.data + (column_valid ? my_column : 0);
  // Row r of a step, for r < 8: 4t + r, then 16 + 4t + r - 4; its offset from the step's
  // first row (32-bit: ternary_weight_grad_fits bounds the row stride).
  auto step_row_of = [&](int r) { return r < 4 ? 4 * t + r : 12 + 4 * t + r; };
  int x_offset[8];
#pragma unroll
  for (int r = 0; r < 8; ++r) x_offset[r] = step_row_of(r) * static_cast<int>(x.row_stride);
  const int dy_offset = dy_row * static_cast<int>(dy.row_stride) + dy_j;

  struct Loaded {
    float dy[2], x[8];
    uint4 a;
  };
  auto load = [&](int64_t step_row) {
    Loaded loaded;
    if (kFragments) loaded.a = chunk_fragments[step_row / kStepRows * 32 + lane];
    const float* dy_step = dy.data + (row_begin + step_row) * dy.row_stride + j0 + dy_offset;
    const float* x_step = x_column + (row_begin + step_row) * x.row_stride;
    if (step_row + kStepRows <= rows && column_valid && (kFragments || dy_valid[1])) {  // the usual case
#pragma unroll
      for (int e = 0; e < 2 && !kFragments; ++e) loaded.dy[e] = dy_step[e];
#pragma unroll
      for (int r = 0; r < 8; ++r) loaded.x[r] = x_step[x_offset[r]];
      return loaded;
    }
    const bool dy_row_valid = step_row + dy_row < rows;
#pragma unroll
    for (int e = 0; e < 2 && !kFragments; ++e) {
      loaded.dy[e] = dy_row_valid && dy_valid[e] ? dy_step[e] : 0.0f;
    }
#pragma unroll
    for (int r = 0; r < 8; ++r) {
      loaded.x[r] = step_row + step_row_of(r) < rows && column_valid ? x_step[x_offset[r]] : 0.0f;
    }
    return loaded;
  };

  int sums[kLimbs][4] = {};  // [limb][fragment d0..d3]
  int sign_sums[4] = {};     // with fragments: Σ s of d0..d3's outputs
  Loaded next = load(0);
  int buffer = 0;
  for (int64_t step_row = 0; step_row < rows; step_row += kStepRows, buffer ^= 1) {
    const Loaded current = next;
    // The next step's loads go out first, so that a whole step covers their latency.
    if (step_row + kStepRows < rows) next = load(step_row + kStepRows);
    uint4 a;
    if (kFragments) {
      a = current.a;
    } else {
      unsigned char* bytes = reinterpret_cast<unsigned char*>(fragments[buffer]);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int s = sign_of(current.dy[e]);
        my_sign_sums[e] += s;
        bytes[byte_at[e]] = static_cast<unsigned char>(s);
      }
      __syncthreads();  // the step's fragments are laid out (and last-but-one step's read)
      a = fragments[buffer][lane];
    }
    Offset u[8];
    bool outside[8];
    bool any_outside = whole;
#pragma unroll
    for (int r = 0; r < 8; ++r) {
      u[r] = offset_fixed(current.x[r], scale, outside[r]);
      any_outside = any_outside || outside[r];
    }
    // Elements outside the window are rare (about one in 300,000 from randn): one vote
    // a step, not a branch an element. Each goes to the warp's list, and its products
    // into the digits once the warp's sums are in, a lane an output. Taken here, one
    // lane's 16 products one after the other held its warp, and so the kernel, long
    // after most SMs had finished (measured; bench/RESULTS.md). Past the list (a column
    // of infinities), here.
    if (__any_sync(0xffffffffu, any_outside)) {
#pragma unroll
      for (int r = 0; r < 8; ++r) {
        const int local = static_cast<int>(step_row) + step_row_of(r);
        const bool keep = (outside[r] || whole) && local < rows;
        const unsigned voters = __ballot_sync(0xffffffffu, keep);
        if (keep) {
          const int slot = kept_count + __popc(voters & ((1u << lane) - 1u));
          if (slot < kOutsidePerWarp) {
            kept[warp][slot] = {current.x[r], local, g};
          } else {
            add_outside_window(dy, current.x[r], row_begin + local, my_column, j0,
                               min(j0 + kGroup, out), in, digits, count);
          }
        }
        kept_count += __popc(voters);
        if (outside[r] || whole) u[r] = {0u, 1u << (kWindowBits - 32)};  // 2^44: 0 in the window's sums
      }
    }
    __syncwarp();  // mma.sync wants the whole warp
    unsigned rows_0_3[kLimbs], rows_16_19[kLimbs];
    byte_planes(u, 0, rows_0_3);
    byte_planes(u, 4, rows_16_19);
#pragma unroll
    for (int limb = 0; limb < kLimbs; ++limb) {
      imma_16x8x32(sums[limb], a, rows_0_3[limb], rows_16_19[limb]);
    }
    if (kFragments) imma_16x8x32(sign_sums, a, 0x01010101u, 0x01010101u);  // Σ s, row by row
  }
  if (!kFragments) {
    // Σ s of each output over the chunk (integers: exact in any order).
#pragma unroll
    for (int e = 0; e < 2; ++e) atomicAdd(&sign_totals[dy_j + e], my_sign_sums[e]);
    __syncthreads();
  }

  // Each of this lane's 4 sums: Σ s v = Σ_l 2^(8 l) (Σ s u_l) - 2^44 Σ s, times f's
  // significand, into the digits at the window's unit times f's. The sums are of
  // columns 2t and 2t + 1, whose windows lanes 8t and 8t + 4 hold (g = 2t, 2t + 1).
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
    const int signs = kFragments ? sign_sums[d] : sign_totals[jj];
    int64_t total = -(int64_t{signs} << kWindowBits);
#pragma unroll
    for (int limb = 0; limb < kLimbs; ++limb) total += int64_t{sums[limb][d]} << (8 * limb);
    exact::add_scaled_product_atomically(digits + j * in + k, count, total,
                                         static_cast<uint32_t>(magnitude.significand),
                                         column_lsb[d % 2] + magnitude.exponent);
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

}  // namespace

bool ternary_weight_grad_fits(const ConstRows& grad_y, const ConstRows& x) {
  // Row offsets within a step are 32-bit.
  return cuda::ceil_div(x.rows, kRowsPerChunk) <= 65535 &&
         cuda::ceil_div(grad_y.cols, kGroup) <= 65535 && cuda::ceil_div(x.cols, kColumns) <= 0x7fffffff &&
         x.row_stride * kStepRows < (int64_t{1} << 31) && grad_y.row_stride * kStepRows < (int64_t{1} << 31);
}

void launch_ternary_weight_grad(const ConstRows& grad_y, const ConstRows& x,
                                const unsigned int* x_largest, const unsigned int* words,
                                int64_t* digits, int64_t stride, cuda::Stream stream,
                                const uint8_t* sign_fragments) {
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
  if (sign_fragments != nullptr) {
    SEQPAR_CHECK(grad_y.cols <= kSignFragmentOutputs, "launch_ternary_weight_grad: sign fragments for ",
                 grad_y.cols, " outputs (at most ", kSignFragmentOutputs, ")");
    cuda::launch_dependent(ternary_weight_grad_kernel<true>, grid, dim3(kThreads), 0, stream, grad_y,
                           x, x_largest, words, digits, stride, rows_per_chunk, sign_fragments);
  } else {
    cuda::launch_dependent(ternary_weight_grad_kernel<false>, grid, dim3(kThreads), 0, stream, grad_y,
                           x, x_largest, words, digits, stride, rows_per_chunk, sign_fragments);
  }
  CUDA_LAUNCH_CHECK();
}

}  // namespace seqpar::nn::detail
