// CUDA kernel of nn/cuda/gemm_tile128.h: the classic register-blocked SGEMM.
//
// A block of 256 threads owns a 128 x 128 tile of C and walks K, whole, in slices of
// 32 k. Each slice of A and Bᵀ
// (128 x 32 each) is loaded in parts of 8 k, one 16-byte load per thread, operand and
// part, and stored k-major in shared memory, tile[k][row], rows padded by 4 floats,
// double-buffered: part p of the next slice is loaded before k 8p .. 8p + 7 of this one
// and stored after them, so that one float4 per operand is in registers at a time; one
// barrier per slice. Each thread accumulates an 8 x 8 sub-tile in registers: rows
// ty*4 + i and 64 + ty*4 + i, columns tx*4 + j and 64 + tx*4 + j, so every
// shared-memory read is a 16-byte vector, a warp's reads of B cover 32 distinct banks,
// and its reads of A are broadcasts. Per k a thread does 64 FMAs for 4 vector loads.
//
// Why 32 k a slice: each slice ends at a barrier, where a block's warps wait for its
// slowest, and twice the depth halves the barriers (the faster depth, bench/RESULTS.md).
// The two buffers then take 67.6 KB a block, past the default 48 KB: every launch
// raises the kernel's limit first (cuda::allow_dynamic_shared_memory), which is legal
// inside a graph capture too, so captured and eager launches run the same kernel.
//
// Operand layouts (template arguments, one per operand; see Operand in the header):
//   along K     x, dy and the forward's W: a thread loads 4 consecutive k of one row
//               (two threads per row and part: k 0..3 and 4..7 of part 0, 8..11 and
//               12..15 of part 1, and so on, so a warp's load fills 16 whole 32-byte
//               sectors) and stores them transposed, tile[k..k+3][row]; the padding
//               makes a warp's 4 scalar stores hit 32 distinct banks each.
//   along rows  dx's W, read down its columns: a thread loads 4 consecutive rows at
//               one k (32 threads per k: k 0..7 in part 0, 8..15 in part 1, ...) and
//               stores them as they are, one float4 at tile[k][row..row+3]; a warp's
//               stores cover one contiguous 512-byte row of the tile, 4 conflict-free
//               wavefronts.
// Only the staging differs: the FMA loop and the write-out are the same for both.
//
// Each element is one fma chain over k in increasing order from +0, then + bias: the
// canonical order of nn/cpu/linear.h, the same bits as the CPU and the 64 x 64
// kernel, at either depth. The k staged past K (the last slice's rest) must change
// nothing, so they are -0 in A and +0 in Bᵀ (kPastKA, kPastKB in the header). With +0
// in both, a chain whose sum is -0 (a negative product below half the smallest
// subnormal rounds to -0) would end +0, where the CPU's ends -0.
//
// What it does not use: Hopper's tensor cores (wgmma), whose fp32 inputs go through
// TF32, and the asynchronous copy engine (cp.async / TMA), which cannot transpose the
// operands read along K on their way into shared memory.
#include "nn/cuda/gemm_tile128.h"

#include <cstdint>

#include "core/cuda_check.h"
#include "core/cuda_util.cuh"

namespace seqpar::nn::detail {

namespace {

constexpr int kTile = kGemm128Tile, kThreads = 256, kPad = 4;
constexpr int kHalf = kTile / 2;
// A slice is loaded in parts of 8 k: one float4 of each operand per thread and part.
constexpr int kPartDepth = 8;
static_assert(kTile * kPartDepth == 4 * kThreads, "one float4 of each operand per thread and part");
constexpr int kSlice = kGemm128Slice;
static_assert(kSlice % kPartDepth == 0, "slices of whole parts");
// One k of a staged slice: a row of the tile, padded.
typedef float TileRow[kTile + kPad];

// The dynamic shared memory: two buffers of A's slice and two of Bᵀ's.
constexpr size_t kStagingBytes = size_t{4} * kSlice * sizeof(TileRow);

// Where this thread's float4 sits in part 0 of every 128-row slice of an operand; part p
// is the same float4 8 p further along K.
template <bool kAlongK>
struct SliceSpot {
  int row, k;
  __device__ explicit SliceSpot(int t)
      : row(kAlongK ? t / 2 : (t % 32) * 4), k(kAlongK ? (t % 2) * 4 : t / 32) {}
};

// The float4 at (row, k) of `op`: k .. k + 3 along K, rows row .. row + 3 along rows.
// `zero` outside the matrix or past K; K % 4 == 0 along K and rows % 4 == 0 along rows
// make the first element's test cover all four.
template <bool kAlongK>
__device__ __forceinline__ float4 load_slice(const Operand& op, int64_t row, int64_t rows,
                                             int64_t k, int64_t k_end, float zero) {
  if (row >= rows || k >= k_end) return make_float4(zero, zero, zero, zero);
  const int64_t offset = kAlongK ? row * op.row_stride + k : k * op.k_stride + row;
  return *reinterpret_cast<const float4*>(op.data + offset);
}

// Stores part `part` of a slice (k + 8 part) into a tile row of kTile + kPad floats.
template <bool kAlongK>
__device__ __forceinline__ void store_slice(TileRow* tile, SliceSpot<kAlongK> spot,
                                            int part, float4 v) {
  const int k = spot.k + part * kPartDepth;
  if (kAlongK) {  // transposed: 4 k of one row
    tile[k + 0][spot.row] = v.x;
    tile[k + 1][spot.row] = v.y;
    tile[k + 2][spot.row] = v.z;
    tile[k + 3][spot.row] = v.w;
  } else {  // as loaded: 4 rows at one k
    *reinterpret_cast<float4*>(&tile[k][spot.row]) = v;
  }
}

template <bool kAAlongK, bool kBAlongK>
__global__ void __launch_bounds__(kThreads, 2) gemm128_kernel(Gemm g) {
  constexpr int kParts = kSlice / kPartDepth;
  extern __shared__ __align__(16) float staging[];
  // Buffer b of A's slices is a_tile + b * kSlice, and likewise for Bᵀ.
  TileRow* const a_tile = reinterpret_cast<TileRow*>(staging);
  TileRow* const b_tile = a_tile + 2 * kSlice;
  const int t = threadIdx.x;
  const SliceSpot<kAAlongK> a_spot(t);
  const SliceSpot<kBAlongK> b_spot(t);
  const int ty = t / 16, tx = t % 16;
  const int64_t m0 = int64_t{blockIdx.x} * kTile, n0 = int64_t{blockIdx.y} * kTile;

  // The first slice, part by part; a_next and b_next then carry one part at a time.
  float4 a_next, b_next;
#pragma unroll
  for (int part = 0; part < kParts; ++part) {
    const int64_t k = part * kPartDepth;
    a_next = load_slice<kAAlongK>(g.a, m0 + a_spot.row, g.m, k + a_spot.k, g.k, kPastKA);
    b_next = load_slice<kBAlongK>(g.b, n0 + b_spot.row, g.n, k + b_spot.k, g.k, kPastKB);
    store_slice(a_tile, a_spot, part, a_next);
    store_slice(b_tile, b_spot, part, b_next);
  }
  __syncthreads();

  float sum[8][8] = {};
  int current = 0;
  for (int64_t k0 = 0; k0 < g.k; k0 += kSlice, current ^= 1) {
    const int64_t k = k0 + kSlice;
    const bool more = k < g.k;
    // Part by part: the next slice's part p is loaded before this slice's part p (k 8 p
    // .. 8 p + 7) is multiplied and stored after it, so that one float4 per operand is in
    // flight. (With a whole slice loaded up front, ptxas holds its 128 registers by
    // sinking the loads down to the stores.)
    if (more) {
      a_next = load_slice<kAAlongK>(g.a, m0 + a_spot.row, g.m, k + a_spot.k, g.k, kPastKA);
      b_next = load_slice<kBAlongK>(g.b, n0 + b_spot.row, g.n, k + b_spot.k, g.k, kPastKB);
    }
#pragma unroll
    for (int kk = 0; kk < kSlice; ++kk) {
      // Part p - 1 multiplied: store the next slice's part p - 1 (the other buffer was
      // last read before the previous barrier) and load its part p.
      if (kk % kPartDepth == 0 && kk > 0 && more) {
        const int part = kk / kPartDepth;
        store_slice(a_tile + (current ^ 1) * kSlice, a_spot, part - 1, a_next);
        store_slice(b_tile + (current ^ 1) * kSlice, b_spot, part - 1, b_next);
        const int64_t k1 = k + part * kPartDepth;
        a_next = load_slice<kAAlongK>(g.a, m0 + a_spot.row, g.m, k1 + a_spot.k, g.k, kPastKA);
        b_next = load_slice<kBAlongK>(g.b, n0 + b_spot.row, g.n, k1 + b_spot.k, g.k, kPastKB);
      }
      const float* a_row = a_tile[current * kSlice + kk];
      const float* b_row = b_tile[current * kSlice + kk];
      const float4 a_low = *reinterpret_cast<const float4*>(a_row + ty * 4);
      const float4 a_high = *reinterpret_cast<const float4*>(a_row + kHalf + ty * 4);
      const float4 b_low = *reinterpret_cast<const float4*>(b_row + tx * 4);
      const float4 b_high = *reinterpret_cast<const float4*>(b_row + kHalf + tx * 4);
      const float a[8] = {a_low.x, a_low.y, a_low.z, a_low.w, a_high.x, a_high.y, a_high.z, a_high.w};
      const float b[8] = {b_low.x, b_low.y, b_low.z, b_low.w, b_high.x, b_high.y, b_high.z, b_high.w};
      // Row by row; odd rows walk the columns backwards, so each turn reuses the b[j]
      // just read, which ptxas schedules with fewer stalls. The chains are independent:
      // any order gives the same bits.
#pragma unroll
      for (int i = 0; i < 8; ++i) {
#pragma unroll
        for (int step = 0; step < 8; ++step) {
          const int j = i % 2 == 1 ? 7 - step : step;
          sum[i][j] = fmaf(a[i], b[j], sum[i][j]);
        }
      }
    }
    if (more) {  // the last part
      store_slice(a_tile + (current ^ 1) * kSlice, a_spot, kParts - 1, a_next);
      store_slice(b_tile + (current ^ 1) * kSlice, b_spot, kParts - 1, b_next);
    }
    __syncthreads();
  }

  // C and the bias, added after the chain.
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int64_t row = m0 + (i < 4 ? ty * 4 + i : kHalf + ty * 4 + i - 4);
    if (row >= g.m) continue;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t col = n0 + half * kHalf + tx * 4;
      if (col >= g.n) continue;  // n % 4 == 0: col < n covers col .. col + 3
      float4 v = make_float4(sum[i][4 * half], sum[i][4 * half + 1], sum[i][4 * half + 2],
                             sum[i][4 * half + 3]);
      if (g.bias != nullptr) {
        v.x += g.bias[col];
        v.y += g.bias[col + 1];
        v.z += g.bias[col + 2];
        v.w += g.bias[col + 3];
      }
      *reinterpret_cast<float4*>(g.c + row * g.c_row_stride + col) = v;
    }
  }
}

// float4 loads: along K, 4 k of a row (K and the row stride multiples of 4); along
// rows, 4 rows at one k (the row count and the k stride multiples of 4).
template <bool kAlongK>
bool operand_fits(const Operand& op, int64_t rows, int64_t k) {
  if (!cuda::aligned16(op.data)) return false;
  if (kAlongK) return op.k_stride == 1 && op.row_stride % 4 == 0 && k % 4 == 0;
  return op.row_stride == 1 && op.k_stride % 4 == 0 && rows % 4 == 0;
}

}  // namespace

template <bool kAAlongK, bool kBAlongK>
bool gemm128_fits(const Gemm& g) {
  return operand_fits<kAAlongK>(g.a, g.m, g.k) && operand_fits<kBAlongK>(g.b, g.n, g.k) &&
         g.n % 4 == 0 && g.c_row_stride % 4 == 0 && cuda::aligned16(g.c) &&
         cuda::ceil_div(g.m, kTile) <= INT32_MAX && cuda::ceil_div(g.n, kTile) <= 65535;
}

template <bool kAAlongK, bool kBAlongK>
void gemm128_cuda(const Gemm& g, cuda::Stream stream) {
  SEQPAR_CHECK((gemm128_fits<kAAlongK, kBAlongK>(g)),
               "gemm128_cuda: shape, layout or alignment not supported");
  const auto kernel = gemm128_kernel<kAAlongK, kBAlongK>;
  cuda::allow_dynamic_shared_memory(kernel, kStagingBytes);
  const dim3 grid(static_cast<unsigned>(cuda::ceil_div(g.m, kTile)),
                  static_cast<unsigned>(cuda::ceil_div(g.n, kTile)));
  kernel<<<grid, kThreads, kStagingBytes, stream>>>(g);
  CUDA_LAUNCH_CHECK();
}

// The layouts of the two GEMM products of a Linear (linear.cu's design note).
template bool gemm128_fits<true, true>(const Gemm&);   // y = x Wᵀ + b
template bool gemm128_fits<true, false>(const Gemm&);  // dx = dy W
template void gemm128_cuda<true, true>(const Gemm&, cuda::Stream);
template void gemm128_cuda<true, false>(const Gemm&, cuda::Stream);

}  // namespace seqpar::nn::detail
