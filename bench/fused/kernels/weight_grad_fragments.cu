// dW's sums of the exact fused step from dy's sign fragments, which the L1 loss's
// kernels lay out as they write dy (exact_l1.cuh): nn's few-outputs one-magnitude
// kernel (nn/cuda/one_magnitude_dw_few_outputs.cuh) with a sign policy of this step's own.
//
// Each lane loads its 16 bytes of a step (the block's eight warps the same 512, from
// L1) instead of the block reading dy and laying the signs out, and a seventh
// tensor-core product, with a matrix of ones, gives Σ s. Where dy has not one magnitude
// (a NaN came in), each block does the general row sums of its own share
// (nn/cuda/linear_row_sums.cuh) instead of returning: so no binned kernel is launched beside
// it, one launch instead of two in the step's chain, where even a launch that returns at
// once costs the step time (bench/RESULTS.md).
#include "bench/fused/kernels/exact_step.h"
#include "core/cuda_check.h"
#include "core/error.h"
#include "core/exact_sums.h"
#include "nn/cuda/linear_row_sums.cuh"
#include "nn/cuda/one_magnitude_dw_few_outputs.cuh"

namespace seqpar::fused::kernels {

namespace {

using namespace nn::detail::few_outputs_dw;
using nn::detail::ConstRows;

static_assert(kSignFragmentOutputs == kGroup && kStepRows * kGroup == 512,
              "a step of fragments is one block's tensor-core operand");

// one_magnitude_dw_kernel's sign policy (its comment lists the calls): the chunk's
// fragments, a step's 512 bytes after another (the chunk is whole steps), each lane's
// loaded one step ahead.
class SignsFromFragments {
 public:
  struct Params {
    const uint8_t* fragments;
    const unsigned int* dy_largest;  // dy's column maxima, for the general sums
  };
  struct Shared {};

  __device__ SignsFromFragments(const Params& params, const Block& block, Shared&)
      : chunk_(reinterpret_cast<const uint4*>(params.fragments +
                                              nn::detail::sign_fragment_byte(block.row_begin, 0))),
        next_(chunk_[threadIdx.x % 32]) {}

  // dy has not one magnitude: the general row sums of this block's share, 32 columns and
  // one output at a time, as the general kernel's blocks would take them.
  __device__ static void general(const Params& params, const Block& block, const unsigned int* x_largest,
                                 int64_t* digits, int64_t count) {
    static_assert(kWarps == nn::detail::kRowSumsWarps && nn::detail::kRowSumsOutputs<true> == 1 &&
                      kColumns % 32 == 0,
                  "the block takes the general kernel's blocks one after another");
    const ConstRows& dy = block.dy;
    const ConstRows& x = block.x;
    for (int64_t k0 = block.k_block; k0 < min(block.k_block + kColumns, x.cols); k0 += 32) {
      for (int64_t j = block.j0; j < min(block.j0 + kGroup, dy.cols); ++j) {
        nn::detail::sum_rows_block<true>(dy, x, dy.cols, x.cols, k0, j, block.row_begin,
                                         block.row_begin + block.rows, params.dy_largest, x_largest,
                                         digits, count);
      }
    }
  }

  __device__ void next(int step, int steps) {
    current_ = next_;
    if (step + 1 < steps) next_ = chunk_[(step + 1) * 32 + threadIdx.x % 32];
  }
  __device__ uint4 fragment(int) const { return current_; }
  // Σ s, row by row: the signs times a matrix of ones.
  __device__ void count(const uint4& a) { imma_16x8x32(sums_, a, 0x01010101u, 0x01010101u); }
  __device__ void finish() {}
  __device__ int total(int d, int) const { return sums_[d]; }

 private:
  const uint4* chunk_;
  uint4 next_, current_ = {};
  int sums_[4] = {};
};

}  // namespace

void enqueue_weight_grad_sums_from_fragments(const ConstRows& grad_y, const ConstRows& x,
                                             const nn::detail::WeightGradMaxima& maxima, int64_t* digits,
                                             int64_t stride, cuda::Stream stream,
                                             const uint8_t* sign_fragments) {
  if (sign_fragments == nullptr || !fits(grad_y, x)) {
    nn::detail::enqueue_weight_grad_sums(grad_y, x, maxima, digits, stride, stream);
    return;
  }
  SEQPAR_CHECK(grad_y.rows == x.rows && stride >= grad_y.cols * x.cols && grad_y.cols <= kSignFragmentOutputs,
               "enqueue_weight_grad_sums_from_fragments: dy ", grad_y.rows, " x ", grad_y.cols, ", x ",
               x.rows, " x ", x.cols, ", digit stride ", stride, " (sign fragments hold at most ",
               kSignFragmentOutputs, " outputs)");
  exact::check_term_count("enqueue_weight_grad_sums_from_fragments", x.rows);
  if (x.rows == 0 || x.cols == 0 || grad_y.cols == 0) return;
  const LaunchShape shape = launch_shape(grad_y, x);
  const auto kernel = shape.aligned16 ? one_magnitude_dw_kernel<SignsFromFragments, true>
                                      : one_magnitude_dw_kernel<SignsFromFragments, false>;
  cuda::launch_dependent(kernel, shape.grid, dim3(kThreads), 0, stream, grad_y, x, maxima.x_largest,
                         maxima.dy_words, digits, stride, shape.rows_per_chunk,
                         SignsFromFragments::Params{sign_fragments, maxima.dy_largest});
  CUDA_LAUNCH_CHECK();
}

}  // namespace seqpar::fused::kernels
