// AdamW with PyTorch's exact semantics (torch.optim.AdamW, single-tensor path):
//
//   step += 1
//   p     *= 1 - lr * weight_decay                 (decoupled weight decay)
//   m      = m + (1 - beta1) * (g - m)              (m.lerp_(g, 1 - beta1))
//   v      = beta2 * v + (1 - beta2) * g * g
//   denom  = sqrt(v) / sqrt(1 - beta2^step) + eps   (eps after the square root)
//   p     -= lr / (1 - beta1^step) * m / denom
//
// Parameters whose gradient is undefined are skipped, as in PyTorch; like PyTorch's
// state["step"], each parameter counts its own steps, so a parameter that starts
// receiving gradients late gets the bias corrections of its own first step.
#pragma once

#include <cstdint>
#include <tuple>
#include <vector>

#include "autograd/variable.h"
#include "seqpar/config.h"

namespace seqpar::optim {

// AdamW's hyperparameters, PyTorch's defaults, set by name and chained as in libtorch:
//
//   AdamW optimizer(model.parameters(), AdamWOptions(1e-4).weight_decay(0.01));
//   AdamWOptions().lr(1e-4).betas({0.9, 0.95}).eps(1e-6)
//
// A setter returns the options, a getter of the same name reads them. The values are
// checked when an AdamW is made of them.
class AdamWOptions {
 public:
  // Implicit, as libtorch's: AdamW(parameters, 1e-4) sets the learning rate.
  AdamWOptions(double lr = 1e-3) : lr_(lr) {}

  AdamWOptions& lr(double lr) { lr_ = lr; return *this; }
  AdamWOptions& betas(std::tuple<double, double> betas) {
    std::tie(beta1_, beta2_) = betas;
    return *this;
  }
  AdamWOptions& eps(double eps) { eps_ = eps; return *this; }
  AdamWOptions& weight_decay(double weight_decay) { weight_decay_ = weight_decay; return *this; }

  double lr() const { return lr_; }
  std::tuple<double, double> betas() const { return {beta1_, beta2_}; }
  double beta1() const { return beta1_; }
  double beta2() const { return beta2_; }
  double eps() const { return eps_; }
  double weight_decay() const { return weight_decay_; }

 private:
  double lr_;
  double beta1_ = 0.9;
  double beta2_ = 0.999;
  double eps_ = 1e-8;
  double weight_decay_ = 1e-2;
};

class AdamW {
 public:
  AdamW(std::vector<autograd::Variable> parameters, AdamWOptions options = {});

  void step();
  // Clears the parameters' gradients for the next backward pass, as PyTorch's
  // optimizer.zero_grad(set_to_none=True): by default each becomes undefined (freed;
  // step() then skips a parameter that no later backward reaches, where PyTorch's
  // step() skips a grad of None). zero_grad(false) fills them with zeros in place and
  // keeps their memory, for code that holds on to it (a captured CUDA graph); a zero
  // gradient is still a step (decay and moments move).
  void zero_grad(bool set_to_none = true);

  const std::vector<autograd::Variable>& parameters() const { return parameters_; }
  // How many times step() ran.
  int64_t step_count() const { return step_count_; }
  const AdamWOptions& options() const { return options_; }
  // State of parameter i (undefined before its first step).
  const Tensor& exp_avg(size_t i) const { return exp_avg_[i]; }
  const Tensor& exp_avg_sq(size_t i) const { return exp_avg_sq_[i]; }

 private:
  std::vector<autograd::Variable> parameters_;
  AdamWOptions options_;
  int64_t step_count_ = 0;
  std::vector<int64_t> parameter_steps_;  // steps taken by each parameter
  std::vector<Tensor> exp_avg_, exp_avg_sq_;
};

namespace detail {
// The scalars of one step as PyTorch hands them to its float32 kernels: computed in
// double on the host (Python floats), then rounded to float once. The CPU loop and
// the CUDA kernel both take exactly these, so they agree bitwise.
struct AdamWStepScalars {
  float decay;                  // 1 - lr * weight_decay
  float lerp_weight;            // 1 - beta1
  float beta2, one_minus_beta2;
  float bias_correction2_sqrt;  // sqrt(1 - beta2^step)
  float eps;
  float step_size;              // lr / (1 - beta1^step)
};
AdamWStepScalars adamw_step_scalars(const AdamWOptions& options, int64_t step);

}  // namespace detail

}  // namespace seqpar::optim
