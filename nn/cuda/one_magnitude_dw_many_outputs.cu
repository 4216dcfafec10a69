// dW = dyᵀ x when every dy has one magnitude (dy = s * f, s in {-1, 0, +1}: an L1 loss's
// backward) and dy has many outputs, on the integer tensor cores through one int8 GEMM per chunk
// of rows.
//
// The few-outputs kernel (one_magnitude_dw_few_outputs.cuh) writes x in fixed point in registers for
// each group of 16 outputs: at 1024 outputs, 64 times over. Here each element of x is
// converted once, into the six signed bytes of its balanced base-256 digits, stored as
// six "byte planes" [6][in][rows]; dy's signs are an int8 matrix [out][rows], written
// by the pass over dy that finds its maxima (column_maxima_cuda's SignMatrix); and
//
//   C[j, l in' + k] = Σ_rows s[row, j] d_l[row, k]    (cuBLASLt, int32: exact)
//   Σ_rows s v      = Σ_l 256^l C[j, l in' + k]       (the fold, in 128 bits: exact)
//
// f times that goes into dW's digits. Integer products and sums are exact in any order,
// so these are the exact row sums of the general path, the same bits once rounded.
// Elements outside their column's window (about one in 300,000 from randn) take the
// binned sums one by one, with the general path's rules, as in the few-outputs kernel; but
// not inside the conversion, where one element's 1024 products held up its whole block.
// The conversion lists them (an integer counter hands out the slots) and counts them as
// 0; a kernel of their own then spreads each one's products over a warp. The list's
// order changes from run to run, the digits' integer sums do not.
//
// Balanced digits: an element v of its column's window is an integer with |v| < 2^44.
// w = v + K, K = 0x808080808080 (128 in every byte), lies in [0, 2^48), and byte l of w
// minus 128 is a digit d_l in [-128, 127] with Σ_l 256^l d_l = w - K = v. In double,
// adding 2^52 + K to y = x 2^-lsb rounds y to an integer (the sum lies in [2^52, 2^53),
// where the spacing is 1) and leaves w in the significand's low 48 bits: exactly when y
// was an integer, which subtracting back checks. Those bytes xor 0x80 are the digits as
// int8.
//
// Whether dy has one magnitude is known only on the device, as for the few-outputs kernel:
// the kernels here read the words and do nothing when it does not; the GEMM's products
// are then never read.
#include <algorithm>

#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "core/device_buffer.h"
#include "core/exact_bins.cuh"
#include "core/exact_fixed_point.h"
#include "nn/cuda/int8_gemm.h"
#include "nn/cuda/linear.h"
#include "nn/cuda/one_magnitude_dw.cuh"

namespace seqpar::nn::detail {

namespace {

constexpr int kPlanes = 6;          // balanced base-256 digits of |v| < 2^44 (and K < 2^48)
constexpr int kTileColumns = 32;    // a tile: 32 columns (one a lane) of 128 rows
constexpr int kTileRows = 128;
constexpr int kThreads = 256;
// The byte planes' tiles: 32 columns of 64 rows, 4 warps of 16 rows (four words of
// four) each. Smaller tiles than 128 rows keep more blocks in flight through a
// block's load, convert, barrier and store, which is what limits the pass.
constexpr int kPlaneTileRows = 64;
constexpr int kPlaneThreads = 2 * kPlaneTileRows;
static_assert(kTileRows % kPlaneTileRows == 0, "a chunk's rows are whole plane tiles");
// Scratch for a chunk's planes: about this many bytes.
constexpr int64_t kScratchBytes = int64_t{512} << 20;
// Rows between folds: |C| <= rows * 128 (|s| <= 1, |d_l| <= 128) stays below 2^31, and
// |Σ s v| < rows 2^44 times f's significand (< 2^24) below add_scaled_integer's 2^93.
constexpr int64_t kRowsPerFold = int64_t{1} << 23;
static_assert(kRowsPerFold * 128 < (int64_t{1} << 31), "a fold's int32 sums stay in range");
static_assert(kWindowBits + 24 + 23 < 93, "a fold's total times f's significand fits add_scaled_integer");
// A chunk's tiles fit a grid's y dimension.
constexpr int64_t kMaxRowsPerChunk = int64_t{65535} * kPlaneTileRows;
constexpr double kDigitsMagic = 0x1p52 + 0x808080808080p0;  // 2^52 + K
constexpr uint64_t kDigitsBias = 0x808080808080ull;         // K: byte l xor 0x80 is d_l
// Elements outside their windows listed per chunk; beyond this many (a column holding
// an infinity, say) the chunk is scanned for them instead.
constexpr int64_t kOutsideCapacity = 65536;

// An element outside its column's window: x[row, column] = value.
struct OutsideElement {
  int64_t row, column;
  float value;
};

// Whether value 2^-lsb (scale = 2^-lsb) is an integer of the window, |v| < 2^44, and
// d = v + 2^52 + K in double (its low 48 bits are v + K).
__device__ inline bool in_window(float value, double scale, double& d) {
  const double y = __dmul_rn(static_cast<double>(value), scale);
  d = __dadd_rn(y, kDigitsMagic);
  return fabs(y) < kWindowLimit && __dsub_rn(d, kDigitsMagic) == y;
}

// Column `column`'s 2^-lsb and whether it has no window (both 0 / false past the edge).
struct ColumnScale {
  double scale = 0.0;
  bool whole = false;
};
__device__ inline ColumnScale column_scale(const unsigned int* x_largest, int64_t column, int64_t in,
                                           int f_exponent) {
  if (column >= in) return {};
  const Window window = column_window(x_largest[column], f_exponent);
  return {ldexp(1.0, -window.lsb), window.whole};
}

// x's balanced digits in its column's window, bytes 0..5 (zeros past the edges); an
// element outside the window goes on the chunk's list and counts as 0.
struct DigitBytes {
  const unsigned int* x_largest;
  const unsigned int* words;
  int64_t in;
  unsigned long long* outside_count;
  OutsideElement* outside;
  int64_t outside_capacity;
  ColumnScale column;
  __device__ bool prepare(int64_t index) {
    const OneMagnitude magnitude = one_magnitude(words);
    if (!magnitude.holds) return false;
    column = column_scale(x_largest, index, in, magnitude.exponent);
    return true;
  }
  __device__ uint64_t operator()(float value, int64_t row, int64_t index, bool valid) const {
    double d;
    const bool inside = in_window(value, column.scale, d);
    if (valid && (column.whole || !inside)) {
      const unsigned long long slot = atomicAdd(outside_count, 1ull);
      if (slot < static_cast<unsigned long long>(outside_capacity)) outside[slot] = {row, index, value};
      return 0;
    }
    return static_cast<uint64_t>(__double_as_longlong(d)) ^ kDigitsBias;  // 0 past the edges
  }
};

// A 64-row x 32-column tile of m as kPlanes byte planes, each column's rows contiguous:
// planes[p * plane_stride + column * ld + row] = byte p of convert(m[row_begin + row,
// column]), for the chunk's rows [0, rows) (zeros from there to the tile's end) and
// columns [0, written_columns) (m's columns, then zeros). Reads a row's 32 columns per
// warp load; packs each plane's bytes of four rows into a word with byte permutes;
// transposes through shared memory (rows of 17 words: no bank conflicts); writes 16
// bytes a thread.
__global__ void __launch_bounds__(kPlaneThreads) byte_planes_kernel(ConstRows m, int64_t row_begin, int64_t rows,
                                                                    int64_t written_columns, int64_t ld,
                                                                    int8_t* planes, int64_t plane_stride,
                                                                    DigitBytes convert) {
  static_assert(kPlanes == 6, "the byte permutes below pack six planes");
  constexpr int kWords = kPlaneTileRows / 4;  // a column's words in the tile
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int64_t column = int64_t{blockIdx.x} * kTileColumns + lane;
  const int64_t tile_row = int64_t{blockIdx.y} * kPlaneTileRows;
  if (!convert.prepare(column)) return;  // the same for every thread of the grid
  __shared__ unsigned int words[kPlanes][kTileColumns][kWords + 1];
  // This warp's 16 rows, all loaded before any is converted (a conversion may write the
  // outside list, and the compiler keeps a load after a store it cannot tell apart).
  constexpr int kWarpRows = 16;
  const int64_t warp_row = tile_row + kWarpRows * warp;
  float values[kWarpRows];
#pragma unroll
  for (int e = 0; e < kWarpRows; ++e) {
    const bool valid = warp_row + e < rows && column < m.cols;
    values[e] = valid ? m.data[(row_begin + warp_row + e) * m.row_stride + column] : 0.0f;
  }
#pragma unroll
  for (int g = 0; g < kWarpRows / 4; ++g) {  // word 4 warp + g: rows 4 g .. 4 g + 3 of the warp's
    unsigned int low[4], high[4];  // bytes 0..3 and 4..5 of the four rows' digits
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t row = warp_row + 4 * g + i;
      const uint64_t bytes = convert(values[4 * g + i], row_begin + row, column, row < rows && column < m.cols);
      low[i] = static_cast<unsigned int>(bytes);
      high[i] = static_cast<unsigned int>(bytes >> 32);
    }
    // A 4 x 4 transpose of bytes: plane p's word holds byte p of rows 0..3, in order.
    // __byte_perm(a, b, s): byte n of the result is byte (s >> 4 n) & 7 of b:a.
    const unsigned int bytes01_a = __byte_perm(low[0], low[1], 0x5140);  // bytes 0, 1 of rows 0, 1
    const unsigned int bytes01_b = __byte_perm(low[2], low[3], 0x5140);  // ... of rows 2, 3
    const unsigned int bytes23_a = __byte_perm(low[0], low[1], 0x7362);  // bytes 2, 3
    const unsigned int bytes23_b = __byte_perm(low[2], low[3], 0x7362);
    const unsigned int bytes45_a = __byte_perm(high[0], high[1], 0x5140);  // bytes 4, 5
    const unsigned int bytes45_b = __byte_perm(high[2], high[3], 0x5140);
    const unsigned int packed[kPlanes] = {
        __byte_perm(bytes01_a, bytes01_b, 0x5410), __byte_perm(bytes01_a, bytes01_b, 0x7632),
        __byte_perm(bytes23_a, bytes23_b, 0x5410), __byte_perm(bytes23_a, bytes23_b, 0x7632),
        __byte_perm(bytes45_a, bytes45_b, 0x5410), __byte_perm(bytes45_a, bytes45_b, 0x7632)};
#pragma unroll
    for (int p = 0; p < kPlanes; ++p) words[p][lane][4 * warp + g] = packed[p];
  }
  __syncthreads();
  constexpr int kParts = kPlaneTileRows / 16;  // 16-byte stores a column
  for (int index = static_cast<int>(threadIdx.x); index < kPlanes * kTileColumns * kParts;
       index += kPlaneThreads) {
    const int line = index / kParts, part = index % kParts;
    const int p = line / kTileColumns, c = line % kTileColumns;
    const int64_t out_column = int64_t{blockIdx.x} * kTileColumns + c;
    if (out_column >= written_columns) continue;
    const unsigned int* source = &words[p][c][4 * part];
    *reinterpret_cast<uint4*>(planes + p * plane_stride + out_column * ld + tile_row + 16 * part) =
        make_uint4(source[0], source[1], source[2], source[3]);
  }
}

// The chunk's elements outside their windows, each one's products with its row's dy,
// into the digits (add_outside_product: integer atomics). From the list, a warp an
// element and its lanes over the outputs; when the list overflowed, by scanning the
// chunk, a thread an element (the same test as the conversion's).
__global__ void __launch_bounds__(kThreads) outside_kernel(ConstRows dy, ConstRows x, int64_t row_begin,
                                                           int64_t rows, const unsigned int* x_largest,
                                                           const unsigned int* words,
                                                           const unsigned long long* outside_count,
                                                           const OutsideElement* outside,
                                                           int64_t outside_capacity, int64_t* digits,
                                                           int64_t count) {
  const OneMagnitude magnitude = one_magnitude(words);
  const unsigned long long found = *outside_count;
  if (!magnitude.holds || found == 0) return;
  const int64_t in = x.cols, out = dy.cols;
  const int64_t thread = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int64_t threads = int64_t{gridDim.x} * blockDim.x;
  if (found <= static_cast<unsigned long long>(outside_capacity)) {
    const int lane = static_cast<int>(threadIdx.x % 32);
    for (int64_t e = thread / 32; e < static_cast<int64_t>(found); e += threads / 32) {
      const OutsideElement element = outside[e];
      for (int64_t j = lane; j < out; j += 32) {
        add_outside_product(dy, element.value, element.row, element.column, j, in, digits, count);
      }
    }
    return;
  }
  for (int64_t index = thread; index < rows * in; index += threads) {
    const int64_t row = row_begin + index / in, k = index % in;
    const float value = x.data[row * x.row_stride + k];
    const ColumnScale column = column_scale(x_largest, k, in, magnitude.exponent);
    double d;
    if (column.whole || !in_window(value, column.scale, d)) {
      add_outside_window(dy, value, row, k, 0, out, in, digits, count);
    }
  }
}

// Each dW[j, k] of a window: Σ s v = Σ_l 256^l C[j, l in' + k] (Horner, in 128 bits),
// times f's significand, into the digits at the window's unit times f's. One thread an
// output, after every kernel that touched these digits: plain integer adds.
__global__ void fold_kernel(const int32_t* products, int64_t out_padded, int64_t in_padded,
                            int64_t out, int64_t in, const unsigned int* x_largest,
                            const unsigned int* words, int64_t* digits, int64_t count) {
  const OneMagnitude magnitude = one_magnitude(words);
  if (!magnitude.holds) return;
  const int64_t total_outputs = out * in;
  for (int64_t index = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; index < total_outputs;
       index += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = index % out, k = index / out;  // j fastest: C's columns are read whole
    const Window window = column_window(x_largest[k], magnitude.exponent);
    if (window.whole) continue;
    exact::Int128 total = 0;
#pragma unroll
    for (int p = kPlanes - 1; p >= 0; --p) {
      total = total * 256 + products[(p * in_padded + k) * out_padded + j];
    }
    exact::add_scaled_integer(digits + j * in + k, count, total * magnitude.significand,
                              window.lsb + magnitude.exponent);
  }
}

}  // namespace

void launch_one_magnitude_dw_many_outputs(const ConstRows& grad_y, const ConstRows& x,
                                     const unsigned int* x_largest, const unsigned int* words,
                                     SignMatrix signs, int64_t* digits, int64_t stride,
                                     cuda::Stream stream, const ManyOutputsChunks& chunks) {
  SEQPAR_CHECK(signs.data != nullptr && signs.ld >= cuda::round_up(x.rows, kTileRows) && signs.ld % 16 == 0,
               "launch_one_magnitude_dw_many_outputs: dy's signs for ", x.rows, " rows, got ld ", signs.ld);
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  const int64_t rows = x.rows, in = x.cols, out = grad_y.cols;
  const int64_t out_padded = cuda::round_up(out, kTileColumns), in_padded = cuda::round_up(in, kTileColumns);
  const int64_t bytes_per_row = kPlanes * in_padded;
  int64_t rows_per_chunk = chunks.rows_per_chunk > 0 ? cuda::round_up(chunks.rows_per_chunk, kTileRows)
                                                     : kScratchBytes / bytes_per_row / kTileRows * kTileRows;
  rows_per_chunk = std::clamp<int64_t>(rows_per_chunk, kTileRows,
                                       std::min({cuda::round_up(rows, kTileRows), kMaxRowsPerChunk, kRowsPerFold}));
  const int64_t rows_per_fold =
      std::min(chunks.rows_per_fold > 0 ? chunks.rows_per_fold : kRowsPerFold, kRowsPerFold);
  const int64_t chunks_per_fold = std::max<int64_t>(1, rows_per_fold / rows_per_chunk);

  const Device gpu = Device::cuda(device);
  DeviceBuffer<int8_t> planes(kPlanes * in_padded * rows_per_chunk, gpu);
  DeviceBuffer<int32_t> products(out_padded * kPlanes * in_padded, gpu);
  const int64_t outside_capacity = chunks.outside_capacity > 0 ? chunks.outside_capacity : kOutsideCapacity;
  DeviceBuffer<unsigned long long> outside_count(1, gpu);
  DeviceBuffer<OutsideElement> outside(outside_capacity, gpu);
  const DigitBytes digit_bytes{x_largest, words, in, outside_count.data(), outside.data(), outside_capacity};
  const int spread_blocks = 8 * cuda::multiprocessor_count(device);
  const int fold_blocks =
      static_cast<int>(std::min<int64_t>(cuda::ceil_div(out * in, int64_t{kThreads}), spread_blocks));

  int64_t chunk = 0;
  for (int64_t begin = 0; begin < rows; begin += rows_per_chunk, ++chunk) {
    const int64_t chunk_rows = std::min(rows_per_chunk, rows - begin);
    const int64_t ld = cuda::round_up(chunk_rows, kTileRows);
    const unsigned tiles = static_cast<unsigned>(ld / kPlaneTileRows);
    outside_count.zero();
    byte_planes_kernel<<<dim3(static_cast<unsigned>(in_padded / kTileColumns), tiles), kPlaneThreads, 0,
                          stream>>>(x, begin, chunk_rows, in_padded, ld, planes.data(), in_padded * ld,
                                    digit_bytes);
    CUDA_LAUNCH_CHECK();
    outside_kernel<<<spread_blocks, kThreads, 0, stream>>>(grad_y, x, begin, chunk_rows, x_largest, words,
                                                         outside_count.data(), outside.data(),
                                                         outside_capacity, digits, stride);
    CUDA_LAUNCH_CHECK();
    // The chunk's rows of dy's signs: past its last row (to ld) they are zeros.
    int8_product({out_padded, kPlanes * in_padded, ld, signs.data + begin, planes.data(), products.data(),
                  chunk % chunks_per_fold != 0, signs.ld},
                 device, stream);
    if ((chunk + 1) % chunks_per_fold == 0 || begin + chunk_rows >= rows) {
      fold_kernel<<<fold_blocks, kThreads, 0, stream>>>(products.data(), out_padded, in_padded, out, in,
                                                         x_largest, words, digits, stride);
      CUDA_LAUNCH_CHECK();
    }
  }
}

}  // namespace seqpar::nn::detail
