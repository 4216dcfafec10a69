#include "train/linear_l1_step.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "train/kernels/skinny.h"

#ifdef SEQPAR_WITH_CUDA
#include "core/cuda_runtime.h"
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
    : FusedL1Step("LinearL1Step", model, std::move(batches), reduction, adamw, max_norm,
                  kernels::kSkinnyMaxOut, /*norm_given=*/false),
      sync_(std::move(sync)),
      one_pass_(std::make_unique<OnePass>()) {
  const Device device = weight_.device();  // the base checked it and made it current
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
  } else {
    const nd::L1Outputs l1{target, sign_.data(), loss_partials_.data()};
    nd::skinny_forward_l1_cuda(x, weight_.data(), bias_.data(), rows_, in_, out_, l1, stream);
    nd::skinny_weight_grad_cuda(nd::GradSource{nd::RowsView{nullptr, 0}, sign_.data(), loss_scale_},
                                x, rows_, in_, out_, grad_weight_.data(), grad_bias_.data(),
                                weight_partials_.data(), bias_partials_.data(), finish, stream);
  }
  if (sync_.hook) sync_.hook(gradients_);
}

const char* LinearL1Step::capture_refusal() const {
  if (sync_.capturable()) return nullptr;
  return "a step with a synchronize hook meets its peers on the host and cannot be captured; "
         "use run(), or a hook that only enqueues stream-ordered work "
         "(GradientSync::stream_ordered, e.g. NcclProcessGroup::all_reduce_enqueue)";
}

#else  // CPU-only build: FusedL1Step's constructor refuses, naming the public API.

LinearL1Step::LinearL1Step(const nn::Linear& model, std::vector<Batch> batches,
                           nn::Reduction reduction, const optim::AdamWOptions& adamw,
                           double max_norm, GradientSync sync)
    : FusedL1Step("LinearL1Step", model, std::move(batches), reduction, adamw, max_norm,
                  kernels::kSkinnyMaxOut, false),
      sync_(std::move(sync)) {}
LinearL1Step::~LinearL1Step() = default;
void LinearL1Step::enqueue_gradients(size_t) {}
const char* LinearL1Step::capture_refusal() const { return nullptr; }

#endif

}  // namespace seqpar::train
