// Exact dW = dyᵀ x for any dy on the int8 tensor cores (the scheme of nn/cuda/exact_dw_crt.h):
//
//   column maxima of dy and x (column_maxima_cuda)      -> each column's window
//   for each chunk of at most crt::kRowsPerProduct rows:
//     residue planes of dy and x, one int8 plane per modulus, each column's rows
//     contiguous (the K-major layout int8_product reads); elements outside their
//     windows are residue 0 and go on a list
//     one batched int8 GEMM: C_i = DY_iᵀ X_i for every modulus i (int32, exact)
//     C reduced modulo m_i into the running residues (when there are several chunks)
//     the outside elements' products, term by term through the bins
//   Garner's CRT per output: S, added at 2^(u_j + u_k) into the digits
//   the pairs whose products could reach 2^129: the binned sum over every row
//
// Integer sums are exact in any order and the outside terms meet through integer
// atomics, so the digits, and the bits, never depend on cuBLASLt's algorithm, the grid
// or the order of the lists.
#include <algorithm>
#include <utility>

#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "core/cuda_util.cuh"
#include "core/device_buffer.h"
#include "core/exact_bins.cuh"
#include "nn/cuda/exact_dw_crt.h"
#include "nn/cuda/int8_gemm.h"
#include "nn/cuda/linear.h"

namespace seqpar::nn::detail {

namespace {

constexpr int kThreads = 256;
// A residue tile: 32 columns (a lane each) of 64 rows (eight warps of two words of four
// rows). A chunk's planes have a multiple of 64 rows, its columns a multiple of 32.
constexpr int kTileColumns = 32;
constexpr int kTileRows = 64;
constexpr int kTileWords = kTileRows / 4;
constexpr int64_t kOutsideCapacity = 65536;

// An element outside its column's window: m[row, column] = value (row counted from the
// first row of the whole matrix).
struct OutsideElement {
  int64_t row, column;
  float value;
};

struct OutsideList {
  unsigned long long* count;
  OutsideElement* elements;
  int64_t capacity;
  __device__ void add(int64_t row, int64_t column, float value) const {
    const unsigned long long slot = atomicAdd(count, 1ull);
    if (slot < static_cast<unsigned long long>(capacity)) elements[slot] = {row, column, value};
  }
};

// dy's windows, then x's, their units raised against the least of dy's (one block).
__global__ void windows_kernel(const unsigned int* dy_largest, int64_t out, const unsigned int* x_largest,
                               int64_t in, int window_bits, crt::ColumnWindow* dy_windows,
                               crt::ColumnWindow* x_windows) {
  __shared__ int lowest_dy_unit;
  if (threadIdx.x == 0) lowest_dy_unit = crt::kNoUnit;
  __syncthreads();
  for (int64_t j = threadIdx.x; j < out; j += blockDim.x) {
    const crt::ColumnWindow w = crt::column_window(dy_largest[j], window_bits);
    dy_windows[j] = w;
    if (w.kind == crt::kWindowColumn) atomicMin(&lowest_dy_unit, w.unit);
  }
  __syncthreads();
  for (int64_t k = threadIdx.x; k < in; k += blockDim.x) {
    x_windows[k] = crt::raise_unit(crt::column_window(x_largest[k], window_bits), lowest_dy_unit);
  }
}

// The residues modulo m_kIndex of a thread's eight elements, four rows of each of its
// two words, as two words of bytes (element e in byte e % 4), into the tile's words.
template <int kIndex>
__device__ __forceinline__ void store_residues(const crt::WindowDigits (&digits)[8], int lane, int warp,
                                               unsigned int (&words)[crt::kMaxModuli][kTileColumns][kTileWords + 1]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    unsigned int r[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) r[e] = static_cast<unsigned int>(crt::window_residue<kIndex>(digits[4 * half + e]));
    // bytes 0 of r0, r1, r2, r3 in order: the low byte of each is its int8 two's complement
    words[kIndex][lane][warp + 8 * half] =
        __byte_perm(__byte_perm(r[0], r[1], 0x0040), __byte_perm(r[2], r[3], 0x0040), 0x5410);
  }
}

// Every modulus below `count`: a uniform branch a modulus (count is the launch's), not
// one an element.
template <int... kIndex>
__device__ __forceinline__ void store_all_residues(const crt::WindowDigits (&digits)[8], int count, int lane,
                                                   int warp,
                                                   unsigned int (&words)[crt::kMaxModuli][kTileColumns][kTileWords + 1],
                                                   std::integer_sequence<int, kIndex...>) {
  ((kIndex < count ? store_residues<kIndex>(digits, lane, warp, words) : void()), ...);
}

// One operand's planes for a chunk: planes[i * cols_padded * ld + column * ld + row] =
// the residue modulo m_i of m[row_begin + row, column] (0 outside its window, past the
// chunk's rows and past m's columns). Lanes read adjacent columns of a row; each
// thread takes eight rows of its column (two words of four), splits each element's
// window integer once (crt::window_digits) and packs its residues a modulus at a time;
// the tile goes out through shared memory (rows of 17 words: no bank conflicts) as
// 16-byte stores.
__global__ void __launch_bounds__(kThreads) residue_planes_kernel(ConstRows m, const crt::ColumnWindow* windows,
                                                                  int window_bits, crt::Table table,
                                                                  int64_t row_begin, int64_t rows, int64_t ld,
                                                                  int64_t cols_padded, int8_t* planes,
                                                                  OutsideList outside) {
  __shared__ unsigned int words[crt::kMaxModuli][kTileColumns][kTileWords + 1];
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int64_t column = int64_t{blockIdx.x} * kTileColumns + lane;
  const int64_t tile_row = int64_t{blockIdx.y} * kTileRows;
  const bool column_valid = column < m.cols;
  const crt::WindowScale scale =
      column_valid ? crt::window_scale(windows[column], window_bits) : crt::WindowScale{0.0, 0.0};
  // Element 4 h + e: row 4 (warp + 8 h) + e of the tile.
  const auto row_of = [&](int element) { return tile_row + 4 * (warp + 8 * (element / 4)) + element % 4; };
  float values[8];
#pragma unroll
  for (int element = 0; element < 8; ++element) {
    const int64_t row = row_of(element);
    values[element] = column_valid && row < rows ? m.data[(row_begin + row) * m.row_stride + column] : 0.0f;
  }
  crt::WindowDigits digits[8];
#pragma unroll
  for (int element = 0; element < 8; ++element) {
    double integer = 0.0;  // 0 past the edges: residue 0
    const bool valid = column_valid && row_of(element) < rows;
    if (valid && !crt::inside_window(values[element], scale, integer)) {
      outside.add(row_begin + row_of(element), column, values[element]);
      integer = 0.0;
    }
    digits[element] = crt::window_digits(static_cast<int64_t>(integer));
  }
  store_all_residues(digits, table.count, lane, warp, words, std::make_integer_sequence<int, crt::kMaxModuli>{});
  __syncthreads();
  constexpr int kParts = kTileRows / 16;  // 16-byte stores a column
  const int64_t plane_stride = cols_padded * ld;
  for (int index = static_cast<int>(threadIdx.x); index < table.count * kTileColumns * kParts;
       index += kThreads) {
    const int i = index / (kTileColumns * kParts), c = index / kParts % kTileColumns, part = index % kParts;
    const unsigned int* source = &words[i][c][4 * part];
    *reinterpret_cast<uint4*>(planes + i * plane_stride + (int64_t{blockIdx.x} * kTileColumns + c) * ld +
                              tile_row + 16 * part) = make_uint4(source[0], source[1], source[2], source[3]);
  }
}

// running[i][n] = (running[i][n] (unless first) + products[i][n]) mod m_i, in [0, m_i).
__global__ void fold_kernel(const int32_t* products, int32_t* running, int64_t per_modulus, crt::Table table,
                            bool first) {
  const int64_t total = per_modulus * table.count;
  for (int64_t n = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; n < total; n += int64_t{gridDim.x} * blockDim.x) {
    const int m = table.moduli[n / per_modulus];
    running[n] = crt::reduced(int64_t{first ? 0 : running[n]} + products[n], m);
  }
}

__device__ inline void add_term_atomically(double term, int64_t* digits, int64_t stride) {
  int64_t local[exact::kDigits];
  crt::term_digits(term, local);
  exact::add_digits_atomically(local, digits, stride);
}

// What the outside kernels share: the factors, their windows, the digits.
struct Terms {
  ConstRows dy, x;
  const crt::ColumnWindow *dy_windows, *x_windows;
  int window_bits;
  int64_t* digits;
  int64_t stride;
  // x[row, k] outside its window: its products with dy[row, j] for j = first, first + step, ...
  __device__ void x_outside(int64_t row, int64_t k, float value, int64_t first, int64_t step) const {
    for (int64_t j = first; j < dy.cols; j += step) {
      if (crt::pair_binned_whole(dy_windows[j], x_windows[k])) continue;
      add_term_atomically(static_cast<double>(dy(row, j)) * value, digits + j * x.cols + k, stride);
    }
  }
  // dy[row, j] outside: its products with the x[row, k] inside their windows.
  __device__ void dy_outside(int64_t row, int64_t j, float value, int64_t first, int64_t step) const {
    for (int64_t k = first; k < x.cols; k += step) {
      double integer;
      const float factor = x(row, k);
      if (crt::pair_binned_whole(dy_windows[j], x_windows[k]) ||
          !crt::inside_window(factor, crt::window_scale(x_windows[k], window_bits), integer)) {
        continue;
      }
      add_term_atomically(static_cast<double>(factor) * value, digits + j * x.cols + k, stride);
    }
  }
};

// The chunk's elements of one operand (x when kX, else dy) outside their windows: from
// the list, a warp an element and its lanes over the other factor's columns; when the
// list overflowed, by scanning the chunk, a thread an element.
template <bool kX>
__global__ void __launch_bounds__(kThreads) outside_kernel(Terms terms, int64_t row_begin, int64_t rows,
                                                           OutsideList outside) {
  const unsigned long long found = *outside.count;
  if (found == 0) return;
  const int64_t thread = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int64_t threads = int64_t{gridDim.x} * blockDim.x;
  const auto add = [&](const OutsideElement& e, int64_t first, int64_t step) {
    if (kX) {
      terms.x_outside(e.row, e.column, e.value, first, step);
    } else {
      terms.dy_outside(e.row, e.column, e.value, first, step);
    }
  };
  if (found <= static_cast<unsigned long long>(outside.capacity)) {
    for (int64_t n = thread / 32; n < static_cast<int64_t>(found); n += threads / 32) {
      add(outside.elements[n], thread % 32, 32);
    }
    return;
  }
  const ConstRows& m = kX ? terms.x : terms.dy;
  const crt::ColumnWindow* windows = kX ? terms.x_windows : terms.dy_windows;
  for (int64_t n = thread; n < rows * m.cols; n += threads) {
    const int64_t row = row_begin + n / m.cols, column = n % m.cols;
    const float value = m(row, column);
    double integer;
    if (!crt::inside_window(value, crt::window_scale(windows[column], terms.window_bits), integer)) {
      add({row, column, value}, 0, 1);
    }
  }
}

// Each output with an integer part: its residues (running ones, in [0, m_i), or one
// chunk's int32 products), Garner's S, and S 2^(u_j + u_k) into the digits. A thread an
// output (plain adds: nothing else touches these digits while it runs), j fastest: C's
// columns are read whole.
__global__ void crt_kernel(const int32_t* residues, int64_t out_padded, int64_t per_modulus, crt::Table table,
                           const crt::ColumnWindow* dy_windows, const crt::ColumnWindow* x_windows, int64_t out,
                           int64_t in, int64_t* digits, int64_t stride) {
  for (int64_t n = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; n < out * in; n += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = n % out, k = n / out;
    const crt::ColumnWindow dy = dy_windows[j], x = x_windows[k];
    if (!crt::pair_takes_integers(dy, x)) continue;
    int r[crt::kMaxModuli] = {};
#pragma unroll
    for (int i = 0; i < crt::kMaxModuli; ++i) {
      if (i < table.count) r[i] = crt::reduced(residues[i * per_modulus + k * out_padded + j], table.moduli[i]);
    }
    crt::add_wide_scaled_integer(digits + j * in + k, stride, crt::signed_value(table, r), dy.unit + x.unit);
  }
}

// The pairs whose products could reach 2^129 (crt::pair_binned_whole): every row's term
// through one binned sum, a thread a pair. Every other thread returns at once.
__global__ void binned_pairs_kernel(ConstRows dy, ConstRows x, const crt::ColumnWindow* dy_windows,
                                    const crt::ColumnWindow* x_windows, int64_t* digits, int64_t stride) {
  const int64_t n = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (n >= dy.cols * x.cols) return;
  const int64_t j = n / x.cols, k = n % x.cols;
  if (!crt::pair_binned_whole(dy_windows[j], x_windows[k])) return;
  exact::BinnedSum sum;
  sum.clear();
  for (int64_t row = 0; row < x.rows; ++row) {
    sum.add(static_cast<double>(dy(row, j)) * x(row, k));
    if ((row + 1) % exact::kTermsPerFlush == 0) sum.flush(digits + n, stride);
  }
  sum.flush(digits + n, stride);
}

// The scratch of one call, and the shapes it was cut for.
struct CrtScratch {
  int64_t out_padded, in_padded, max_ld, per_modulus;
  DeviceBuffer<unsigned int> largest;            // x's maxima [in] (unless given), dy's [out]
  DeviceBuffer<crt::ColumnWindow> windows;       // dy's [out], x's [in]
  DeviceBuffer<int8_t> dy_planes, x_planes;      // [moduli][columns padded][max_ld]
  DeviceBuffer<int32_t> products, running;       // [moduli][in_padded][out_padded]
  DeviceBuffer<unsigned long long> outside_counts;  // dy's, x's
  DeviceBuffer<OutsideElement> dy_outside, x_outside;
};

CrtScratch make_scratch(int64_t out, int64_t in, int64_t rows_per_product, bool several_chunks, int moduli,
                        int64_t outside_capacity, Device gpu) {
  const int64_t out_padded = cuda::round_up(out, kTileColumns), in_padded = cuda::round_up(in, kTileColumns);
  const int64_t max_ld = cuda::round_up(rows_per_product, kTileRows);
  const int64_t per_modulus = out_padded * in_padded;
  return {out_padded,
          in_padded,
          max_ld,
          per_modulus,
          DeviceBuffer<unsigned int>(in + out, gpu),
          DeviceBuffer<crt::ColumnWindow>(out + in, gpu),
          DeviceBuffer<int8_t>(moduli * out_padded * max_ld, gpu),
          DeviceBuffer<int8_t>(moduli * in_padded * max_ld, gpu),
          DeviceBuffer<int32_t>(moduli * per_modulus, gpu),
          DeviceBuffer<int32_t>(several_chunks ? moduli * per_modulus : 0, gpu),
          DeviceBuffer<unsigned long long>(2, gpu),
          DeviceBuffer<OutsideElement>(outside_capacity, gpu),
          DeviceBuffer<OutsideElement>(outside_capacity, gpu)};
}

// One chunk of rows [begin, begin + rows): planes, the batched GEMM, the fold, the
// outside terms.
void enqueue_chunk(const Terms& terms, const crt::Table& table, CrtScratch& s, int64_t begin, int64_t rows,
                   bool first, bool fold, int device, cuda::Stream stream) {
  const int64_t ld = cuda::round_up(rows, kTileRows);
  const auto tiles = static_cast<unsigned>(ld / kTileRows);
  const int64_t capacity = s.dy_outside.size();
  const OutsideList dy_list{s.outside_counts.data(), s.dy_outside.data(), capacity};
  const OutsideList x_list{s.outside_counts.data() + 1, s.x_outside.data(), capacity};
  s.outside_counts.zero();
  residue_planes_kernel<<<dim3(static_cast<unsigned>(s.out_padded / kTileColumns), tiles), kThreads, 0, stream>>>(
      terms.dy, terms.dy_windows, terms.window_bits, table, begin, rows, ld, s.out_padded, s.dy_planes.data(),
      dy_list);
  CUDA_LAUNCH_CHECK();
  residue_planes_kernel<<<dim3(static_cast<unsigned>(s.in_padded / kTileColumns), tiles), kThreads, 0, stream>>>(
      terms.x, terms.x_windows, terms.window_bits, table, begin, rows, ld, s.in_padded, s.x_planes.data(), x_list);
  CUDA_LAUNCH_CHECK();
  Int8Product product{s.out_padded, s.in_padded, ld, s.dy_planes.data(), s.x_planes.data(), s.products.data(),
                      false};
  product.batch = table.count;
  product.a_batch_stride = s.out_padded * ld;
  product.b_batch_stride = s.in_padded * ld;
  product.c_batch_stride = s.per_modulus;
  int8_product(product, device, stream);
  const int spread_blocks = 8 * cuda::multiprocessor_count(device);
  if (fold) {
    fold_kernel<<<cuda::blocks_for(s.per_modulus * table.count, kThreads, spread_blocks), kThreads, 0, stream>>>(
        s.products.data(), s.running.data(), s.per_modulus, table, first);
    CUDA_LAUNCH_CHECK();
  }
  outside_kernel<true><<<spread_blocks, kThreads, 0, stream>>>(terms, begin, rows, x_list);
  CUDA_LAUNCH_CHECK();
  outside_kernel<false><<<spread_blocks, kThreads, 0, stream>>>(terms, begin, rows, dy_list);
  CUDA_LAUNCH_CHECK();
}

}  // namespace

void accumulate_weight_grad_crt_cuda(const ConstRows& grad_y, const ConstRows& x, exact::ExactSums& sums,
                                     const unsigned int* x_largest, const CrtChunks& chunks,
                                     const unsigned int* dy_largest) {
  const int64_t rows = x.rows, in = x.cols, out = grad_y.cols;
  SEQPAR_CHECK(grad_y.rows == rows && sums.count() >= out * in, "accumulate_weight_grad_crt_cuda: dy ",
               grad_y.rows, " x ", out, ", x ", rows, " x ", in, ", ", sums.count(), " sums");
  SEQPAR_CHECK(sums.device().is_cuda(), "accumulate_weight_grad_crt_cuda: the sums must be on a GPU");
  exact::check_term_count("linear_backward", rows);
  if (rows == 0 || in == 0 || out == 0) return;
  const int device = sums.device().index;
  cuda::set_device(device);
  const cuda::Stream stream = cuda::current_stream(device);
  const crt::Plan plan = crt::plan_for_rows(rows);
  const crt::Table table = crt::crt_table(plan.moduli);
  const int64_t rows_per_product = std::min(chunks.rows_per_product > 0 ? chunks.rows_per_product : crt::kRowsPerProduct,
                                            std::min(crt::kRowsPerProduct, rows));
  const bool several_chunks = rows > rows_per_product;
  CrtScratch s = make_scratch(out, in, rows_per_product, several_chunks, table.count,
                              chunks.outside_capacity > 0 ? chunks.outside_capacity : kOutsideCapacity, sums.device());
  if (x_largest == nullptr || dy_largest == nullptr) s.largest.zero();  // atomic maxima start at 0
  if (x_largest == nullptr) {
    column_maxima_cuda(x, s.largest.data(), nullptr, stream);
    x_largest = s.largest.data();
  }
  if (dy_largest == nullptr) {
    column_maxima_cuda(grad_y, s.largest.data() + in, nullptr, stream);
    dy_largest = s.largest.data() + in;
  }
  crt::ColumnWindow* const dy_windows = s.windows.data();
  crt::ColumnWindow* const x_windows = s.windows.data() + out;
  windows_kernel<<<1, 1024, 0, stream>>>(dy_largest, out, x_largest, in, plan.window_bits, dy_windows, x_windows);
  CUDA_LAUNCH_CHECK();
  const Terms terms{grad_y, x, dy_windows, x_windows, plan.window_bits, sums.digits(), sums.count()};
  for (int64_t begin = 0; begin < rows; begin += rows_per_product) {
    enqueue_chunk(terms, table, s, begin, std::min(rows_per_product, rows - begin), begin == 0, several_chunks,
                  device, stream);
  }
  const int spread_blocks = 8 * cuda::multiprocessor_count(device);
  crt_kernel<<<cuda::blocks_for(out * in, kThreads, spread_blocks), kThreads, 0, stream>>>(
      several_chunks ? s.running.data() : s.products.data(), s.out_padded, s.per_modulus, table, dy_windows,
      x_windows, out, in, sums.digits(), sums.count());
  CUDA_LAUNCH_CHECK();
  binned_pairs_kernel<<<static_cast<unsigned>(cuda::ceil_div(out * in, int64_t{kThreads})), kThreads, 0, stream>>>(
      grad_y, x, dy_windows, x_windows, sums.digits(), sums.count());
  CUDA_LAUNCH_CHECK();
}

}  // namespace seqpar::nn::detail
