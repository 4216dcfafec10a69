// dW = dyᵀ x on the GPU when every dy has one magnitude (dy = s * f, s in {-1, 0, +1}:
// an L1 loss's backward), by the fixed-point integer sums of nn/one_magnitude.h: the
// exact row sums of nn/cuda/linear_row_sums.cu, the same digits' value and so the same bits
// once rounded, at a fraction of the cost. Elements outside their column's window take
// the binned sum one by one (with their own products, so with the general path's
// rounding and IEEE rules). The kernel is in nn/cuda/one_magnitude_dw_few_outputs.cuh.
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
#include "core/cuda_check.h"
#include "nn/cuda/linear.h"
#include "nn/cuda/one_magnitude_dw_few_outputs.cuh"

namespace seqpar::nn::detail {

namespace {

using namespace few_outputs_dw;

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

}  // namespace

void launch_one_magnitude_dw(const ConstRows& grad_y, const ConstRows& x, const unsigned int* x_largest,
                             const unsigned int* words, int64_t* digits, int64_t stride, cuda::Stream stream) {
  const LaunchShape shape = launch_shape(grad_y, x);
  const auto kernel = shape.aligned16 ? one_magnitude_dw_kernel<SignsFromDy, true>
                                      : one_magnitude_dw_kernel<SignsFromDy, false>;
  cuda::launch_dependent(kernel, shape.grid, dim3(kThreads), 0, stream, grad_y, x, x_largest, words, digits,
                         stride, shape.rows_per_chunk, SignsFromDy::Params{});
  CUDA_LAUNCH_CHECK();
}

}  // namespace seqpar::nn::detail
