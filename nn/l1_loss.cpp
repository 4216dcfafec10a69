#include "nn/l1_loss.h"

#include <cmath>
#include <limits>
#include <vector>

#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/elementwise.h"
#include "core/checks.h"
#include "core/error.h"
#include "core/exact_bins.h"
#include "core/exact_fixed_point.h"
#include "core/exact_sums.h"
#include "nn/eigen_rows.h"
#include "nn/l1_sign.h"
#include "nn/reference/l1_loss.h"
#include "nn/cuda/l1_loss.h"

namespace seqpar::nn {

using autograd::Variable;

Reduction Reduction::sum_divided_by(int64_t count) {
  SEQPAR_CHECK(count > 0, "Reduction::sum_divided_by: the count must be positive, got ", count);
  return {Kind::SumDividedBy, count};
}

double Reduction::scale(int64_t numel) const {
  switch (kind) {
    case Kind::Mean:  // the mean of nothing is NaN, as torch.mean of an empty tensor
      return numel > 0 ? 1.0 / static_cast<double>(numel)
                       : std::numeric_limits<double>::quiet_NaN();
    case Kind::Sum:
      return 1.0;
    case Kind::SumDividedBy:
      return 1.0 / static_cast<double>(divisor);
  }
  SEQPAR_FAIL("Reduction::scale: unknown reduction kind ", static_cast<int>(kind));
}

namespace {

void check_l1_arguments(const char* op, const Tensor& input, const Tensor& target,
                        Reduction reduction) {
  SEQPAR_CHECK(input.defined() && target.defined(), op, ": input and target must be defined");
  SEQPAR_CHECK(input.dim() == 2, op, ": input must be [n, m], got shape ", input.shape());
  SEQPAR_CHECK(input.shape() == target.shape(), op, ": input has shape ", input.shape(),
               " but target has shape ", target.shape());
  SEQPAR_CHECK(input.device() == target.device(), op, ": input is on ", input.device(),
               " but target is on ", target.device());
  SEQPAR_CHECK(reduction.kind != Reduction::Kind::SumDividedBy || reduction.divisor > 0, op,
               ": sum_divided_by needs a positive count, got ", reduction.divisor);
}

// ---------------------------------------------------------------- dispatch
//
// One dispatch table for the op, by device:
//
//   reference, cpu  the plain loops of nn/reference/l1_loss.cpp: they define the bits.
//                   The host has no faster path: the loss has rows x out terms, a small
//                   part of a step's work beside Linear's rows x out x in.
//   cuda            nn/cuda/l1_loss.cu: the same terms summed by exact::ScaledAbsSum (the |d| in
//                   [2^-33, 2^8) as one fixed-point integer, times s at the flush: the
//                   binned sum's value) in blocks whose digits meet by integer atomics;
//                   tested bitwise against these loops (tests/nn/l1_loss_cuda_test.cpp).

// As the CUDA kernel forms it: the float scale times the incoming gradient, in
// double, rounded once; so both devices give the same bits for any grad_loss.
float gradient_scale(float scale, const Tensor& grad_loss) {
  return static_cast<float>(static_cast<double>(scale) * static_cast<double>(grad_loss.item()));
}

// `where` says what grad_loss must share a device with: "input is" or "the signs are".
void check_grad_loss(const Tensor& grad_loss, Device device, const char* where) {
  SEQPAR_CHECK(grad_loss.defined() && grad_loss.numel() == 1,
               "l1_loss_backward: grad_loss must hold one element, got shape ", grad_loss.shape());
  SEQPAR_CHECK(grad_loss.device() == device, "l1_loss_backward: grad_loss is on ",
               grad_loss.device(), " but ", where, " on ", device);
}

// d loss / d input under a checked row mask, with the loss's float scale.
Tensor masked_l1_backward(const Tensor& grad_loss, const Tensor& input, const Tensor& target,
                          const Tensor& row_mask, float scale) {
  const Tensor input_rows = detail::with_unit_column_stride(input);
  const Tensor target_rows = detail::with_unit_column_stride(target);
  switch (input.device().type) {
    case DeviceType::Reference:
    case DeviceType::CPU: {
      return reference::l1_loss_backward(gradient_scale(scale, grad_loss), input_rows, target_rows,
                                         reference::RowMask{row_mask.data(), row_mask.stride(0)});
    }
    case DeviceType::CUDA: {
#ifdef SEQPAR_WITH_CUDA
      Tensor grad_input = Tensor::empty(input.shape(), input.device());
      detail::l1_loss_backward_masked_cuda(grad_loss, input_rows, target_rows, row_mask, scale,
                                           grad_input);
      return grad_input;
#else
      require_host("l1_loss_backward", input.device());
#endif
    }
  }
  SEQPAR_FAIL("l1_loss_backward: unknown device ", input.device());
}

}  // namespace

Tensor l1_loss_forward(const Tensor& input, const Tensor& target, Reduction reduction,
                       L1Signs* signs) {
  check_l1_arguments("l1_loss", input, target, reduction);
  const Tensor input_rows = detail::with_unit_column_stride(input);
  const Tensor target_rows = detail::with_unit_column_stride(target);
  exact::check_term_count("l1_loss", input.numel());
  uint8_t* codes = nullptr;
  if (signs != nullptr) {
    *signs = L1Signs{DeviceBuffer<uint8_t>(input.numel(), input.device()), input.shape()};
    codes = signs->codes.data();
  }
  // s: the scale rounded to float32 once, the same on every device.
  const float scale = static_cast<float>(reduction.scale(input.numel()));
  if (input.numel() == 0) {  // no terms: 0 * s, which keeps torch's NaN for a mean of nothing
    return Tensor::full({}, 0.0f * scale, input.device());
  }
  switch (input.device().type) {
    case DeviceType::Reference:
    case DeviceType::CPU: {
      return reference::l1_loss_forward(input_rows, target_rows, scale, {}, codes);
    }
    case DeviceType::CUDA: {
#ifdef SEQPAR_WITH_CUDA
      Tensor loss = Tensor::empty({}, input.device());
      detail::l1_loss_forward_cuda(input_rows, target_rows, scale, loss, codes);
      return loss;
#else
      require_host("l1_loss", input.device());
#endif
    }
  }
  SEQPAR_FAIL("l1_loss: unknown device ", input.device());
}

Tensor l1_loss_forward(const Tensor& input, const Tensor& target, Reduction reduction) {
  return l1_loss_forward(input, target, reduction, nullptr);
}

Tensor l1_loss_backward(const Tensor& grad_loss, const Tensor& input, const Tensor& target,
                        Reduction reduction) {
  check_l1_arguments("l1_loss_backward", input, target, reduction);
  check_grad_loss(grad_loss, input.device(), "input is");
  const Tensor input_rows = detail::with_unit_column_stride(input);
  const Tensor target_rows = detail::with_unit_column_stride(target);
  const double scale = reduction.scale(input.numel());
  switch (input.device().type) {
    case DeviceType::Reference:
    case DeviceType::CPU: {
      return reference::l1_loss_backward(gradient_scale(static_cast<float>(scale), grad_loss), input_rows,
                                         target_rows);
    }
    case DeviceType::CUDA: {
#ifdef SEQPAR_WITH_CUDA
      Tensor grad_input = Tensor::empty(input.shape(), input.device());
      detail::l1_loss_backward_cuda(grad_loss, input_rows, target_rows, static_cast<float>(scale),
                                    grad_input);
      return grad_input;
#else
      require_host("l1_loss_backward", input.device());
#endif
    }
  }
  SEQPAR_FAIL("l1_loss_backward: unknown device ", input.device());
}

Tensor l1_loss_backward(const Tensor& grad_loss, const L1Signs& signs, Reduction reduction) {
  SEQPAR_CHECK(signs.shape.size() == 2 && signs.codes.size() == signs.shape[0] * signs.shape[1],
               "l1_loss_backward: the signs must be a forward's, [n, m] with one code an element;"
               " got shape ", signs.shape, " with ", signs.codes.size(), " codes");
  const Device device = signs.codes.device();
  check_grad_loss(grad_loss, device, "the signs are");
  const float scale = static_cast<float>(reduction.scale(signs.codes.size()));
  switch (device.type) {
    case DeviceType::Reference:
    case DeviceType::CPU: {
      return reference::l1_loss_backward_from_signs(gradient_scale(scale, grad_loss), signs.codes.data(),
                                                    signs.shape, device);
    }
    case DeviceType::CUDA: {
#ifdef SEQPAR_WITH_CUDA
      Tensor grad_input = Tensor::empty(signs.shape, device);
      detail::l1_loss_backward_from_signs_cuda(grad_loss, signs.codes.data(), scale, grad_input);
      return grad_input;
#else
      require_host("l1_loss_backward", device);
#endif
    }
  }
  SEQPAR_FAIL("l1_loss_backward: unknown device ", device);
}

// ---------------------------------------------------------------- row mask

int64_t unmasked_rows(const char* op, const Tensor& row_mask, int64_t rows, Device device) {
  SEQPAR_CHECK(row_mask.defined(), op, ": row_mask must be defined (one value per row)");
  SEQPAR_CHECK(row_mask.dim() == 1 && row_mask.size(0) == rows, op,
               ": row_mask must have shape [", rows, "] (one value per row), got shape ",
               row_mask.shape());
  SEQPAR_CHECK(row_mask.device() == device, op, ": row_mask is on ", row_mask.device(),
               " but the inputs are on ", device);
  const std::vector<float> values = row_mask.to_vector();  // from a GPU: one copy, a wait
  int64_t kept = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    // Anything else (0.5, 2, NaN) would be a weight, which this mask is not.
    SEQPAR_CHECK(values[i] == 0.0f || values[i] == 1.0f, op, ": row_mask of shape ",
                 row_mask.shape(), " holds ", values[i], " at row ", i,
                 "; a row mask holds only 0 (ignore the row) and 1 (count it)");
    kept += values[i] == 1.0f;
  }
  return kept;
}

namespace {

// The mask checked against the inputs, and the loss's float scale for the rows it keeps.
float masked_scale(const char* op, const Tensor& input, const Tensor& row_mask,
                   Reduction reduction, int64_t* terms) {
  const int64_t kept = unmasked_rows(op, row_mask, input.size(0), input.device());
  *terms = kept * input.size(1);
  exact::check_term_count(op, *terms);
  return static_cast<float>(reduction.scale(*terms));
}

// The loss over a checked mask's rows, given its scale and term count.
Tensor masked_l1_forward(const Tensor& input, const Tensor& target, const Tensor& row_mask,
                         float scale, int64_t terms) {
  if (terms == 0) {  // as without a mask: 0 * s, NaN for a mean of nothing
    return Tensor::full({}, 0.0f * scale, input.device());
  }
  const Tensor input_rows = detail::with_unit_column_stride(input);
  const Tensor target_rows = detail::with_unit_column_stride(target);
  switch (input.device().type) {
    case DeviceType::Reference:
    case DeviceType::CPU: {
      return reference::l1_loss_forward(input_rows, target_rows, scale,
                                        reference::RowMask{row_mask.data(), row_mask.stride(0)});
    }
    case DeviceType::CUDA: {
#ifdef SEQPAR_WITH_CUDA
      Tensor loss = Tensor::empty({}, input.device());
      detail::l1_loss_forward_masked_cuda(input_rows, target_rows, row_mask, scale, loss);
      return loss;
#else
      require_host("l1_loss", input.device());
#endif
    }
  }
  SEQPAR_FAIL("l1_loss: unknown device ", input.device());
}

}  // namespace

Tensor l1_loss_forward(const Tensor& input, const Tensor& target, Reduction reduction,
                       const Tensor& row_mask) {
  check_l1_arguments("l1_loss", input, target, reduction);
  int64_t terms = 0;
  const float scale = masked_scale("l1_loss", input, row_mask, reduction, &terms);
  return masked_l1_forward(input, target, row_mask, scale, terms);
}

Tensor l1_loss_backward(const Tensor& grad_loss, const Tensor& input, const Tensor& target,
                        Reduction reduction, const Tensor& row_mask) {
  check_l1_arguments("l1_loss_backward", input, target, reduction);
  check_grad_loss(grad_loss, input.device(), "input is");
  int64_t terms = 0;
  const float scale = masked_scale("l1_loss_backward", input, row_mask, reduction, &terms);
  return masked_l1_backward(grad_loss, input, target, row_mask, scale);
}

// ---------------------------------------------------------------- autograd

namespace {

// d loss / d input = scale · g · sign(input - target); d loss / d target is its negative.
// It keeps the forward's signs, not input and target (nn/l1_loss.h).
struct L1LossBackward : autograd::Node {
  L1LossBackward(L1Signs signs, Reduction reduction)
      : signs(std::move(signs)), reduction(reduction) {}
  std::vector<Tensor> apply(const Tensor& grad_output) override {
    const bool want_input = next_edges()[0].valid(), want_target = next_edges()[1].valid();
    const Tensor grad_input = l1_loss_backward(grad_output, signs, reduction);
    return {want_input ? grad_input : Tensor(),
            want_target ? seqpar::mul(grad_input, -1.0f) : Tensor()};
  }
  std::string name() const override { return "L1LossBackward"; }
  L1Signs signs;
  Reduction reduction;
};

// Under a row mask: the scale the forward used (so the mask is checked and counted
// once), and d loss / d target as sign(target - input) itself, which is exactly the
// negative of input's (a float subtraction rounds symmetrically) and leaves a masked
// row's gradient +0 rather than -0.
struct MaskedL1LossBackward : autograd::Node {
  MaskedL1LossBackward(Tensor input, Tensor target, Tensor row_mask, float scale)
      : input(std::move(input)), target(std::move(target)), row_mask(std::move(row_mask)),
        scale(scale) {}
  std::vector<Tensor> apply(const Tensor& grad_output) override {
    const bool want_input = next_edges()[0].valid(), want_target = next_edges()[1].valid();
    return {want_input ? masked_l1_backward(grad_output, input, target, row_mask, scale) : Tensor(),
            want_target ? masked_l1_backward(grad_output, target, input, row_mask, scale)
                        : Tensor()};
  }
  std::string name() const override { return "MaskedL1LossBackward"; }
  Tensor input, target, row_mask;
  float scale;
};

}  // namespace

Variable l1_loss(const Variable& input, const Variable& target, Reduction reduction,
                 const Tensor& row_mask) {
  SEQPAR_CHECK(input.defined() && target.defined(), "l1_loss: input and target must be defined");
  check_l1_arguments("l1_loss", input.data(), target.data(), reduction);
  int64_t terms = 0;
  const float scale = masked_scale("l1_loss", input.data(), row_mask, reduction, &terms);
  Tensor loss = masked_l1_forward(input.data(), target.data(), row_mask, scale, terms);
  if (!autograd::any_requires_grad({&input, &target})) return Variable(std::move(loss));
  auto node = std::make_shared<MaskedL1LossBackward>(input.data(), target.data(), row_mask, scale);
  node->add_input(input);
  node->add_input(target);
  return Variable::from_op(std::move(loss), std::move(node));
}

Variable l1_loss(const Variable& input, const Variable& target, Reduction reduction) {
  SEQPAR_CHECK(input.defined() && target.defined(), "l1_loss: input and target must be defined");
  if (!autograd::any_requires_grad({&input, &target})) {
    return Variable(l1_loss_forward(input.data(), target.data(), reduction));
  }
  L1Signs signs;
  Tensor loss = l1_loss_forward(input.data(), target.data(), reduction, &signs);
  auto node = std::make_shared<L1LossBackward>(std::move(signs), reduction);
  node->add_input(input);
  node->add_input(target);
  return Variable::from_op(std::move(loss), std::move(node));
}

}  // namespace seqpar::nn
