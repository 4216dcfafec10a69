#include "train/exact_l1_step.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "core/exact_sum.h"
#include "core/nvtx.h"

#ifdef SEQPAR_WITH_CUDA
#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "nn/linear_kernels.h"
#include "train/kernels/clip_adamw.h"
#include "train/kernels/exact_step.h"
#endif

namespace seqpar::train {

#ifdef SEQPAR_WITH_CUDA

namespace {
// The loss's digits and the norm's (two sums), ahead of the maxima in step_words_.
constexpr int64_t kStepDigits = 3 * exact::kDigits;
}  // namespace

ExactL1Step::ExactL1Step(const nn::Linear& model, std::vector<Batch> batches,
                         nn::Reduction reduction, const optim::AdamWOptions& adamw,
                         double max_norm, exact::CrossRankSums* across)
    : weight_(model.weight().data()),
      bias_(model.bias().data()),
      batches_(std::move(batches)),
      rows_(0),
      in_(model.in_features()),
      out_(model.out_features()),
      loss_scale_(0.0f),
      max_norm_(static_cast<float>(max_norm)),
      across_(across),
      device_(weight_.device().index) {
  const Device device = weight_.device();
  SEQPAR_CHECK(device.is_cuda(), "ExactL1Step: the model must be on a GPU, it is on ", device);
  SEQPAR_CHECK(out_ <= kernels::kExactL1MaxOut, "ExactL1Step: out_features ", out_,
               " is above the step's ", kernels::kExactL1MaxOut);
  SEQPAR_CHECK(weight_.is_contiguous() && bias_.is_contiguous(),
               "ExactL1Step: weight and bias must be contiguous");
  SEQPAR_CHECK(max_norm > 0.0, "ExactL1Step: max_norm must be positive, got ", max_norm);
  detail::check_batches("ExactL1Step", batches_, in_, out_, device);
  SEQPAR_CHECK(kernels::clip_adamw_fits({out_ * in_, out_}),
               "ExactL1Step: too many parameters for the one-launch optimizer");
  rows_ = batches_[0].x.size(0);
  exact::check_term_count("ExactL1Step", rows_ * out_);
  loss_scale_ = static_cast<float>(reduction.scale(rows_ * out_));

  cuda::set_device(device_);
  const int64_t parameters = out_ * in_ + out_;
  y_ = Tensor::empty({rows_, out_}, device);
  grad_y_ = Tensor::empty({rows_, out_}, device);
  gradient_sums_ = exact::ExactSums(parameters, device);
  const int64_t maxima = nn::detail::weight_grad_scratch_words(in_, out_);
  step_words_ = DeviceBuffer<int64_t>(kStepDigits + (maxima + 1) / 2, device);
  gradients_ = Tensor::zeros({parameters}, device);
  grad_weight_ = gradients_.narrow(0, 0, out_ * in_).view({out_, in_});
  grad_bias_ = gradients_.narrow(0, out_ * in_, out_);
  loss_ = Tensor::zeros({}, device);
  total_norm_ = Tensor::zeros({}, device);
  exp_avg_ = Tensor::zeros({parameters}, device);
  exp_avg_sq_ = Tensor::zeros({parameters}, device);
  schedule_ = std::make_unique<detail::AdamWSchedule>(adamw, device);
  blocks_done_ = DeviceBuffer<unsigned>(2, device);
  blocks_done_.zero();
  model.weight().set_grad(grad_weight_);
  model.bias().set_grad(grad_bias_);
}

ExactL1Step::~ExactL1Step() = default;

void ExactL1Step::enqueue(size_t batch) {
  const Batch& b = batches_[batch];
  cudaStream_t stream = cuda::current_stream(device_);
  int64_t* digits = gradient_sums_.digits();
  const int64_t stride = gradient_sums_.count();
  int64_t* loss_digits = step_words_.data();
  int64_t* norm_digits = loss_digits + exact::kDigits;
  auto* maxima = reinterpret_cast<unsigned int*>(step_words_.data() + kStepDigits);
  CUDA_CHECK(cudaMemsetAsync(digits, 0, sizeof(int64_t) * gradient_sums_.words(), stream));
  CUDA_CHECK(cudaMemsetAsync(step_words_.data(), 0, sizeof(int64_t) * step_words_.size(), stream));

  // x's column maxima (the windows of dW's fixed point), then the forward.
  const nn::detail::ConstRows x{b.x.data(), rows_, in_, b.x.stride(0)};
  nn::detail::column_maxima_cuda(x, maxima, nullptr, stream);
  nn::detail::linear_forward_cuda(b.x, weight_, bias_, y_);
  const kernels::ExactL1Outputs l1{grad_y_.data(), loss_digits, digits + out_ * in_, stride,
                                   maxima + in_};
  kernels::exact_l1_cuda(y_.data(), b.target.data(), b.target.stride(0), rows_, out_, loss_scale_,
                         l1, stream);
  const nn::detail::ConstRows dy{grad_y_.data(), rows_, out_, out_};
  nn::detail::enqueue_weight_grad_sums(dy, x, maxima, digits, stride, stream);

  if (across_ != nullptr) across_->combine(gradient_sums_);
  const kernels::ExactFinish finish{digits,      stride,       out_ * in_,        gradients_.data(),
                                    loss_digits, loss_.data(), norm_digits,       blocks_done_.data(),
                                    total_norm_.data()};
  kernels::exact_finish_cuda(finish, stream);

  optim::detail::AdamWTensors tensors;
  tensors.params = {weight_.data(), bias_.data()};
  tensors.grads = {grad_weight_.data(), grad_bias_.data()};
  tensors.exp_avgs = {exp_avg_.data(), exp_avg_.data() + out_ * in_};
  tensors.exp_avg_sqs = {exp_avg_sq_.data(), exp_avg_sq_.data() + out_ * in_};
  tensors.sizes = {out_ * in_, out_};
  const kernels::ClipAdamWState state{schedule_->table(), schedule_->slot(),
                                      blocks_done_.data() + 1, total_norm_.data()};
  kernels::clip_adamw_step_cuda(tensors, max_norm_, state, kernels::NormSum::Given, stream);
}

void ExactL1Step::run(size_t batch) {
  SEQPAR_NVTX_RANGE("ExactL1Step::run");
  SEQPAR_CHECK(batch < batches_.size(), "ExactL1Step::run: batch ", batch, " of ",
               batches_.size());
  cuda::set_device(device_);
  schedule_->begin_step();
  enqueue(batch);
}

void ExactL1Step::capture() {
  SEQPAR_CHECK(across_ == nullptr || across_->only_enqueues(),
               "ExactL1Step::capture: the step's ranks meet on the host to add their digits "
               "and cannot be captured; use run(), or a combiner that only enqueues "
               "stream-ordered work");
  SEQPAR_CHECK(!captured(), "ExactL1Step::capture: already captured");
  graphs_.capture(batches_.size(), device_, [this](size_t batch) { enqueue(batch); });
}

void ExactL1Step::replay(size_t batch) {
  SEQPAR_NVTX_RANGE("ExactL1Step::replay");
  SEQPAR_CHECK(batch < graphs_.size(), "ExactL1Step::replay: no graph for batch ", batch,
               " (capture() first)");
  schedule_->begin_step();
  graphs_.replay(batch, device_);
}

#else  // CPU-only build: the fused step is a GPU path; the public API serves the CPU.

[[noreturn]] static void no_cuda() {
  SEQPAR_FAIL("ExactL1Step: this seqpar was built without CUDA; use the public API "
              "(nn::linear, nn::l1_loss, optim::clip_grad_norm, optim::AdamW) on the CPU");
}
ExactL1Step::ExactL1Step(const nn::Linear&, std::vector<Batch>, nn::Reduction,
                         const optim::AdamWOptions&, double, exact::CrossRankSums*)
    : rows_(0), in_(0), out_(0), loss_scale_(0.0f), max_norm_(0.0f), across_(nullptr), device_(0) {
  no_cuda();
}
ExactL1Step::~ExactL1Step() = default;
void ExactL1Step::run(size_t) { no_cuda(); }
void ExactL1Step::capture() { no_cuda(); }
void ExactL1Step::replay(size_t) { no_cuda(); }
void ExactL1Step::enqueue(size_t) {}

#endif

}  // namespace seqpar::train
