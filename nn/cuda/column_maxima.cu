// The pass over a matrix that the exact dW and db take before their sums
// (linear_row_sums.cu): each column's largest magnitude, and for dy also its
// one-magnitude words, its sign sums and its signs as bytes, all from one read.
#include <algorithm>

#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "core/cuda_util.cuh"
#include "nn/cuda/linear.h"
#include "nn/cuda/one_magnitude_dw.cuh"

namespace seqpar::nn::detail {

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;

// largest[c] = the largest |m[row, c]| over all rows, as the bits of a float (integer
// atomics on the bits order non-negative floats). fmaxf passes over NaNs, rightly: NaN
// terms never reach the bins (they go to the special sum); an infinity makes every bin
// reachable. Block: 32 columns (a lane each) x 8 warps; grid.y: chunks of 256 rows, a
// warp's rows in runs of four (rows 32 g + 4 warp .. + 3, g = 0..7) where it writes
// signs, else rows warp, warp + 8, ..., the faster order where no words are built
// (bench/RESULTS.md).
// With `magnitudes`, also the two words of the one-magnitude test over all of m
// (one_magnitude_dw.cuh): the largest |m| bits (NaN above infinity) and the complement of
// the smallest nonzero. With `sign_sums`, also each column's count of positive elements
// less its count of negative ones (what db is, in units of dy's one magnitude, when dy
// has one: the same pass, not a second read of dy). With `signs`, also every element's
// sign as a byte, column by column (SignMatrix): a run of four rows is one word, the
// block's words meet in shared memory, and each column's 256 bytes go out as 16-byte
// stores.
constexpr int kMaxRowsPerBlock = 256;
static_assert(kMaxRowsPerBlock == kSignRowsMultiple, "a block writes its whole rows of signs");
template <bool kSigns>
__global__ void column_maxima_kernel(ConstRows m, int64_t rows_per_block, unsigned int* largest,
                                     unsigned int* magnitudes, int64_t* sign_sums,
                                     SignMatrix sign_matrix) {
  constexpr int kRun = 4, kRuns = kMaxRowsPerBlock / (kRun * kWarps);  // 8 runs a warp
  constexpr int kColumnWords = kMaxRowsPerBlock / 4 + 1;  // + 1: lanes' words in distinct banks
  __shared__ unsigned int sign_words[kSigns ? 32 : 1][kColumnWords];
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int64_t column = int64_t{blockIdx.x} * 32 + lane;
  const int64_t row_begin = int64_t{blockIdx.y} * rows_per_block;  // kMaxRowsPerBlock with signs
  const int64_t row_end = min(m.rows, row_begin + rows_per_block);
  const bool inside = column < m.cols;
  float value = 0.0f;
  unsigned int most = 0, least_complement = 0;
  int signs = 0;
  const auto element_at = [&](int64_t row) {
    return inside && row < row_end ? m.data[row * m.row_stride + column] : 0.0f;
  };
  const auto take = [&](float element) {  // returns the element's sign
    value = fmaxf(value, fabsf(element));
    const unsigned int bits = __float_as_uint(element) & 0x7fffffffu;
    most = max(most, bits);
    if (bits != 0) least_complement = max(least_complement, ~bits);
    const int sign = sign_of(element);
    signs += sign;
    return sign;
  };
  if (kSigns) {  // a warp's rows in runs of four, whose signs make one word
#pragma unroll 2  // eight loads in flight side by side: the pass is bound by their latency
    for (int g = 0; g < kRuns; ++g) {
      const int64_t run = row_begin + 32 * g + kRun * warp;
      float elements[kRun];
#pragma unroll
      for (int r = 0; r < kRun; ++r) elements[r] = element_at(run + r);
      unsigned int word = 0;
#pragma unroll
      for (int r = 0; r < kRun; ++r) {
        const int8_t sign = static_cast<int8_t>(take(elements[r]));
        word |= static_cast<unsigned int>(static_cast<uint8_t>(sign)) << (8 * r);
      }
      sign_words[lane][8 * g + warp] = word;  // rows 4 (8 g + warp) ..
    }
  } else if (inside) {  // one row a load
#pragma unroll 8
    for (int64_t row = row_begin + warp; row < row_end; row += kWarps) {
      take(m.data[row * m.row_stride + column]);
    }
  }
  if (inside) atomicMax(largest + column, __float_as_uint(value));
  if (kSigns) {
    __syncthreads();
    constexpr int kParts = kMaxRowsPerBlock / 16;  // 16-byte stores a column
    for (int index = static_cast<int>(threadIdx.x); index < 32 * kParts; index += kThreads) {
      const int c = index / kParts, part = index % kParts;
      const unsigned int* source = &sign_words[c][4 * part];
      *reinterpret_cast<uint4*>(sign_matrix.data + (int64_t{blockIdx.x} * 32 + c) * sign_matrix.ld +
                                row_begin + 16 * part) =
          make_uint4(source[0], source[1], source[2], source[3]);
    }
  }
  if (sign_sums != nullptr) {  // the block's 8 warps of each column, then one atomic
    __shared__ int block_signs[kThreads / 32][32];
    block_signs[threadIdx.x / 32][threadIdx.x % 32] = signs;
    __syncthreads();
    if (threadIdx.x < 32 && column < m.cols) {
      int64_t total = 0;
      for (int w = 0; w < kThreads / 32; ++w) total += block_signs[w][threadIdx.x];
      if (total != 0) {
        atomicAdd(reinterpret_cast<unsigned long long*>(sign_sums + column),
                  static_cast<unsigned long long>(total));  // two's complement
      }
    }
  }
  if (magnitudes != nullptr) {
    // The warps meet in the block, and the block updates the two words only when it
    // holds more than they already do: a million warps' atomics on the same two words
    // had cost more than the whole pass. A stale read costs an atomic, never a maximum.
    __shared__ unsigned int block_words[2][kThreads / 32];
    most = __reduce_max_sync(0xffffffffu, most);
    least_complement = __reduce_max_sync(0xffffffffu, least_complement);
    if (threadIdx.x % 32 == 0) {
      block_words[0][threadIdx.x / 32] = most;
      block_words[1][threadIdx.x / 32] = least_complement;
    }
    __syncthreads();
    if (threadIdx.x < 2) {
      unsigned int word = 0;
      for (int w = 0; w < kThreads / 32; ++w) word = max(word, block_words[threadIdx.x][w]);
      if (word > __ldcg(magnitudes + threadIdx.x)) atomicMax(magnitudes + threadIdx.x, word);
    }
  }
}

}  // namespace

void column_maxima_cuda(const ConstRows& m, unsigned int* largest, unsigned int* magnitudes,
                        cuda::Stream stream, int64_t* sign_sums, SignMatrix signs) {
  if (m.rows == 0 || m.cols == 0) return;
  const int64_t sign_rows = cuda::round_up(m.rows, kSignRowsMultiple);
  SEQPAR_CHECK(signs.data == nullptr ||
                   (signs.ld >= sign_rows && signs.ld % 16 == 0 && cuda::aligned16(signs.data)),
               "column_maxima_cuda: a sign matrix for ", m.rows, " rows needs a 16-byte-aligned start and ",
               "an ld of at least ", sign_rows, " (a multiple of 16), got ", signs.ld);
  const int64_t column_blocks = cuda::ceil_div(m.cols, 32);
  // Without signs, an m of few columns (dy of a Linear with 16 outputs: one column block) takes
  // fewer rows a block, so that its blocks cover the SMs about twice: 256-row blocks
  // would leave most SMs idle for a few thousand rows. Any split gives the same maxima
  // and sums.
  int64_t rows_per_block = kMaxRowsPerBlock;
  if (signs.data == nullptr) {
    int device = 0;  // the callers' (they set it)
    CUDA_CHECK(cudaGetDevice(&device));
    const int64_t target_blocks = 2 * int64_t{cuda::multiprocessor_count(device)};
    const int64_t row_blocks = std::max<int64_t>(target_blocks / column_blocks, 1);
    rows_per_block = std::clamp<int64_t>(cuda::round_up(cuda::ceil_div(m.rows, row_blocks), kWarps),
                                         kWarps, kMaxRowsPerBlock);
  }
  const dim3 grid(static_cast<unsigned>(column_blocks),
                  static_cast<unsigned>(cuda::ceil_div(m.rows, rows_per_block)));
  if (signs.data != nullptr) {
    column_maxima_kernel<true><<<grid, kThreads, 0, stream>>>(m, rows_per_block, largest, magnitudes,
                                                              sign_sums, signs);
  } else {
    column_maxima_kernel<false><<<grid, kThreads, 0, stream>>>(m, rows_per_block, largest,
                                                               magnitudes, sign_sums, signs);
  }
  CUDA_LAUNCH_CHECK();
}

}  // namespace seqpar::nn::detail
