#include "nn/attention.h"

#include <cmath>
#include <memory>

#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/checks.h"
#include "core/error.h"
#include "nn/cpu/attention.h"
#include "nn/cuda/attention.h"
#include "nn/reference/attention.h"

namespace seqpar::nn {

using autograd::Variable;

float attention_scale(int64_t head_dim) {
  SEQPAR_CHECK(head_dim >= 1, "attention_scale: the head dim must be positive, got ", head_dim);
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

namespace {

void check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v) {
  SEQPAR_CHECK(q.defined() && k.defined() && v.defined(), op, ": q, k and v must be defined");
  SEQPAR_CHECK(q.dim() == 3, op, ": q must be [S, H, D] (tokens, heads, head dim), got shape ",
               q.shape());
  SEQPAR_CHECK(k.shape() == q.shape() && v.shape() == q.shape(), op,
               ": q, k and v must have one shape [S, H, D]; got q ", q.shape(), ", k ", k.shape(),
               ", v ", v.shape());
  SEQPAR_CHECK(k.device() == q.device() && v.device() == q.device(), op,
               ": q, k and v must be on one device; got q on ", q.device(), ", k on ", k.device(),
               ", v on ", v.device());
  SEQPAR_CHECK(q.size(2) >= 1 && q.size(2) <= kMaxAttentionHeadDim, op, ": the head dim D = ",
               q.size(2), " of q's shape ", q.shape(), " must be in [1, ", kMaxAttentionHeadDim, "]");
}

void check_mask(const char* op, const Tensor& q, const AttentionMask& mask) {
  if (mask.positions.empty()) return;
  SEQPAR_CHECK(mask.causal, op, ": mask positions are given but the mask is not causal (positions "
               "only decide a causal mask's visible keys)");
  SEQPAR_CHECK(static_cast<int64_t>(mask.positions.size()) == q.size(0), op, ": the mask has ",
               mask.positions.size(), " positions for S = ", q.size(0), " tokens (one per token)");
}

void check_forward(const Tensor& q, const AttentionForward& forward) {
  const Shape rows{q.size(1), q.size(0)};
  SEQPAR_CHECK(forward.out.defined() && forward.out.shape() == q.shape() &&
                   forward.row_max.defined() && forward.row_max.shape() == rows &&
                   forward.row_sum.defined() && forward.row_sum.shape() == rows,
               "attention_backward: the forward's tensors must be this q's: out ", q.shape(),
               ", row_max and row_sum ", rows);
  SEQPAR_CHECK(forward.out.device() == q.device() && forward.row_max.device() == q.device() &&
                   forward.row_sum.device() == q.device(),
               "attention_backward: the forward's tensors must be on q's device ", q.device());
}

[[noreturn]] void refuse_cuda() {
  SEQPAR_FAIL("attention on CUDA: this seqpar was built without CUDA; run it on the cpu or "
              "reference device");
}

// ---------------------------------------------------------------- dispatch
//
// One dispatch table for the op, by device:
//
//   reference  nn/reference/attention.cpp: the plain loops that define the bits.
//   cpu        nn/cpu/attention.cpp: the same chains, eight keys (or head dims) side by
//              side in vector registers where the host has FMA (AVX2), else the
//              reference's loops; tested bitwise against the reference.
//   cuda       nn/cuda/attention.cu: the same chains, one thread each, the independent
//              ones side by side; tested bitwise against the reference.

AttentionForward dispatch_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const AttentionMask& mask) {
  switch (q.device().type) {
    case DeviceType::Reference:
      return reference::attention_forward(q, k, v, mask);
    case DeviceType::CPU:
      return cpu::attention_forward(q, k, v, mask);
    case DeviceType::CUDA:
#ifdef SEQPAR_WITH_CUDA
      return detail::attention_forward_cuda(q, k, v, mask);
#else
      break;
#endif
  }
  refuse_cuda();
}

AttentionGrads dispatch_backward(const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v,
                                 const AttentionForward& forward, const AttentionMask& mask) {
  switch (q.device().type) {
    case DeviceType::Reference:
      return reference::attention_backward(g, q, k, v, forward, mask);
    case DeviceType::CPU:
      return cpu::attention_backward(g, q, k, v, forward, mask);
    case DeviceType::CUDA:
#ifdef SEQPAR_WITH_CUDA
      return detail::attention_backward_cuda(g, q, k, v, forward, mask);
#else
      break;
#endif
  }
  refuse_cuda();
}

}  // namespace

AttentionForward attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const AttentionMask& mask) {
  check_qkv("scaled_dot_product_attention", q, k, v);
  check_mask("scaled_dot_product_attention", q, mask);
  return dispatch_forward(q.contiguous(), k.contiguous(), v.contiguous(), mask);
}

AttentionGrads attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const AttentionForward& forward,
                                  const AttentionMask& mask) {
  check_qkv("attention_backward", q, k, v);
  check_mask("attention_backward", q, mask);
  SEQPAR_CHECK(grad_out.defined() && grad_out.shape() == q.shape() &&
                   grad_out.device() == q.device(),
               "attention_backward: grad_out must be q's shape ", q.shape(), " on ", q.device(),
               "; got ", grad_out.defined() ? grad_out.shape() : Shape{});
  check_forward(q, forward);
  const AttentionForward saved{forward.out.contiguous(), forward.row_max.contiguous(),
                               forward.row_sum.contiguous()};
  return dispatch_backward(grad_out.contiguous(), q.contiguous(), k.contiguous(), v.contiguous(),
                           saved, mask);
}

// ---------------------------------------------------------------- autograd

namespace {

// Keeps q, k, v and the forward's out, m and l; the backward recomputes P from them.
struct AttentionBackward : autograd::Node {
  AttentionBackward(Tensor q, Tensor k, Tensor v, AttentionForward forward, AttentionMask mask)
      : q(std::move(q)), k(std::move(k)), v(std::move(v)), forward(std::move(forward)),
        mask(std::move(mask)) {}
  std::vector<Tensor> apply(const Tensor& grad_output) override {
    AttentionGrads grads = attention_backward(grad_output, q, k, v, forward, mask);
    const auto& edges = next_edges();
    return {edges[0].valid() ? grads.q : Tensor(), edges[1].valid() ? grads.k : Tensor(),
            edges[2].valid() ? grads.v : Tensor()};
  }
  std::string name() const override { return "AttentionBackward"; }
  Tensor q, k, v;
  AttentionForward forward;
  AttentionMask mask;
};

}  // namespace

Variable scaled_dot_product_attention(const Variable& q, const Variable& k, const Variable& v,
                                      const AttentionMask& mask) {
  SEQPAR_CHECK(q.defined() && k.defined() && v.defined(),
               "scaled_dot_product_attention: q, k and v must be defined");
  check_qkv("scaled_dot_product_attention", q.data(), k.data(), v.data());
  check_mask("scaled_dot_product_attention", q.data(), mask);
  const Tensor qc = q.data().contiguous(), kc = k.data().contiguous(), vc = v.data().contiguous();
  AttentionForward forward = dispatch_forward(qc, kc, vc, mask);
  Tensor out = forward.out;
  if (!autograd::any_requires_grad({&q, &k, &v})) return Variable(std::move(out));
  auto node = std::make_shared<AttentionBackward>(qc, kc, vc, std::move(forward), mask);
  node->add_input(q);
  node->add_input(k);
  node->add_input(v);
  return Variable::from_op(std::move(out), std::move(node));
}

}  // namespace seqpar::nn
