#include "bench/fused/exact_l1_step.h"

#include <vector>

#include "core/error.h"
#include "core/exact_bins.h"
#include "bench/fused/kernels/exact_step.h"

#ifdef SEQPAR_WITH_CUDA
#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "nn/cuda/linear.h"
#endif

namespace seqpar::fused {

#ifdef SEQPAR_WITH_CUDA

namespace {
// The loss's digits and the norm's (two sums), ahead of the maxima in step_words_.
constexpr int64_t kStepDigits = 3 * exact::kDigits;
}  // namespace

ExactL1Step::ExactL1Step(const nn::Linear& model, std::vector<Batch> batches,
                         nn::Reduction reduction, const optim::AdamWOptions& adamw,
                         double max_norm, exact::CrossRankSums* across)
    : FusedL1Step("ExactL1Step", model, std::move(batches), reduction, adamw, max_norm,
                  kernels::kExactL1MaxOut),
      across_(across) {
  const Device device = weight_.device();
  exact::check_term_count("ExactL1Step", rows_ * out_);
  y_ = Tensor::empty({rows_, out_}, device);
  grad_y_ = Tensor::empty({rows_, out_}, device);
  gradient_sums_ = exact::ExactSums(out_ * in_ + out_, device);
  const int64_t maxima = kernels::weight_grad_maxima_words(in_, out_);
  step_words_ = DeviceBuffer<int64_t>(kStepDigits + (maxima + 1) / 2, device);
  step_words_.zero();  // gradient_sums_ starts zero too
  finish_counts_ = DeviceBuffer<unsigned>(2, device);
  finish_counts_.zero();
  finish_grid_ = kernels::exact_finish_grid(out_ * in_ + out_, out_ * in_, device_);
  // dy's signs as dW's tensor-core operand, written with dy (one tile of outputs); zeroed
  // once: the rows past the last, up to a whole step of 32, are never written.
  if (out_ <= kernels::kSignFragmentOutputs) {
    sign_fragments_ = DeviceBuffer<uint8_t>(kernels::sign_fragment_bytes(rows_), device);
    sign_fragments_.zero();
  }
}

ExactL1Step::~ExactL1Step() = default;

void ExactL1Step::enqueue_step(size_t batch) {
  const Batch& b = batches_[batch];
  cudaStream_t stream = cuda::current_stream(device_);
  int64_t* digits = gradient_sums_.digits();
  const int64_t stride = gradient_sums_.count();
  int64_t* loss_digits = step_words_.data();
  int64_t* norm_digits = loss_digits + exact::kDigits;
  auto* maxima = reinterpret_cast<unsigned int*>(step_words_.data() + kStepDigits);
  if (!zeroed_) {
    CUDA_CHECK(cudaMemsetAsync(digits, 0, sizeof(int64_t) * gradient_sums_.words(), stream));
    CUDA_CHECK(cudaMemsetAsync(step_words_.data(), 0, sizeof(int64_t) * step_words_.size(), stream));
    CUDA_CHECK(cudaMemsetAsync(finish_counts_.data(), 0, sizeof(unsigned) * finish_counts_.size(), stream));
  }
  zeroed_ = false;  // until this step's finishing kernel is enqueued

  // The forward, which also finds x's column maxima (the windows of dW's fixed point),
  // and the L1 loss: in the forward's epilogue where the few-outputs kernel runs, else a
  // launch of its own that reads y back.
  const nn::detail::ConstRows x{b.x.data(), rows_, in_, b.x.stride(0)};
  const kernels::ExactL1Outputs l1{grad_y_.data(), loss_digits,  digits + out_ * in_,
                                   stride,         maxima + in_, sign_fragments_.data()};
  if (kernels::few_outputs_forward_exact_l1_fits(x, out_) && weight_.stride(1) == 1) {
    const kernels::ExactL1Target target{b.target.data(), b.target.stride(0), loss_scale_};
    kernels::few_outputs_forward_exact_l1_cuda(x, weight_.data(), weight_.stride(0), bias_.data(),
                                             out_, y_.data(), device_, maxima, target, l1);
  } else {
    nn::detail::linear_forward_cuda(b.x, weight_, bias_, y_, maxima);
    kernels::exact_l1_cuda(y_.data(), b.target.data(), b.target.stride(0), rows_, out_,
                           loss_scale_, l1, stream);
  }
  const nn::detail::ConstRows dy{grad_y_.data(), rows_, out_, out_};
  kernels::enqueue_weight_grad_sums_from_fragments(dy, x, kernels::weight_grad_maxima_at(maxima, in_, out_), digits,
                                                   stride, stream, sign_fragments_.data());

  if (across_ != nullptr) across_->combine(gradient_sums_);
  kernels::ExactFinish finish{};
  finish.gradient_digits = digits;
  finish.count = stride;
  finish.weight_count = out_ * in_;
  finish.gradients = gradients_.data();
  finish.loss_digits = loss_digits;
  finish.loss = loss_.data();
  finish.norm_digits = norm_digits;
  finish.total_norm = total_norm_.data();
  finish.step_words = step_words_.data();
  finish.step_word_count = step_words_.size();
  finish.counts = finish_counts_.data();
  finish.weight = weight_.data();
  finish.bias = bias_.data();
  finish.exp_avg = exp_avg_.data();
  finish.exp_avg_sq = exp_avg_sq_.data();
  finish.table = schedule_->table();
  finish.step_slot = schedule_->slot();
  finish.max_norm = max_norm_;
  kernels::exact_finish_cuda(finish, finish_grid_, stream);
  zeroed_ = true;
}

const char* ExactL1Step::capture_refusal() const {
  if (across_ == nullptr || across_->only_enqueues()) return nullptr;
  return "the step's ranks meet on the host to add their digits and cannot be captured; use "
         "run(), or a combiner that only enqueues stream-ordered work (fused::NcclEnqueuedSums)";
}

#else  // CPU-only build: FusedL1Step's constructor refuses, naming the public API.

ExactL1Step::ExactL1Step(const nn::Linear& model, std::vector<Batch> batches,
                         nn::Reduction reduction, const optim::AdamWOptions& adamw,
                         double max_norm, exact::CrossRankSums* across)
    : FusedL1Step("ExactL1Step", model, std::move(batches), reduction, adamw, max_norm,
                  kernels::kExactL1MaxOut),
      across_(across) {}
ExactL1Step::~ExactL1Step() = default;
void ExactL1Step::enqueue_step(size_t) {}
const char* ExactL1Step::capture_refusal() const { return nullptr; }

#endif

}  // namespace seqpar::fused
