#include "nn/rope.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <limits>
#include <memory>

#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/error.h"
#include "nn/cuda/attention.h"
#include "nn/reference/rope.h"

namespace seqpar::nn {

using autograd::Variable;

namespace {

// f(x) correctly rounded to float, from libm. An approximation y with relative error
// below `error` decides the rounding when y (1 - margin) and y (1 + margin) round to
// the same float (margin >= 4 error: the true value lies between them). The double
// functions (glibc: within 1 ulp, 2^-52) decide all but about one value in 2^26 with
// margin 2^-50; the rest go to the long double ones (x87's 64 bits: within 2 ulps,
// 2^-62) with margin 2^-60; a value neither decides is an error, not a guess.
template <typename Real>
bool round_if_decided(Real approximation, Real margin, float* rounded) {
  const Real spread = std::fabs(approximation) * margin;
  const float below = static_cast<float>(approximation - spread);
  const float above = static_cast<float>(approximation + spread);
  *rounded = below;
  return below == above;
}

template <typename Function>
float correctly_rounded(const Function& function, const char* what, double x) {
  float rounded;
  if (round_if_decided<double>(function(x), 0x1p-50, &rounded)) return rounded;
  static_assert(std::numeric_limits<long double>::digits >= 64,
                "RopeTable: the second evaluation needs a long double of 64 bits or more");
  if (round_if_decided<long double>(function(static_cast<long double>(x)), 0x1p-60L, &rounded)) {
    return rounded;
  }
  SEQPAR_FAIL("RopeTable: cannot decide the float rounding of ", what, " at ", x,
              " from libm's double and long double values");
}

}  // namespace

// positions up to 2^29 in magnitude: pos · θ (θ a float, 24 bits) is then exact in a
// double, so the angle is the stated product, not a rounding of it.
constexpr int64_t kMaxRopePosition = int64_t{1} << 29;

RopeTable::RopeTable(const std::vector<int64_t>& positions, int64_t head_dim, float base,
                     Device device) {
  SEQPAR_CHECK(head_dim >= 2 && head_dim % 2 == 0,
               "RopeTable: the head dim must be even and positive, got ", head_dim);
  SEQPAR_CHECK(std::isfinite(base) && base > 1.0f, "RopeTable: base must be finite and above 1, got ",
               base);
  const int64_t tokens = static_cast<int64_t>(positions.size()), half = head_dim / 2;
  std::vector<float> inverse_frequency(half), cos_values(tokens * half), sin_values(tokens * half);
  for (int64_t m = 0; m < half; ++m) {  // θ_m = base^(-2m/D), correctly rounded to float
    const double exponent = -static_cast<double>(2 * m) / static_cast<double>(head_dim);
    inverse_frequency[m] = correctly_rounded(
        [base](auto e) { return std::pow(static_cast<decltype(e)>(base), e); }, "base^e", exponent);
  }
  for (int64_t t = 0; t < tokens; ++t) {
    SEQPAR_CHECK(positions[t] >= -kMaxRopePosition && positions[t] <= kMaxRopePosition,
                 "RopeTable: position ", positions[t], " of token ", t, " is beyond +-2^29");
    for (int64_t m = 0; m < half; ++m) {
      const double angle = static_cast<double>(positions[t]) * inverse_frequency[m];  // exact
      cos_values[t * half + m] = correctly_rounded([](auto a) { return std::cos(a); }, "cos", angle);
      sin_values[t * half + m] = correctly_rounded([](auto a) { return std::sin(a); }, "sin", angle);
    }
  }
  // Built on the host, then copied: every device rotates by these bits.
  const Device host = device.is_reference() ? device : Device::cpu();
  cos_ = Tensor::from_data({tokens, half}, cos_values, host).to(device);
  sin_ = Tensor::from_data({tokens, half}, sin_values, host).to(device);
}

namespace {

void check_rope(const char* op, const Tensor& x, const RopeTable& table) {
  SEQPAR_CHECK(x.defined(), op, ": x must be defined");
  SEQPAR_CHECK(x.dim() == 3 || x.dim() == 4, op,
               ": x must be [S, H, D] or [B, S, H, D] (batch, tokens, heads, head dim), got shape ", x.shape());
  const int64_t tokens = x.size(-3), all = x.dim() == 4 ? x.size(0) * tokens : tokens;
  SEQPAR_CHECK((table.tokens() == tokens || table.tokens() == all) && x.size(-1) == table.head_dim(), op,
               ": x of shape ", x.shape(), " needs a table of ", tokens, " positions",
               all != tokens ? " (or one per token of the batch, " + std::to_string(all) + ")" : std::string(),
               " and head dim ", x.size(-1), "; the table has ", table.tokens(), " positions and head dim ",
               table.head_dim());
  SEQPAR_CHECK(x.device() == table.device(), op, ": x is on ", x.device(),
               " but the table is on ", table.device());
}

// x as the kernels take it: [N, H, D], the batch's tokens one after another.
Tensor token_rows(const Tensor& x) {
  const Tensor c = x.contiguous();
  return c.dim() == 3 ? c : c.view({c.size(0) * c.size(1), c.size(2), c.size(3)});
}

// ---------------------------------------------------------------- dispatch
//
//   reference, cpu  nn/reference/rope.cpp's loops: four products an element pair, one
//                   pass over x; a faster path would save little beside attention.
//   cuda            nn/cuda/rope.cu: a thread an element pair, the same roundings.
Tensor rotate(const char* op, const Tensor& x, const RopeTable& table, bool transposed) {
  check_rope(op, x, table);
  switch (x.device().type) {
    case DeviceType::Reference:
    case DeviceType::CPU:
      return reference::rope_rotate(token_rows(x), table.cos(), table.sin(), transposed).view(x.shape());
    case DeviceType::CUDA:
#ifdef SEQPAR_WITH_CUDA
      return detail::rope_rotate_cuda(token_rows(x), table.cos(), table.sin(), transposed).view(x.shape());
#else
      break;
#endif
  }
  SEQPAR_FAIL(op, ": this seqpar was built without CUDA; run it on the cpu or reference device");
}

struct RopeBackward : autograd::Node {
  explicit RopeBackward(RopeTable table) : table(std::move(table)) {}
  std::vector<Tensor> apply(const Tensor& grad_output) override {
    return {rope_backward(grad_output, table)};
  }
  std::string name() const override { return "RopeBackward"; }
  RopeTable table;
};

}  // namespace

Tensor rope_forward(const Tensor& x, const RopeTable& table) {
  return rotate("rope", x, table, false);
}

Tensor rope_backward(const Tensor& grad_out, const RopeTable& table) {
  return rotate("rope_backward", grad_out, table, true);
}

Variable rope(const Variable& x, const RopeTable& table) {
  SEQPAR_CHECK(x.defined(), "rope: x must be defined");
  Tensor out = rope_forward(x.data(), table);
  if (!autograd::any_requires_grad({&x})) return Variable(std::move(out));
  auto node = std::make_shared<RopeBackward>(table);
  node->add_input(x);
  return Variable::from_op(std::move(out), std::move(node));
}

Variable rope(const Variable& x, const std::vector<int64_t>& positions, float base) {
  SEQPAR_CHECK(x.defined(), "rope: x must be defined");
  SEQPAR_CHECK(x.data().dim() == 3 || x.data().dim() == 4,
               "rope: x must be [S, H, D] or [B, S, H, D] (batch, tokens, heads, head dim), got shape ", x.shape());
  return rope(x, RopeTable(positions, x.shape().back(), base, x.device()));
}

std::vector<int64_t> document_positions(const std::vector<int64_t>& boundaries,
                                        const std::vector<int64_t>& positions) {
  SEQPAR_CHECK(boundaries.size() >= 2 && boundaries.front() == 0,
               "document_positions: boundaries must start at 0 and end at the sequence's length; got ",
               boundaries.size(), " values");
  for (size_t n = 1; n < boundaries.size(); ++n) {
    SEQPAR_CHECK(boundaries[n] > boundaries[n - 1], "document_positions: boundaries must increase: boundary ",
                 n, " is ", boundaries[n], " after ", boundaries[n - 1]);
  }
  std::vector<int64_t> within;
  within.reserve(positions.size());
  for (const int64_t p : positions) {
    SEQPAR_CHECK(p >= 0 && p < boundaries.back(), "document_positions: position ", p,
                 " lies outside the documents [0, ", boundaries.back(), ")");
    within.push_back(p - *(std::upper_bound(boundaries.begin(), boundaries.end(), p) - 1));
  }
  return within;
}

}  // namespace seqpar::nn
