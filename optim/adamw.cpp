#include "optim/adamw.h"

#include <cmath>
#include <map>

#include "core/checks.h"
#include "core/error.h"
#include "core/nvtx.h"
#include "optim/cuda/adamw.h"

namespace seqpar::optim {

namespace {

void check_options(const AdamWOptions& options) {
  SEQPAR_CHECK(options.lr() >= 0.0 && std::isfinite(options.lr()),
               "AdamW: learning rate (lr) must be finite and >= 0, got ", options.lr());
  const auto [beta1, beta2] = options.betas();
  SEQPAR_CHECK(beta1 >= 0.0 && beta1 < 1.0, "AdamW: beta1 must be in [0, 1), got ", beta1);
  SEQPAR_CHECK(beta2 >= 0.0 && beta2 < 1.0, "AdamW: beta2 must be in [0, 1), got ", beta2);
  SEQPAR_CHECK(options.eps() >= 0.0, "AdamW: eps must be >= 0, got ", options.eps());
  SEQPAR_CHECK(options.weight_decay() >= 0.0, "AdamW: weight_decay must be >= 0, got ",
               options.weight_decay());
}

// torch.lerp as PyTorch's vectorized CPU kernel computes it: one fused multiply-add,
// from whichever end is nearer so that weight 1 gives `end` exactly.
float lerp(float start, float end, float weight) {
  return std::fabs(weight) < 0.5f ? std::fma(weight, end - start, start)
                                  : std::fma(weight - 1.0f, end - start, end);
}

// ---------------------------------------------------------------- the reference
//
// One dispatch table for the op, by device:
//
//   reference, cpu  adamw_update_reference below: the plain loop that defines the bits
//                   (element-wise: no sums, nothing a faster CPU loop would reorder)
//   cuda            optim/cuda/adamw.cu: the same operations in one multi-tensor launch
//                   (optim/cuda/step_math.cuh), tested bitwise against this loop
//                   (tests/optim/adamw_cuda_test.cpp)
//
// PyTorch's single-tensor AdamW, one float32 operation per PyTorch kernel, in its order:
//   param.mul_(decay); exp_avg.lerp_(grad, 1 - beta1);
//   exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2);
//   denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps);
//   param.addcdiv_(exp_avg, denom, value=-step_size)     [self + value * t1 / t2]
// Where PyTorch's compiled CPU kernels fuse a multiply and an add (lerp's explicit
// fmadd; addcmul's self + (value * t1) * t2, which its compiler contracts), so do we,
// with std::fma. Checked against torch 2.11 (CPU, AVX-512) on the model, given
// the same gradients: both moments agree bitwise at every step; the parameters agree
// bitwise after step 1 and in all but a handful of elements (1-4 ulp) after step 5.
// The rest is PyTorch's CPU sqrt (MKL's vector math), which is not correctly rounded
// in under 1% of elements; ours is std::sqrt, as is CUDA's sqrtf.
void adamw_update_reference(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                      int64_t count, const detail::AdamWStepScalars& s, bool decay) {
  const float negative_step_size = -s.step_size;
  for (int64_t i = 0; i < count; ++i) {
    if (decay) param[i] = param[i] * s.decay;
    exp_avg[i] = lerp(exp_avg[i], grad[i], s.lerp_weight);
    exp_avg_sq[i] = std::fma(s.one_minus_beta2 * grad[i], grad[i], exp_avg_sq[i] * s.beta2);
    const float denom = std::sqrt(exp_avg_sq[i]) / s.bias_correction2_sqrt + s.eps;
    param[i] = param[i] + negative_step_size * exp_avg[i] / denom;
  }
}

// One parameter's share of a step: raw pointers on the parameters' device.
struct ParameterUpdate {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  int64_t count;
  int64_t step;  // this parameter's own step number, from 1
};

void step_reference(const std::vector<ParameterUpdate>& updates, const AdamWOptions& options) {
  const bool decay = options.weight_decay() != 0.0;  // PyTorch skips the multiply by 1
  for (const ParameterUpdate& u : updates) {
    adamw_update_reference(u.param, u.grad, u.exp_avg, u.exp_avg_sq, u.count,
                     detail::adamw_step_scalars(options, u.step), decay);
  }
}


}  // namespace

detail::AdamWStepScalars detail::adamw_step_scalars(const AdamWOptions& options, int64_t step) {
  const double bias_correction1 = 1.0 - std::pow(options.beta1(), static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(options.beta2(), static_cast<double>(step));
  AdamWStepScalars scalars;
  scalars.decay = static_cast<float>(1.0 - options.lr() * options.weight_decay());
  scalars.lerp_weight = static_cast<float>(1.0 - options.beta1());
  scalars.beta2 = static_cast<float>(options.beta2());
  scalars.one_minus_beta2 = static_cast<float>(1.0 - options.beta2());
  scalars.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  scalars.eps = static_cast<float>(options.eps());
  scalars.step_size = static_cast<float>(options.lr() / bias_correction1);
  return scalars;
}

AdamW::AdamW(std::vector<autograd::Variable> parameters, AdamWOptions options)
    : parameters_(std::move(parameters)), options_(options) {
  check_options(options_);
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const autograd::Variable& parameter = parameters_[i];
    SEQPAR_CHECK(parameter.defined(), "AdamW: parameter ", i, " is undefined");
    SEQPAR_CHECK(parameter.data().is_contiguous(), "AdamW: parameter ", i, " of shape ",
                 parameter.shape(), " must be contiguous (it is updated in place)");
    SEQPAR_CHECK(parameter.device() == parameters_[0].device(), "AdamW: parameter ", i, " is on ",
                 parameter.device(), " but parameter 0 is on ", parameters_[0].device(),
                 "; one optimizer serves one device");
  }
  parameter_steps_.assign(parameters_.size(), 0);
  exp_avg_.resize(parameters_.size());
  exp_avg_sq_.resize(parameters_.size());
}

void AdamW::zero_grad(bool set_to_none) {
  for (const autograd::Variable& parameter : parameters_) {
    if (set_to_none) {
      parameter.set_grad(Tensor());
    } else {
      parameter.zero_grad();
    }
  }
}

void AdamW::step() {
  SEQPAR_NVTX_RANGE("optimizer: adamw");
  ++step_count_;
  std::vector<ParameterUpdate> updates;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const autograd::Variable& parameter = parameters_[i];
    const Tensor& grad = parameter.grad();
    if (!grad.defined()) continue;
    SEQPAR_CHECK(grad.shape() == parameter.shape() && grad.is_contiguous(),
                 "AdamW: gradient of parameter ", i, " must be contiguous with shape ",
                 parameter.shape(), ", got shape ", grad.shape());
    if (!exp_avg_[i].defined()) {  // the state starts at zeros on the first step
      exp_avg_[i] = Tensor::zeros(parameter.shape(), parameter.device());
      exp_avg_sq_[i] = Tensor::zeros(parameter.shape(), parameter.device());
    }
    ++parameter_steps_[i];
    updates.push_back({parameter.data().data(), grad.data(), exp_avg_[i].data(),
                       exp_avg_sq_[i].data(), parameter.data().numel(), parameter_steps_[i]});
  }
  if (parameters_.empty()) return;
  const Device device = parameters_[0].device();
  switch (device.type) {
    case DeviceType::Reference:
    case DeviceType::CPU: {
      step_reference(updates, options_);
      return;
    }
    case DeviceType::CUDA: {
#ifdef SEQPAR_WITH_CUDA
      // One multi-tensor launch per distinct step number (normally exactly one), since a
      // launch takes one pair of bias corrections.
      std::map<int64_t, detail::AdamWTensors> launches;
      for (const ParameterUpdate& u : updates) {
        detail::AdamWTensors& group = launches[u.step];
        group.params.push_back(u.param);
        group.grads.push_back(const_cast<float*>(u.grad));
        group.exp_avgs.push_back(u.exp_avg);
        group.exp_avg_sqs.push_back(u.exp_avg_sq);
        group.sizes.push_back(u.count);
      }
      for (const auto& [step, tensors] : launches) {
        detail::adamw_step_cuda(tensors, detail::adamw_step_scalars(options_, step), device.index);
      }
      return;
#else
      require_host("AdamW", device, "parameters");
#endif
    }
  }
}

}  // namespace seqpar::optim
