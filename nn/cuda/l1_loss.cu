// CUDA path of nn/l1_loss.h.
//
// Forward: the exact sum of nn/l1_loss.h. Each thread keeps an exact::ScaledAbsSum of
// the terms (double)s * (double)|d| over a grid-stride share of the elements (most |d|
// summed as integers, the rest binned) and moves it into int64 digits of its own; a
// block adds its threads' digits with integer operations (warp shuffles, then
// shared-memory atomics) and adds them into the launch's digits with one integer
// atomic per digit; the last block to finish rounds them into the loss, once. Integer
// addition is associative (the special digit's flags are or-ed), so neither the grid,
// the schedule nor the order of the atomics can change a bit, and the result is
// bitwise the CPU's. No floating-point atomics.
//
// Backward: grad_input = (grad_loss * scale) * sign(input - target), sign(0) = 0 as
// in PyTorch, the product formed in double and rounded once, as the CPU path does.
// grad_loss is read on the device, so a step never waits for the host. The autograd
// node's backward takes the signs from codes the forward wrote (nn/l1_sign.h), one
// byte an element: a quarter of the bytes it writes, instead of twice them.
//
// Under a row mask both kernels skip the rows whose mask value is 0: no term, and a
// gradient of +0. Which rows count decides which terms exist, not their order, so the
// masked loss is as placement-free as the unmasked one.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "core/cuda_util.cuh"
#include "core/device_buffer.h"
#include "core/exact_bins.h"
#include "core/exact_bins.cuh"
#include "core/exact_fixed_point.h"
#include "core/exact_sums.h"
#include "nn/cuda/l1_loss.h"
#include "nn/l1_loss.h"
#include "nn/rows.h"
#include "nn/l1_sign.h"

namespace seqpar::nn::detail {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1024;
constexpr int64_t kMinElementsPerThread = 8;


// Which rows form terms, as on the CPU (nn/l1_loss.cpp): all, or those a checked row
// mask keeps. A template argument, so the unmasked kernels are what they were.
struct AllRows {
  __device__ bool operator()(int64_t) const { return true; }
};
struct KeptRows {
  const float* mask;
  int64_t stride;
  __device__ bool operator()(int64_t row) const { return mask[row * stride] != 0.0f; }
};

// One thread's share of a flat walk over `count` elements, four a quad (the grid's
// threads take quads first, first + step, ... below quads), and one element of the
// last count % 4, at `tail`, if tail < count (step > 3: the first three threads at most).
struct FlatShare {
  int64_t first, step, quads, tail;
  __device__ explicit FlatShare(int64_t count)
      : first(int64_t{blockIdx.x} * blockDim.x + threadIdx.x),
        step(int64_t{gridDim.x} * blockDim.x),
        quads(count / 4),
        tail(4 * quads + first) {}
};

// Four elements' terms, and their four sign codes into *codes unless it is null.
__device__ inline void add_quad(exact::ScaledAbsSum& sum, const float4& a, const float4& b,
                                uchar4* codes) {
  const float4 d = make_float4(__fsub_rn(a.x, b.x), __fsub_rn(a.y, b.y), __fsub_rn(a.z, b.z),
                               __fsub_rn(a.w, b.w));
  sum.add_abs(d.x);
  sum.add_abs(d.y);
  sum.add_abs(d.z);
  sum.add_abs(d.w);
  if (codes != nullptr) {
    *codes = make_uchar4(l1_sign_code(d.x), l1_sign_code(d.y), l1_sign_code(d.z),
                         l1_sign_code(d.w));
  }
}

__device__ inline void add_one(exact::ScaledAbsSum& sum, float a, float b, uint8_t* code) {
  const float d = __fsub_rn(a, b);
  sum.add_abs(d);
  if (code != nullptr) *code = l1_sign_code(d);
}

// `words`: the launch's digits [kDigits], then a count of finished blocks (zeroed).
// `flat`: input and target are each one contiguous run of rows * cols floats, 16-byte
// aligned, and every row counts. The sum is then read as float4s, two of each operand
// in flight a thread: one element a load keeps too few bytes in flight to reach the
// device's bandwidth, once a term costs a few integer operations. `codes` (null: none)
// takes each element's sign code at row * cols + col (only unmasked: every row counts).
// Three blocks an SM: 80 registers a thread, no spills.
template <typename Rows>
__global__ void __launch_bounds__(kThreads, 3)
    abs_diff_exact_sum_kernel(ConstRows input, ConstRows target, int64_t rows, int64_t cols,
                              float scale, Rows kept, bool flat, int64_t* words, float* loss,
                              uint8_t* codes) {
  int64_t local[exact::kDigits] = {};
  exact::ScaledAbsSum sum(scale);
  int64_t pending = 0;  // terms since the last flush
  if (flat) {
    const int64_t count = rows * cols;
    const auto* a = reinterpret_cast<const float4*>(input.data);
    const auto* b = reinterpret_cast<const float4*>(target.data);
    auto* quad_codes = reinterpret_cast<uchar4*>(codes);
    const auto codes_at = [quad_codes](int64_t q) {
      return quad_codes != nullptr ? quad_codes + q : nullptr;
    };
    const FlatShare share(count);
    const int64_t step = share.step, quads = share.quads, tail = share.tail;
    int64_t q = share.first;
    for (; q + step < quads; q += 2 * step) {
      const float4 a0 = a[q], b0 = b[q], a1 = a[q + step], b1 = b[q + step];
      add_quad(sum, a0, b0, codes_at(q));
      add_quad(sum, a1, b1, codes_at(q + step));
      if ((pending += 8) > exact::kTermsPerFlush - 8) {
        sum.flush(local);
        pending = 0;
      }
    }
    if (q < quads) add_quad(sum, a[q], b[q], codes_at(q));
    if (tail < count) {  // pending stays in budget: at most 5 terms past the loop's check
      add_one(sum, input.data[tail], target.data[tail], codes != nullptr ? codes + tail : nullptr);
    }
  } else {
    for (cuda::GridStrideElements e(rows, cols); e.inside(); e.next()) {
      if (!kept(e.row)) continue;  // a masked row forms no term
      add_one(sum, input(e.row, e.col), target(e.row, e.col),
              codes != nullptr ? codes + e.row * cols + e.col : nullptr);
      if (++pending == exact::kTermsPerFlush) {
        sum.flush(local);
        pending = 0;
      }
    }
  }
  sum.flush(local);
  exact::add_block_digits(local, words, 1);
  // The last block to finish rounds the digits into the loss: no launch of its own for
  // that. Each block fences its adds before it counts itself; the last one reads the
  // digits from L2, past its own L1.
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(reinterpret_cast<unsigned int*>(words + exact::kDigits), 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (last && threadIdx.x == 0) {
    int64_t digits[exact::kDigits];
    for (int d = 0; d < exact::kDigits; ++d) digits[d] = __ldcg(words + d);
    *loss = exact::round_to_float(digits);
  }
}

template <typename Rows>
__global__ void l1_backward_kernel(const float* grad_loss, ConstRows input, ConstRows target,
                                   int64_t rows, int64_t cols, float scale, Rows kept, bool flat,
                                   float* grad_input, int64_t grad_row_stride) {
  const float gradient = __double2float_rn(double{*grad_loss} * scale);
  if (flat) {  // the forward's flat walk, grad_input one run too: four elements a load and a store
    const int64_t count = rows * cols;
    const auto* a = reinterpret_cast<const float4*>(input.data);
    const auto* b = reinterpret_cast<const float4*>(target.data);
    auto* grad = reinterpret_cast<float4*>(grad_input);
    const auto grads = [gradient](const float4& x, const float4& y) {
      return make_float4(__fmul_rn(gradient, l1_sign(__fsub_rn(x.x, y.x))),
                         __fmul_rn(gradient, l1_sign(__fsub_rn(x.y, y.y))),
                         __fmul_rn(gradient, l1_sign(__fsub_rn(x.z, y.z))),
                         __fmul_rn(gradient, l1_sign(__fsub_rn(x.w, y.w))));
    };
    const FlatShare share(count);
    for (int64_t q = share.first; q < share.quads; q += share.step) grad[q] = grads(a[q], b[q]);
    if (const int64_t tail = share.tail; tail < count) {
      grad_input[tail] = __fmul_rn(gradient, l1_sign(__fsub_rn(input.data[tail], target.data[tail])));
    }
    return;
  }
  for (cuda::GridStrideElements e(rows, cols); e.inside(); e.next()) {
    float* grad = grad_input + e.row * grad_row_stride + e.col;
    if (!kept(e.row)) {  // a masked row takes no part in the loss: +0, whatever it holds
      *grad = 0.0f;
      continue;
    }
    const float difference = __fsub_rn(input(e.row, e.col), target(e.row, e.col));
    *grad = __fmul_rn(gradient, l1_sign(difference));
  }
}

// From the forward's codes (nn/l1_sign.h): four elements a thread and a step, one
// 4-byte load and one float4 store. grad_input is one 16-byte-aligned run of `count`.
__global__ void l1_backward_from_signs_kernel(const float* grad_loss, float scale,
                                              const uint8_t* codes, int64_t count,
                                              float* grad_input) {
  const float gradient = __double2float_rn(double{*grad_loss} * scale);
  const auto* quad_codes = reinterpret_cast<const uchar4*>(codes);
  auto* grad = reinterpret_cast<float4*>(grad_input);
  const FlatShare share(count);
  for (int64_t q = share.first; q < share.quads; q += share.step) {
    const uchar4 c = quad_codes[q];
    grad[q] = make_float4(__fmul_rn(gradient, l1_sign_of(c.x)), __fmul_rn(gradient, l1_sign_of(c.y)),
                          __fmul_rn(gradient, l1_sign_of(c.z)), __fmul_rn(gradient, l1_sign_of(c.w)));
  }
  if (share.tail < count) grad_input[share.tail] = __fmul_rn(gradient, l1_sign_of(codes[share.tail]));
}

// Whether m is one contiguous run of rows * cols floats from a 16-byte boundary: the
// kernels' flat walk, four elements a load.
bool one_run(const ConstRows& m) {
  return (m.rows <= 1 || m.row_stride == m.cols) && cuda::aligned16(m.data);
}

void check_operands(const char* op, const Tensor& input, const Tensor& target) {
  SEQPAR_CHECK(input.defined() && target.defined() && input.device().is_cuda() &&
                   input.device() == target.device(),
               op, ": input and target must be on the same GPU");
  SEQPAR_CHECK(input.dim() == 2 && input.shape() == target.shape() && input.stride(1) == 1 &&
                   target.stride(1) == 1,
               op, ": input ", input.shape(), " and target ", target.shape(),
               " must be the same [n, m] with unit column stride");
}

}  // namespace

namespace {

template <typename Rows>
void launch_forward(const Tensor& input, const Tensor& target, float scale, Rows kept,
                    const Tensor& loss, uint8_t* codes) {
  SEQPAR_CHECK(loss.defined() && loss.numel() == 1 && loss.is_contiguous() &&
                   loss.device() == input.device(),
               "l1_loss_forward_cuda: loss must be one element on ", input.device());
  const int64_t rows = input.size(0), cols = input.size(1);
  exact::check_term_count("l1_loss", rows * cols);
  const int device = input.device().index;
  cuda::set_device(device);
  // The digits and the count of finished blocks, zeroed on the current stream.
  DeviceBuffer<int64_t> words(exact::kDigits + 1, input.device());
  words.zero();
  // Any grid gives the same bits; this one gives every thread a few elements, and no
  // more blocks than are resident at once: the sum's registers leave a few blocks an
  // SM, and more blocks than fit would make a last wave with SMs idle.
  const auto kernel = abs_diff_exact_sum_kernel<Rows>;
  static const int resident_per_sm = [&] {
    int per_sm = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0));
    return std::max(per_sm, 1);
  }();
  const int64_t resident = int64_t{resident_per_sm} * cuda::multiprocessor_count(device);
  const int64_t blocks = std::clamp<int64_t>(
      cuda::ceil_div(rows * cols, kThreads * kMinElementsPerThread), 1,
      std::min(kMaxBlocks, resident));
  // No elements: one block walks none (0 rows of 1 column) and rounds the zero digits to +0.
  const bool empty = rows * cols == 0;
  const ConstRows a = const_rows_of(input), b = const_rows_of(target);
  const bool flat = std::is_same<Rows, AllRows>::value && one_run(a) && one_run(b);
  kernel<<<static_cast<int>(blocks), kThreads, 0, cuda::current_stream(device)>>>(
      a, b, empty ? 0 : rows, empty ? 1 : cols, scale, kept, flat, words.data(), loss.data(),
      codes);
  CUDA_LAUNCH_CHECK();
}

template <typename Rows>
void launch_backward(const Tensor& grad_loss, const Tensor& input, const Tensor& target,
                     float scale, Rows kept, const Tensor& grad_input) {
  SEQPAR_CHECK(grad_loss.defined() && grad_loss.numel() == 1 &&
                   grad_loss.device() == input.device(),
               "l1_loss_backward_cuda: grad_loss must be one element on ", input.device());
  SEQPAR_CHECK(grad_input.defined() && grad_input.shape() == input.shape() &&
                   grad_input.device() == input.device() && grad_input.stride(1) == 1,
               "l1_loss_backward_cuda: grad_input must be ", input.shape(), " on ",
               input.device(), " with unit column stride");
  const int device = input.device().index;
  const int64_t rows = input.size(0), cols = input.size(1);
  if (rows * cols == 0) return;
  const ConstRows a = const_rows_of(input), b = const_rows_of(target);
  const bool flat = std::is_same<Rows, AllRows>::value && one_run(a) && one_run(b) &&
                    one_run(ConstRows{grad_input.data(), rows, cols, grad_input.stride(0)});
  const int64_t items = flat ? cuda::ceil_div(rows * cols, 4) : rows * cols;  // a thread's first
  const int blocks = static_cast<int>(std::min<int64_t>(cuda::ceil_div(items, kThreads), 65536));
  cuda::set_device(device);
  l1_backward_kernel<<<blocks, kThreads, 0, cuda::current_stream(device)>>>(
      grad_loss.data(), a, b, rows, cols, scale, kept, flat, grad_input.data(), grad_input.stride(0));
  CUDA_LAUNCH_CHECK();
}

// A mask already checked by the caller (nn::unmasked_rows): here only where it lives.
KeptRows kept_rows_of(const char* op, const Tensor& row_mask, const Tensor& input) {
  SEQPAR_CHECK(row_mask.defined() && row_mask.dim() == 1 && row_mask.size(0) == input.size(0) &&
                   row_mask.device() == input.device(),
               op, ": row_mask must be [", input.size(0), "] on ", input.device(), ", got shape ",
               row_mask.shape());
  return KeptRows{row_mask.data(), row_mask.stride(0)};
}

}  // namespace

void l1_loss_forward_cuda(const Tensor& input, const Tensor& target, float scale,
                          const Tensor& loss, uint8_t* codes) {
  check_operands("l1_loss_forward_cuda", input, target);
  SEQPAR_CHECK(codes == nullptr || cuda::aligned16(codes),
               "l1_loss_forward_cuda: the sign codes must start on a 16-byte boundary");
  launch_forward(input, target, scale, AllRows{}, loss, codes);
}

void l1_loss_backward_from_signs_cuda(const Tensor& grad_loss, const uint8_t* codes, float scale,
                                      const Tensor& grad_input) {
  SEQPAR_CHECK(grad_input.defined() && grad_input.device().is_cuda() &&
                   grad_input.is_contiguous() && cuda::aligned16(grad_input.data()),
               "l1_loss_backward_from_signs_cuda: grad_input must be contiguous on a GPU, from"
               " a 16-byte boundary");
  SEQPAR_CHECK(grad_loss.defined() && grad_loss.numel() == 1 &&
                   grad_loss.device() == grad_input.device(),
               "l1_loss_backward_from_signs_cuda: grad_loss must be one element on ",
               grad_input.device());
  const int64_t count = grad_input.numel();
  if (count == 0) return;
  SEQPAR_CHECK(cuda::aligned16(codes),
               "l1_loss_backward_from_signs_cuda: the sign codes must start on a 16-byte boundary");
  const int device = grad_input.device().index;
  const int blocks =
      static_cast<int>(std::min<int64_t>(cuda::ceil_div(cuda::ceil_div(count, 4), kThreads), 65536));
  cuda::set_device(device);
  l1_backward_from_signs_kernel<<<blocks, kThreads, 0, cuda::current_stream(device)>>>(
      grad_loss.data(), scale, codes, count, grad_input.data());
  CUDA_LAUNCH_CHECK();
}

void l1_loss_backward_cuda(const Tensor& grad_loss, const Tensor& input, const Tensor& target,
                           float scale, const Tensor& grad_input) {
  check_operands("l1_loss_backward_cuda", input, target);
  launch_backward(grad_loss, input, target, scale, AllRows{}, grad_input);
}

void l1_loss_forward_masked_cuda(const Tensor& input, const Tensor& target,
                                 const Tensor& row_mask, float scale, const Tensor& loss) {
  check_operands("l1_loss_forward_masked_cuda", input, target);
  launch_forward(input, target, scale, kept_rows_of("l1_loss_forward_masked_cuda", row_mask, input),
                 loss, nullptr);
}

void l1_loss_backward_masked_cuda(const Tensor& grad_loss, const Tensor& input,
                                  const Tensor& target, const Tensor& row_mask, float scale,
                                  const Tensor& grad_input) {
  check_operands("l1_loss_backward_masked_cuda", input, target);
  launch_backward(grad_loss, input, target, scale,
                  kept_rows_of("l1_loss_backward_masked_cuda", row_mask, input), grad_input);
}

}  // namespace seqpar::nn::detail
