#include "optim/clip.h"

#include <algorithm>
#include <cmath>

#include "core/elementwise.h"
#include "core/checks.h"
#include "core/error.h"
#include "core/exact_bins.h"
#include "core/exact_sums.h"
#include "core/nvtx.h"
#include "optim/cuda/clip.h"

namespace seqpar::optim {

using autograd::Variable;

namespace {

// The defined gradients, in parameter order, all on one device.
std::vector<Tensor> defined_gradients(const char* op, const std::vector<Variable>& parameters) {
  std::vector<Tensor> gradients;
  for (size_t i = 0; i < parameters.size(); ++i) {
    SEQPAR_CHECK(parameters[i].defined(), op, ": parameter ", i, " is undefined");
    const Tensor& gradient = parameters[i].grad();
    if (!gradient.defined()) continue;
    SEQPAR_CHECK(gradients.empty() || gradient.device() == gradients[0].device(), op,
                 ": the gradient of parameter ", i, " is on ", gradient.device(),
                 " but an earlier one is on ", gradients[0].device());
    gradients.push_back(gradient);
  }
  return gradients;
}

// ---------------------------------------------------------------- the reference
//
// One dispatch table for the op, by device:
//
//   reference, cpu  the plain loops below (one exact sum of squares a tensor, then the
//                   norm of the norms): they define the bits; a gradient has as many
//                   terms as parameters, a small part of a step's work
//   cuda            optim/cuda/clip.cu: the squares' digits by blocks, met by integer atomics, and
//                   the same rounding; tested bitwise against these loops
//                   (tests/optim/clip_cuda_test.cpp)
//
// round_to_double(exact Σ (double)g * (double)g) over the elements: each square is
// exact in double, the sum exact, rounded once; the order changes nothing.
double exact_sum_of_squares_reference(const Tensor& gradient) {
  exact::check_term_count("grad_norm", gradient.numel());
  const Tensor values = gradient.contiguous();
  const float* data = values.data();
  int64_t digits[exact::kDigits] = {};
  exact::FlushingSum sum(digits);
  for (int64_t i = 0; i < values.numel(); ++i) {
    sum.add(static_cast<double>(data[i]) * static_cast<double>(data[i]));
  }
  sum.finish();
  return exact::round_to_double(digits);
}

// The canonical total (optim/clip.h): norm_i = (float)sqrt(S_i), then
// total = (float)sqrt(round_to_double(exact Σ (double)norm_i * (double)norm_i)).
float total_norm_reference(const std::vector<Tensor>& gradients) {
  exact::check_term_count("grad_norm", static_cast<int64_t>(gradients.size()));
  int64_t digits[exact::kDigits] = {};
  exact::FlushingSum sum(digits);
  for (const Tensor& gradient : gradients) {
    const float norm = static_cast<float>(std::sqrt(exact_sum_of_squares_reference(gradient)));
    sum.add(static_cast<double>(norm) * static_cast<double>(norm));
  }
  sum.finish();
  return static_cast<float>(std::sqrt(exact::round_to_double(digits)));
}

// torch: clip_coef = max_norm / (total_norm + 1e-6), in float32, where a Python number
// divided by a tensor is computed as reciprocal(tensor) * number; then clamp(max=1).
// NaN stays NaN, as torch.clamp keeps it. optim/cuda/clip.cu forms the same float operations
// (__frcp_rn is the correctly rounded 1 / x, and std::min(c, 1) is 1 < c ? 1 : c), and
// both scale by one float product: the clipped gradients are bitwise the same.
float clip_coefficient(double max_norm, float total_norm) {
  const float coefficient = (1.0f / (total_norm + 1e-6f)) * static_cast<float>(max_norm);
  return std::min(coefficient, 1.0f);
}

}  // namespace

Tensor grad_norm(const std::vector<Variable>& parameters) {
  SEQPAR_NVTX_RANGE("gradient norm");
  const std::vector<Tensor> gradients = defined_gradients("grad_norm", parameters);
  if (gradients.empty()) {  // as torch: the norm of no gradients is 0
    return Tensor::zeros({}, parameters.empty() ? Device::cpu() : parameters[0].device());
  }
  const Device device = gradients[0].device();
  switch (device.type) {
    case DeviceType::Reference:
    case DeviceType::CPU: {
      Tensor total_norm = Tensor::empty({}, device);
      total_norm.data()[0] = total_norm_reference(gradients);
      return total_norm;
    }
    case DeviceType::CUDA: {
#ifdef SEQPAR_WITH_CUDA
      std::vector<Tensor> contiguous;  // keeps any copies alive during the launch
      std::vector<const float*> pointers;
      std::vector<int64_t> sizes;
      for (const Tensor& gradient : gradients) {
        contiguous.push_back(gradient.contiguous());
        pointers.push_back(contiguous.back().data());
        sizes.push_back(gradient.numel());
      }
      Tensor total_norm = Tensor::empty({}, device);
      detail::grad_norm_cuda(pointers, sizes, total_norm, device.index);
      return total_norm;
#else
      require_host("grad_norm", device, "gradients");
#endif
    }
  }
  SEQPAR_FAIL("grad_norm: unknown device ", device);
}

void clip_grads_with_norm(const std::vector<Variable>& parameters, double max_norm,
                          const Tensor& total_norm) {
  SEQPAR_CHECK(max_norm >= 0.0, "clip_grad_norm: max_norm must be >= 0, got ", max_norm);
  SEQPAR_CHECK(total_norm.defined() && total_norm.numel() == 1,
               "clip_grad_norm: total_norm must hold one element, got shape ", total_norm.shape());
  std::vector<Tensor> gradients = defined_gradients("clip_grad_norm", parameters);
  if (gradients.empty()) return;
  const Device device = gradients[0].device();
  SEQPAR_CHECK(total_norm.device() == device, "clip_grad_norm: total_norm is on ",
               total_norm.device(), " but the gradients are on ", device);
  for (const Tensor& gradient : gradients) {
    SEQPAR_CHECK(gradient.is_contiguous(), "clip_grad_norm: a gradient of shape ",
                 gradient.shape(), " is not contiguous (it is scaled in place)");
  }
  switch (device.type) {
    case DeviceType::Reference:
    case DeviceType::CPU: {
      // Applied even when it is 1, as torch multiplies by the clamped coefficient.
      const float coefficient = clip_coefficient(max_norm, total_norm.item());
      for (Tensor& gradient : gradients) mul_(gradient, coefficient);
      return;
    }
    case DeviceType::CUDA: {
#ifdef SEQPAR_WITH_CUDA
      std::vector<float*> pointers;
      std::vector<int64_t> sizes;
      for (const Tensor& gradient : gradients) {
        pointers.push_back(gradient.data());
        sizes.push_back(gradient.numel());
      }
      detail::clip_grads_cuda(pointers, sizes, static_cast<float>(max_norm), total_norm,
                              device.index);
      return;
#else
      require_host("clip_grad_norm", device, "gradients");
#endif
    }
  }
}

Tensor clip_grad_norm(const std::vector<Variable>& parameters, double max_norm) {
  Tensor total_norm = grad_norm(parameters);
  clip_grads_with_norm(parameters, max_norm, total_norm);
  return total_norm;
}

}  // namespace seqpar::optim
