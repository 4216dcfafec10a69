// CUDA path of nn/l1_loss.h.
//
// Forward: the exact sum of nn/l1_loss.h. Each thread keeps an exact::BinnedSum over a
// grid-stride share of the elements, terms (double)s * (double)|d|, and moves it into
// int64 digits of its own; a block adds its threads' digits with integer operations
// (warp shuffles, then shared-memory atomics) and adds them into the launch's digits
// with one integer atomic per digit; the last block to finish rounds them into the
// loss, once. Integer addition is associative (the special digit's flags are or-ed), so
// neither the grid, the schedule nor the order of the atomics can change a bit, and
// the result is bitwise the CPU's. No floating-point atomics.
//
// Backward: grad_input = (grad_loss * scale) * sign(input - target), sign(0) = 0 as
// in PyTorch, the product formed in double and rounded once, as the CPU path does.
// grad_loss is read on the device, so a step never waits for the host.
//
// Under a row mask both kernels skip the rows whose mask value is 0: no term, and a
// gradient of +0. Which rows count decides which terms exist, not their order, so the
// masked loss is as placement-free as the unmasked one.
#include <algorithm>
#include <cstdint>

#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "core/cuda_util.cuh"
#include "core/device_buffer.h"
#include "core/exact_sum.cuh"
#include "core/exact_sums.h"
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

// `words`: the launch's digits [kDigits], then a count of finished blocks (zeroed).
template <typename Rows>
__global__ void __launch_bounds__(kThreads)
    abs_diff_exact_sum_kernel(ConstRows input, ConstRows target, int64_t rows, int64_t cols,
                              float scale, Rows kept, int64_t* words, float* loss) {
  int64_t local[exact::kDigits] = {};
  exact::BinnedSum sum;
  sum.clear();
  int64_t pending = 0;  // terms in the bins since the last flush
  for (cuda::GridStrideElements e(rows, cols); e.inside(); e.next()) {
    if (!kept(e.row)) continue;  // a masked row forms no term
    const float difference = __fsub_rn(input(e.row, e.col), target(e.row, e.col));
    sum.add_skipping_unreached(
        __dmul_rn(static_cast<double>(scale), static_cast<double>(fabsf(difference))));
    if (++pending == exact::kTermsPerFlush) {
      sum.flush(local);
      pending = 0;
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
                                   int64_t rows, int64_t cols, float scale, Rows kept,
                                   float* grad_input, int64_t grad_row_stride) {
  const float gradient = __double2float_rn(double{*grad_loss} * scale);
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
                    const Tensor& loss) {
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
  // more blocks than are resident at once: the bins' registers leave three blocks an
  // SM, and kMaxBlocks alone had made 2.6 waves, the last one with SMs idle.
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
  kernel<<<static_cast<int>(blocks), kThreads, 0, cuda::current_stream(device)>>>(
      const_rows_of(input), const_rows_of(target), empty ? 0 : rows, empty ? 1 : cols, scale,
      kept, words.data(), loss.data());
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
  const int blocks = static_cast<int>(std::min<int64_t>(cuda::ceil_div(rows * cols, kThreads), 65536));
  cuda::set_device(device);
  l1_backward_kernel<<<blocks, kThreads, 0, cuda::current_stream(device)>>>(
      grad_loss.data(), const_rows_of(input),
      const_rows_of(target), rows, cols, scale, kept, grad_input.data(),
      grad_input.stride(0));
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
                          const Tensor& loss) {
  check_operands("l1_loss_forward_cuda", input, target);
  launch_forward(input, target, scale, AllRows{}, loss);
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
                 loss);
}

void l1_loss_backward_masked_cuda(const Tensor& grad_loss, const Tensor& input,
                                  const Tensor& target, const Tensor& row_mask, float scale,
                                  const Tensor& grad_input) {
  check_operands("l1_loss_backward_masked_cuda", input, target);
  launch_backward(grad_loss, input, target, scale,
                  kept_rows_of("l1_loss_backward_masked_cuda", row_mask, input), grad_input);
}

}  // namespace seqpar::nn::detail
