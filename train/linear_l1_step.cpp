#include "train/linear_l1_step.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "core/nvtx.h"
#include "train/kernels/skinny.h"

#ifdef SEQPAR_WITH_CUDA
#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "train/kernels/clip_adamw.h"
#endif

namespace seqpar::train {

struct LinearL1Step::OnePass {
  kernels::SkinnyStepPlan plan;
};

#ifdef SEQPAR_WITH_CUDA

namespace {

DeviceBuffer<double> double_buffer(int64_t count, Device device) {
  return DeviceBuffer<double>(std::max<int64_t>(count, 1), device);
}

}  // namespace

LinearL1Step::LinearL1Step(const nn::Linear& model, std::vector<Batch> batches,
                           nn::Reduction reduction, const optim::AdamWOptions& adamw,
                           double max_norm, GradientSync sync)
    : weight_(model.weight().data()),
      bias_(model.bias().data()),
      batches_(std::move(batches)),
      rows_(0),
      in_(model.in_features()),
      out_(model.out_features()),
      loss_scale_(0.0f),
      adamw_(adamw),
      max_norm_(static_cast<float>(max_norm)),
      sync_(std::move(sync)),
      device_(weight_.device().index),
      one_pass_(std::make_unique<OnePass>()) {
  const Device device = weight_.device();
  SEQPAR_CHECK(device.is_cuda(), "LinearL1Step: the model must be on a GPU, it is on ", device);
  SEQPAR_CHECK(kernels::is_skinny(out_), "LinearL1Step: out_features ", out_,
               " is above the skinny path's ", kernels::kSkinnyMaxOut);
  SEQPAR_CHECK(weight_.is_contiguous() && bias_.is_contiguous(),
               "LinearL1Step: weight and bias must be contiguous");
  SEQPAR_CHECK(max_norm > 0.0, "LinearL1Step: max_norm must be positive, got ", max_norm);
  detail::check_batches("LinearL1Step", batches_, in_, out_, device);
  SEQPAR_CHECK(kernels::clip_adamw_fits({out_ * in_, out_}),
               "LinearL1Step: too many parameters for the one-launch optimizer");
  rows_ = batches_[0].x.size(0);
  loss_scale_ = static_cast<float>(reduction.scale(rows_ * out_));

  cuda::set_device(device_);
  const kernels::SkinnyGradScratch scratch = kernels::skinny_grad_scratch(rows_, in_, out_);
  one_pass_->plan = kernels::skinny_step_plan(rows_, in_, out_);
  if (one_pass_->plan.supported) {
    loss_partial_count_ = rows_ > 0 ? one_pass_->plan.loss_partials : 0;
  } else {
    loss_partial_count_ = kernels::skinny_forward_partial_count(rows_, out_);
    sign_ = Tensor::empty({std::max<int64_t>(rows_ * out_, 1)}, device);
  }
  loss_partials_ = double_buffer(loss_partial_count_, device);
  weight_partials_ = Tensor::empty({std::max<int64_t>(scratch.weight_floats, 1)}, device);
  bias_partials_ = double_buffer(scratch.bias_doubles, device);
  gradients_ = Tensor::zeros({out_ * in_ + out_}, device);
  grad_weight_ = gradients_.narrow(0, 0, out_ * in_).view({out_, in_});
  grad_bias_ = gradients_.narrow(0, out_ * in_, out_);
  loss_ = Tensor::zeros({}, device);
  total_norm_ = Tensor::zeros({}, device);
  exp_avg_ = Tensor::zeros({out_ * in_ + out_}, device);
  exp_avg_sq_ = Tensor::zeros({out_ * in_ + out_}, device);
  schedule_ = std::make_unique<detail::AdamWSchedule>(adamw_, device);
  blocks_done_ = DeviceBuffer<unsigned>(1, device);
  blocks_done_.zero();
  model.weight().set_grad(grad_weight_);
  model.bias().set_grad(grad_bias_);
}

LinearL1Step::~LinearL1Step() = default;

// The loss, grad_weight_ and grad_bias_ of batch `batch`: one pass over x and the
// chunk sums, or (wide inputs) the two-pass route.
void LinearL1Step::enqueue_gradients(size_t batch) {
  namespace nd = kernels;
  const Batch& b = batches_[batch];
  cuda::Stream stream = cuda::current_stream(device_);
  const nd::RowsView x{b.x.data(), b.x.stride(0)}, target{b.target.data(), b.target.stride(0)};
  const nd::LossFinish finish{loss_partials_.data(), loss_partial_count_, loss_scale_,
                              loss_.data()};
  if (one_pass_->plan.supported) {
    nd::skinny_step_partials_cuda(one_pass_->plan, x, target, weight_.data(), bias_.data(), rows_, in_,
                                  out_, loss_scale_, weight_partials_.data(),
                                  bias_partials_.data(), loss_partials_.data(), stream);
    nd::skinny_sum_partials_cuda(weight_partials_.data(), bias_partials_.data(), rows_, in_,
                                 out_, grad_weight_.data(), grad_bias_.data(), finish, stream);
    return;
  }
  const nd::L1Outputs l1{target, sign_.data(), loss_partials_.data()};
  nd::skinny_forward_l1_cuda(x, weight_.data(), bias_.data(), rows_, in_, out_, l1, stream);
  nd::skinny_weight_grad_cuda(nd::GradSource{nd::RowsView{nullptr, 0}, sign_.data(), loss_scale_},
                              x, rows_, in_, out_, grad_weight_.data(), grad_bias_.data(),
                              weight_partials_.data(), bias_partials_.data(), finish,
                              stream);
}

void LinearL1Step::enqueue(size_t batch) {
  cuda::Stream stream = cuda::current_stream(device_);
  enqueue_gradients(batch);
  if (sync_.hook) sync_.hook(gradients_);
  optim::detail::AdamWTensors tensors;
  tensors.params = {weight_.data(), bias_.data()};
  tensors.grads = {grad_weight_.data(), grad_bias_.data()};
  tensors.exp_avgs = {exp_avg_.data(), exp_avg_.data() + out_ * in_};
  tensors.exp_avg_sqs = {exp_avg_sq_.data(), exp_avg_sq_.data() + out_ * in_};
  tensors.sizes = {out_ * in_, out_};
  const kernels::ClipAdamWState state{
      schedule_->table(), schedule_->slot(), blocks_done_.data(), total_norm_.data()};
  kernels::clip_adamw_step_cuda(tensors, max_norm_, state, kernels::NormSum::FloatOrder, stream);
}

void LinearL1Step::run(size_t batch) {
  SEQPAR_NVTX_RANGE("LinearL1Step::run");
  SEQPAR_CHECK(batch < batches_.size(), "LinearL1Step::run: batch ", batch, " of ",
               batches_.size());
  cuda::set_device(device_);
  schedule_->begin_step();
  enqueue(batch);
}

void LinearL1Step::capture() {
  SEQPAR_CHECK(sync_.capturable(),
               "LinearL1Step::capture: a step with a synchronize hook meets its peers on the "
               "host and cannot be captured; use run(), or a hook that only enqueues "
               "stream-ordered work (GradientSync::stream_ordered, e.g. "
               "NcclProcessGroup::all_reduce_enqueue)");
  SEQPAR_CHECK(!captured(), "LinearL1Step::capture: already captured");
  graphs_.capture(batches_.size(), device_, [this](size_t batch) { enqueue(batch); });
}

void LinearL1Step::replay(size_t batch) {
  SEQPAR_NVTX_RANGE("LinearL1Step::replay");
  SEQPAR_CHECK(batch < graphs_.size(), "LinearL1Step::replay: no graph for batch ", batch,
               " (capture() first)");
  schedule_->begin_step();
  graphs_.replay(batch, device_);
}

#else  // CPU-only build: the fused step is a GPU path; the public API serves the CPU.

[[noreturn]] static void no_cuda() {
  SEQPAR_FAIL("LinearL1Step: this seqpar was built without CUDA; use the public API "
              "(nn::linear, nn::l1_loss, optim::clip_grad_norm, optim::AdamW) on the CPU");
}
LinearL1Step::LinearL1Step(const nn::Linear&, std::vector<Batch>, nn::Reduction,
                           const optim::AdamWOptions&, double, GradientSync)
    : rows_(0), in_(0), out_(0), loss_scale_(0.0f), max_norm_(0.0f), device_(0) {
  no_cuda();
}
LinearL1Step::~LinearL1Step() = default;
void LinearL1Step::run(size_t) { no_cuda(); }
void LinearL1Step::capture() { no_cuda(); }
void LinearL1Step::replay(size_t) { no_cuda(); }
void LinearL1Step::enqueue(size_t) {}
void LinearL1Step::enqueue_gradients(size_t) {}

#endif

}  // namespace seqpar::train
